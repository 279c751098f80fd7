"""Every MLflow tag the package writes or reads, by name: who writes it and who reads it back.

Tags are a model's lineage and audit trail. The training job writes them on its run, the register
task copies the lineage onto the model version, and the gate, approval, promotion and canary add
their decisions; `trainpipe reproduce`, `trainpipe snapshots gc`, validation's drift reference and
the serving side read them back in other processes, often months later. A renamed tag breaks its
readers silently (a `tags.get` that finds nothing), so each name is spelled once, here, below every
writer and reader, as contracts/artifacts.py does for a run's files.

Invariants: every name starts with `PREFIX` (the `airflow.*` ones name the DAG run and are
Airflow's words); no other module of the package spells the prefix, and a name that is built (the
audit tags of an alias move) comes from `audit_tag_names`. Values are strings, as MLflow stores
them; MLflow caps a value at 5000 characters, so writers cut free text to that.
"""

from __future__ import annotations

PREFIX = "trainpipe."

# -- the training job's run (runtime/tracking.py writes them when the run starts) ------------------
PIPELINE_TAG = "trainpipe.pipeline"
"""The pipeline's name. Also on the version (register task) and on a study's parent run (tune)."""
RUN_ID_TAG = "trainpipe.run_id"
"""The job's run id (its run directory), not MLflow's."""
DATA_DIGEST_TAG = "trainpipe.data_digest"
"""The snapshot the run trained on. Read by register (its result), by the drift reference
(registry/reads.champion_data_digest) and by `trainpipe snapshots gc` (registry/retention)."""
WORLD_SIZE_TAG = "trainpipe.world_size"
RESUMED_FROM_STEP_TAG = "trainpipe.resumed_from_step"
CONFIG_HASH_TAG = "trainpipe.config_hash"
"""The config's content hash; register falls back to the task's config for a run without it."""
CODE_VERSION_TAG = "trainpipe.code_version"
"""The package version that trained; `trainpipe reproduce` names a change as a likely cause."""
TRANSFORM_HASH_TAG = "trainpipe.transform_hash"
HYPERPARAMETER_OVERRIDES_TAG = "trainpipe.hyperparameter_overrides"
"""The trigger form's overrides, JSON."""
LIBRARIES_TAG = "trainpipe.libraries"
"""contracts/artifacts.library_versions() as JSON; read by `trainpipe reproduce`."""
PRETRAINED_URI_TAG = "trainpipe.pretrained_uri"
PRETRAINED_SOURCE_TAG = "trainpipe.pretrained_source"
PRETRAINED_SHA256_TAG = "trainpipe.pretrained_sha256"
THRESHOLD_TAG = "trainpipe.threshold"
"""The candidate's decision threshold (runtime/evaluation/final.py); register copies it onto the
version, where serving and the canary's checks read it."""

# -- the data's lineage (data/sources/* and contracts/manifest.py, through the job's run) -----------
DATA_WINDOW_TAG = "trainpipe.data_window"
DATA_PARTITIONS_TAG = "trainpipe.data_partitions"
DATA_MISSING_TAG = "trainpipe.data_missing"
DATA_SOURCE_TAG = "trainpipe.data_source"
DATA_QUERY_SHA256_TAG = "trainpipe.data_query_sha256"
DATA_TABLE_VERSION_TAG = "trainpipe.data_table_version"
DATA_SNAPSHOT_ID_TAG = "trainpipe.data_snapshot_id"
DATA_FILTER_TAG = "trainpipe.data_filter"
FEAST_PROJECT_TAG = "trainpipe.feast_project"
FEAST_FEATURES_TAG = "trainpipe.feast_features"
FEAST_FEATURE_VIEWS_TAG = "trainpipe.feast_feature_views"
"""Comma-separated; registry/online_features reads it to load the views before the alias moves."""
FEAST_DEFINITIONS_SHA256_TAG = "trainpipe.feast_definitions_sha256"
FEAST_ENTITY_DIGEST_TAG = "trainpipe.feast_entity_digest"
FEAST_ENTITY_TIME_TAG = "trainpipe.feast_entity_time"
"""`<start> .. <end>` of the entity rows; registry/online_features loads the views from start."""

# -- the champion the job scored beside the candidate (final.py writes, registry/reads reads) -------
CHAMPION_MODEL_NAME_TAG = "trainpipe.champion.model_name"
CHAMPION_ALIAS_TAG = "trainpipe.champion.alias"
CHAMPION_VERSION_TAG = "trainpipe.champion.version"
"""The version scored, or `NO_CHAMPION`; a run without the tag never scored a champion."""
CHAMPION_RUN_ID_TAG = "trainpipe.champion.run_id"
CHAMPION_ERROR_TAG = "trainpipe.champion.error"
"""Why the champion could not be scored; the gate refuses to decide on it unless forced."""
NO_CHAMPION = "none"
"""The value of `CHAMPION_VERSION_TAG` when no version held the alias (bootstrap)."""

# -- who started a run (cli/training.py, tuning/local.py, registry/reproduce.py) --------------------
LAUNCHED_BY_TAG = "trainpipe.launched_by"
"""`cli` or `reproduce`; a run the DAG started has none."""
REPRODUCES_TAG = "trainpipe.reproduces"
"""`<model>/<version>` a `trainpipe reproduce` run trains again."""

# -- a study (tuning/trials.py tags each trial's run, tuning/report.py the parent and the end) ------
STUDY_TAG = "trainpipe.study"
ROLE_TAG = "trainpipe.role"
"""`study` on a study's parent run: with `STUDY_TAG`, how a resumed study finds its parent."""
TRIAL_TAG = "trainpipe.trial"
TRIAL_STATE_TAG = "trainpipe.trial_state"
TRIAL_RUNGS_TAG = "trainpipe.trial_rungs"
BEST_TRIAL_TAG = "trainpipe.best_trial"

# -- the gate's decision (registry/versions.py: on the candidate's run, then on its version) --------
GATE_PROMOTE_TAG = "trainpipe.gate.promote"
"""On the run only: `true` or `false`."""
GATE_FORCED_TAG = "trainpipe.gate.forced"
GATE_REASON_TAG = "trainpipe.gate.reason"
GATE_METRIC_TAG = "trainpipe.gate.metric"
GATE_CANDIDATE_TAG = "trainpipe.gate.candidate"
GATE_CHAMPION_TAG = "trainpipe.gate.champion"
GATE_IMPROVEMENT_TAG = "trainpipe.gate.improvement"
GATE_CONFIDENCE_TAG = "trainpipe.gate.confidence"
GATE_IMPROVEMENT_INTERVAL_TAG = "trainpipe.gate.improvement_interval"
"""`[lower, upper]` as JSON; with `GATE_CONFIDENCE_TAG`, only when `gate.confidence` is set."""

# -- the model version (register task, registry/versions.py) ----------------------------------------
MLFLOW_RUN_ID_TAG = "trainpipe.mlflow_run_id"
CHAMPION_COMPARED_TAG = "trainpipe.champion_compared"
"""`<model>/<version>` the gate compared against, or `none`."""
AIRFLOW_DAG_ID_TAG = "airflow.dag_id"
AIRFLOW_DAG_RUN_ID_TAG = "airflow.dag_run_id"
FEAST_MATERIALIZED_VIEWS_TAG = "trainpipe.feast_materialized_views"
FEAST_MATERIALIZED_UNTIL_TAG = "trainpipe.feast_materialized_until"
"""registry/online_features: what was loaded into the online store before the alias moved."""
APPROVAL_TAG = "trainpipe.approval"
"""`approved` or `rejected` (operators/approval.py), beside the audit tags of that action."""

# -- the canary (registry/versions.py, for operators/canary.py) -------------------------------------
CANARY_RESULT_TAG = "trainpipe.canary.result"
"""`promoted`, `no_champion` or `rolled_back`."""
CANARY_FAILED_STEP_TAG = "trainpipe.canary.failed_step"
CANARY_FAILED_TAG = "trainpipe.canary.failed"
CANARY_FIGURES_TAG = "trainpipe.canary.figures"
CANARY_REPORT_TAG = "trainpipe.canary.report"
"""The canary report's URL in MLflow's UI, else its `runs:/` URI."""
CANARY_STEP_TAG_PREFIX = "trainpipe.canary.step."
"""+ the step (1-based): JSON of each check's figure, interval, threshold, decision and count."""

LINEAGE_RUN_TAGS = (
    DATA_DIGEST_TAG,
    CONFIG_HASH_TAG,
    CODE_VERSION_TAG,
    WORLD_SIZE_TAG,
    TRANSFORM_HASH_TAG,
    DATA_WINDOW_TAG,
    DATA_PARTITIONS_TAG,
    DATA_MISSING_TAG,
    DATA_SOURCE_TAG,
    DATA_QUERY_SHA256_TAG,
    DATA_TABLE_VERSION_TAG,
    DATA_SNAPSHOT_ID_TAG,
    DATA_FILTER_TAG,
    PRETRAINED_URI_TAG,
    PRETRAINED_SOURCE_TAG,
    PRETRAINED_SHA256_TAG,
    FEAST_PROJECT_TAG,
    FEAST_FEATURES_TAG,
    FEAST_FEATURE_VIEWS_TAG,
    FEAST_DEFINITIONS_SHA256_TAG,
    FEAST_ENTITY_DIGEST_TAG,
    FEAST_ENTITY_TIME_TAG,
    THRESHOLD_TAG,
)
"""The job's run tags the register task copies onto the model version (those the run has)."""


def audit_tag_names(action: str) -> tuple[str, str, str]:
    """The (who, when, why) tag names of a registry action on a version: `promoted`, `restored`,
    `rolled_back` (registry/aliases.py), `approved`, `rejected` (operators/approval.py),
    `canary_rolled_back` (registry/versions.py)."""
    return f"{PREFIX}{action}_by", f"{PREFIX}{action}_at", f"{PREFIX}{action}_reason"

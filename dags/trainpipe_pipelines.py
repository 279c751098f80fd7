"""airflow-trainpipe: every YAML file in `configs/` next to this file becomes one retrain DAG.

Add, change or remove a config and the DAG processor picks it up on its next parse; this file
never changes. A config that does not parse becomes a DAG marked `trainpipe:broken-config`
whose description and Docs name the file, the field and what is expected.
"""

from pathlib import Path

from airflow_trainpipe.factory import register_pipelines

register_pipelines(Path(__file__).parent / "configs", globals())

"""The OpenLineage provider's operator protocol, once for all our operators.

The provider's listener asks an operator for `get_openlineage_facets_on_start/on_complete/
on_failure`; each of ours answers from `_openlineage()`, what its `execute()` left on the
instance (the payloads it returned or was about to). Only the listener calls these, so without
the provider installed nothing here runs, and nothing here imports it at module level.
"""

from __future__ import annotations

from typing import Any


class OpenLineageReporting:
    def get_openlineage_facets_on_start(self) -> Any:
        # Nothing is known before execute() ran: the datasets come with COMPLETE (or FAIL).
        from airflow.providers.openlineage.extractors import OperatorLineage

        return OperatorLineage()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return self._openlineage()

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        # A failed validation reports the checks that failed it; a failed job its input.
        return self._openlineage()

    def _openlineage(self) -> Any:
        raise NotImplementedError


class ModelVersionReporting(OpenLineageReporting):
    """register and promote: the model version they left, from what their execute() returned."""

    _lineage_registered: dict[str, Any] | None = None
    _lineage_tracking_uri = ""
    config: Any

    def _openlineage(self) -> Any:
        from airflow_trainpipe.openlineage import lineage

        return lineage.registration(self.config, self._lineage_registered, self._lineage_tracking_uri)

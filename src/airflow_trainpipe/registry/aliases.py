"""Moving a model's serving aliases by hand: promote a version, roll the champion back.

The register task moves `@champion` (and `@previous_champion`) after a gate; people need the same
move without a pipeline run (a hotfix version, a bad model found in production). These use the
register task's own hook calls (`MlflowHook.move_alias`), so the aliases move exactly as a
pipeline moves them, and every move records on the versions who made it, when and why.

A rollback points `@champion` back at the `@previous_champion` version and removes
`@previous_champion`, so a second rollback has nothing to undo instead of re-promoting the model
just taken out. The version taken out is tagged `trainpipe.rolled_back_*`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from airflow_trainpipe.contracts.tags import audit_tag_names
from airflow_trainpipe.registry.reads import RegistryError, current_champion

if TYPE_CHECKING:
    from airflow_trainpipe.hooks.mlflow import MlflowHook


@dataclass(frozen=True)
class AliasMove:
    model_name: str
    alias: str
    version: str
    """The version that holds `alias` now."""

    replaced: str | None
    """The version that held it before (None: none did, or it already was `version`)."""

    previous_alias: str | None
    """Where `replaced` went: `previous_champion` after a promotion, nowhere after a rollback."""

    already: bool = False
    """`version` held `alias` before the move: nothing moved."""

    def describe(self) -> str:
        if self.already:
            return f"{self.model_name} version {self.version} is @{self.alias} already: nothing moved"
        if self.replaced is None:
            return (
                f"{self.model_name} version {self.version} is now @{self.alias} (no version held it before)"
            )
        where = f", version {self.replaced} is @{self.previous_alias}" if self.previous_alias else ""
        return f"{self.model_name} version {self.version} is now @{self.alias} (was version {self.replaced}){where}"


def audit_tags(action: str, actor: str, reason: str) -> dict[str, str]:
    """Who, when and why of `action` (promoted, approved, rejected, ...), as version tags."""
    by, at, why = audit_tag_names(action)
    return {by: actor, at: datetime.now(UTC).isoformat(timespec="seconds"), why: reason[:5000]}


def promote(
    hook: MlflowHook,
    model_name: str,
    version: str,
    *,
    actor: str,
    reason: str,
    alias: str = "champion",
    previous_alias: str | None = "previous_champion",
    prepare: Callable[[str], None] | None = None,
) -> AliasMove:
    """Make `version` the `alias` holder; the version it replaces gets `previous_alias`.
    `prepare(version)` runs first (loading its online features): if it raises, nothing moves."""
    if previous_alias == alias:
        raise RegistryError(f"the replaced version cannot go to @{alias}, the alias being moved")
    # The registry's own spelling: it reads "03" as version 3, and the holder check compares text.
    version = _require_version(hook, model_name, version)
    holder = hook.call(current_champion, model_name, alias)
    if holder is not None and holder[0] == version:
        return AliasMove(model_name, alias, version, None, None, already=True)
    if prepare is not None:
        prepare(version)
    replaced = hook.move_alias(model_name, alias, version, previous_alias, holder[0] if holder else None)
    hook.set_version_tags(model_name, version, audit_tags("promoted", actor, reason))
    return AliasMove(model_name, alias, version, replaced, previous_alias if replaced else None)


def rollback(
    hook: MlflowHook,
    model_name: str,
    *,
    actor: str,
    reason: str,
    alias: str = "champion",
    previous_alias: str = "previous_champion",
    prepare: Callable[[str], None] | None = None,
) -> AliasMove:
    """Point `alias` back at the `previous_alias` version and remove `previous_alias`.
    `prepare(version)` runs first with the version restored: if it raises, nothing moves."""
    previous = hook.call(current_champion, model_name, previous_alias)
    if previous is None:
        raise RegistryError(f"{model_name}@{previous_alias} does not exist: there is nothing to roll back to")
    holder = hook.call(current_champion, model_name, alias)
    restored = previous[0]
    if prepare is not None:
        prepare(restored)
    hook.move_alias(model_name, alias, restored, None, None)
    hook.remove_alias(model_name, previous_alias)
    if holder is not None and holder[0] != restored:
        hook.set_version_tags(model_name, holder[0], audit_tags("rolled_back", actor, reason))
    hook.set_version_tags(model_name, restored, audit_tags("restored", actor, reason))
    return AliasMove(model_name, alias, restored, holder[0] if holder else None, None)


def release_alias(hook: MlflowHook, model_name: str, alias: str, version: str) -> None:
    """Remove `alias` if `version` holds it (it may have moved on to a newer version meanwhile)."""
    holder = hook.call(current_champion, model_name, alias)
    if holder is not None and holder[0] == version:
        hook.remove_alias(model_name, alias)


def _require_version(hook: MlflowHook, model_name: str, version: str) -> str:
    """`version` as the registry spells it; RegistryError when the model has no such version."""
    from mlflow.exceptions import MlflowException

    from airflow_trainpipe.registry.reads import RegistryUnavailable, is_not_found

    with hook.activated():
        try:
            return str(hook.get_conn().get_model_version(model_name, version).version)
        except MlflowException as exc:
            if is_not_found(exc):
                raise RegistryError(f"{model_name} has no version {version}") from exc
            raise RegistryUnavailable(f"cannot read {model_name} version {version}: {exc.message}") from exc

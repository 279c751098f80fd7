"""PromoteModelOperator against real MLflow: the approved version becomes the champion through the
`trainpipe promote` code path, and a stale comparison moves nothing."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_trainpipe.operators.promote import PromoteModelOperator
from tests.operators.conftest import TaskInstance, aliases, answer


def _context(result: dict, decision, approval: dict) -> dict:
    approval = {k: v for k, v in approval.items() if k != "timedout"}
    return {
        "ti": TaskInstance(
            xcoms={
                ("register", "return_value"): result,
                ("gate", "return_value"): decision.as_dict(),
                ("approve", "return_value"): approval,
            }
        )
    }


def test_the_approved_version_becomes_champion_with_the_approver_recorded(staged) -> None:
    hook, config, name, result, decision = staged
    operator = PromoteModelOperator(task_id="promote", config=config)
    out = operator.execute(_context(result, decision, answer("Approve", reason="ship it")))
    assert (out["version"], out["alias"], out["promoted"], out["previous_version"]) == (
        "2",
        "champion",
        True,
        "1",
    )
    assert out["approved_by"] == "alice"
    assert aliases(hook, name) == {"champion": "2", "previous_champion": "1"}  # @challenger removed
    tags = hook.get_conn().get_model_version(name, "2").tags
    assert (tags["trainpipe.promoted_by"], tags["trainpipe.promoted_reason"]) == ("alice", "ship it")


def test_nothing_moves_without_an_approval_or_when_the_champion_changed(staged) -> None:
    hook, config, name, result, decision = staged
    operator = PromoteModelOperator(task_id="promote", config=config)
    with pytest.raises(AirflowFailException, match="did not approve"):
        operator.execute(_context(result, decision, answer("Reject")))
    hook.move_alias(name, "champion", "2", None, None)  # someone promoted by hand meanwhile...
    hook.move_alias(name, "champion", "1", None, None)  # ...and back: the champion is what the gate saw
    stale = decision.model_copy(update={"champion_version": None})
    with pytest.raises(AirflowFailException, match="the champion changed in between"):
        operator.execute(_context(result, stale, answer("Approve")))
    assert aliases(hook, name) == {"champion": "1", "challenger": "2"}


def test_a_timeout_that_approves_is_recorded_as_the_timeout(staged) -> None:
    hook, config, name, result, decision = staged
    operator = PromoteModelOperator(task_id="promote", config=config)
    operator.execute(_context(result, decision, answer("Approve", user=None, timedout=True)))
    tags = hook.get_conn().get_model_version(name, "2").tags
    assert tags["trainpipe.promoted_by"] == "timeout"
    assert tags["trainpipe.promoted_reason"] == "no answer in time; register.on_approval_timeout is approve"

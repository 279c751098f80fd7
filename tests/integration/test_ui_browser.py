"""The Airflow UI in a real browser: Debian's Chromium (headless) driven by Playwright, against the
session's `airflow standalone` + `mlflow server` (conftest.py), as a user clicks through it.

- the trigger form of `fraud_detector` submits with its defaults, and that run trains on the run's
  own partition (`ds=<today>`: a manual trigger's logical date is "now");
- a second trigger with the Hyperparameters field edited and Force registration ticked: the edited
  values reach the training job (the train task's rendered field; the job stops at the edited
  max_steps) and the model version is tagged forced;
- the train task's "MLflow run" extra link and Browse > MLflow open MLflow's own UI, and the gate
  task's "Gate report" link opens the decision's HTML report in MLflow's artifact viewer.

Playwright never downloads a browser here: it launches /usr/bin/chromium (`.ci/run` installs the
Debian package when it is missing). On failure, a screenshot and the HTML of every open page are
saved under var/test-artifacts/<test>/ (conftest.py), and the failure report names the folder.
This module runs after test_standalone.py (file order), whose registry assertions expect an empty
registry; it asserts only what its own runs did, so it also runs alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.integration.conftest import Stack

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags Chromium keeps calling out to Google services, which
# floods a machine without a network; QUIC and the GPU process are of no use headless.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DAG = "fraud_detector"
RUN_TIMEOUT = 480  # one DAG run: the training job and two model evaluations on 2 busy cores


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=60_000)  # the default 5 s is short for MLflow's UI on 2 busy cores
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install chromium (.ci/run installs it)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, stack: Stack, request: pytest.FixtureRequest) -> Iterator[object]:
    """A logged-in page of a fresh browser context; MLflow's basic auth answered for its origin only."""
    context = browser.new_context(
        viewport={"width": 1400, "height": 1000},
        timezone_id="UTC",
        http_credentials={
            "username": stack.mlflow.username,
            "password": stack.mlflow.password,
            "origin": stack.mlflow.url,
        },
    )
    request.node.browser_context = context  # for pytest_runtest_makereport (conftest.py): evidence on failure
    page = context.new_page()
    page.set_default_timeout(60_000)
    login(page, stack)
    yield page
    context.close()


def login(page, stack: Stack) -> None:
    """The simple auth manager's sign-in form (conftest writes the admin password)."""
    page.goto(f"{stack.url}/dags")
    page.locator("input[name=username]").fill(stack.username)
    page.locator("input[name=password]").fill(stack.password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{stack.url}/dags")


def open_trigger_form(page, stack: Stack):
    """Dags list -> fraud_detector -> Trigger: the form's dialog."""
    from playwright.sync_api import expect

    page.goto(f"{stack.url}/dags")
    page.get_by_role("link", name=DAG, exact=True).click()
    page.wait_for_url(f"{stack.url}/dags/{DAG}")
    button = page.get_by_test_id("trigger-dag-button")
    expect(button).to_have_count(1)  # the list's one-per-row buttons are gone: the DAG page is shown
    button.click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_text("Run Parameters")).to_be_visible()
    return dialog


def submit(page, stack: Stack, dialog) -> dict:
    """Click the dialog's Trigger; returns the DAG run it created (REST)."""
    from playwright.sync_api import expect

    before = {run["dag_run_id"] for run in runs(stack)}
    trigger = dialog.get_by_role("button", name="Trigger", exact=True)
    expect(trigger).to_be_enabled()
    trigger.click()
    new = stack.wait_for(
        "the run the form triggered",
        lambda: [r for r in runs(stack) if r["dag_run_id"] not in before] or None,
        60,
    )
    assert len(new) == 1, new
    return new[0]


def runs(stack: Stack) -> list[dict]:
    return stack.get(f"/api/v2/dags/{DAG}/dagRuns", order_by="-run_after", limit=20)["dag_runs"]


def edit_json_field(page, field, changes: dict[str, tuple[str, str]]) -> None:
    """Edit a form's JSON editor (Monaco) as a user types: for each key, go to the end of its line
    and replace the old value text by the new one (typing a whole document in would fight the
    editor's auto-closing brackets and indentation)."""
    for key, (old, new) in changes.items():
        field.get_by_text(f'"{key}"').click()
        page.keyboard.press("End")
        for _ in old:
            page.keyboard.press("Backspace")
        page.keyboard.type(new)


def rendered(stack: Stack, run_id: str, task_id: str) -> dict:
    return stack.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/{task_id}")["rendered_fields"]


@pytest.mark.timeout(1500)  # two DAG runs with training, on top of the stack's start when run alone
def test_trigger_form_defaults_then_overrides_and_the_mlflow_run_link(
    page, stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import expect

    stack.wait_for(f"DAG {DAG}", lambda: stack.dag(DAG), 120)
    response = stack.session.patch(f"{stack.url}/api/v2/dags/{DAG}", json={"is_paused": False}, timeout=30)
    assert response.status_code == 200, response.text
    today = datetime.now(UTC).date()  # the form's logical date is "now"
    for offset in (-1, 0, 1):  # the day before is the drift reference; the day after covers midnight
        stack.write_day(today + timedelta(days=offset))

    # 1. The form's defaults: nothing typed, Trigger enabled, a run on its own partition.
    dialog = open_trigger_form(page, stack)
    expect(dialog.locator("#element_partition")).to_have_value("")
    defaults = submit(page, stack, dialog)
    assert defaults["conf"]["partition"] is None and defaults["conf"]["force_registration"] is False, (
        defaults["conf"]
    )
    first = defaults["dag_run_id"]
    assert stack.wait_for_run(DAG, first, RUN_TIMEOUT) == "success", stack.task_report(DAG, first)
    ds = defaults["logical_date"][:10]
    assert rendered(stack, first, "validate_data")["partition"] == f"ds={ds}"
    assert rendered(stack, first, "train")["partition"] == f"ds={ds}"
    states = stack.task_states(DAG, first)
    assert states.pop("register") in ("success", "skipped"), (
        states
    )  # skipped: the gate kept a better champion
    assert set(states.values()) == {"success"}, states

    # 2. Edited hyperparameters (one epoch, capped at 2 steps: a candidate the gate rejects) + Force registration.
    dialog = open_trigger_form(page, stack)
    edit_json_field(
        page,
        dialog.locator("#element_hyperparameters"),
        {"epochs": ("3,", "1,"), "max_steps": ("null,", "2,")},
    )
    dialog.locator('label[id="switch:element_force_registration"]').click()
    expect(dialog.locator("input[name=element_force_registration]")).to_be_checked()
    forced = submit(page, stack, dialog)
    second = forced["dag_run_id"]
    assert forced["conf"]["force_registration"] is True, forced["conf"]
    assert (forced["conf"]["hyperparameters"]["epochs"], forced["conf"]["hyperparameters"]["max_steps"]) == (
        1,
        2,
    ), forced["conf"]
    assert stack.wait_for_run(DAG, second, RUN_TIMEOUT) == "success", stack.task_report(DAG, second)
    assert stack.task_states(DAG, second) == dict.fromkeys(
        ("wait_for_data", "validate_data", "train", "gate", "register"), "success"
    )
    overrides = json.loads(rendered(stack, second, "train")["hyperparameter_overrides"])
    assert (overrides["epochs"], overrides["max_steps"]) == (1, 2), overrides
    # The training job applied them: it stopped at the edited max_steps (the config trains 3 epochs).
    trained = stack.get(f"/api/v2/dags/{DAG}/dagRuns/{second}/taskInstances/train/xcomEntries/return_value")[
        "value"
    ]
    assert trained["final_step"] == 2, trained

    client = stack.mlflow_client(monkeypatch)
    [version] = [
        v
        for v in client.search_model_versions(f"name = '{DAG}'")
        if v.tags.get("airflow.dag_run_id") == second
    ]
    assert version.tags["trainpipe.gate.forced"] == "true", version.tags
    assert client.get_model_version_by_alias(DAG, "champion").version == version.version

    # 3. The train task's "MLflow run" extra link (Details tab) opens that run in MLflow's UI.
    page.goto(f"{stack.url}/dags/{DAG}/runs/{quote(second, safe='')}/tasks/train")
    page.get_by_role("link", name="Details", exact=True).click()
    link = page.get_by_role("link", name="MLflow run", exact=True)
    expected = (
        f"{stack.mlflow.url}/#/experiments/{trained['mlflow_experiment_id']}/runs/{trained['mlflow_run_id']}"
    )
    expect(link).to_have_attribute("href", expected)
    with page.context.expect_page() as opened:
        link.click()
    mlflow_page = opened.value
    mlflow_page.wait_for_load_state()
    assert mlflow_page.url == expected
    expect(mlflow_page.get_by_text(second).first).to_be_visible()  # the MLflow run is named after the DAG run
    expect(mlflow_page).to_have_title(re.compile(r"MLflow"))

    # 4. The gate task's "Gate report" link opens the decision's HTML report in MLflow's artifact
    # viewer: the verdict, the ROC and precision-recall curves of both models, every metric.
    page.goto(f"{stack.url}/dags/{DAG}/runs/{quote(second, safe='')}/tasks/gate")
    page.get_by_role("link", name="Details", exact=True).click()
    link = page.get_by_role("link", name="Gate report", exact=True)
    expect(link).to_have_attribute("href", f"{expected}/artifacts/gate/report.html")
    with page.context.expect_page() as opened:
        link.click()
    viewer = opened.value
    viewer.wait_for_load_state()
    report = viewer.frame_locator("iframe").first
    expect(report.get_by_text("PROMOTE (forced)", exact=True)).to_be_visible()
    expect(report.get_by_role("heading", name="Every metric")).to_be_visible()
    expect(report.get_by_text("Precision-recall", exact=True)).to_be_visible()  # an SVG chart's title
    expect(report.locator("td", has_text="roc_auc").first).to_be_visible()


def test_browse_menu_opens_the_mlflow_ui(page, stack: Stack) -> None:
    from playwright.sync_api import expect

    page.get_by_role("button", name="Browse").click()
    item = page.get_by_role("menuitem", name="MLflow")
    expect(item).to_have_attribute("href", stack.mlflow.url)  # from the mlflow_default connection
    with page.context.expect_page() as opened:
        item.click()
    mlflow_page = opened.value
    mlflow_page.wait_for_load_state()
    assert mlflow_page.url.rstrip("/") == stack.mlflow.url
    expect(mlflow_page.get_by_text("Welcome to MLflow")).to_be_visible()
    expect(mlflow_page).to_have_title(re.compile(r"MLflow"))

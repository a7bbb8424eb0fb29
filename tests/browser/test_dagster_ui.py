"""The Dagster UI in a real browser: see the asset graph, materialize ONE generation partition from the
asset's page, open its run, and see the run page say it succeeded (checked through GraphQL as well).

The screenshot of the succeeded run is kept at ``test-artifacts/browser/dagster_run_success.png``.
"""

import re
import time
from typing import Any

import pytest

from tests.browser.conftest import ARTIFACTS, CODE_LOCATION, DagsterUI

ASSET_PATH = ["generated", "B1"]
PARTITION = "0000"
REQUIRED_GROUPS = ("generation", "tokens")
RUN_TIMEOUT_S = 120.0

RUN_QUERY = """
query Run($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { runId status tags { key value } assetSelection { path } }
  }
}
"""
RUNS_QUERY = "query { runsOrError { __typename ... on Runs { results { runId status } } } }"
PARTITIONS_QUERY = """
query Partitions($path: [String!]!) {
  assetNodes(assetKeys: [{path: $path}]) {
    assetPartitionStatuses {
      __typename
      ... on DefaultPartitionStatuses { materializedPartitions failedPartitions materializingPartitions }
    }
  }
}
"""


def run_status(ui: DagsterUI, run_id: str) -> dict:
    run = ui.graphql(RUN_QUERY, {"runId": run_id})["runOrError"]
    assert run["__typename"] == "Run", run
    return run


def see_asset_graph(ui: DagsterUI, page: Any) -> list[str]:
    from playwright.sync_api import expect

    groups = sorted({n["groupName"] for n in ui.graphql("query { assetNodes { groupName } }")["assetNodes"]})
    assert set(REQUIRED_GROUPS) <= set(groups), groups
    page.goto(f"{ui.url}/asset-groups", wait_until="domcontentloaded")
    expect(page.get_by_text("Global asset lineage")).to_be_visible(timeout=60_000)
    for group in groups:  # in the sidebar's group list and as a box in the graph
        expect(page.get_by_text(group, exact=True).first).to_be_visible(timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "asset_lineage.png"))
    return groups


def launch_one_partition(ui: DagsterUI, page: Any) -> str:
    """Materialize… → pick only PARTITION in the partition dialog → Launch 1 run; returns the run id."""
    from playwright.sync_api import expect

    page.goto(f"{ui.url}/assets/{'/'.join(ASSET_PATH)}", wait_until="domcontentloaded")
    materialize = page.get_by_role("button", name="Materialize").first  # "Materialize…" (icon + text)
    expect(materialize).to_be_enabled(timeout=60_000)
    materialize.click()
    # generated/* depends on generation_plan; on a fresh instance the plan is not materialized, so the UI first
    # asks "Are you sure?" (upstream assets missing), as it would ask a user: confirm it.
    confirm = page.get_by_role("dialog").filter(has_text="have not been materialized yet")
    dialog = page.get_by_role("dialog").filter(has_text="Launch runs to materialize")
    expect(confirm.or_(dialog)).to_be_visible(timeout=30_000)
    if confirm.is_visible():
        expect(confirm).to_contain_text("generation_plan")
        confirm.get_by_role("button", name="Confirm").click()
    expect(dialog).to_be_visible(timeout=30_000)
    # A fresh instance opens on "Custom" with nothing selected; clear any preselected partition chips
    # (clicking "Custom" itself would select them all).
    chips_close = dialog.get_by_role("img", name="close")
    for _ in range(20):
        if chips_close.count() == 0:
            break
        chips_close.first.click()
    expect(dialog.get_by_text("0 partitions", exact=True)).to_be_visible()
    dialog.get_by_text("Select a partition or create one").click()
    page.get_by_placeholder("Filter partitions").fill(PARTITION)
    option = page.get_by_role("menuitem").filter(has_text=PARTITION).filter(has_not_text="Select all")
    expect(option).to_have_count(1)
    option.click()
    dialog.get_by_text("Launch runs to materialize").click()  # closes the partition list
    expect(dialog.get_by_text("1 partition", exact=True)).to_be_visible()
    launch = dialog.get_by_role("button", name="Launch 1 run", exact=True)
    expect(launch).to_be_enabled()
    launch.click()
    # Follow the toast ("Launched run abcd1234  [View]"), or, if it is gone already, the Runs page.
    view = page.get_by_role("link", name="View", exact=True)
    try:
        expect(view).to_be_visible(timeout=20_000)
    except AssertionError:
        (run,) = ui.graphql(RUNS_QUERY)["runsOrError"]["results"]
        page.goto(f"{ui.url}/runs", wait_until="domcontentloaded")
        view = page.get_by_role("link", name=run["runId"][:8]).first  # "run abcd1234" (icon + id)
    match = re.search(r"/runs/([0-9a-f-]{36})", view.get_attribute("href") or "")
    assert match, view.get_attribute("href")
    view.click()
    expect(page).to_have_url(re.compile(rf"/runs/{match.group(1)}"), timeout=30_000)
    return match.group(1)


def wait_for_ui_success(ui: DagsterUI, page: Any, run_id: str) -> dict:
    from playwright.sync_api import expect

    # The run page shows the run; then the browser leaves it while the run goes on: its live Gantt chart redraws
    # without pause in software rendering (~15 CPU-s of Chromium per run, measured), and comes back when it ended.
    expect(page.locator("body")).to_contain_text(re.compile(rf"partition:\s*{PARTITION}"), timeout=30_000)
    run_page = page.url
    page.goto("about:blank")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    run = run_status(ui, run_id)
    while run["status"] not in ("SUCCESS", "FAILURE", "CANCELED") and time.monotonic() < deadline:
        time.sleep(1.0)
        run = run_status(ui, run_id)
    page.goto(run_page, wait_until="domcontentloaded")
    if run["status"] != "SUCCESS":
        body = page.locator("body").inner_text()[:4000]
        pytest.fail(
            f"run {run_id} is {run['status']} after {RUN_TIMEOUT_S:.0f}s.\nRun page:\n{body}\n"
            f"dagster dev log:\n{ui.log_tail()}",
            pytrace=False,
        )
    # The run page's header tag says "Success".
    expect(page.get_by_text("Success", exact=True).first).to_be_visible(timeout=30_000)
    expect(page.locator("body")).to_contain_text(re.compile(rf"partition:\s*{PARTITION}"))
    return run


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_materialize_one_generation_partition_from_the_ui(dagster_ui: DagsterUI, page: Any) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    groups = see_asset_graph(dagster_ui, page)
    t_graph = time.monotonic()
    run_id = launch_one_partition(dagster_ui, page)
    t_launch = time.monotonic()
    run = wait_for_ui_success(dagster_ui, page, run_id)
    t_done = time.monotonic()
    shot = ARTIFACTS / "dagster_run_success.png"
    page.screenshot(path=str(shot))
    print(f"\nscreenshot of the succeeded run: {shot}")
    print(
        f"groups {groups}; graph {t_graph - t0:.1f}s, launch {t_launch - t_graph:.1f}s, "
        f"run to Success {t_done - t_launch:.1f}s"
    )

    # Exactly one run, of exactly that asset and partition, and only that partition materialized.
    tags = {t["key"]: t["value"] for t in run["tags"]}
    assert tags.get("dagster/partition") == PARTITION, tags
    assert [a["path"] for a in run["assetSelection"]] == [ASSET_PATH]
    runs = dagster_ui.graphql(RUNS_QUERY)["runsOrError"]["results"]
    assert [(r["runId"], r["status"]) for r in runs] == [(run_id, "SUCCESS")]
    (node,) = dagster_ui.graphql(PARTITIONS_QUERY, {"path": ASSET_PATH})["assetNodes"]
    statuses = node["assetPartitionStatuses"]
    assert statuses["materializedPartitions"] == [PARTITION], statuses
    assert statuses["failedPartitions"] == [], statuses
    # The simulator that served it ran under the temporary home, on the port the test chose.
    sim_log = (dagster_ui.forge_home / "simulator" / "simulator.log").read_text(errors="replace")
    assert f"127.0.0.1:{dagster_ui.sim_port}" in sim_log, sim_log[:500]


LAUNCH_MUTATION = """
mutation Launch($params: ExecutionParams!) {
  launchPipelineExecution(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""


def launch_plan(ui: DagsterUI) -> str:
    """The generation plan without a pilot (the embedded target answers slowly on CPU): the prior's plan."""
    params = {
        "selector": {
            "repositoryLocationName": CODE_LOCATION,
            "repositoryName": "__repository__",
            "pipelineName": "__ASSET_JOB",
            "assetSelection": [{"path": ["generation_plan"]}],
        },
        "runConfigData": {"ops": {"generation_plan": {"config": {"pilot_prompts": 0}}}},
    }
    out = ui.graphql(LAUNCH_MUTATION, {"params": params}, timeout_s=60.0)["launchPipelineExecution"]
    assert out["__typename"] == "LaunchRunSuccess", out
    return out["run"]["runId"]


def wait_for_run(ui: DagsterUI, run_id: str) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    run = run_status(ui, run_id)
    while run["status"] not in ("SUCCESS", "FAILURE", "CANCELED") and time.monotonic() < deadline:
        time.sleep(1.0)
        run = run_status(ui, run_id)
    assert run["status"] == "SUCCESS", f"run {run_id}: {run['status']}\n{ui.log_tail()}"


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_the_generation_plan_and_the_accounts_plot_in_the_ui(dagster_ui: DagsterUI, page: Any) -> None:
    """The plan's table and cost plot on its asset page; the account's spend plotted over its observations (the
    plan observed it once; the asset page's Observe button adds one)."""
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    wait_for_run(dagster_ui, launch_plan(dagster_ui))
    page.goto(f"{dagster_ui.url}/assets/generation_plan", wait_until="domcontentloaded")

    def open_markdown(key: str) -> Any:
        row = page.get_by_role("row").filter(has=page.get_by_text(key, exact=True))
        row.get_by_text("[Show Markdown]").first.click()
        dialog = page.get_by_role("dialog")
        expect(dialog).to_be_visible()
        return dialog

    expect(page.get_by_text("projected_usd", exact=True).first).to_be_visible(timeout=60_000)
    table = open_markdown("plan")
    expect(table.get_by_text("answer lengths from").first).to_be_visible()  # the table's header
    expect(table.get_by_text("available to this plan").first).to_be_visible()
    page.screenshot(path=str(ARTIFACTS / "generation_plan.png"))
    page.keyboard.press("Escape")
    expect(table).to_be_hidden()
    plot = open_markdown("cost_plot")
    expect(plot.get_by_role("img", name="generation plan")).to_be_visible()  # cost per dataset, cumulative
    page.screenshot(path=str(ARTIFACTS / "generation_plan_plot.png"))
    page.keyboard.press("Escape")

    page.goto(f"{dagster_ui.url}/assets/openrouter_account", wait_until="domcontentloaded")
    observe = page.get_by_role("button", name="Observe").first  # the header's "Observe" (icon + text)
    expect(observe).to_be_enabled(timeout=60_000)
    observe.click()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        count = dagster_ui.graphql(OBSERVATIONS_QUERY)["assetNodes"][0]["assetObservations"]
        if len(count) >= 2:
            break
        time.sleep(1.0)
    else:
        pytest.fail(f"no second observation of openrouter_account:\n{dagster_ui.log_tail()}", pytrace=False)
    page.goto(f"{dagster_ui.url}/assets/openrouter_account", wait_until="domcontentloaded")
    expect(page.get_by_text("observed_by", exact=True).first).to_be_visible(timeout=60_000)
    page.get_by_role("button", name="Plots").first.click()  # the metadata section's Table | Plots switch
    plots = page.get_by_text("No numeric metadata entries available to be graphed.")
    expect(page.get_by_text("spent_usd", exact=True).first).to_be_visible()
    expect(page.get_by_text("remaining_credit_usd", exact=True).first).to_be_visible()
    expect(plots).to_have_count(0)
    expect(page.locator("canvas").first).to_be_visible()  # the charts themselves
    page.screenshot(path=str(ARTIFACTS / "account_plots.png"), full_page=True)


OBSERVATIONS_QUERY = """
query { assetNodes(assetKeys: [{path: ["openrouter_account"]}]) { assetObservations(limit: 10) { timestamp } } }
"""

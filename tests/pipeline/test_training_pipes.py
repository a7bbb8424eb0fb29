"""The training Pipes channel reads whole messages even when the writer's line arrives in pieces."""

import json
import sys
import textwrap
import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from eagle_assets.assets.draft import training_report
from resources.target.training_pipes import training_pipes_client, whole_lines


def test_a_line_written_in_two_pieces_is_read_once_whole(tmp_path: Path) -> None:
    path = tmp_path / "messages"
    path.write_text("")
    message = json.dumps({"metadata": "x" * 20_000}) + "\n"
    read: list[str] = []
    done = threading.Event()
    reader = threading.Thread(target=lambda: read.extend(whole_lines(str(path), done.is_set, poll_s=0.001)))
    reader.start()
    with path.open("a") as f:
        f.write(message[:7_000])
        f.flush()
        time.sleep(0.1)  # the reader polls the half line many times
        f.write(message[7_000:] + "second\n")
        f.write("torn, the writer killed mid-line")
    time.sleep(0.1)
    done.set()
    reader.join(5)
    assert read == [message, "second\n"]


# The external process writes the Pipes protocol by hand, its materialization in two pieces with a pause between,
# as a large message reaches the file when the writer's buffer is flushed part by part.
_WRITER = textwrap.dedent(
    """
    import json, os, time
    from dagster_pipes import DAGSTER_PIPES_MESSAGES_ENV_VAR, decode_env_var
    path = decode_env_var(os.environ[DAGSTER_PIPES_MESSAGES_ENV_VAR])["path"]
    def line(method, params):
        return json.dumps({"__dagster_pipes_version": "0.1", "method": method, "params": params}) + "\\n"
    curve = {"curve": {"raw_value": "y" * 30000, "type": "md"}}
    big = line("report_asset_materialization", {"asset_key": "trained", "data_version": None, "metadata": curve})
    with open(path, "a") as f:
        f.write(line("opened", {}))
        f.write(big[:9000]); f.flush(); time.sleep(0.5)
        f.write(big[9000:]); f.write(line("closed", {}))
    """
)


def test_the_draft_assets_client_keeps_a_materialization_written_in_pieces(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)

    @dg.asset
    def trained(context: dg.AssetExecutionContext, pipes: dg.PipesSubprocessClient) -> dg.MaterializeResult:
        return pipes.run(command=[sys.executable, str(script)], context=context).get_materialize_result()

    result = dg.materialize([trained], resources={"pipes": training_pipes_client()})
    assert result.success
    (mat,) = result.asset_materializations_for_node("trained")
    assert mat.metadata["curve"].value == "y" * 30000


def test_a_training_run_whose_report_never_arrived_fails_instead_of_ending_green(tmp_path: Path) -> None:
    # What Dagster's Pipes session returns when the process reported nothing: a result without metadata.
    with pytest.raises(dg.Failure, match="ended without its report reaching Dagster"):
        training_report(dg.MaterializeResult(), tmp_path)
    assert training_report(dg.MaterializeResult(metadata={"steps": 12}), tmp_path) == {"steps": 12}

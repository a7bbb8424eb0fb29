"""The chat route's helpers: one home for a /generation record, and the share a stream cut short is billed for.

The handlers record an attempt in many places (a drop, an error mid-stream, a client gone); each goes through
``ChatCore._record``, which fills in what the attempt shares and marks it recorded, so that a disconnect after
the answer was settled does not record (and bill) it again.
"""

from types import SimpleNamespace
from typing import Any

import pytest

from resources.simulator.chat_core import Attempt, ChatCore
from resources.simulator.chat_plain import PlainAnswer
from resources.simulator.chat_stream import StreamAnswer, _Progress
from resources.simulator.config import DEFAULT_PROVIDERS


class _Recorder:
    """The part of ``SimulatorState`` the record and the abandon paths touch."""

    stopping = False

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.stats = SimpleNamespace(by_outcome={"stream_abandoned": 0, "abandoned": 0})

    def record_generation(self, *args: Any, **kwargs: Any) -> float:
        self.calls.append((args, kwargs))
        return 0.5


PREPARED: Any = SimpleNamespace(prompt_tokens=11, completion_tokens=120, reasoning_tokens=100, finish_reason="stop")
REQUEST: Any = SimpleNamespace(content_hash="h")


def _attempt(billable: bool, recorded: bool = False, started: float = 0.0) -> Attempt:
    return Attempt("gen-1", REQUEST, PREPARED, DEFAULT_PROVIDERS[0], started, True, billable, recorded)


def _core(cls: type) -> tuple[Any, _Recorder]:
    core: Any = object.__new__(cls)  # no tokenizer, no generator: only these helpers are under test
    core.state = _Recorder()
    return core, core.state


def test_an_attempt_is_recorded_with_what_it_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    core, state = _core(ChatCore)
    attempt = _attempt(billable=True, started=100.0)
    monkeypatch.setattr("resources.simulator.chat_core.time.monotonic", lambda: 103.0)
    assert core._record(attempt, 7, 3, "stop", billed=True, cancelled=True) == 0.5
    assert attempt.recorded
    args, kwargs = state.calls[0]
    assert args == ("gen-1", "h", DEFAULT_PROVIDERS[0], 11, 7, 3, "stop")
    assert kwargs == {
        "billed": True,
        "streamed": True,
        "cancelled": True,
        "started": 100.0,
        "generation_s": 3.0,  # cut short: the time since the request arrived
    }
    core._record(attempt, 7, 3, "stop", billed=True, generation_s=0.25)
    assert state.calls[1][1]["generation_s"] == 0.25 and state.calls[1][1]["cancelled"] is False


def test_a_stream_cut_short_is_billed_for_the_share_sent() -> None:
    progress = _Progress(12)
    assert progress.share(300) == 0
    progress.sent = 6
    assert progress.share(300) == 150
    assert _Progress(0).share(300) == 0


def test_a_stream_left_by_its_client_is_recorded_once_for_what_was_sent() -> None:
    core, state = _core(StreamAnswer)
    progress = _Progress(12, sent=3)
    core._stream_abandoned(_attempt(billable=True, recorded=True), progress)  # settled before the client left
    assert state.calls == []
    core._stream_abandoned(_attempt(billable=False), progress)  # unbilled, still known to /generation
    args, kwargs = state.calls[0]
    assert args[4:6] == (30, 30) and kwargs["billed"] is False and kwargs["cancelled"] is True
    core._stream_abandoned(_attempt(billable=True), progress)
    assert state.calls[1][0][4:6] == (30, 30) and state.calls[1][1]["billed"] is True
    assert state.stats.by_outcome["stream_abandoned"] == 1


def test_a_plain_answer_left_by_its_client() -> None:
    core, state = _core(PlainAnswer)
    core._plain_abandoned(_attempt(billable=False), head_sent=False)  # no id went out: nothing to know
    assert state.calls == []
    core._plain_abandoned(_attempt(billable=False), head_sent=True)  # the head named it: known, at no cost
    core._plain_abandoned(_attempt(billable=True), head_sent=False)  # billed in full: the upstream ran on
    (unbilled, _), (billed, _) = state.calls
    assert unbilled[4:6] == (0, 0) and billed[4:6] == (120, 100)
    assert [c[1]["billed"] for c in state.calls] == [False, True]
    assert state.stats.by_outcome["abandoned"] == 1

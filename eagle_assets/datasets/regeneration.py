"""What is asked of the target for one conversation: the regeneration modes.

- ``last_user``: everything up to the last user message, one request (the set's own earlier
  answers stay in the history). A conversation that ends with the assistant has that answer
  regenerated; one that ends with the user is asked as it is.
- ``first_turn``: the system prompt and the first user message, one request.
- ``every_turn`` (SpecForge's regeneration): the set's assistant turns are dropped and each user
  turn is asked in order, with the target's own earlier answers as the history. Turn k is one
  request and one training sample, and it can only be built once turn k-1 has returned
  (:mod:`eagle_assets.generation.turn_chains` runs the chain).

A user turn here is one user message, with the system or developer messages that came just
before it. Tool results of the set's original tool calls are dropped with those calls in
``every_turn``: they answer calls the target never made.

A turn's history message carries the target's reasoning as ``reasoning_content``, the field the
Kimi K2.5 template reads (and drops for plain history turns, so it costs no prompt tokens there).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eagle_assets.datasets.formats import RowError
from eagle_assets.errors import ConfigError

MODES = ("last_user", "first_turn", "every_turn")
DEFAULT_MODE = "last_user"
TURN_SEPARATOR = "#t"
# Context messages that stay with the user turn after them in every_turn.
_CONTEXT_ROLES = frozenset({"system", "developer"})


class RegenerationModeError(ConfigError, ValueError):
    """A regeneration mode that is unknown, or asked of a reader that cannot serve it (one prompt per row
    cannot stand for an every_turn conversation, whose turns are asked one after another)."""


def turn_prompt_id(conversation_id: str, turn: int) -> str:
    """The sample id of turn ``turn`` (0-based) of a conversation: ``<id>#t1``, ``<id>#t2``, ..."""
    return f"{conversation_id}{TURN_SEPARATOR}{turn + 1}"


def _user_positions(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.get("role") == "user"]


def single_request(messages: list[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    """The one request of ``last_user`` or ``first_turn``."""
    users = _user_positions(messages)
    if not users:
        raise RowError("no_user_turn", "the conversation has no user message: nothing to answer")
    if mode == "last_user":
        return messages[: users[-1] + 1]
    if mode == "first_turn":
        return messages[: users[0] + 1]
    raise RegenerationModeError(f"{mode!r} is not a single-request mode (those are last_user and first_turn)")


def turn_inputs(messages: Sequence[Mapping[str, Any]], max_turns: int | None = None) -> list[list[dict[str, Any]]]:
    """every_turn: for each user turn, the messages it adds to the history (its context and itself)."""
    turns: list[list[dict[str, Any]]] = []
    context: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role in _CONTEXT_ROLES:
            context.append(dict(m))
        elif role == "user":
            turns.append([*context, dict(m)])
            context = []
            if max_turns is not None and len(turns) >= max_turns:
                break
    if not turns:
        raise RowError("no_user_turn", "the conversation has no user message: nothing to answer")
    return turns


def answer_message(record: Mapping[str, Any]) -> dict[str, Any]:
    """The target's journaled answer as the next turn's history message."""
    msg: dict[str, Any] = {"role": "assistant", "content": record.get("content") or ""}
    if record.get("reasoning"):
        msg["reasoning_content"] = record["reasoning"]
    if record.get("tool_calls"):
        msg["tool_calls"] = record["tool_calls"]
    return msg


def turn_request(inputs: Sequence[Sequence[dict[str, Any]]], answers: Sequence[Mapping[str, Any]]) -> list[dict]:
    """The request for turn ``len(answers)``: each earlier turn's input followed by the target's answer."""
    k = len(answers)
    if k >= len(inputs):
        raise IndexError(f"turn {k + 1} requested of a conversation with {len(inputs)} turns")
    out: list[dict[str, Any]] = []
    for i in range(k):
        out += [dict(m) for m in inputs[i]]
        out.append(answer_message(answers[i]))
    out += [dict(m) for m in inputs[k]]
    return out


@dataclass(frozen=True)
class ChainEnd:
    """Why a conversation's later turns cannot be asked: its last answer is no history to build on."""

    reason: str
    detail: str


def chain_end(record: Mapping[str, Any]) -> ChainEnd | None:
    """None when the next turn may follow this journaled one; else why the chain stops here.

    A cut-off answer (``length``) or one that called tools (their results would be invented) is not a
    history the target would have produced; a refused turn has no answer at all."""
    if record.get("status") != "ok":
        return ChainEnd("previous_turn_skipped", f"turn {record.get('prompt_id')} got no answer")
    finish = record.get("finish_reason")
    if record.get("tool_calls") or finish == "tool_calls":
        return ChainEnd("previous_turn_called_tools", f"turn {record.get('prompt_id')} answered with tool calls")
    if finish not in ("stop", "eos"):
        return ChainEnd("previous_turn_cut", f"turn {record.get('prompt_id')} ended with finish_reason={finish!r}")
    return None

"""every_turn conversations as chains of requests: turn k+1 is built from turn k's journaled answer.

A turn carries the target's own answers to the earlier turns as its history (``regeneration.turn_request``), so
it exists only once the turn before is journaled. Everything is rebuilt from the journal, never from memory: after
a crash at turn 3 of 5 the chain resumes at turn 3 with turns 1 and 2 as journaled (none bought again).

States of a chain: ``running`` (its next turn is queued or asked), ``finished`` (the runner gave up on that turn;
``dead`` once the commit queue is drained and no record came), ``held`` (its skip is held until a success says the
request works, as for single prompts), ``done`` (every turn journaled, or stopped early: ``chain_end``). A dead
chain's later turns are not started; the next run asks its failed turn again, as it does a skip that is not final.
"""

import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from eagle_assets.datasets.prompts import Conversation, Prompt
from eagle_assets.datasets.regeneration import TURN_SEPARATOR, ChainEnd, chain_end, turn_prompt_id, turn_request


def chain_stop_record(prompt_id: str, end: ChainEnd) -> dict[str, Any]:
    """A later turn that will not be asked, journaled as skipped so the partition can complete."""
    return {
        "prompt_id": prompt_id,
        "status": "skipped",
        "error_class": end.reason,
        "message": f"not asked: {end.detail}",
        "attempts": 0,
        "at": time.time(),
    }


# Classes of the records that mark a chain's later turns as not asked (``chain_stop_record``): never asked
# again by themselves; the turn that ended the chain is.
STOP_CLASSES = frozenset({"previous_turn_skipped", "previous_turn_called_tools", "previous_turn_cut"})


def asked_again(record: Mapping[str, Any], reask_skipped: bool) -> bool:
    """A journaled turn asked again: a skip not confirmed by a success (not final), or any skip with
    ``reask_skipped``; never a kept answer or a chain's stop record."""
    if record.get("status") != "skipped" or record.get("error_class") in STOP_CLASSES:
        return False
    return reask_skipped or record.get("final") is False


def split_turn_id(prompt_id: str) -> tuple[str, int] | None:
    """``<conversation>#t<k>`` → (conversation id, 0-based turn), or None for other ids."""
    head, sep, tail = prompt_id.rpartition(TURN_SEPARATOR)
    if not sep or not tail.isdigit() or int(tail) < 1:
        return None
    return head, int(tail) - 1


@dataclass
class _Chain:
    conv: Conversation
    answers: list[Mapping[str, Any]] = field(default_factory=list)
    state: str = "waiting"  # waiting (not yet resumed) | running | finished | held | dead | done

    @property
    def n(self) -> int:
        assert self.conv.turns is not None
        return len(self.conv.turns)

    @property
    def next_turn(self) -> int:
        return len(self.answers)

    def prompt(self) -> Prompt:
        assert self.conv.turns is not None
        messages = turn_request(self.conv.turns, self.answers)
        return Prompt(
            turn_prompt_id(self.conv.conversation_id, self.next_turn),
            messages,
            self.conv.tools,
            self.conv.line,
            self.conv.index,
        )

    def turn_ids(self) -> Iterator[str]:
        return (turn_prompt_id(self.conv.conversation_id, k) for k in range(self.n))


class TurnChains:
    """The every_turn conversations of one partition and where each one stands."""

    def __init__(self, conversations: list[Conversation]) -> None:
        missing = [c.conversation_id for c in conversations if not c.turns]
        if missing:
            raise ValueError(f"conversations without turns cannot be chained: {missing[:5]}")
        self._chains = {c.conversation_id: _Chain(c) for c in conversations}
        if len(self._chains) != len(conversations):
            raise ValueError("conversation ids must be unique within a partition")
        self.total = sum(ch.n for ch in self._chains.values())
        self._states: Counter[str] = Counter({"waiting": len(self._chains)})
        self.restarted_at_skip = 0  # chains the last ``resume`` restarts at a journaled skip

    def _set(self, ch: _Chain, state: str) -> None:
        self._states[ch.state] -= 1
        self._states[state] += 1
        ch.state = state

    def __len__(self) -> int:
        return len(self._chains)

    def prompt_ids(self) -> Iterator[str]:
        for ch in self._chains.values():
            yield from ch.turn_ids()

    def done_count(self, journaled: Mapping[str, Mapping[str, Any]], reask_skipped: bool = False) -> int:
        """Turns journaled for good: those before a chain's first turn that is asked again (see ``asked_again``)."""
        done = 0
        for ch in self._chains.values():
            for pid in ch.turn_ids():
                rec = journaled.get(pid)
                if rec is not None and asked_again(rec, reask_skipped):
                    break
                done += rec is not None
        return done

    def resume(
        self, journaled: Mapping[str, Mapping[str, Any]], reask_skipped: bool = False
    ) -> tuple[list[Prompt], list[dict[str, Any]]]:
        """The next turn of every unfinished conversation, from the journal (a turn ``asked_again`` is that next
        turn); and the stop records a crash left unwritten (a chain that ended at a journaled turn whose later
        turns were not yet marked)."""
        ready: list[Prompt] = []
        owed: list[dict[str, Any]] = []
        self.restarted_at_skip = 0
        for ch in self._chains.values():
            ch.answers = []
            self._set(ch, "running")
            for k, pid in enumerate(ch.turn_ids()):
                rec = journaled.get(pid)
                if rec is None:
                    break
                if asked_again(rec, reask_skipped):
                    self.restarted_at_skip += 1
                    break
                end = chain_end(rec)
                if end is not None and k < ch.n - 1:
                    owed += [chain_stop_record(p, end) for p in list(ch.turn_ids())[k + 1 :] if p not in journaled]
                    self._set(ch, "done")
                    break
                ch.answers.append(rec)
            if ch.state == "running":
                if ch.next_turn >= ch.n:
                    self._set(ch, "done")
                else:
                    ready.append(ch.prompt())
        return ready, owed

    def on_committed(self, record: Mapping[str, Any]) -> tuple[Prompt | None, list[dict[str, Any]]]:
        """A turn's record is in the journal: the conversation's next turn, or the stop records of its rest."""
        parsed = split_turn_id(str(record.get("prompt_id", "")))
        if parsed is None:
            return None, []
        ch = self._chains.get(parsed[0])
        if ch is None or ch.state not in ("running", "finished", "held") or parsed[1] != ch.next_turn:
            return None, []  # a stop record, or a turn of a chain that already moved on
        end = chain_end(record)
        if parsed[1] == ch.n - 1:
            ch.answers.append(record)
            self._set(ch, "done")
            return None, []
        if end is not None:
            self._set(ch, "done")
            return None, [chain_stop_record(p, end) for p in list(ch.turn_ids())[parsed[1] + 1 :]]
        ch.answers.append(record)
        self._set(ch, "running")
        return ch.prompt(), []

    def attempt_finished(self, prompt_id: str) -> None:
        """The runner is done with this turn; if its record does not come, the chain dies (see ``reap``)."""
        ch = self._current(prompt_id)
        if ch is not None and ch.state == "running":
            self._set(ch, "finished")

    def on_held(self, prompt_id: str) -> None:
        """The turn was skipped and the runner holds the skip: the chain waits for it to be journaled, neither
        open (nothing comes before that) nor dead."""
        ch = self._current(prompt_id)
        if ch is not None and ch.state == "running":
            self._set(ch, "held")

    def drop_held(self, prompt_id: str) -> None:
        """A held skip that will not be journaled (a request-wide error): the chain dies at that turn, which the
        next run asks again."""
        ch = self._current(prompt_id)
        if ch is not None and ch.state == "held":
            self._set(ch, "dead")

    def _current(self, prompt_id: str) -> _Chain | None:
        """The chain whose next turn this is, if any."""
        parsed = split_turn_id(prompt_id)
        ch = self._chains.get(parsed[0]) if parsed else None
        return ch if ch is not None and parsed is not None and parsed[1] == ch.next_turn else None

    def reap(self) -> int:
        """Call once every queued commit is in: chains whose turn ended without a record are dead."""
        dead = [ch for ch in self._chains.values() if ch.state == "finished"]
        for ch in dead:
            self._set(ch, "dead")
        return len(dead)

    @property
    def running(self) -> int:
        return self._states["running"]

    @property
    def open(self) -> int:
        """Chains whose next turn may still come this run."""
        return self._states["running"] + self._states["finished"]

    def turns_after_dead(self) -> int:
        """Turns behind a dead chain's failed turn: not started, because that turn failed."""
        return sum(ch.n - ch.next_turn - 1 for ch in self._chains.values() if ch.state == "dead")

    def turns_per_row(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for ch in self._chains.values():
            out[ch.n] = out.get(ch.n, 0) + 1
        return dict(sorted(out.items()))

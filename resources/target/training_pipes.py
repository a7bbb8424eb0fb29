"""The Pipes client the draft asset trains through, with a message reader that reads whole lines only.

Dagster's file reader (``PipesFileMessageReader``, the default of ``PipesSubprocessClient``) tails the message
file with ``readline()``, which returns whatever part of a line is written so far. The training process's last
message, the materialization with its loss and accuracy charts, is ~15 KB: read half-written, it fails to parse,
the reader thread dies, and that message and every later one are lost (seen in this suite:
``JSONDecodeError ... char 15234`` in the Kimi-target pipeline test). This reader holds a partial line until its
newline arrives.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import dagster as dg
from dagster_pipes import PipesDefaultMessageWriter


def whole_lines(path: str, should_stop: Callable[[], bool], poll_s: float = 0.01) -> Iterator[str]:
    """Each complete line appended to ``path`` while it is written; stops once ``should_stop()`` and nothing is
    left to read. A last line without its newline (a writer killed mid-write) is not a message and is dropped."""
    pending = ""
    with open(path, encoding="utf-8") as f:
        while True:
            part = f.readline()
            if part:
                pending += part
                if pending.endswith("\n"):
                    yield pending
                    pending = ""
            elif should_stop():
                return
            else:
                time.sleep(poll_s)


class WholeLineMessageReader(dg.PipesMessageReader):
    """Messages from a temporary file, as Dagster's temp-file reader, but never from half a line."""

    @contextmanager
    def read_messages(self, handler: Any) -> Iterator[dict[str, Any]]:
        with tempfile.TemporaryDirectory(prefix="eagle-forge-pipes-") as folder:
            path = os.path.join(folder, "messages")
            open(path, "w", encoding="utf-8").close()
            closed = threading.Event()
            thread = threading.Thread(target=_read, args=(path, handler, closed), daemon=True)
            thread.start()
            try:
                yield {
                    PipesDefaultMessageWriter.FILE_PATH_KEY: path,
                    PipesDefaultMessageWriter.INCLUDE_STDIO_IN_MESSAGES_KEY: False,
                }
            finally:
                closed.set()
                thread.join()

    def no_messages_debug_text(self) -> str:
        return "Attempted to read messages from a local temporary file (whole lines only)."


def _read(path: str, handler: Any, closed: threading.Event) -> None:
    try:
        for line in whole_lines(path, closed.is_set):
            handler.handle_message(json.loads(line))
    except Exception:
        handler.report_pipes_framework_exception(f"{WholeLineMessageReader.__name__} reader thread", sys.exc_info())
        raise


def training_pipes_client() -> dg.PipesSubprocessClient:
    """The ``pipes_subprocess_client`` resource of the definitions (and of tests that build their own)."""
    return dg.PipesSubprocessClient(message_reader=WholeLineMessageReader())

"""The engine's timeline: ``start(path)`` records every stream's flushes and kernels
(from all threads) into a Chrome trace event file, written by ``stop()`` or when the
process exits; open it in Perfetto or chrome://tracing."""

import os
from typing import Tuple, Union

from ._streamfuse import trace_start as _start, trace_stop as _stop

__all__ = ["start", "stop"]


def start(path: Union[str, "os.PathLike[str]"]) -> None:
    """Starts recording to ``path`` (created now: a path that cannot be written raises
    ``OSError``; a second ``start`` while recording raises ``RuntimeError``)."""
    _start(os.fspath(path))


def stop() -> Tuple[str, int]:
    """Stops recording and writes the file; returns its path and the number of events
    written. ``RuntimeError`` when no trace is recording."""
    path, events = _stop()
    return os.fspath(path), events

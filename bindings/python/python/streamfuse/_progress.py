"""The progress bar ``encode`` and ``predict`` show when asked: tqdm's when tqdm is
installed, else a one-line bar redrawn on stderr."""

import sys
import time
from typing import Callable, Optional


class _Plain:
    """A minimal bar on stderr: ``desc: done/total [####    ] rate/s``."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.done = total, desc, 0
        self.start = time.monotonic()
        self._draw()

    def update(self, n: int) -> None:
        self.done += n
        self._draw()

    def _draw(self) -> None:
        width = 30
        filled = width * self.done // max(self.total, 1)
        rate = self.done / max(time.monotonic() - self.start, 1e-9)
        sys.stderr.write(
            f"\r{self.desc}: {self.done}/{self.total} [{'#' * filled}{' ' * (width - filled)}] {rate:.1f}/s"
        )
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()


def bar(show: bool, total: int, desc: str):
    """A bar over ``total`` items (tqdm's when installed), or ``None`` when not shown."""
    if not show:
        return None
    try:
        from tqdm.auto import tqdm  # type: ignore[import-not-found]

        return tqdm(total=total, desc=desc)
    except ImportError:
        return _Plain(total, desc)


def callback(b) -> Optional[Callable[[int], None]]:
    """The ``progress`` callback the native calls take for bar ``b``."""
    return None if b is None else b.update

"""Progress of the long evaluation passes (extraction, feature stores, the built-in benchmark's features): a
tqdm bar on a terminal; off a terminal (a SLURM ``.out`` file, a pipe) one line on stderr every ``every``
seconds and at the end, ``NAME: done/total UNIT  rate UNIT/s  eta 3m05s``, so a batch job's log is never
silent. Both only on the process that reports (rank 0)."""

from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["Progress"]


class Progress:
    """``update(n)`` after each unit of work, ``close()`` at the end (it writes the last line)."""

    def __init__(self, total: int, desc: str, unit: str, *, show: bool = True, every: float = 30.0) -> None:
        from tqdm import tqdm

        self.total, self.desc, self.unit, self.every = total, desc, unit, every
        self.bar: Any = tqdm(total=total, desc=desc, unit=unit, leave=False, disable=None if show else True)
        self.lines = show and bool(self.bar.disable)  # tqdm disables itself off a terminal: then lines
        self.done, self.note = 0, ""
        self.start = self.last = time.perf_counter()

    def update(self, n: int = 1, note: str = "") -> None:
        """``n`` more units done; ``note`` (e.g. "120 rows") is shown on the lines until the next one."""
        self.done += n
        self.note = note or self.note
        self.bar.update(n)
        if self.lines and time.perf_counter() - self.last >= self.every:
            self._line()

    def close(self, note: str = "") -> None:
        self.note = note or self.note
        self.bar.close()
        if self.lines:
            self._line()

    def _line(self) -> None:
        note = self.note
        now = time.perf_counter()
        rate = self.done / max(now - self.start, 1e-9)
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        eta_s = f"{int(eta // 60)}m{int(eta % 60):02d}s" if eta == eta else "?"
        extra = f"  {note}" if note else ""
        print(f"{self.desc}: {self.done}/{self.total} {self.unit}s{extra}  {rate:.1f} {self.unit}s/s  eta {eta_s}",
              file=sys.stderr, flush=True)  # fmt: skip
        self.last = now

"""The run writer: takes each step's rows, closes a Parquet part of every table every `flush_every`
steps (and at the end) on a background thread, and rewrites the manifest with the row counts after
each flush — as fp8-capture's writer thread does (capture/src/record/writer.rs) — so that a process
killed at any moment leaves closed, readable parts and a manifest that says it did not complete.
"""

from __future__ import annotations

import math
import queue
import threading

from . import manifest as mf
from . import tables
from .parts import PartWriter


class RunWriter:
    """Writes one run directory. `add` and `flush` return at once; `finish` waits for the thread."""

    def __init__(self, run_dir: str, manifest: dict, *, threaded: bool = True):
        self.run_dir = run_dir
        self.manifest = manifest
        self.writers = {t: PartWriter(run_dir, t) for t in tables.table_names()}
        mf.write(run_dir, manifest)
        self._error: BaseException | None = None
        self._queue: queue.Queue | None = None
        self._thread = None
        if threaded:
            self._queue = queue.Queue(maxsize=64)
            self._thread = threading.Thread(target=self._loop, name="fp8scope-writer", daemon=True)
            self._thread.start()

    # ---- the thread
    def _loop(self):
        while True:
            msg = self._queue.get()
            try:
                if self._error is None:
                    self._handle(msg)
            except BaseException as e:  # kept, and raised in the training thread's next call
                self._error = e
            if msg[0] == "finish":
                return

    def _handle(self, msg):
        kind = msg[0]
        if kind == "rows":
            for table, rows in msg[1].items():
                if rows:
                    self.writers[table].extend(rows)
        elif kind == "flush":
            self.manifest["steps_completed"] = msg[1]
            self._flush_all()
        elif kind == "update":
            self.manifest.update(msg[1])
        elif kind == "finish":
            _, status, steps_completed, final_loss, error = msg
            self.manifest.update(status=status, steps_completed=steps_completed, final_loss=final_loss,
                                 error=error, ended_at=mf.now_rfc3339(), pid=None)
            self._flush_all()

    def _flush_all(self):
        for w in self.writers.values():
            w.flush()
        self.manifest["rows"] = {t: w.rows_written for t, w in self.writers.items()}
        mf.write(self.run_dir, self.manifest)

    # ---- the caller's side
    def _send(self, msg):
        if self._error is not None:
            raise RuntimeError(f"fp8scope: writing {self.run_dir} failed: {self._error}") from self._error
        if self._queue is None:
            self._handle(msg)
        else:
            self._queue.put(msg)

    def add(self, rows: dict[str, list[dict]]) -> None:
        """Rows of one step, per table name."""
        self._send(("rows", rows))

    def flush(self, steps_completed: int) -> None:
        self._send(("flush", steps_completed))

    def update_manifest(self, fields: dict) -> None:
        """Fields of the manifest to change at the next write (e.g. `origin` once modules are known)."""
        self._send(("update", fields))

    def finish(self, status: str, steps_completed: int, losses: list[float], error: str | None) -> dict:
        """Closes every table and writes the final manifest; returns it."""
        if status not in mf.STATUSES:
            raise ValueError(f"unknown run status '{status}'")
        self._send(("finish", status, steps_completed, final_loss(losses), error))
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"fp8scope: writing {self.run_dir} failed: {self._error}") from self._error
        return self.manifest


def final_loss(losses: list[float]) -> float | None:
    """Mean loss of the last min(20, steps) steps, None when any of them is not finite."""
    tail = losses[-20:]
    if not tail or not all(math.isfinite(x) for x in tail):
        return None
    return sum(tail) / len(tail)

"""The run writer: takes each step's rows, closes a Parquet part of every table every `flush_every`
steps (and at the end) on a background thread, and rewrites the rank's liveness file — and on rank 0
the manifest — after each flush, as fp8-capture's writer thread does (capture/src/record/writer.rs),
so that a process killed at any moment leaves closed, readable parts, and a liveness file and
manifest that say it did not end.

Every rank writes its own partition of each table (`stats/rank=00003/part-*.parquet`) and its own
liveness file (`ranks/rank=00003.json`); rank 0 alone writes `run.json`, whose `rows` are the sum of
what the ranks' liveness files said when rank 0 last wrote it.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time

from . import manifest as mf
from . import ranks as rk
from . import tables
from .parts import PartWriter

#: Above this many ranks, rank 0 reads the other ranks' liveness files (to sum their rows) only at
#: its end, not at every flush.
SUM_ROWS_EVERY_FLUSH_UP_TO = 256


class RunWriter:
    """Writes one rank's share of a run directory. `add` and `flush` return at once; `finish` waits
    for the thread. `manifest` is written by rank 0 only (first, before any other file)."""

    def __init__(self, run_dir: str, manifest: dict, *, rank: int = 0, world_size: int = 1,
                 ranks_from_liveness: bool = False, threaded: bool = True):
        self.run_dir = run_dir
        self.manifest = manifest
        self.rank, self.world_size = int(rank), int(world_size)
        # When the ranks met through the filesystem, rank 0 knows the others only by their liveness.
        self.ranks_from_liveness = ranks_from_liveness
        if self.rank == 0:
            mf.write(run_dir, manifest)
        self.writers = {t: PartWriter(run_dir, t, self.rank) for t in tables.table_names()}
        os.makedirs(rk.ranks_dir(run_dir), exist_ok=True)
        self.liveness = rk.new_liveness(self.rank, manifest["started_at"])
        self._last_beat = time.monotonic()
        rk.write_json_atomic(rk.liveness_path(run_dir, self.rank), self.liveness)
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
            now = mf.now_rfc3339()
            self.manifest.update(status=status, steps_completed=steps_completed, final_loss=final_loss,
                                 error=error, ended_at=now, pid=None)
            self.liveness.update(status=status, error=error, ended_at=now)
            self._flush_all(final=True)

    def _flush_all(self, final: bool = False):
        for w in self.writers.values():
            w.flush()
        now = mf.now_rfc3339()
        beat = time.monotonic()
        if not final:  # the interval the rank keeps; the last one (the end) says nothing of it
            self.liveness["heartbeat_every_s"] = round(beat - self._last_beat, 3)
        self._last_beat = beat
        own = {t: w.rows_written for t, w in self.writers.items()}
        self.liveness.update(heartbeat_at=now, steps_completed=int(self.manifest.get("steps_completed") or 0), rows=own)
        rk.write_json_atomic(rk.liveness_path(self.run_dir, self.rank), self.liveness)
        if self.rank != 0:
            return
        self.manifest["heartbeat_at"] = now
        rows = own
        if final and self.world_size > 1:
            # The status goes into run.json before the wait for the other ranks: a launcher that
            # stops this process during the wait (torchrun's SIGTERM once a rank has failed) leaves
            # run.json agreeing with this rank's liveness record (its row counts those of the last flush).
            mf.write(self.run_dir, self.manifest)
        if self.world_size > 1 and (final or self.world_size <= SUM_ROWS_EVERY_FLUSH_UP_TO):
            others = self._others(final)
            rows = dict(own)
            for r, live in others.items():
                for t, n in (live.get("rows") or {}).items():
                    rows[t] = rows.get(t, 0) + int(n)
            if self.ranks_from_liveness:
                known = {e["rank"]: e for e in self.manifest.get("ranks") or []}
                for r, live in others.items():
                    known.setdefault(r, {"rank": r, "local_rank": None, "host": live.get("host"),
                                         "pid": live.get("pid"), "device": None})
                self.manifest["ranks"] = [known[r] for r in sorted(known)]
        self.manifest["rows"] = rows
        mf.write(self.run_dir, self.manifest)

    def _others(self, final: bool) -> dict[int, dict]:
        """The other ranks' liveness records; at the end, after waiting (a few seconds at most) for
        those still running to close theirs."""
        live = {r: v for r, v in rk.read_liveness(self.run_dir).items() if r != self.rank}
        if not final:
            return live
        deadline = time.monotonic() + float(os.environ.get(rk.CLOSE_WAIT_ENV, rk.CLOSE_WAIT_DEFAULT_S))
        while time.monotonic() < deadline:
            waiting = [r for r in range(1, self.world_size)
                       if (live.get(r) or {}).get("status", "running") == "running" and _may_live(live.get(r))]
            if not waiting:
                break
            time.sleep(0.05)
            live = {r: v for r, v in rk.read_liveness(self.run_dir).items() if r != self.rank}
        return live

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
        """Closes every table and writes the final liveness record and manifest; returns the manifest."""
        if status not in mf.STATUSES:
            raise ValueError(f"unknown run status '{status}'")
        self._send(("finish", status, steps_completed, final_loss(losses), error))
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"fp8scope: writing {self.run_dir} failed: {self._error}") from self._error
        return self.manifest

    def bytes_written(self) -> dict[str, int]:
        """Bytes of the closed parts written so far, per table."""
        return {t: w.bytes_written for t, w in self.writers.items()}


def _may_live(live: dict | None) -> bool:
    """Whether a rank that has not closed may still close: no record yet, or a record whose process
    still runs (where this host can tell)."""
    if live is None:
        return True
    if live.get("host") != rk.host_name():
        return True
    pid = live.get("pid")
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="utf-8") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError, TypeError, ValueError):
        return not os.path.isdir("/proc/self")


def final_loss(losses: list[float]) -> float | None:
    """Mean loss of the last min(20, steps) steps, None when any of them is not finite."""
    tail = losses[-20:]
    if not tail or not all(math.isfinite(x) for x in tail):
        return None
    return sum(tail) / len(tail)

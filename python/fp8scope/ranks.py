"""Runs of several processes, host side (no torch): where a rank's parts and liveness file live, the
liveness record itself (schemas/src/ranks.rs `RankLiveness`), and how ranks that share no process
group agree on one run directory through the filesystem.

Every rank writes its parts under its own partition, `<table>/rank=00003/part-00000.parquet`, and its
liveness file `ranks/rank=00003.json`, rewritten atomically when it starts, with each part it closes
(its heartbeat) and when it ends. Rank 0 alone writes `run.json`. A one-process recording is rank 0
of 1 and uses the same layout.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field

from . import tables

#: How long a rank other than 0 waits for rank 0 to start the run when they share no process group.
WAIT_ENV = "FP8SCOPE_RANK_WAIT_S"
WAIT_DEFAULT_S = 120.0
#: How long rank 0 waits at its end for the other ranks' last liveness (to count their rows).
CLOSE_WAIT_ENV = "FP8SCOPE_CLOSE_WAIT_S"
CLOSE_WAIT_DEFAULT_S = 5.0
#: The note of run.json that names the job when ranks meet through the filesystem.
JOB_NOTE_PREFIX = "job: "


def _layout() -> dict:
    return tables.spec()["layout"]


def partition(rank: int) -> str:
    """`rank=00003`: a rank's partition folder in every table, and the stem of its liveness file."""
    lay = _layout()
    return f"{lay['rank_partition_prefix']}{int(rank):0{lay['rank_digits']}d}"


def rank_of_partition(name: str) -> int | None:
    """The rank of `rank=00003` or `rank=00003.json`; None for any other name."""
    prefix = _layout()["rank_partition_prefix"]
    if not name.startswith(prefix):
        return None
    digits = name[len(prefix):]
    if digits.endswith(".json"):
        digits = digits[: -len(".json")]
    return int(digits) if digits.isdigit() else None


def table_dir(run_dir: str, table: str, rank: int) -> str:
    """The folder of `rank`'s parts of `table`."""
    return os.path.join(run_dir, table, partition(rank))


def ranks_dir(run_dir: str) -> str:
    return os.path.join(run_dir, _layout()["ranks_dir"])


def liveness_path(run_dir: str, rank: int) -> str:
    return os.path.join(ranks_dir(run_dir), partition(rank) + ".json")


def host_name() -> str:
    """This machine's name, as the Rust side reads it (/proc/sys/kernel/hostname on Linux)."""
    try:
        with open("/proc/sys/kernel/hostname", encoding="utf-8") as f:
            name = f.read().strip()
            if name:
                return name
    except OSError:
        pass
    return os.environ.get("HOSTNAME") or socket.gethostname()


def write_json_atomic(path: str, value: dict) -> None:
    """Writes `value` as JSON through a temp file and a rename: readers see the old or the new file."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(value, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)


def read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_liveness(run_dir: str) -> dict[int, dict]:
    """Every liveness file of the run, by rank (unreadable ones skipped)."""
    d = ranks_dir(run_dir)
    out = {}
    if not os.path.isdir(d):
        return out
    for name in os.listdir(d):
        r = rank_of_partition(name)
        if r is not None and name.endswith(".json"):
            v = read_json(os.path.join(d, name))
            if v is not None:
                out[r] = v
    return dict(sorted(out.items()))


def new_liveness(rank: int, started_at: str) -> dict:
    """A rank's liveness record when it starts (`RankLiveness`)."""
    return {
        "rank": int(rank),
        "host": host_name(),
        "pid": os.getpid(),
        "status": "running",
        "started_at": started_at,
        "heartbeat_at": started_at,
        "ended_at": None,
        "steps_completed": 0,
        "heartbeat_every_s": None,
        "error": None,
        "rows": {t: 0 for t in tables.table_names()},
    }


@dataclass
class RankContext:
    """Where this process stands in its job, and what rank 0 writes into the manifest about the job."""

    rank: int = 0
    world_size: int = 1
    #: `parallel` of the manifest (None for one process).
    parallel: dict | None = None
    #: `ranks` of the manifest: [{rank, local_rank, host, pid, device}] (empty for one process).
    ranks: list = field(default_factory=list)
    #: This process's entry of `ranks`.
    me: dict | None = None
    #: The job's identity when ranks meet through the filesystem (no process group at start).
    job_id: str | None = None
    #: Free-text facts for the manifest's notes (how groups were found, what was assumed).
    notes: list = field(default_factory=list)

    @property
    def single(self) -> bool:
        return self.world_size <= 1


def job_note(job_id: str) -> str:
    return f"{JOB_NOTE_PREFIX}{job_id}"


def env_job_id() -> str | None:
    """The launcher's identity of this job, the same on every rank: torchrun's run id, restart count
    and rendezvous endpoint; Slurm's job and step; else the rendezvous endpoint alone."""
    env = os.environ
    endpoint = f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    if "TORCHELASTIC_RUN_ID" in env:
        return f"torchrun {env['TORCHELASTIC_RUN_ID']} restart {env.get('TORCHELASTIC_RESTART_COUNT', '0')} at {endpoint}"
    if "SLURM_JOB_ID" in env:
        return f"slurm {env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')} at {endpoint}"
    if endpoint != ":":
        return f"job at {endpoint}"
    return None


def wait_for_run(run_dir: str, rank: int, job_id: str, *, timeout_s: float | None = None, poll_s: float = 0.05) -> None:
    """For rank `rank` > 0 of a job whose ranks share no process group: waits until rank 0 has
    started the run at `run_dir` (its run.json names this job), and refuses a directory that holds
    another run with the message rank 0 gives. Raises TimeoutError after `timeout_s`
    (FP8SCOPE_RANK_WAIT_S, default 120 s)."""
    from . import manifest as mf

    if timeout_s is None:
        timeout_s = float(os.environ.get(WAIT_ENV, WAIT_DEFAULT_S))
    t0 = time.time()
    path = mf.manifest_path(run_dir)
    note = job_note(job_id)
    while True:
        m = read_json(path)
        if m is not None:
            notes = (m.get("origin") or {}).get("notes") or []
            fresh = not os.path.exists(liveness_path(run_dir, rank))
            if note in notes and fresh:
                return
            raise FileExistsError(mf.holds_a_run(run_dir))
        if time.time() - t0 > timeout_s:
            seen = sorted(os.listdir(run_dir)) if os.path.isdir(run_dir) else None
            what = "does not exist" if seen is None else f"holds {seen[:8]}" if seen else "is empty"
            raise TimeoutError(
                f"fp8scope: rank {rank} waited {timeout_s:.0f} s for rank 0 to start the run {run_dir} "
                f"(a run.json naming {job_id!r}); the directory {what}. Rank 0 may have refused it "
                f"(see its error), or not reached its Recorder; {WAIT_ENV} sets the wait")
        time.sleep(poll_s)

"""The manifest `run.json` of a run written outside fp8-capture, as schemas/src/manifest.rs reads it.

It follows the contract for external runs: `source` ("pytorch"), `origin` (framework, modules in the
order first seen, what the run lacks, notes), and a full `config` whose unknown parts are zeros, with
data kind "external". Written when the run starts (`status: running`), rewritten atomically (temp
file + rename) as parts close, and finally with `completed`, `diverged` or `crashed`.
"""

from __future__ import annotations

import datetime
import json
import os
import sys

from . import __version__, tables
from . import ranks as _ranks

#: What each `status` means is documented in schemas/README.md.
STATUSES = ("running", "completed", "diverged", "crashed")
ROLES = ("activation", "weight", "gradient", "output", "dgrad", "wgrad")


def now_rfc3339() -> str:
    """The current time, RFC 3339, seconds precision, UTC (as the Rust writer formats it)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def manifest_path(run_dir: str) -> str:
    return os.path.join(run_dir, tables.spec()["manifest_file"])


def holds_a_run(run_dir: str) -> str:
    """The refusal of a directory that already holds a run (every rank of a job gives this one)."""
    return f"{run_dir} already holds a run; choose another out= or remove it first"


def not_empty(run_dir: str) -> str:
    return f"{run_dir} exists and is not an empty directory; refusing to write a run into it"


def prepare_new_run_dir(run_dir: str) -> None:
    """Creates `run_dir`, or accepts it when empty; refuses one that holds a run or anything else,
    so that no recorded data is ever overwritten."""
    if os.path.exists(run_dir):
        if not os.path.isdir(run_dir):
            raise FileExistsError(not_empty(run_dir))
        if os.path.isfile(manifest_path(run_dir)):
            raise FileExistsError(holds_a_run(run_dir))
        if os.listdir(run_dir):
            raise FileExistsError(not_empty(run_dir))
    else:
        try:
            os.makedirs(run_dir)
        except FileExistsError:  # made by another process meanwhile: refuse it as any other
            raise FileExistsError(not_empty(run_dir)) from None


def write(run_dir: str, manifest: dict) -> None:
    """Writes `run.json` atomically: a reader sees the old or the new manifest, never half of one."""
    path = manifest_path(run_dir)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(manifest, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)


def record_config(*, stats_every: int, quant_error_every: int, dump_every: int, dump_layers: str,
                  dump_roles, dump_max_elems: int, dump_sample: str, shadow: bool, flush_every: int) -> dict:
    return {
        "stats_every": stats_every,
        "quant_error_every": quant_error_every,
        "dump_every": dump_every,
        "dump_layers": dump_layers,
        "dump_roles": list(dump_roles),
        "dump_max_elems": dump_max_elems,
        "dump_sample": dump_sample,
        "shadow": shadow,
        "flush_every": flush_every,
    }


def external_config(*, recipe: dict, record: dict, device: str, preset: str = "pytorch",
                    model: dict | None = None, train: dict | None = None) -> dict:
    """A full RunConfig for a run whose model and data fp8scope does not know: what the writer knows,
    zeros for the rest, data kind `external`."""
    dims = {"vocab": 0, "channels": 0, "ffn": 0, "heads": 0, "layers": 0, "batch": 0, "seq": 0, "attn_mask": "causal"}
    dims.update(model or {})
    tr = {"steps": 0, "lr": 0.0, "warmup_steps": 0, "weight_decay": 0.0, "beta1": 0.0, "beta2": 0.0, "eps": 0.0,
          "grad_clip": 0.0, "seed": 0}
    tr.update(train or {})
    return {
        "preset": preset,
        "model": dims,
        "recipe": recipe,
        "routing": {"bf16_gemms": [], "bf16_layers": [], "bf16_sites": []},
        "data": {"kind": "external", "path": None, "language_seed": 0, "branching": 0, "topics": 0,
                 "zipf_exponent": 1.0},
        "train": tr,
        "record": record,
        "injections": [],
        "scenario": None,
        "scenario_step": None,
        "device": device,
    }


def recipe_config(kind: str, *, format: str = "hybrid", amax_history: int = 1024, amax_algo: str = "max",
                  margin: int = 0) -> dict:
    return {"kind": kind, "format": format, "amax_history": amax_history, "amax_algo": amax_algo,
            "margin": margin, "overflow": "saturate"}


def new_running(*, name: str, config: dict, device: dict, origin: dict, source: str = "pytorch",
                libraries: dict | None = None, ln_vocab: float = 0.0, entropy_floor: float | None = None,
                world_size: int = 1, parallel: dict | None = None, ranks: list | None = None,
                host: str | None = None) -> dict:
    """A fresh manifest for a run that is about to start (rank 0's, for a job of several ranks)."""
    now = now_rfc3339()
    return {
        "schema_version": tables.schema_version(),
        "name": name,
        "status": "running",
        "writer": f"fp8scope-python {__version__}",
        "source": source,
        "origin": origin,
        "config": config,
        "device": device,
        "libraries": dict(libraries or {}),
        "data": {"entropy_floor": entropy_floor, "ln_vocab": ln_vocab},
        "started_at": now,
        "ended_at": None,
        "steps_completed": 0,
        "final_loss": None,
        "rows": {t: 0 for t in tables.table_names()},
        "error": None,
        "command": list(sys.argv),
        "pid": os.getpid(),
        "host": host if host is not None else _ranks.host_name(),
        "heartbeat_at": now,
        "world_size": int(world_size),
        "parallel": parallel,
        "ranks": list(ranks or []),
    }


def origin(*, framework: str, modules: list[str], lacks: list[str], notes: list[str],
           stats_decimals: int | None = None) -> dict:
    return {"framework": framework, "modules": list(modules), "stats_decimals": stats_decimals,
            "lacks": list(lacks), "notes": list(notes)}

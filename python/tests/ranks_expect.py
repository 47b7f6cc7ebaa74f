"""What `fp8-analyze ranks` must find in a multi-rank run, computed here from the tables alone
(pyarrow), by the rules the analyzer documents (analyze/src/analysis/ranks/): the tests hold the
recorded tables to these findings, and the analyzer's output to the same findings where it has the
command.

- scale / amax_used / digest agree across each group instance: dp — a weight's scale, amax_used and
  digest; fsdp — a weight's scale and amax_used; tp — every role's scale and amax_used (casts every
  rank of the instance made at that step). The ranks named are those off the instance's majority at
  the first step that disagrees (on a tie, the value the lowest rank holds).
- amax_group: a cast's amax_used must be the max of the amax_local of its reduction set (a weight:
  its fsdp and tp instances; an activation or gradient: its tp instances; the rank itself always;
  closed over the instances of the ranks it takes in, as `Parallel::amax_set` does), within a
  relative 1e-6.
- cast_mismatch (audit_mismatched > 0), forward_weight_mismatch (master_mismatched > 0),
  stale_forward_weight (master_changed and not forward_changed): the ranks at the tensor's first
  flagged step.
- rank_crashed / rank_stopped from the liveness files (a `running` record whose pid is gone), one
  per rank, at the rank's steps_completed.

A finding is a dict {check, step, module, role, ranks}.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fp8scope import parts, ranks as rk  # noqa: E402

AMAX_REL_TOL = 1e-6


def read(run: str, table: str) -> list[dict]:
    import pyarrow.parquet as pq

    files = parts.closed_parts(run, table)
    return pq.read_table(files, partitioning=None).to_pylist() if files else []


def manifest(run: str) -> dict:
    with open(os.path.join(run, "run.json"), encoding="utf-8") as f:
        return json.load(f)


def _majority_off(values: dict[int, object]) -> list[int]:
    counts: dict = {}
    for r in sorted(values):
        v = values[r]
        c = counts.setdefault(v, [0, r])
        c[0] += 1
    maj = sorted(counts.items(), key=lambda kv: (-kv[1][0], kv[1][1]))[0][0]
    return sorted(r for r, v in values.items() if v != maj)


def _first(found: dict, key, step: int, ranks: list[int]) -> None:
    """Keeps, per key, the first step and the ranks named there (of every instance)."""
    if key not in found or step < found[key][0]:
        found[key] = (step, list(ranks))
    elif step == found[key][0]:
        found[key][1].extend(ranks)


def cast_findings(run: str) -> list[dict]:
    rows = read(run, "casts")
    par = manifest(run).get("parallel") or {}
    groups = par.get("groups") or []
    by = defaultdict(dict)  # (step, module, role) → rank → row
    for r in rows:
        by[(r["step"], r["module"], r["role"])][r["rank"]] = r
    found: dict = {}
    for (step, module, role), at in sorted(by.items()):
        for g in groups:
            kind = g["kind"]
            if kind not in ("dp", "fsdp", "tp") or (kind != "tp" and role != "weight"):
                continue
            cols = ["scale", "amax_used"] + (["digest"] if kind == "dp" else [])
            for inst in g["members"]:
                got = {r: at[r] for r in inst if r in at}
                if len(got) < 2 or (kind == "tp" and len(got) < len(inst)):
                    continue
                for c in cols:
                    vals = {r: got[r][c] for r in got if got[r][c] is not None}
                    if len(set(vals.values())) > 1:
                        # scale and amax_used make one scale_disagrees: the value that disagreed first
                        check = "digest_disagrees" if c == "digest" else "scale_disagrees"
                        _first(found, (check, module, role, g["name"], c), step, _majority_off(vals))
        # amax_group: the reduction set of each rank.
        for r, row in at.items():
            if row["amax_used"] is None or row["amax_local"] is None:
                continue
            kinds = ("fsdp", "tp") if role == "weight" else ("tp",)
            # The rank's instances of those groups, closed over (the mesh slice they span together).
            members, grown = {r}, True
            while grown:
                grown = False
                for g in groups:
                    if g["kind"] in kinds:
                        for inst in g["members"]:
                            if members & set(inst) and not set(inst) <= members:
                                members |= set(inst)
                                grown = True
            if not all(m in at for m in members):
                continue
            m = max(at[x]["amax_local"] for x in members)
            u = row["amax_used"]
            if abs(m - u) > AMAX_REL_TOL * max(abs(m), abs(u)):
                _first(found, ("amax_group", module, role, None, None), step, [r])
        for r, row in at.items():
            for check, flag in (("cast_mismatch", (row["audit_mismatched"] or 0) > 0),
                                ("forward_weight_mismatch", (row["master_mismatched"] or 0) > 0),
                                ("stale_forward_weight", row["master_changed"] is True and row["forward_changed"] is False)):
                if flag:
                    _first(found, (check, module, role, None, None), step, [r])
    # One scale_disagrees per (module, role, group): the first of its columns.
    merged: dict = {}
    for (check, module, role, group, _), (step, ranks) in found.items():
        k = (check, module, role, group)
        if k not in merged or step < merged[k][0]:
            merged[k] = (step, sorted(set(ranks)))
    return [{"check": c, "step": s, "module": m, "role": r, "ranks": rs, "group": g}
            for (c, m, r, g), (s, rs) in sorted(merged.items(), key=lambda kv: (kv[1][0], kv[0][0], kv[0][1], kv[0][2]))]


def pid_alive(pid) -> bool:
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError, TypeError, ValueError):
        return False


def liveness_findings(run: str) -> list[dict]:
    out = []
    for r, live in rk.read_liveness(run).items():
        if live["status"] == "crashed":
            out.append({"check": "rank_crashed", "step": live["steps_completed"], "module": None, "role": None,
                        "ranks": [r], "error": live.get("error")})
        elif live["status"] == "running" and live.get("host") == rk.host_name() and not pid_alive(live.get("pid")):
            out.append({"check": "rank_stopped", "step": live["steps_completed"], "module": None, "role": None,
                        "ranks": [r]})
    return out


def findings(run: str) -> list[dict]:
    return cast_findings(run) + liveness_findings(run)


if __name__ == "__main__":
    for f in findings(sys.argv[1]):
        print(json.dumps(f))

"""`fp8scope.torch.Recorder` under `torchrun` on the CPU (gloo), 2 and 4 ranks: one launch per world
size runs every scenario of `dist_scenarios.py` (DDP, FSDP2, tensor + sequence parallelism, FSDP2 ×
tensor parallelism; clean runs over three seeds; planted faults; a refused directory; a crashed or
killed rank), then the tests read the tables back:

- the layout: one run directory per scenario, every table partitioned by rank with `rank` in every
  row, a liveness file per rank, rank 0's run.json with world size, ranks and the parallel layout;
- clean runs: every audit checked and matched, the scales that groups must share agree, no finding;
- each planted fault is visible in the casts table exactly (which check, module, role, ranks, first
  step), as `ranks_expect` computes the findings by the analyzer's rules;
- every rank refuses a directory that holds a run, with the same message;
- a rank that raises is `crashed` with its error; a rank killed with SIGKILL stays `running` with a
  dead pid;
- DuckDB reads `stats` of a multi-rank run as a hive-partitioned dataset and sees every rank.

With FP8SCOPE_RANKS_KEEP=DIR the runs are written under DIR and kept, with DIR/expect.json listing
what `fp8-analyze ranks` must report for each (tests/python_ranks.rs reads it). Not found by
`unittest discover` (the launches take ~30 s): run `python3 -m unittest -v tests.torchrun_ranks`.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

try:
    import torch  # noqa: F401
    import torchao  # noqa: F401
except ImportError:  # pragma: no cover
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from fp8scope import parts, ranks as rk  # noqa: E402
from tests import ranks_expect as rx  # noqa: E402
from tests.dist_scenarios import CORRUPT_BYTES, CORRUPT_STEP, FAULT_STEP  # noqa: E402

SEEDS = (0, 1, 2)
STEPS = 6
CLEAN = {2: ["ddp", "fsdp", "tp"], 4: ["ddp", "fsdp", "tp", "fsdp_tp"]}
FAULTS = {2: ["tp-localamax", "ddp-replica", "ddp-stale", "fsdp-stale", "ddp-corrupt"],
          4: ["tp-localamax", "fsdp_tp-localamax", "ddp-replica", "fsdp_tp-stale", "ddp-corrupt"]}
# The scenario that ends each launch.
LAST = {2: "ddp-crash", 4: "ddp-kill"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scenarios(world: int) -> list[str]:
    clean = [f"{k}-clean-s{s}" for k in CLEAN[world] for s in SEEDS]
    return clean + ["ddp-refuse"] + FAULTS[world] + [LAST[world]]


def launch(out: str, world: int) -> tuple[int, str, float]:
    """Runs every scenario of `world` ranks in one torchrun launch; (exit status, output, seconds)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(HERE, ".."), FP8SCOPE_CLOSE_WAIT_S="2")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world), "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "--monitor-interval", "0.1",
           os.path.join(HERE, "dist_scenarios.py"), out, ",".join(scenarios(world)), "--steps", str(STEPS)]
    t0 = time.time()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    return p.returncode, p.stdout, time.time() - t0


def planted(world: int) -> dict[str, list[dict]]:
    """The findings each fault must produce, by construction (ranks None: computed from the tables
    by the majority rule, checked separately)."""
    everyone = list(range(world))
    return {
        "tp-localamax": [dict(check="scale_disagrees", step=FAULT_STEP, module="layers.0.fc1", role="activation"),
                         dict(check="amax_group", step=FAULT_STEP, module="layers.0.fc1", role="activation")],
        "fsdp_tp-localamax": [dict(check="scale_disagrees", step=FAULT_STEP, module="layers.0.fc1", role="activation"),
                              dict(check="amax_group", step=FAULT_STEP, module="layers.0.fc1", role="activation")],
        "ddp-replica": [dict(check="scale_disagrees", step=FAULT_STEP, module="layers.1.fc2", role="weight", ranks=[1]),
                        dict(check="digest_disagrees", step=FAULT_STEP, module="layers.1.fc2", role="weight", ranks=[1])],
        "ddp-stale": [dict(check="forward_weight_mismatch", step=FAULT_STEP + 1, module="layers.0.fc1", role="weight",
                           ranks=everyone),
                      dict(check="stale_forward_weight", step=FAULT_STEP + 1, module="layers.0.fc1", role="weight",
                           ranks=everyone)],
        "ddp-corrupt": [dict(check="cast_mismatch", step=CORRUPT_STEP, module="layers.0.fc2", role="activation",
                             ranks=[1])],
    }


@unittest.skipIf(torch is None, "torch and torchao are not installed")
class TorchrunRanks(unittest.TestCase):
    runs: dict = {}

    @classmethod
    def setUpClass(cls):
        keep = os.environ.get("FP8SCOPE_RANKS_KEEP")
        cls.tmp = None if keep else tempfile.mkdtemp(prefix="fp8scope-ranks-")
        cls.root = keep or cls.tmp
        cls.launches = {}
        for world in (2, 4):
            out = os.path.join(cls.root, f"w{world}")
            if os.path.exists(out):
                shutil.rmtree(out)
            os.makedirs(out)
            cls.launches[world] = (out,) + launch(out, world)
            print(f"\ntorchrun --nproc-per-node {world}: {len(scenarios(world))} scenarios in {cls.launches[world][3]:.1f} s "
                  f"(exit {cls.launches[world][1]})", file=sys.stderr)
        if keep:
            cls.write_expectations()

    @classmethod
    def tearDownClass(cls):
        if cls.tmp:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def write_expectations(cls):
        """expect.json: per run, its world size, whether it must be clean, and the findings it must have."""
        out = {"runs": []}
        for world, (root, *_rest) in cls.launches.items():
            for name in scenarios(world):
                run = os.path.join(root, name)
                if name in ("ddp-refuse",) or not os.path.isfile(os.path.join(run, "run.json")):
                    continue
                found = rx.findings(run)
                out["runs"].append({"run": run, "name": name, "world_size": world, "clean": "-clean-" in name,
                                    "findings": [{k: f[k] for k in ("check", "step", "module", "role", "ranks")}
                                                 for f in found]})
        with open(os.path.join(cls.root, "expect.json"), "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)

    def run_dir(self, world: int, name: str) -> str:
        return os.path.join(self.launches[world][0], name)

    def output(self, world: int) -> str:
        return self.launches[world][2]

    # ------------------------------------------------------------------ the launches
    def test_each_launch_ran_every_scenario_and_ended_as_planted(self):
        for world in (2, 4):
            out = self.output(world)
            for name in scenarios(world)[:-1]:
                self.assertIn(f"scenario {name}:", out, f"{world} ranks: {name} did not finish:\n{out[-3000:]}")
            self.assertNotEqual(self.launches[world][1], 0, "the last scenario ends the job with a failure")
        self.assertIn("planted crash on rank 1", self.output(2))
        self.assertRegex(self.output(4), r"rank\s*: 2 \(local_rank: 2\)\s*\n\s*exitcode\s*: -9")

    # ------------------------------------------------------------------ the layout
    def test_one_run_directory_every_table_partitioned_by_rank(self):
        import pyarrow.parquet as pq

        for world in (2, 4):
            run = self.run_dir(world, "fsdp-clean-s0")
            m = rx.manifest(run)
            self.assertEqual((m["schema_version"], m["status"], m["world_size"]), (3, "completed", world))
            self.assertEqual([r["rank"] for r in m["ranks"]], list(range(world)))
            self.assertEqual(len({r["pid"] for r in m["ranks"]}), world, "one process per rank")
            self.assertTrue(all(r["host"] == rk.host_name() and r["device"] == "cpu" for r in m["ranks"]))
            self.assertEqual(m["parallel"]["launcher"], "torchrun")
            self.assertEqual(m["parallel"]["backend"], "gloo")
            for table in ("steps", "stats", "casts"):
                self.assertEqual([r for r, _ in parts.partitions(run, table)], list(range(world)), table)
                for r in range(world):
                    files = parts.closed_parts(run, table, rank=r)
                    self.assertTrue(files, f"{table} rank {r}")
                    got = pq.read_table(files, partitioning=None).column("rank").to_pylist()
                    self.assertEqual(set(got), {r}, f"{table}: rank {r}'s rows say rank {r}")
            live = rk.read_liveness(run)
            self.assertEqual(sorted(live), list(range(world)))
            for r, l in live.items():
                self.assertEqual((l["rank"], l["status"], l["steps_completed"], l["error"]), (r, "completed", STEPS, None))
                self.assertIsNotNone(l["ended_at"])
                self.assertEqual(l["rows"]["steps"], STEPS)
            self.assertEqual(m["rows"]["steps"], STEPS * world, "run.json's rows count every rank's")

    def test_the_parallel_layout_names_each_wrapper_and_its_groups(self):
        want = {
            (2, "ddp"): (["DDP", "Float8Linear"], None, [("dp", "dp", [[0, 1]])]),
            (2, "fsdp"): (["FSDP2", "DTensor", "Float8Linear"], ["dp_shard"], [("dp_shard", "fsdp", [[0, 1]])]),
            (2, "tp"): (["DTensor", "Float8Linear"], ["tp"], [("tp", "tp", [[0, 1]])]),
            (4, "ddp"): (["DDP", "Float8Linear"], None, [("dp", "dp", [[0, 1, 2, 3]])]),
            (4, "fsdp_tp"): (["FSDP2", "DTensor", "Float8Linear"], ["dp_shard", "tp"],
                             [("dp_shard", "fsdp", [[0, 2], [1, 3]]), ("tp", "tp", [[0, 1], [2, 3]])]),
        }
        for (world, kind), (wrappers, dims, groups) in want.items():
            p = rx.manifest(self.run_dir(world, f"{kind}-clean-s0"))["parallel"]
            self.assertEqual(p["wrappers"], wrappers, (world, kind))
            self.assertEqual(None if p["mesh"] is None else p["mesh"]["dim_names"], dims, (world, kind))
            self.assertEqual([(g["name"], g["kind"], g["members"]) for g in p["groups"]], groups, (world, kind))
            self.assertIsNone(p["amax_groups"])
        mesh = rx.manifest(self.run_dir(4, "fsdp_tp-clean-s0"))["parallel"]["mesh"]
        self.assertEqual((mesh["shape"], mesh["ranks"]), ([2, 2], [0, 1, 2, 3]))

    # ------------------------------------------------------------------ clean runs
    def test_clean_runs_audit_every_cast_and_agree_across_their_groups(self):
        for world in (2, 4):
            for kind in CLEAN[world]:
                for seed in SEEDS:
                    name = f"{kind}-clean-s{seed}"
                    run = self.run_dir(world, name)
                    rows = rx.read(run, "casts")
                    # 4 linears × 3 roles × ranks × steps.
                    self.assertEqual(len(rows), 4 * 3 * world * STEPS, name)
                    audited = [r for r in rows if r["audit_checked"] is not None]
                    self.assertEqual({r["step"] for r in audited}, {1}, f"{name}: audit at step 1 (audit_every 10)")
                    self.assertTrue(all(r["audit_checked"] == r["numel"] and r["audit_mismatched"] == 0 for r in audited), name)
                    weights = [r for r in rows if r["role"] == "weight"]
                    self.assertTrue(all(r["master_checked"] > 0 and r["master_mismatched"] == 0 for r in weights), name)
                    later = [r for r in weights if r["step"] > 1]
                    self.assertTrue(all(r["master_changed"] and r["forward_changed"] for r in later), name)
                    self.assertTrue(all(r["amax_used"] is not None and r["scale"] is not None for r in rows), name)
                    self.assertEqual(rx.findings(run), [], f"{name}: a clean run has no finding")

    def test_a_data_parallel_weight_is_one_tensor_on_every_rank(self):
        for world in (2, 4):
            rows = [r for r in rx.read(self.run_dir(world, "ddp-clean-s1"), "casts") if r["role"] == "weight"]
            by = {}
            for r in rows:
                by.setdefault((r["step"], r["module"]), set()).add((r["scale"], r["digest"], r["amax_used"]))
            self.assertTrue(all(len(v) == 1 for v in by.values()), "replicas cast the same bytes at the same scale")

    def test_tensor_parallel_amaxes_are_reduced_over_the_group(self):
        for world in (2, 4):
            rows = rx.read(self.run_dir(world, "tp-clean-s0"), "casts")
            by = {}
            for r in rows:
                by.setdefault((r["step"], r["module"], r["role"]), []).append(r)
            for key, rs in by.items():
                self.assertEqual(len(rs), world)
                top = max(r["amax_local"] for r in rs)
                self.assertTrue(all(r["amax_used"] == top for r in rs), f"{key}: every rank used the group's max")
                self.assertEqual(len({r["scale"] for r in rs}), 1, key)
                self.assertEqual(len({r["numel"] for r in rs}), 1, f"{key}: each rank casts its equal shard")

    def test_fsdp_weights_are_checked_against_each_ranks_shard(self):
        for world, name in ((2, "fsdp-clean-s0"), (4, "fsdp-clean-s0"), (4, "fsdp_tp-clean-s0")):
            rows = [r for r in rx.read(self.run_dir(world, name), "casts") if r["role"] == "weight"]
            tp = 2 if "tp" in name else 1
            for r in rows:
                # Every linear is 32×64 or 64×32: the forward's weight is all of it (its tp shard), the
                # master this rank holds is 1/world of it.
                self.assertEqual(r["numel"] * tp, 2048, name)
                self.assertEqual(r["master_checked"] * world, 2048, name)

    # ------------------------------------------------------------------ planted faults
    def assert_planted(self, world: int, name: str, expected: list[dict]) -> list[dict]:
        found = rx.findings(self.run_dir(world, name))
        got = [{k: f[k] for k in ("check", "step", "module", "role", "ranks")} for f in found]
        for want in expected:
            match = [g for g in got if all(g[k] == want[k] for k in want)]
            self.assertEqual(len(match), 1, f"{world} ranks, {name}: want {want} in\n{json.dumps(got, indent=1)}")
        self.assertEqual(len(got), len(expected), f"{world} ranks, {name}: only the planted findings:\n{json.dumps(got, indent=1)}")
        return got

    def test_a_tensor_parallel_input_scaled_by_its_own_shard_torchtitan_3109(self):
        for world, name in ((2, "tp-localamax"), (4, "tp-localamax"), (4, "fsdp_tp-localamax")):
            got = self.assert_planted(world, name, planted(world)[name])
            rows = [r for r in rx.read(self.run_dir(world, name), "casts")
                    if (r["module"], r["role"]) == ("layers.0.fc1", "activation")]
            tp = world if name.startswith("tp") else 2
            for step in range(1, STEPS + 1):
                at = sorted((r for r in rows if r["step"] == step), key=lambda r: r["rank"])
                for inst in [list(range(i, i + tp)) for i in range(0, world, tp)]:
                    mine = [r for r in at if r["rank"] in inst]
                    top = max(r["amax_local"] for r in mine)
                    if step < FAULT_STEP:
                        self.assertTrue(all(r["amax_used"] == top for r in mine), (name, step))
                    else:  # the used amax is the shard's own: the scales differ across the group
                        self.assertTrue(all(r["amax_used"] == r["amax_local"] for r in mine), (name, step))
                        self.assertGreater(len({r["scale"] for r in mine}), 1, (name, step))
            first = [r for r in rows if r["step"] == FAULT_STEP]
            amax = next(g for g in got if g["check"] == "amax_group")
            tops = {}
            for r in first:
                inst = r["rank"] // tp
                tops[inst] = max(tops.get(inst, 0.0), r["amax_local"])
            self.assertEqual(amax["ranks"], sorted(r["rank"] for r in first if r["amax_local"] != tops[r["rank"] // tp]),
                             "amax_group names the ranks whose own amax is not their group's max")

    def test_a_replica_whose_weight_differs_on_one_rank(self):
        for world in (2, 4):
            self.assert_planted(world, "ddp-replica", planted(world)["ddp-replica"])

    def test_a_stale_forward_weight(self):
        for world, name in ((2, "ddp-stale"), (2, "fsdp-stale"), (4, "fsdp_tp-stale")):
            self.assert_planted(world, name, planted(world)["ddp-stale"])
            rows = [r for r in rx.read(self.run_dir(world, name), "casts")
                    if (r["module"], r["role"]) == ("layers.0.fc1", "weight")]
            for r in rows:
                stale = r["step"] > FAULT_STEP
                self.assertEqual(r["master_mismatched"] > 0, stale, (name, r["step"], r["rank"]))
                if r["step"] > 1:
                    self.assertEqual((r["master_changed"], r["forward_changed"]), (True, not stale), (name, r["step"]))

    def test_a_corrupted_cast(self):
        for world in (2, 4):
            self.assert_planted(world, "ddp-corrupt", planted(world)["ddp-corrupt"])
            rows = rx.read(self.run_dir(world, "ddp-corrupt"), "casts")
            bad = [(r["step"], r["rank"], r["module"], r["role"], r["audit_mismatched"]) for r in rows
                   if r["audit_mismatched"]]
            self.assertEqual(bad, [(CORRUPT_STEP, 1, "layers.0.fc2", "activation", CORRUPT_BYTES)])
            audited = sorted({r["step"] for r in rows if r["audit_checked"] is not None})
            self.assertEqual(audited, [1, 2, 4, 6], "audit_every=2: step 1 and every second step")

    # ------------------------------------------------------------------ how ranks end
    def test_every_rank_refuses_a_directory_that_holds_a_run_with_one_message(self):
        for world in (2, 4):
            said = []
            for r in range(world):
                with open(os.path.join(self.run_dir(world, "ddp-refuse"), f"rank{r}.txt")) as f:
                    said.append(f.read().splitlines())
            self.assertTrue(all(s == said[0] for s in said), said)
            held, other = said[0]
            self.assertEqual(held, f"FileExistsError: {self.run_dir(world, 'ddp-clean-s0')} already holds a run; "
                                   "choose another out= or remove it first")
            self.assertIn("exists and is not an empty directory", other)
            self.assertTrue(other.startswith("FileExistsError: "))
            m = rx.manifest(self.run_dir(world, "ddp-clean-s0"))
            self.assertEqual(m["status"], "completed", "the run it refused is untouched")
            self.assertTrue(all(l["status"] == "completed" for l in rk.read_liveness(self.run_dir(world, "ddp-clean-s0")).values()))

    def test_a_rank_that_raises_is_crashed_with_its_error(self):
        run = self.run_dir(2, "ddp-crash")
        live = rk.read_liveness(run)
        self.assertEqual(live[1]["status"], "crashed")
        self.assertIn("RuntimeError: planted crash on rank 1 at step 3 (after step 2)", live[1]["error"])
        self.assertEqual(live[1]["steps_completed"], 2)
        self.assertIsNotNone(live[1]["ended_at"])
        # Rank 0, waiting for rank 1 in DDP's all-reduce, either met the closed connection (crashed,
        # with gloo's error) or was stopped by torchrun's SIGTERM first (still `running`, pid gone).
        r0 = live[0]
        if r0["status"] == "crashed":
            self.assertIn("RuntimeError", r0["error"])
        else:
            self.assertEqual(r0["status"], "running")
            self.assertFalse(rx.pid_alive(r0["pid"]))
        self.assertEqual(rx.manifest(run)["status"], r0["status"], "run.json is rank 0's")
        checks = {(f["check"], tuple(f["ranks"])) for f in rx.liveness_findings(run)}
        self.assertIn(("rank_crashed", (1,)), checks)

    def test_a_rank_killed_with_sigkill_is_left_running_with_a_dead_pid(self):
        run = self.run_dir(4, "ddp-kill")
        live = rk.read_liveness(run)
        killed = live[2]
        self.assertEqual((killed["status"], killed["ended_at"], killed["steps_completed"]), ("running", None, 2),
                         "its last heartbeat is the part it closed at step 2 (flush_every=2)")
        self.assertFalse(rx.pid_alive(killed["pid"]))
        self.assertEqual(killed["host"], rk.host_name())
        self.assertIsNotNone(killed["heartbeat_every_s"])
        self.assertEqual(len(parts.closed_parts(run, "steps", rank=2)), 1, "one closed part: steps 1-2")
        self.assertIn({"check": "rank_stopped", "step": 2, "module": None, "role": None, "ranks": [2]},
                      rx.liveness_findings(run))
        # The others met a closed connection (crashed) or torchrun's SIGTERM (stopped); none completed.
        self.assertTrue(all(live[r]["status"] in ("crashed", "running") for r in (0, 1, 3)))

    # ------------------------------------------------------------------ other readers
    def test_duckdb_reads_stats_of_every_rank_as_a_hive_partitioned_dataset(self):
        import duckdb

        run = self.run_dir(4, "tp-clean-s0")
        got = duckdb.sql(f"SELECT rank, COUNT(*) FROM read_parquet('{run}/stats/*/*.parquet', hive_partitioning=true) "
                         "GROUP BY rank ORDER BY rank").fetchall()
        self.assertEqual(got, [(f"{r:05d}", 4 * 6 * STEPS) for r in range(4)],
                         "the partition's rank, as text (zero-padded): 4 linears × 6 operands × steps per rank")
        typed = duckdb.sql(f"SELECT DISTINCT rank FROM read_parquet('{run}/stats/*/*.parquet', hive_partitioning=true, "
                           "hive_types={'rank': INTEGER}) ORDER BY rank").fetchall()
        self.assertEqual(typed, [(r,) for r in range(4)])
        own = duckdb.sql(f"SELECT DISTINCT rank FROM read_parquet('{run}/stats/*/*.parquet', hive_partitioning=false) "
                         "ORDER BY rank").fetchall()
        self.assertEqual(own, [(r,) for r in range(4)], "the rank column the files hold")

    def test_bytes_recorded_per_rank_per_step(self):
        """Not a bound: prints the sizes (the README quotes them)."""
        for world, name in ((2, "ddp-clean-s0"), (4, "fsdp_tp-clean-s0")):
            run = self.run_dir(world, name)
            sizes = {t: sum(os.path.getsize(p) for p in parts.closed_parts(run, t, rank=0))
                     for t in ("steps", "stats", "casts")}
            live = os.path.getsize(rk.liveness_path(run, 0))
            print(f"\n{world} ranks, {name}: rank 0 wrote {sizes} bytes over {STEPS} steps (one part each), "
                  f"liveness {live} B, run.json {os.path.getsize(os.path.join(run, 'run.json'))} B", file=sys.stderr)
            self.assertGreater(sizes["casts"], 0)


if __name__ == "__main__":
    unittest.main()

"""The pieces of a multi-rank recording that run in one process (or two plain ones), on the CPU:
the digest and the audits' byte comparisons against numpy, the rank layout and liveness file of a
one-process run, the group kinds of mesh dimensions, torchao's casts recorded (and a corrupted one
caught) in one process, and ranks that meet through the filesystem when no process group exists.
The torchrun launches are `tests.torchrun_ranks`. Skipped where torch (or torchao) is not installed."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

try:
    import torch
    import torch.nn as nn

    import fp8scope.torch
    from fp8scope.torch import casts as ct
    from fp8scope.torch import distributed as dist_
except ImportError:  # pragma: no cover
    torch = None
try:
    import torchao  # noqa: F401
except ImportError:  # pragma: no cover
    torchao = None

from fp8scope import fp8, parts, ranks as rk

HERE = os.path.dirname(os.path.abspath(__file__))
LIVENESS_FIELDS = {"rank", "host", "pid", "status", "started_at", "heartbeat_at", "ended_at", "steps_completed",
                   "heartbeat_every_s", "error", "rows"}


def np_digest(codes: np.ndarray) -> int:
    i = np.arange(codes.size, dtype=np.int64)
    return int((codes.reshape(-1).astype(np.int64) * (i % 65521 + 1)).sum()) & ((1 << 63) - 1)


def read(run, table):
    import pyarrow.parquet as pq

    files = parts.closed_parts(run, table)
    return pq.read_table(files, partitioning=None).to_pylist() if files else []


def manifest(run):
    with open(os.path.join(run, "run.json")) as f:
        return json.load(f)


class Layout(unittest.TestCase):
    def test_partitions_and_liveness_files_are_named_as_the_schemas_name_them(self):
        self.assertEqual(rk.partition(3), "rank=00003")
        self.assertEqual((rk.rank_of_partition("rank=01023.json"), rk.rank_of_partition("rank=00003")), (1023, 3))
        for bad in ("rank=", "rank=x1", "ranks=1", "part-00000.parquet"):
            self.assertIsNone(rk.rank_of_partition(bad), bad)
        self.assertEqual(rk.liveness_path("r", 7), os.path.join("r", "ranks", "rank=00007.json"))
        self.assertEqual(rk.table_dir("r", "stats", 12), os.path.join("r", "stats", "rank=00012"))

    def test_a_waiting_rank_refuses_another_jobs_run_and_times_out_clearly(self):
        from fp8scope import manifest as mf

        with tempfile.TemporaryDirectory() as d:
            run = os.path.join(d, "run")
            with self.assertRaisesRegex(TimeoutError, r"rank 1 waited 0 s for rank 0 .*does not exist"):
                rk.wait_for_run(run, 1, "job A", timeout_s=0.1)
            os.makedirs(run)
            mf.write(run, {"origin": {"notes": [rk.job_note("job B")]}})
            with self.assertRaises(FileExistsError) as e:
                rk.wait_for_run(run, 1, "job A", timeout_s=5)
            self.assertEqual(str(e.exception), mf.holds_a_run(run))
            mf.write(run, {"origin": {"notes": [rk.job_note("job A")]}})
            rk.wait_for_run(run, 1, "job A", timeout_s=5)  # rank 0 of this job started it: no error
            os.makedirs(rk.ranks_dir(run))
            rk.write_json_atomic(rk.liveness_path(run, 1), {"rank": 1})
            with self.assertRaises(FileExistsError, msg="a rank 1 of an earlier job of the same id left its file"):
                rk.wait_for_run(run, 1, "job A", timeout_s=5)


@unittest.skipIf(torch is None, "torch is not installed")
class Bytes(unittest.TestCase):
    def test_the_digest_is_the_weighted_sum_over_row_major_bytes(self):
        rng = np.random.default_rng(0)
        for n in (1, 100, 65520, 65521, 65522, 2 * 65521 + 17):
            codes = rng.integers(0, 256, n, dtype=np.uint8)
            self.assertEqual(int(ct.digest(torch.from_numpy(codes))), np_digest(codes), n)
        w = torch.from_numpy(rng.integers(0, 256, (48, 40), dtype=np.uint8))
        rm, transposed = ct.row_major_codes(w, "weight")
        self.assertFalse(transposed, "a row-major weight is taken as it is")
        self.assertEqual(int(ct.digest(rm)), np_digest(w.numpy()))
        rm, transposed = ct.row_major_codes(w.t(), "weight")  # what torchao casts: weight.t()
        self.assertTrue(transposed)
        self.assertEqual(int(ct.digest(rm)), np_digest(w.numpy()), "the weight's own (out, in) order")

    def test_mismatches_count_differing_codes_and_take_nan_for_nan(self):
        a = torch.tensor([0x00, 0x7F, 0xFF, 0x10, 0x7E], dtype=torch.uint8)
        b = torch.tensor([0x00, 0xFF, 0x7F, 0x11, 0x7F], dtype=torch.uint8)
        self.assertEqual(int(ct.mismatches(a, b, "e4m3")), 2, "NaN vs -NaN equal; 0x10/0x11 and 448/NaN differ")
        a = torch.tensor([0x7D, 0x7E, 0x7C], dtype=torch.uint8)
        b = torch.tensor([0x7F, 0xFE, 0x7D], dtype=torch.uint8)
        self.assertEqual(int(ct.mismatches(a, b, "e5m2")), 1, "E5M2 NaNs alike; Inf (0x7C) is no NaN")

    def test_mesh_dimensions_get_group_kinds_from_their_names(self):
        cases = {("tp", False): "tp", ("dp_shard", False): "fsdp", ("dp_shard_cp", False): "fsdp", ("fsdp", False): "fsdp",
                 ("dp", False): "dp", ("dp_replicate", False): "dp", ("cp", False): "other", ("pp", False): "other",
                 ("dp", True): "fsdp", (None, False): "tp", (None, True): "fsdp"}
        for (name, fsdp), kind in cases.items():
            self.assertEqual(dist_.kind_of_dim(name, fsdp), kind, (name, fsdp))
        merged = dist_.merge_groups([[("tp", "tp", [0, 1]), ("dp", "dp", [0, 2])], [("tp", "tp", [2, 3])],
                                     [("tp", "tp", [0, 1]), ("dp", "dp", [1, 3])]])
        self.assertEqual(merged, [{"name": "tp", "kind": "tp", "members": [[0, 1], [2, 3]]},
                                  {"name": "dp", "kind": "dp", "members": [[0, 2], [1, 3]]}])


@unittest.skipIf(torch is None, "torch is not installed")
class OneProcess(unittest.TestCase):
    def test_a_plain_process_is_rank_0_of_1_in_the_partitioned_layout(self):
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with tempfile.TemporaryDirectory() as d:
            run = os.path.join(d, "run")
            with fp8scope.torch.Recorder(model, out=run, flush_every=2) as rec:
                for _ in range(3):
                    loss = model(torch.randn(4, 8)).pow(2).mean()
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    rec.step(loss)
            m = manifest(run)
            self.assertEqual((m["schema_version"], m["world_size"], m["parallel"], m["ranks"]), (3, 1, None, []))
            self.assertEqual(m["host"], rk.host_name())
            self.assertIsNotNone(m["heartbeat_at"])
            self.assertEqual(sorted(os.listdir(os.path.join(run, "stats"))), ["rank=00000"])
            self.assertEqual([os.path.basename(p) for p in parts.closed_parts(run, "steps")],
                             ["part-00000.parquet", "part-00001.parquet"])
            self.assertTrue(all(r["rank"] == 0 for t in ("steps", "stats") for r in read(run, t)))
            live = rk.read_liveness(run)
            self.assertEqual(list(live), [0])
            self.assertEqual(set(live[0]), LIVENESS_FIELDS)
            self.assertEqual((live[0]["status"], live[0]["steps_completed"], live[0]["pid"]), ("completed", 3, os.getpid()))
            self.assertEqual(live[0]["rows"], m["rows"])
            self.assertIsInstance(live[0]["heartbeat_every_s"], float)
            self.assertEqual(read(run, "casts"), [], "plain nn.Linear modules make no casts of their own")


@unittest.skipIf(torch is None, "torch is not installed")
@unittest.skipIf(torchao is None, "torchao is not installed")
class TorchaoCasts(unittest.TestCase):
    def train(self, run, steps=4, corrupt_at=0, **kw):
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        import torchao.float8.float8_training_tensor as ftt

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 48, bias=False), nn.ReLU(), nn.Linear(48, 16, bias=False))
        convert_to_float8_training(model, config=Float8LinearConfig(emulate=True))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        seen = {}

        def look(path):
            def hook(m, args, out):
                seen[(rec.step_no, path)] = (args[0].detach().clone(), m.weight.detach().clone())
            return hook

        for path in ("0", "2"):
            model.get_submodule(path).register_forward_hook(look(path))
        orig = ftt.to_fp8_saturated
        state = {"armed": False}

        def corrupting(x, dtype):
            out = orig(x, dtype)
            if state["armed"] and dtype == torch.float8_e4m3fn:
                state["armed"] = False
                out.view(torch.uint8).view(-1)[:3] ^= 0x02
            return out

        ftt.to_fp8_saturated = corrupting
        try:
            with fp8scope.torch.Recorder(model, out=run, **kw) as rec:
                for step in range(1, steps + 1):
                    state["armed"] = step == corrupt_at
                    loss = model(torch.randn(6, 32)).pow(2).mean()
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    rec.step(loss)
        finally:
            ftt.to_fp8_saturated = orig
        return seen

    def test_each_operand_cast_is_recorded_with_the_modules_own_scale_and_bytes(self):
        with tempfile.TemporaryDirectory() as d:
            run = os.path.join(d, "run")
            recomputed = []
            orig = ct.abs_max
            ct.abs_max = lambda x: recomputed.append(x.shape) or orig(x)
            try:
                seen = self.train(run, audit_every=2)
            finally:
                ct.abs_max = orig
            self.assertEqual(recomputed, [], "one process: amax_local is the amax torchao computed, not a second pass")
            rows = read(run, "casts")
            self.assertEqual(len(rows), 4 * 2 * 3, "steps × modules × roles")
            self.assertEqual({(r["role"], r["gemm"], r["format"]) for r in rows},
                             {("activation", "fprop", "e4m3"), ("weight", "fprop", "e4m3"), ("gradient", "dgrad", "e5m2")})
            self.assertTrue(all(r["source"] == "torchao" and r["rank"] == 0 for r in rows))
            for r in rows:
                if r["role"] == "gradient":
                    continue
                x, w = seen[(r["step"], r["module"])]
                t = (x.reshape(-1, x.shape[-1]) if r["role"] == "activation" else w).numpy()
                amax = float(np.abs(t).max())
                self.assertEqual(r["amax_local"], amax)
                self.assertEqual(r["amax_used"], amax, "the amax torchao's scale came from, as torchao computed it")
                self.assertEqual(r["scale"], float(np.float32(448.0 / np.float64(amax))), "torchao: f32(448 / f64(amax))")
                self.assertEqual(r["numel"], t.size)
                self.assertEqual(r["digest"], np_digest(fp8.cast("e4m3", t, r["scale"])),
                                 "the digest of fp8scope's cast of the same values at the module's scale")
            audited = sorted({r["step"] for r in rows if r["audit_checked"] is not None})
            self.assertEqual(audited, [1, 2, 4])
            self.assertTrue(all(r["audit_mismatched"] == 0 for r in rows if r["audit_checked"] is not None))
            w = [r for r in rows if r["role"] == "weight"]
            self.assertTrue(all(r["master_checked"] == r["numel"] and r["master_mismatched"] == 0 for r in w))
            self.assertEqual({(r["master_changed"], r["forward_changed"]) for r in w if r["step"] > 1}, {(True, True)})
            self.assertTrue(all(r["master_changed"] is None for r in w if r["step"] == 1))

    def test_a_compiled_float8_model_keeps_one_graph_with_the_recorder(self):
        # torchao's casts stay in the graph with the recorder's traced hooks (no break between them).
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 48, bias=False), nn.ReLU(), nn.Linear(48, 16, bias=False))
        convert_to_float8_training(model, config=Float8LinearConfig(emulate=True))
        with tempfile.TemporaryDirectory() as d:
            with fp8scope.torch.Recorder(model, out=os.path.join(d, "r"), recipe="current") as rec:
                torch._dynamo.reset()
                ex = torch._dynamo.explain(model)(torch.randn(6, 32))
                self.assertEqual((ex.graph_count, ex.graph_break_count), (1, 0), ex.break_reasons)
                rec.step(torch.tensor(1.0))
            torch._dynamo.reset()

    def test_a_corrupted_cast_is_caught_by_the_audit(self):
        with tempfile.TemporaryDirectory() as d:
            run = os.path.join(d, "run")
            self.train(run, corrupt_at=3, audit_every=0, dump_every=3, dump_layers="^0$")
            bad = [(r["step"], r["module"], r["role"], r["audit_mismatched"]) for r in read(run, "casts")
                   if r["audit_mismatched"]]
            self.assertEqual(bad, [(3, "0", "activation", 3)], "audits at dump steps (1, 3) only; 3 bytes flipped")

    def test_casts_are_not_recorded_off_statistics_steps_or_in_evaluation(self):
        with tempfile.TemporaryDirectory() as d:
            run = os.path.join(d, "run")
            self.train(run, steps=4, stats_every=2)
            self.assertEqual(sorted({r["step"] for r in read(run, "casts")}), [1, 2, 4])
        self.assertFalse(ct._taps, "a closed recorder leaves torchao's functions as they were")
        import torchao.float8.float8_scaling_utils as fsu

        self.assertFalse(getattr(fsu.hp_tensor_and_scale_to_float8, "_fp8scope", False))


SCRIPT = r"""
import os, sys, torch, torch.nn as nn
sys.path.insert(0, {root!r})
import fp8scope.torch
torch.manual_seed(0)
model = nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
try:
    with fp8scope.torch.Recorder(model, out={out!r}) as rec:
        for _ in range(2):
            loss = model(torch.randn(3, 8)).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad(); rec.step(loss)
    print("ok")
except Exception as e:
    print(f"{{type(e).__name__}}: {{e}}")
"""


@unittest.skipIf(torch is None, "torch is not installed")
class Filesystem(unittest.TestCase):
    def launch(self, out, job):
        procs = []
        for rank in (0, 1):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", TORCHELASTIC_RUN_ID=job,
                       MASTER_ADDR="127.0.0.1", MASTER_PORT="29999", FP8SCOPE_RANK_WAIT_S="60", OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, "-c", SCRIPT.format(root=os.path.join(HERE, ".."), out=out)],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        return [p.communicate(timeout=120)[0].strip().splitlines()[-1] for p in procs]

    def test_ranks_without_a_process_group_meet_through_the_filesystem(self):
        with tempfile.TemporaryDirectory() as d:
            run = os.path.join(d, "run")
            self.assertEqual(self.launch(run, "job-1"), ["ok", "ok"])
            m = manifest(run)
            self.assertEqual((m["world_size"], m["parallel"]["launcher"], m["parallel"]["groups"]), (2, "torchrun", []))
            self.assertIn(rk.job_note("torchrun job-1 restart 0 at 127.0.0.1:29999"), m["origin"]["notes"])
            self.assertEqual([r for r, _ in parts.partitions(run, "steps")], [0, 1])
            self.assertEqual({r: l["status"] for r, l in rk.read_liveness(run).items()}, {0: "completed", 1: "completed"})
            self.assertEqual([r["rank"] for r in m["ranks"]], [0, 1], "rank 1 known from its liveness file")
            self.assertEqual(m["rows"]["steps"], 4)
            # Another job into the same directory: both ranks refuse it, with one message.
            said = self.launch(run, "job-2")
            self.assertEqual(said, [f"FileExistsError: {run} already holds a run; choose another out= or remove it first"] * 2)


if __name__ == "__main__":
    unittest.main()

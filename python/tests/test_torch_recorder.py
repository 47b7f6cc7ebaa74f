"""`fp8scope.torch.Recorder` end to end on a small model, on the CPU (and on a GPU when one is
there): what it records against numpy references computed from the same tensors, dumps re-cast
bit for bit, how runs end, and a torch.compile'd model. Skipped where torch is not installed (CI);
run with a torch install: `python3 -m unittest tests.test_torch_recorder` in python/."""

import json
import os
import tempfile
import unittest

import numpy as np

try:
    import torch
    import torch.nn as nn

    import fp8scope.torch
except ImportError:  # pragma: no cover
    torch = None

from fp8scope import fp8, parts, stats as st


def read(run, table):
    import pyarrow.parquet as pq

    files = parts.closed_parts(run, table)  # every rank's partition (`stats/rank=00000/part-*.parquet`)
    return pq.read_table(files, partitioning=None).to_pylist() if files else []


def manifest(run):
    with open(os.path.join(run, "run.json")) as f:
        return json.load(f)


if torch is not None:
    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

        def forward(self, x):
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))

    class Net(nn.Module):
        def __init__(self, d=16, v=32):
            super().__init__()
            self.emb = nn.Embedding(v, d)
            self.layers = nn.ModuleList([Block(d) for _ in range(2)])
            self.lm_head = nn.Linear(d, v, bias=False)

        def forward(self, tok):
            x = self.emb(tok)
            for b in self.layers:
                x = b(x)
            return self.lm_head(x)


@unittest.skipIf(torch is None, "torch is not installed")
class TorchRecorder(unittest.TestCase):
    def train(self, out, steps=6, nan_at=0, raise_at=0, compile=False, inf_at=0, **kw):
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        tok = torch.randint(0, 32, (4, 8))
        seen = {}
        # An independent look at layers.0.fc1's input, to check the recorded statistics against.
        def look(module, args, output):
            seen[len(seen) + 1] = args[0].detach().clone()

        model.layers[0].fc1.register_forward_hook(look)
        fwd = torch.compile(model) if compile else model
        rec = fp8scope.torch.Recorder(model, out=out, optimizer=opt, vocab=32, **kw)
        with rec:
            for step in range(1, steps + 1):
                if step == inf_at:  # one token's embedding overflows: non-finite tensors from there on
                    with torch.no_grad():
                        model.emb.weight[tok[0, 0]] = float("inf")
                loss = torch.nn.functional.cross_entropy(fwd(tok).view(-1, 32), tok.view(-1))
                if step == nan_at:
                    loss = loss * float("nan")
                if step == raise_at:
                    raise RuntimeError("planted")
                loss.backward()
                opt.step()
                opt.zero_grad()
                rec.step(loss, tokens=32)
                if rec.closed:
                    break
        return seen

    def test_a_delayed_run_records_what_numpy_computes_from_the_same_tensors(self):
        with tempfile.TemporaryDirectory() as d:
            run = os.path.join(d, "run")
            seen = self.train(run, steps=6, recipe="delayed", dump_every=5, dump_layers=r"layers\.1\.", shadow=True,
                              quant_error_every=1)
            m = manifest(run)
            self.assertEqual((m["status"], m["steps_completed"], m["source"]), ("completed", 6, "pytorch"))
            self.assertEqual(m["origin"]["modules"], ["layers.0.fc1", "layers.0.fc2", "layers.1.fc1", "layers.1.fc2", "lm_head"])
            self.assertEqual(m["config"]["data"]["kind"], "external")
            self.assertNotIn("dumps", m["origin"]["lacks"])
            self.assertIn("grad_norm", m["origin"]["lacks"])
            stats = read(run, "stats")
            self.assertEqual(len(stats), 6 * 5 * 6)
            acts = [r for r in stats if (r["module"], r["gemm"], r["role"]) == ("layers.0.fc1", "fprop", "activation")]
            for r, k in zip(acts, range(1, 7)):
                x = seen[k].numpy().reshape(-1, 16)
                if k == 1:
                    scale, used = 1.0, 0.0
                else:
                    used = float(np.float32(max(np.abs(seen[j].numpy()).max() for j in range(1, k))))
                    scale = fp8.scale_for_amax("e4m3", used)
                want = st.stat_row(k, 0, "layers.0.fc1", "fprop", "activation", "e4m3", st.raw_stats(x, "e4m3", scale, used, True))
                for key, v in want.items():
                    if isinstance(v, float):
                        self.assertAlmostEqual(r[key], v, delta=1e-6 * max(1.0, abs(v)), msg=f"step {k} {key}")
                    else:
                        self.assertEqual(r[key], v, f"step {k} {key}")
            tensors = read(run, "tensors")
            self.assertEqual({(t["step"], t["module"]) for t in tensors},
                             {(s, m) for s in (1, 5) for m in ("layers.1.fc1", "layers.1.fc2")})
            roles = [t["role"] for t in tensors if t["step"] == 1 and t["module"] == "layers.1.fc2"]
            # Forward roles first, then backward as autograd produces them (here W's grad before X's).
            self.assertEqual(roles[:4], ["activation", "weight", "output", "gradient"])
            self.assertEqual(sorted(roles[4:]), ["dgrad", "wgrad"])
            for t in tensors:
                if t["fp8"] is not None:
                    self.assertEqual(fp8.cast(t["format"], np.float32(t["values"]), t["scale"]).tobytes(), t["fp8"])
            self.assertEqual(sorted({(s["module"], s["gemm"]) for s in read(run, "shadow")}),
                             sorted((m, g) for m in ("layers.1.fc1", "layers.1.fc2") for g in ("fprop", "dgrad", "wgrad")))
            steps = read(run, "steps")
            self.assertEqual([s["tokens"] for s in steps], [32] * 6)
            self.assertEqual(steps[0]["lr"], 1e-2)

    def test_bf16_baseline_records_bf16_casts(self):
        with tempfile.TemporaryDirectory() as d:
            run = os.path.join(d, "run")
            self.train(run, steps=2, recipe="bf16", dump_every=1)
            stats = read(run, "stats")
            self.assertEqual({r["format"] for r in stats}, {"bf16"})
            self.assertTrue(all(r["scale"] == 1.0 and r["amax_used"] == r["amax"] for r in stats))
            self.assertTrue(all(t["fp8"] is None and t["gemm"] is None for t in read(run, "tensors")))
            self.assertIn("shadow", manifest(run)["origin"]["lacks"])

    def test_a_dump_selection_that_matches_nothing_names_modules(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(ValueError, r"matches none of the 5 recorded modules, e\.g\. layers\.0\.fc1"):
                fp8scope.torch.Recorder(Net(), out=os.path.join(d, "r"), dump_every=5, dump_layers="blocks")
            self.assertFalse(os.path.exists(os.path.join(d, "r")), "no run directory for a refused selection")

    def test_an_exception_marks_the_run_crashed(self):
        with tempfile.TemporaryDirectory() as d:
            run = os.path.join(d, "run")
            with self.assertRaisesRegex(RuntimeError, "planted"):
                self.train(run, steps=5, raise_at=4, recipe="current")
            m = manifest(run)
            self.assertEqual((m["status"], m["steps_completed"]), ("crashed", 3))
            self.assertIn("RuntimeError: planted (after step 3)", m["error"])

    def test_a_nan_loss_marks_the_run_diverged_and_stops_recording(self):
        with tempfile.TemporaryDirectory() as d:
            run = os.path.join(d, "run")
            with self.assertWarnsRegex(RuntimeWarning, "non-finite loss at step 3"):
                self.train(run, steps=6, nan_at=3, recipe="delayed")
            m = manifest(run)
            self.assertEqual((m["status"], m["steps_completed"], m["error"]), ("diverged", 3, "non-finite loss at step 3"))
            self.assertEqual(read(run, "events")[-1]["kind"], "nonfinite_loss")

    def test_the_batched_recorder_writes_the_reference_paths_tables_bit_for_bit(self):
        # The same run recorded by the batched path (one multi-tensor reduction and one asynchronous
        # copy per step, delayed scaling's history on the device) and by the reference path (each
        # operand reduced in its hook, the host's history, a synchronous copy): identical tables.
        for recipe, inf_at in (("delayed", 0), ("current", 0), ("bf16", 0), ("delayed", 5)):
            with tempfile.TemporaryDirectory() as d:
                kw = dict(steps=7, recipe=recipe, dump_every=3, dump_layers=r"layers\.0\.", shadow=True,
                          quant_error_every=2, amax_history=3, fused=False, inf_at=inf_at)
                self.train(os.path.join(d, "batched"), batched=True, **kw)
                self.train(os.path.join(d, "reference"), batched=False, **kw)
                for table in ("stats", "tensors", "shadow", "events", "steps"):
                    a, b = read(os.path.join(d, "batched"), table), read(os.path.join(d, "reference"), table)
                    self.assertEqual(len(a), len(b), f"{recipe} {table}")
                    if table == "steps":
                        for r in a + b:
                            r.pop("step_ms")
                    for ra, rb in zip(a, b):
                        self.assertEqual(repr(ra), repr(rb), f"{recipe} {table}")  # repr: NaN equals NaN
                stats = read(os.path.join(d, "batched"), "stats")
                if inf_at:  # the run diverged at the poisoned step, after its non-finite tensors
                    self.assertEqual(manifest(os.path.join(d, "batched"))["status"], "diverged")
                    self.assertEqual(len(stats), inf_at * 5 * 6)
                    self.assertTrue(any(e["kind"] == "nonfinite_tensor" for e in read(os.path.join(d, "batched"), "events")))
                    continue
                self.assertEqual(len(stats), 7 * 5 * 6)
                if recipe == "delayed":  # the history was used: scales moved off 1
                    self.assertTrue(any(r["scale"] != 1.0 for r in stats))
                cost = manifest(os.path.join(d, "batched"))["recorder_cost"]
                self.assertEqual(cost["steps"], 6)
                self.assertTrue(0 < cost["host_ms"] and 0 < cost["share"], cost)

    def test_the_batched_recorder_holds_at_most_hold_bytes_of_operands(self):
        with tempfile.TemporaryDirectory() as d:
            self.train(os.path.join(d, "small"), steps=3, recipe="delayed", hold_bytes=1, fused=False)
            self.train(os.path.join(d, "reference"), steps=3, recipe="delayed", batched=False, fused=False)
            a, b = read(os.path.join(d, "small"), "stats"), read(os.path.join(d, "reference"), "stats")
            self.assertEqual([repr(r) for r in a], [repr(r) for r in b])

    def test_a_compiled_model_keeps_one_graph_with_the_recorder(self):
        # dynamo's explanation of one recorded training forward: no graph break (the hooks are traced
        # into the graph); a dump step may break (the dumps read values on the host side).
        torch.manual_seed(0)
        model = Net()
        tok = torch.randint(0, 32, (4, 8))
        with tempfile.TemporaryDirectory() as d:
            rec = fp8scope.torch.Recorder(model, out=os.path.join(d, "r"), recipe="current", dump_every=3)
            rec.step(torch.tensor(1.0))  # step 1 dumps; step 2 does not (dump_every 3)
            torch._dynamo.reset()
            ex = torch._dynamo.explain(model)(tok)
            self.assertEqual((ex.graph_count, ex.graph_break_count), (1, 0), ex.break_reasons)
            rec.close()
            torch._dynamo.reset()
            base = torch._dynamo.explain(model)(tok)
            self.assertEqual((base.graph_count, base.graph_break_count), (1, 0))

    def test_a_compiled_model_records_the_same_statistics_as_the_eager_one(self):
        with tempfile.TemporaryDirectory() as d:
            self.train(os.path.join(d, "eager"), steps=3, recipe="delayed", fused=False)
            self.train(os.path.join(d, "compiled"), steps=3, recipe="delayed", compile=True, fused=True)
            a, b = read(os.path.join(d, "eager"), "stats"), read(os.path.join(d, "compiled"), "stats")
            self.assertEqual(len(a), len(b))
            key = lambda r: (r["step"], r["module"], r["gemm"], r["role"])  # noqa: E731
            for ra, rb in zip(sorted(a, key=key), sorted(b, key=key)):
                self.assertEqual(key(ra), key(rb))
                for k in ("amax", "scale", "underflow_frac", "saturated_frac", "zero_frac", "numel", "min", "max",
                          "mean", "std"):
                    self.assertAlmostEqual(ra[k], rb[k], delta=1e-4 * max(1.0, abs(ra[k])), msg=f"{key(ra)} {k}")


if __name__ == "__main__":
    unittest.main()

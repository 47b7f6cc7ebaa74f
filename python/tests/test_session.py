"""The host side of a recording (`fp8scope.session`, `fp8scope.stats`, `fp8scope.recipe`): statistics
against direct computations, delayed scaling as Transformer Engine defines it, and how a run ends
(completed, diverged on a non-finite loss, crashed on an exception) — read back with pyarrow."""

import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import pyarrow.parquet as pq

from fp8scope import fp8, parts, stats as st
from fp8scope.recipe import Recipe
from fp8scope.session import AMAX, CHEAP, FULL, Session, StepRecord

HERE = os.path.dirname(os.path.abspath(__file__))


def manifest(run):
    with open(os.path.join(run, "run.json")) as f:
        return json.load(f)


def read(run, table):
    files = parts.closed_parts(run, table)  # every rank's partition (`stats/rank=00000/part-*.parquet`)
    return pq.read_table(files, partitioning=None).to_pylist() if files else []


class Stats(unittest.TestCase):
    def test_stat_row_matches_direct_computation(self):
        rng = np.random.default_rng(0)
        x = (rng.standard_normal(5000) * 3).astype(np.float32)
        x[:10] = 0
        x[10:20] = 1e-6  # underflow in e4m3 at scale 1
        x[20:25] = 1000  # saturate at scale 1
        x[25], x[26] = np.nan, -np.inf
        row = st.stat_row(4, 2, "layers.2.fc1", "fprop", "activation", "e4m3", st.raw_stats(x, "e4m3", 1.0, 0.0, True))
        fin = x[np.isfinite(x)].astype(np.float64)
        nonzero = np.count_nonzero(fin)
        tiny = np.count_nonzero((fin != 0) & (np.abs(fin) <= 2.0**-10))  # half the smallest subnormal, ties to 0
        self.assertGreaterEqual(tiny, 10)
        self.assertEqual(row["underflow_frac"], tiny / nonzero)
        self.assertEqual(row["saturated_frac"], 6 / x.size, "five at 1000 and the -Inf")
        self.assertEqual((row["nan_count"], row["inf_count"], row["zero_frac"]), (1, 1, 10 / x.size))
        self.assertAlmostEqual(row["mean"], fin.mean(), places=12)
        self.assertAlmostEqual(row["std"], fin.std(), places=9)
        self.assertEqual((row["min"], row["max"], row["amax"]), (fin.min(), 1000.0, 1000.0))
        self.assertAlmostEqual(row["dynamic_range_log2"], math.log2(1000 / np.abs(fin[fin != 0]).min()), places=12)
        # Independent quantization error: ml_dtypes' cast of the clipped values.
        import ml_dtypes

        ok = np.isfinite(x)
        dq = np.clip(x[ok], -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
        e = x[ok].astype(np.float64)
        self.assertAlmostEqual(row["quant_mse"], ((dq - e) ** 2).mean(), places=9)
        self.assertAlmostEqual(row["quant_cos"], (dq @ e) / np.linalg.norm(dq) / np.linalg.norm(e), places=12)
        self.assertAlmostEqual(row["quant_bias"], (dq @ e) / (e @ e) - 1.0, places=12)
        self.assertLess(row["quant_bias"], 0.0, "clipping 1000 to 448 shrinks the operand")

    def test_bf16_casts_count_what_bf16_loses(self):
        x = np.array([1.0, 1e-41, 3.4028235e38, 0.0], dtype=np.float32)  # 1e-41 rounds to 0, f32 max to Inf
        row = st.stat_row(1, 0, "m", "fprop", "activation", "bf16", st.raw_stats(x, "bf16", 1.0, 3.4e38, False))
        self.assertEqual((row["underflow_frac"], row["saturated_frac"]), (1 / 3, 1 / 4))
        self.assertIsNone(row["quant_mse"])

    def test_merging_two_calls_equals_one_call_on_both(self):
        rng = np.random.default_rng(1)
        a, b = rng.standard_normal(300).astype(np.float32), (rng.standard_normal(200) * 9).astype(np.float32)
        one = st.stat_row(1, 0, "m", "fprop", "weight", "e4m3", st.raw_stats(np.concatenate([a, b]), "e4m3", 20.0, 1, True))
        two = st.stat_row(1, 0, "m", "fprop", "weight", "e4m3",
                          st.merge([st.raw_stats(a, "e4m3", 20.0, 1, True), st.raw_stats(b, "e4m3", 20.0, 1, True)]))
        for k in one:
            self.assertAlmostEqual(one[k], two[k], places=9, msg=k) if isinstance(one[k], float) else self.assertEqual(one[k], two[k])

    def test_layer_is_the_first_integer_component(self):
        self.assertEqual([st.layer_of(m) for m in ("layers.3.fc1", "blocks.0.attn.qkv", "lm_head", "h.11.mlp.2")],
                         [3, 0, 0, 11])

    def test_dump_window_is_the_captures(self):
        self.assertEqual(st.dump_window(10, 100, 4096, False), (0, 1000, 1))
        self.assertEqual(st.dump_window(100, 100, 4096, False), (0, 4000, 1))
        self.assertEqual(st.dump_window(2, 5000, 4096, False), (0, 4096, 1))
        self.assertEqual(st.dump_window(100, 100, 4096, True), (0, 3334, 3))


class DelayedScaling(unittest.TestCase):
    def test_history_max_margin_and_zero_amax(self):
        r = Recipe("delayed", amax_history=2, margin=1)
        self.assertEqual(r.delayed_scale("m", "activation"), (1.0, 0.0))
        r.observe({("m", "activation"): 4.0, ("m", "gradient"): 8.0})
        self.assertEqual(r.delayed_scale("m", "activation"), (448.0 / 4 / 2, 4.0))
        self.assertEqual(r.delayed_scale("m", "gradient"), (57344.0 / 8 / 2, 8.0), "hybrid: gradients in e5m2")
        r.observe({("m", "activation"): 1.0})
        r.observe({("m", "activation"): 0.0})  # an all-zero tensor keeps the history
        self.assertEqual(r.history_amax("m", "activation"), 4.0)
        r.observe({("m", "activation"): 2.0})  # history length 2: [1, 2]
        self.assertEqual(r.history_amax("m", "activation"), 2.0)
        self.assertEqual(Recipe("delayed", amax_algo="most_recent", format="e4m3").format_for("gradient"), "e4m3")

    def test_plan_follows_the_capture(self):
        with tempfile.TemporaryDirectory() as d:
            s = Session(os.path.join(d, "r"), Recipe("current"), stats_every=2, quant_error_every=3, dump_every=5,
                        threaded=False)
            levels = {k: (s.plan(k).level, s.plan(k).dump) for k in (1, 2, 3, 5, 6, 10, 12)}
            self.assertEqual(levels, {1: (FULL, True), 2: (CHEAP, False), 3: (AMAX, False), 5: (AMAX, True),
                                      6: (FULL, False), 10: (FULL, True), 12: (FULL, False)})
            s.finish("completed")

    def test_a_dump_selection_matching_nothing_is_checked_by_the_recorder_not_here(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(ValueError, "does not compile"):
                Session(os.path.join(d, "r"), Recipe("bf16"), dump_layers="(", threaded=False)
            os.makedirs(os.path.join(d, "full"))
            open(os.path.join(d, "full", "x"), "w").close()
            with self.assertRaisesRegex(FileExistsError, "not an empty directory"):
                Session(os.path.join(d, "full"), Recipe("bf16"), threaded=False)


class Runs(unittest.TestCase):
    def synthetic(self, out, *args):
        return subprocess.run([sys.executable, os.path.join(HERE, "synthetic.py"), out, *args],
                              capture_output=True, text=True)

    def test_a_completed_run_counts_its_rows_and_scales_from_the_previous_step(self):
        with tempfile.TemporaryDirectory() as d:
            run = os.path.join(d, "run")
            p = self.synthetic(run, "--steps", "6")
            self.assertEqual(p.returncode, 0, p.stderr)
            m = manifest(run)
            self.assertEqual((m["status"], m["steps_completed"], m["source"], m["pid"]), ("completed", 6, "pytorch", None))
            for t, n in m["rows"].items():
                self.assertEqual(len(read(run, t)), n, t)
            stats = read(run, "stats")
            act = [r for r in stats if r["module"] == "layers.0.fc1" and r["role"] == "activation" and r["gemm"] == "fprop"]
            self.assertEqual((act[0]["scale"], act[0]["amax_used"]), (1.0, 0.0), "empty history at step 1")
            self.assertEqual(act[1]["amax_used"], act[0]["amax"])
            self.assertEqual(act[1]["scale"], fp8.scale_for_amax("e4m3", act[0]["amax"]))
            self.assertEqual({r["format"] for r in stats if r["role"] == "gradient"}, {"e5m2"})
            # Dumped FP8 bytes re-cast from the values and the scale.
            for t in read(run, "tensors"):
                if t["fp8"] is not None:
                    codes = fp8.cast(t["format"], np.float32(t["values"]), t["scale"])
                    self.assertEqual(codes.tobytes(), t["fp8"])
            self.assertEqual({(t["module"], t["gemm"]) for t in read(run, "shadow")},
                             {("layers.1.fc1", "fprop"), ("layers.1.fc2", "fprop")})
            self.assertEqual(m["origin"]["modules"][0], "layers.0.fc1")

    def test_a_nan_loss_marks_the_run_diverged_and_names_the_first_producer(self):
        with tempfile.TemporaryDirectory() as d:
            run = os.path.join(d, "run")
            p = self.synthetic(run, "--steps", "8", "--nan-step", "3")
            self.assertEqual(p.returncode, 0, p.stderr)
            m = manifest(run)
            self.assertEqual((m["status"], m["steps_completed"], m["error"]), ("diverged", 3, "non-finite loss at step 3"))
            ev = [e for e in read(run, "events") if e["step"] == 3]
            self.assertEqual((ev[0]["module"], ev[0]["role"]), ("layers.1.fc1", "output"), "first non-finite tensor")
            self.assertEqual(ev[-1]["kind"], "nonfinite_loss")
            self.assertGreater(read(run, "steps")[-1]["nonfinite_tensors"], 0)

    def test_an_exception_marks_the_run_crashed_and_keeps_the_closed_steps(self):
        with tempfile.TemporaryDirectory() as d:
            run = os.path.join(d, "run")
            p = self.synthetic(run, "--steps", "9", "--crash-at", "6")
            self.assertNotEqual(p.returncode, 0)
            m = manifest(run)
            self.assertEqual(m["status"], "crashed")
            self.assertIn("planted crash at step 6", m["error"])
            self.assertEqual([r["step"] for r in read(run, "steps")], [1, 2, 3, 4, 5])
            self.assertEqual(glob.glob(os.path.join(run, "*", "*", "*.tmp")) + glob.glob(os.path.join(run, "*", "*.tmp")), [])


if __name__ == "__main__":
    unittest.main()

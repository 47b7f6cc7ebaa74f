"""The numpy FP8 cast (`fp8scope.fp8`) against the Rust cast bit for bit, and against ml_dtypes.

The Rust reference: `tests/python_recorder.rs` writes inputs and `fp8::encode` / `fp8::cast` codes to
the folder named by FP8SCOPE_RUST_CAST_DIR and runs these tests (run alone, that test is skipped).
"""

import os
import unittest

import numpy as np

from fp8scope import fp8


class RustCast(unittest.TestCase):
    def test_numpy_cast_is_bit_identical_to_the_rust_cast(self):
        d = os.environ.get("FP8SCOPE_RUST_CAST_DIR")
        if not d:
            self.skipTest("FP8SCOPE_RUST_CAST_DIR not set: run through `cargo test ... python_unit_tests`")
        x = np.fromfile(os.path.join(d, "values.f32"), dtype="<f4")
        for name in ("e4m3", "e5m2"):
            want = np.fromfile(os.path.join(d, f"{name}.u8"), dtype=np.uint8)
            got = fp8.encode(name, x)
            bad = np.flatnonzero(got != want)
            self.assertEqual(bad.size, 0, f"{name}: {bad.size} codes differ, first x={x[bad[:5]]} "
                                          f"numpy={got[bad[:5]]} rust={want[bad[:5]]}")
            with open(os.path.join(d, f"{name}_scale.txt")) as f:
                scale = float(f.read())
            want = np.fromfile(os.path.join(d, f"{name}_scaled.u8"), dtype=np.uint8)
            got = fp8.cast(name, x, scale)
            self.assertEqual(int(np.count_nonzero(got != want)), 0, f"{name}: scaled codes differ")
        print(f"\nnumpy cast bit-identical on {x.size} values", flush=True)


class Cast(unittest.TestCase):
    def test_known_codes(self):
        # 448 is max; 464 is halfway to the next value the format would have and rounds to even (max);
        # ±Inf saturate; every NaN is 0x7F; 2^-10 is half the smallest subnormal and rounds to even (0).
        x = np.array([0.0, -0.0, 448.0, 464.0, 1e9, -np.inf, np.nan, -np.nan, 2.0**-9, 2.0**-10, 1.5 * 2.0**-9],
                     dtype=np.float32)
        self.assertEqual(fp8.encode("e4m3", x).tolist(),
                         [0x00, 0x80, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x7F, 0x01, 0x00, 0x02])
        y = np.array([57344.0, 61440.0, np.inf, -1e30, np.nan, 2.0**-16, 2.0**-17], dtype=np.float32)
        self.assertEqual(fp8.encode("e5m2", y).tolist(), [0x7B, 0x7B, 0x7B, 0xFB, 0x7F, 0x01, 0x00])

    def test_agrees_with_ml_dtypes_on_clipped_finite_values(self):
        import ml_dtypes

        rng = np.random.default_rng(3)
        x = (rng.standard_normal(200_000) * np.exp(rng.uniform(-25, 15, 200_000))).astype(np.float32)
        for name, dt in (("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)):
            m = fp8.fmt(name).max
            want = np.clip(x, -m, m).astype(dt).view(np.uint8)
            np.testing.assert_array_equal(fp8.encode(name, x), want)
            codes = np.arange(256, dtype=np.uint8)
            ok = ~(fp8.fmt(name).is_nan_code(codes))
            np.testing.assert_array_equal(fp8.decode(name, codes)[ok], codes[ok].view(dt).astype(np.float32))

    def test_scale_for_amax_follows_transformer_engine(self):
        self.assertEqual(fp8.scale_for_amax("e4m3", 2.0), 224.0)
        self.assertEqual(fp8.scale_for_amax("e5m2", 2.0, margin=1), 14336.0)
        self.assertEqual(fp8.scale_for_amax("e4m3", 3.0), float(np.float32(448.0) / np.float32(3.0)))
        for a in (0.0, -1.0, float("inf"), float("nan")):
            self.assertEqual(fp8.scale_for_amax("e4m3", a), 1.0)
        self.assertEqual(fp8.scale_for_amax("e4m3", 1e-45), float(np.finfo(np.float32).max))

    def test_round_bf16_is_nearest_even(self):
        import ml_dtypes

        x = np.random.default_rng(1).standard_normal(10_000).astype(np.float32)
        x = np.concatenate([x, np.float32([1 + 2**-8, 1 + 3 * 2**-8, 3.4e38, -0.0])])
        np.testing.assert_array_equal(fp8.round_bf16(x), x.astype(ml_dtypes.bfloat16).astype(np.float32))


if __name__ == "__main__":
    unittest.main()

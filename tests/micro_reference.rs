//! MXFP8 and NVFP4 (`fp8_capture::micro`) bit for bit against an independent numpy + ml_dtypes
//! implementation of Transformer Engine's definitions (`tests/micro_reference.py`): E8M0 scale codes
//! under both roundings, E4M3/E5M2 element codes and dequantized values; NVFP4's E4M3 block scales,
//! E2M1 codes and values with 1×16, 16×1 and 16×16 blocks, the random Hadamard transform and
//! stochastic rounding. Inputs span many binades per block, all-zero blocks, partial blocks, f32
//! subnormals, Inf and NaN. Also: stochastic rounding is deterministic given the seed, and unbiased.

mod common;

use common::*;
use fp8_capture::fp8::Fp8Format;
use fp8_capture::micro::{e2m1, mxfp8, nvfp4};
use fp8scope_schemas::quant::E8m0Rounding;
use std::path::Path;

/// Inputs: per row a magnitude from 2^-30 to 2^30, mixed signs, some exact ties of both element
/// formats, an all-zero block, f32 subnormals, and (when `specials`) ±Inf and NaN.
fn inputs(rows: usize, cols: usize, seed: u64, specials: bool) -> Vec<f32> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut x: Vec<f32> = (0..rows * cols)
        .map(|i| {
            let r = next();
            let unit = (r >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            let sign = if r & 1 == 0 { 1.0 } else { -1.0 };
            let binade = ((i / cols) % 61) as i32 - 30 + ((r >> 8) % 5) as i32 - 2;
            sign * (0.5 + unit) * 2f32.powi(binade)
        })
        .collect();
    for v in &mut x[..cols.min(32)] {
        *v = 0.0; // an all-zero block in row 0 (1×16 and 1×32)
    }
    x[cols + 1] = f32::from_bits(5); // f32 subnormals
    x[cols + 2] = -f32::from_bits(0x0040_0000);
    x[2 * cols + 3] = 2.5; // ties of E2M1 and E4M3 under unit scales
    x[2 * cols + 4] = 1.0625;
    // Blocks whose amax is exactly a power of two times max (E4M3, E5M2): where the two E8M0
    // roundings and any off-by-one in "round up" show. Rows 6 to 9 are otherwise near 2^-24.
    for (j, v) in [448.0f32 * 0.125, -57344.0 * 2f32.powi(-20), 448.0 * 2f32.powi(-30), 6.0 * 2f32.powi(-9)].into_iter().enumerate() {
        x[(6 + j) * cols + 33] = v;
        x[(6 + j) * cols] = v; // the first block of the row too, and a 32×1 / 16×1 block of column 0
    }
    if specials {
        x[3 * cols + 5] = f32::NAN;
        x[4 * cols + 6] = f32::INFINITY;
        x[5 * cols + 7] = f32::NEG_INFINITY;
    }
    x
}

fn write_f32(path: &Path, v: &[f32]) {
    std::fs::write(path, v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).expect("write");
}

#[test]
fn mxfp8_and_nvfp4_match_the_numpy_ml_dtypes_reference_bit_for_bit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cases = Vec::new();
    let (rows, cols) = (96, 80); // 80 = 2.5 blocks of 32: partial blocks along the columns
    for (k, fmt) in Fp8Format::ALL.into_iter().enumerate() {
        for rounding in E8m0Rounding::ALL {
            for (tr, tc) in [(1, 32), (32, 1)] {
                let name = format!("mx-{fmt}-{}-{tr}x{tc}", rounding.as_str());
                let d = dir.path().join(&name);
                std::fs::create_dir(&d).unwrap();
                let x = inputs(rows, cols, 0x9e37 + k as u64, true);
                let m = mxfp8::quantize(fmt, rounding, &x, rows, cols, tr, tc);
                write_f32(&d.join("x.f32"), &x);
                std::fs::write(d.join("codes.u8"), &m.codes).unwrap();
                std::fs::write(d.join("scales.u8"), &m.scales).unwrap();
                write_f32(&d.join("deq.f32"), &m.dequantized);
                let meta =
                    serde_json::json!({"kind": "mxfp8", "format": fmt.name(), "rounding": rounding.as_str(), "rows": rows, "cols": cols, "block": [tr, tc]});
                std::fs::write(d.join("meta.json"), meta.to_string()).unwrap();
                cases.push(name);
            }
        }
    }
    let (rows, cols) = (64, 48);
    for (tr, tc) in [(1, 16), (16, 1), (16, 16)] {
        for rht in [false, true] {
            for seed in [None, Some(0x5eed_u64)] {
                let name = format!("nv-{tr}x{tc}-rht{}-sr{}", u8::from(rht), u8::from(seed.is_some()));
                let d = dir.path().join(&name);
                std::fs::create_dir(&d).unwrap();
                // NaN and Inf make the whole tensor's scale degenerate: one case keeps them.
                let specials = tr == 16 && tc == 16 && !rht && seed.is_none();
                let x = inputs(rows, cols, 0x51 + tr as u64 + u64::from(rht), specials);
                let x: Vec<f32> = if specials { x } else { x.iter().map(|v| v * 1e-3).collect() };
                let q = nvfp4::quantize(&x, rows, cols, nvfp4::Nvfp4Opts { block: (tr, tc), rht, stochastic_seed: seed });
                write_f32(&d.join("x.f32"), &x);
                std::fs::write(d.join("codes.u8"), &q.codes).unwrap();
                std::fs::write(d.join("scales.u8"), &q.block_scales).unwrap();
                write_f32(&d.join("deq.f32"), &q.dequantized);
                write_f32(&d.join("amax.f32"), &[q.tensor_amax, q.s_enc]);
                let meta = serde_json::json!({"kind": "nvfp4", "rows": rows, "cols": cols, "block": [tr, tc], "rht": rht, "seed": seed});
                std::fs::write(d.join("meta.json"), meta.to_string()).unwrap();
                cases.push(name);
            }
        }
    }
    let mut args = vec![dir.path().to_str().unwrap().to_string()];
    args.extend(cases.iter().cloned());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = python("micro_reference.py", &argv);
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "the reference disagrees:\n{text}");
    assert_eq!(text.matches(": ok").count(), cases.len(), "{text}");
    eprintln!("{text}");
}

/// Stochastic rounding: the same seed gives the same codes, another seed others; and the mean of
/// many roundings of a value is the value (within 4 standard errors).
#[test]
fn stochastic_rounding_is_deterministic_given_the_seed_and_unbiased() {
    let x: Vec<f32> = (0..64 * 32).map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 3.0).collect();
    let opts = |seed| nvfp4::Nvfp4Opts { block: (1, 16), rht: false, stochastic_seed: Some(seed) };
    let a = nvfp4::quantize(&x, 64, 32, opts(1));
    let b = nvfp4::quantize(&x, 64, 32, opts(1));
    let c = nvfp4::quantize(&x, 64, 32, opts(2));
    assert_eq!(a.codes, b.codes, "same seed, same codes");
    let differ = a.codes.iter().zip(&c.codes).filter(|(p, q)| p != q).count();
    assert!(differ > 100, "another seed should round differently: {differ} codes differ");

    let n = 200_000u64;
    for y in [0.1f32, 0.3, 0.7, 1.1, 1.6, 2.7, 3.3, 3.9, 5.5, -2.2] {
        let mean: f64 = (0..n).map(|i| f64::from(e2m1::decode(e2m1::encode_sr(y, e2m1::random_bits(42, i))))).sum::<f64>() / n as f64;
        // A rounding between neighbours `step` apart has standard deviation at most step / 2.
        let step = if y.abs() < 2.0 {
            0.5
        } else if y.abs() < 4.0 {
            1.0
        } else {
            2.0
        };
        let tol = 4.0 * (step / 2.0) / (n as f64).sqrt();
        assert!((mean - f64::from(y)).abs() < tol, "E[sr({y})] = {mean}, off by more than {tol}");
        let rn = f64::from(e2m1::decode(e2m1::encode_rn(y)));
        if (rn - f64::from(y)).abs() > 4.0 * tol {
            assert!((mean - f64::from(y)).abs() < (rn - f64::from(y)).abs(), "{y}: stochastic rounding should beat nearest in mean");
        }
    }
}

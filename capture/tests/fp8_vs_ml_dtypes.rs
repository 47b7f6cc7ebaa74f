//! Cross-checks the FP8 emulation (`fp8_capture::fp8`) against Python's `ml_dtypes`, an
//! independent implementation, on every bf16 bit pattern and on all 256 codes of each format.
//!
//! Needs `python3` with `numpy` and `ml_dtypes` (`pip install ml_dtypes numpy`; CI installs
//! them). If they are missing the test fails: it never passes silently. Set `FP8SCOPE_PYTHON`
//! to use another interpreter.
//!
//! ml_dtypes does not saturate, so the script casts `clip(x, -max, max)`; that equals a
//! saturating cast for every non-NaN input, including ±Inf. NaN inputs are the one place where
//! the two are meant to differ in bits: ml_dtypes keeps the NaN's sign and uses 0x7E for E5M2,
//! while `encode` gives 0x7F for every NaN, as `cvt.rn.satfinite` does on an H200. For those the
//! test checks that both codes are NaN codes and that ours is exactly 0x7F.

use fp8_capture::fp8::{self, CANONICAL_NAN, Fp8Format};
use std::path::Path;
use std::process::Command;

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("reading {name}: {e}"))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn run_script(out: &Path) {
    // Where `cargo test` says the package is at run time, else where it was built from.
    let dir = std::env::var_os("CARGO_MANIFEST_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    let script = dir.join("tests").join("fp8_vectors.py");
    let python = std::env::var("FP8SCOPE_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let result = Command::new(&python).arg(&script).arg(out).output();
    match result {
        Err(e) => panic!("cannot run {python} ({e}): this test needs python3 with ml_dtypes and numpy: pip install ml_dtypes numpy"),
        Ok(o) if !o.status.success() => {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err.lines().last().unwrap_or("").trim();
            panic!("fp8_vectors.py failed ({}): {last} -- this test needs python3 with ml_dtypes and numpy: pip install ml_dtypes numpy", o.status);
        }
        Ok(o) => eprintln!("{}", String::from_utf8_lossy(&o.stdout).trim()),
    }
}

#[test]
fn fp8_matches_ml_dtypes() {
    let dir = tempfile::tempdir().unwrap();
    run_script(dir.path());
    for fmt in Fp8Format::ALL {
        let name = fmt.name();
        let inputs = f32s(&read(dir.path(), &format!("{name}_inputs.f32")));
        let codes = read(dir.path(), &format!("{name}_codes.u8"));
        let decoded = f32s(&read(dir.path(), &format!("{name}_decode.f32")));
        assert_eq!(inputs.len(), 65536);
        assert_eq!(codes.len(), 65536);
        assert_eq!(decoded.len(), 256);

        // The inputs must be exactly the bf16 patterns, in order.
        for (h, x) in inputs.iter().enumerate() {
            assert_eq!(x.to_bits(), (h as u32) << 16, "{name}: input {h:#06x}");
        }

        let mut identical = 0u32;
        let mut nan_inputs = 0u32;
        let mut ml_nan_codes = std::collections::BTreeSet::new();
        for (i, (&x, &want)) in inputs.iter().zip(&codes).enumerate() {
            let got = fp8::encode(fmt, x);
            if x.is_nan() {
                assert!(fmt.is_nan_code(want), "{name}: ml_dtypes gave non-NaN {want:#04x} for NaN input {i:#06x}");
                assert_eq!(got, CANONICAL_NAN, "{name}: NaN input {i:#06x}");
                ml_nan_codes.insert(want);
                nan_inputs += 1;
            } else {
                assert_eq!(got, want, "{name}: bf16 {i:#06x} ({x:e}): ours {got:#04x}, ml_dtypes {want:#04x}");
                identical += 1;
            }
        }
        assert_eq!(nan_inputs, 254, "{name}: a bf16 has 2 * 127 NaN patterns");
        assert_eq!(identical + nan_inputs, 65536);

        let mut decode_same = 0u32;
        for code in 0..=255u8 {
            let ours = fp8::decode(fmt, code);
            let theirs = decoded[code as usize];
            if theirs.is_nan() {
                assert!(ours.is_nan(), "{name}: code {code:#04x} should be NaN, ours is {ours}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{name}: code {code:#04x}: ours {ours}, ml_dtypes {theirs}");
            }
            decode_same += 1;
        }
        assert_eq!(decode_same, 256);

        let nan_list: Vec<String> = ml_nan_codes.iter().map(|c| format!("{c:#04x}")).collect();
        eprintln!(
            "{name}: {} of 65536 bf16 patterns agree with ml_dtypes ({identical} byte-identical; {nan_inputs} NaN inputs: \
             NaN codes on both sides, ml_dtypes {} vs ours {CANONICAL_NAN:#04x}); {decode_same} of 256 codes decode identically",
            identical + nan_inputs,
            nan_list.join("/")
        );
    }
}

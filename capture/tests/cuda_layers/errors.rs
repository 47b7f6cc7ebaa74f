//! A failing primitive keeps its error for `take_error`, and the primitives after it skip their
//! device work.

use super::*;

/// A primitive that fails (here the fused attention forward, given a saved buffer one float short)
/// keeps its error for `take_error` instead of panicking; every later primitive skips its device
/// work and returns a harmless value until the error is taken, and then the backend works again.
#[test]
fn a_failing_primitive_keeps_its_error_and_later_primitives_are_skipped() {
    let Some(mut gpu) = cuda_common::gpu("backend errors") else { return };
    let (b, t, nh, kvh, hd) = (1usize, 8usize, 2usize, 2usize, 64usize);
    let (c, w) = (nh * hd, (nh + 2 * kvh) * hd);
    gpu.set_fused_attention(true);
    let saved = gpu.attention_saved_len(b, t, c, nh);
    assert_eq!(gpu.take_error(), None, "a fresh backend keeps no error");
    let qkv = gpu.upload(&vec![0.5f32; b * t * w]);
    let mut out = gpu.zeros(b * t * c);
    let mut att = gpu.zeros(saved - 1);
    let mut kept = gpu.upload(&[7.0, 8.0]);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        gpu.attention_fwd(&mut out, &mut att, &qkv, b, t, c, nh, kvh, true);
        // Skipped from here on: no allocation, no copy, no launch.
        let later = gpu.upload(&[1.0, 2.0, 3.0]);
        gpu.fill_zero(&mut kept);
        let sum = gpu.sumsq(&qkv);
        let nonfinite = gpu.count_nonfinite(&qkv);
        let back = gpu.download(&qkv, 0, 4, 1);
        let reports = gpu.take_reports().len();
        (later, sum, nonfinite, back, reports)
    }));
    let (later, sum, nonfinite, back, reports) = r.expect("the backend panicked instead of keeping its error");
    let e = gpu.take_error().expect("the failed attention_fwd kept no error");
    println!("kept: {e}");
    assert!(
        e.starts_with("attention_fwd: ") && e.contains("saved log-sum-exp") && e.contains(&format!("holds {} floats; {saved} are needed", saved - 1)),
        "unexpected error: {e}"
    );
    assert!(!e.contains('\n'), "not one line: {e}");
    assert_eq!(gpu.len(&later), 0, "upload allocated after the error");
    assert!(sum.is_nan(), "sumsq after the error: {sum}");
    assert_eq!(nonfinite, (b * t * w) as u64, "count_nonfinite after the error counts every value");
    assert!(back.len() == 4 && back.iter().all(|v| v.is_nan()), "download after the error: {back:?}");
    assert_eq!(reports, 0);
    // Taken: the error is gone, the skipped fill_zero left `kept` as it was, and the backend runs
    // again (also after dropping the empty buffer it returned).
    assert_eq!(gpu.take_error(), None, "take_error did not forget the error");
    drop(later);
    assert_eq!(gpu.download(&kept, 0, 2, 1), vec![7.0, 8.0], "fill_zero ran after the error");
    let x = gpu.upload(&[1.0, 2.0, 3.0]);
    assert_eq!(gpu.download(&x, 0, 3, 1), vec![1.0, 2.0, 3.0]);
    assert_eq!(gpu.sumsq(&x), 14.0);
    assert_eq!(gpu.take_error(), None, "the backend failed after the error was taken");
}

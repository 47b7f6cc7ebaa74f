//! Per-channel statistics of a GEMM operand: which channel holds the amax, and how much of the
//! tensor's energy its top channels hold — the signature of an outlier channel (a few features
//! carrying values orders of magnitude above the rest, as in large language models' activations),
//! which a per-tensor scale must accommodate at the expense of every other channel.
//!
//! A *channel* is a column of the operand's row-major layout as the GEMM receives it
//! ([`crate::backend::operands::operand_shapes`]): an input feature of X (n×k) and W (m×k), an
//! output feature of dY (n×m). Over the finite values only (NaN and ±Inf are counted elsewhere):
//! - `amax_channel`: the column of max |x| (ties: the lowest column); none without a finite value;
//! - `top_channel_sq_frac`: Σ of the K largest per-channel Σx² over the total Σx², with
//!   K = max(1, ⌊cols / 100⌋) (the top 1% of channels, at least one); none when Σx² = 0. Channels
//!   of equal energy give K / cols (about 1%); one channel holding everything gives 1.
//!
//! The CPU computes the per-channel sums here ([`channel_sums`], f64, rows in chunks combined in
//! chunk order: deterministic); the CUDA backend reduces the same sums on the device
//! (`kernels/stats.cu`: `channel_stats_*`); both finish with [`summarize`] on the host.

use rayon::prelude::*;

/// Where the amax sits and how concentrated the energy is, over a tensor's channels.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ChannelStats {
    /// The channel (column) holding max |x|, the lowest on ties; None without a finite value.
    pub amax_channel: Option<u32>,
    /// Share of Σx² held by the top K channels by Σx² (K = [`top_channels`]); None when Σx² = 0.
    pub top_channel_sq_frac: Option<f64>,
}

/// Per-channel reductions over finite values: Σx² (f64) and max |x| (−∞ for a channel without a
/// finite value).
#[derive(Clone, Debug, PartialEq)]
pub struct ChannelSums {
    pub sumsq: Vec<f64>,
    pub amax: Vec<f32>,
}

/// Elements per parallel chunk (whole rows; at least one row).
const CHUNK: usize = 1 << 15;

/// K, the number of top channels whose share is reported: 1% of `cols`, at least one.
pub fn top_channels(cols: usize) -> usize {
    (cols / 100).max(1)
}

fn chunk_sums(x: &[f32], cols: usize) -> ChannelSums {
    let mut s = ChannelSums { sumsq: vec![0.0; cols], amax: vec![f32::NEG_INFINITY; cols] };
    for row in x.chunks_exact(cols) {
        for ((&v, q), a) in row.iter().zip(s.sumsq.iter_mut()).zip(s.amax.iter_mut()) {
            if v.is_finite() {
                *q += (v as f64) * (v as f64);
                *a = a.max(v.abs());
            }
        }
    }
    s
}

/// Per-channel Σx² and max |x| of `x` (rows × cols, row-major) over finite values. Rows are
/// reduced in chunks in parallel and the chunks combined in order, so the result does not depend
/// on the number of threads.
pub fn channel_sums(x: &[f32], rows: usize, cols: usize) -> ChannelSums {
    debug_assert_eq!(x.len(), rows * cols);
    if cols == 0 {
        return ChannelSums { sumsq: Vec::new(), amax: Vec::new() };
    }
    let per = (CHUNK / cols).max(1) * cols;
    let parts: Vec<ChannelSums> = x.par_chunks(per).map(|c| chunk_sums(c, cols)).collect();
    let mut out = ChannelSums { sumsq: vec![0.0; cols], amax: vec![f32::NEG_INFINITY; cols] };
    for p in parts {
        out.sumsq.iter_mut().zip(&p.sumsq).for_each(|(a, b)| *a += b);
        out.amax.iter_mut().zip(&p.amax).for_each(|(a, b)| *a = a.max(*b));
    }
    out
}

/// The amax channel and the top channels' share of Σx² from per-channel sums (see the module
/// documentation for the definitions).
pub fn summarize(sumsq: &[f64], amax: &[f32]) -> ChannelStats {
    let mut amax_channel = None;
    let mut best = f32::NEG_INFINITY;
    for (c, &a) in amax.iter().enumerate() {
        // Strictly greater: the lowest channel wins a tie. −∞ marks a channel without a finite value.
        if a > best {
            best = a;
            amax_channel = Some(c as u32);
        }
    }
    let total: f64 = sumsq.iter().sum();
    let top_channel_sq_frac = (total > 0.0).then(|| {
        // The K largest, summed in descending order: a partition (linear time), then a sort of
        // those K alone — the same sum as a full sort's first K, at a fraction of the cost.
        let k = top_channels(sumsq.len());
        let mut v = sumsq.to_vec();
        let top = if k < v.len() {
            v.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
            &mut v[..k]
        } else {
            &mut v[..]
        };
        top.sort_unstable_by(|a, b| b.total_cmp(a));
        let top: f64 = top.iter().sum();
        (top / total).min(1.0)
    });
    ChannelStats { amax_channel, top_channel_sq_frac }
}

/// [`ChannelStats`] of `x` (rows × cols, row-major).
pub fn channel_stats(x: &[f32], rows: usize, cols: usize) -> ChannelStats {
    let s = channel_sums(x, rows, cols);
    summarize(&s.sumsq, &s.amax)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic value in [-1, 1).
    fn noise(i: u64) -> f32 {
        let mut z = i.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(0x1234_5678);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z >> 40) as f64 / (1u64 << 23) as f64 - 1.0) as f32
    }

    /// The definitions computed plainly: one f64 pass in row order, the top K by a full sort.
    fn reference(x: &[f32], rows: usize, cols: usize) -> (Option<u32>, Option<f64>) {
        let mut sq = vec![0f64; cols];
        let mut best: Option<(f64, usize)> = None;
        for r in 0..rows {
            for c in 0..cols {
                let v = x[r * cols + c];
                if !v.is_finite() {
                    continue;
                }
                let v = v as f64;
                sq[c] += v * v;
                let better = match best {
                    None => true,
                    Some((b, bc)) => v.abs() > b || (v.abs() == b && c < bc),
                };
                if better {
                    best = Some((v.abs(), c));
                }
            }
        }
        let total: f64 = sq.iter().sum();
        let mut s = sq.clone();
        s.sort_by(|a, b| b.partial_cmp(a).unwrap());
        let k = if cols >= 200 { cols / 100 } else { 1 };
        let frac = (total > 0.0).then(|| s[..k].iter().sum::<f64>() / total);
        (best.map(|b| b.1 as u32), frac)
    }

    fn planted(rows: usize, cols: usize, outliers: &[(usize, f32)]) -> Vec<f32> {
        let mut x: Vec<f32> = (0..rows * cols).map(|i| noise(i as u64)).collect();
        for &(c, f) in outliers {
            for r in 0..rows {
                x[r * cols + c] *= f;
            }
        }
        x
    }

    #[test]
    fn a_planted_outlier_channel_is_found_and_its_share_matches_an_f64_reference() {
        // 300 × 250: several parallel chunks (131 rows each); K = 2.
        let (rows, cols) = (300, 250);
        let x = planted(rows, cols, &[(173, 50.0), (9, 4.0)]);
        let got = channel_stats(&x, rows, cols);
        let (ch, frac) = reference(&x, rows, cols);
        assert_eq!(got.amax_channel, Some(173));
        assert_eq!(got.amax_channel, ch);
        let (g, w) = (got.top_channel_sq_frac.unwrap(), frac.unwrap());
        assert!((g - w).abs() <= 1e-12 * w, "{g} vs {w}");
        // Channels 173 (2500×) and 9 (16×) over 248 ordinary ones: (2500 + 16) / (2500 + 16 + 248).
        let expect = 2516.0 / 2764.0;
        assert!((g - expect).abs() < 0.02, "{g} vs about {expect}");
        // Without outliers the top 2 of 250 channels hold about 2/250.
        let flat = channel_stats(&planted(rows, cols, &[]), rows, cols).top_channel_sq_frac.unwrap();
        assert!(flat > 2.0 / 250.0 && flat < 0.02, "{flat}");
    }

    #[test]
    fn ties_go_to_the_lowest_channel_and_nonfinite_values_are_skipped() {
        let (rows, cols) = (4, 8);
        let mut x = vec![0.5f32; rows * cols];
        x[cols + 7] = -9.0; // row 1, channel 7
        x[2 * cols + 3] = 9.0; // row 2, channel 3: the same |x|, a lower channel
        x[5] = f32::INFINITY;
        x[6] = f32::NAN;
        let got = channel_stats(&x, rows, cols);
        assert_eq!(got.amax_channel, Some(3));
        let (ch, frac) = reference(&x, rows, cols);
        assert_eq!(got.amax_channel, ch);
        assert!((got.top_channel_sq_frac.unwrap() - frac.unwrap()).abs() < 1e-15);
    }

    #[test]
    fn zeros_and_nothing_finite_have_no_share() {
        let z = channel_stats(&[0.0; 12], 3, 4);
        assert_eq!(z, ChannelStats { amax_channel: Some(0), top_channel_sq_frac: None });
        let n = channel_stats(&[f32::NAN; 12], 3, 4);
        assert_eq!(n, ChannelStats { amax_channel: None, top_channel_sq_frac: None });
        assert_eq!(channel_stats(&[], 0, 4), ChannelStats::default());
    }

    #[test]
    fn the_top_is_one_percent_of_the_channels_and_at_least_one() {
        assert_eq!([1, 64, 99, 199, 200, 1024, 4096].map(top_channels), [1, 1, 1, 1, 2, 10, 40]);
        // Equal channels: exactly K / cols.
        let x = vec![1.0f32; 3 * 1024];
        let f = channel_stats(&x, 3, 1024).top_channel_sq_frac.unwrap();
        assert!((f - 10.0 / 1024.0).abs() < 1e-15, "{f}");
    }

    #[test]
    fn the_result_does_not_depend_on_the_thread_count() {
        let (rows, cols) = (1000, 96);
        let x = planted(rows, cols, &[(40, 30.0)]);
        let many = channel_sums(&x, rows, cols);
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(|| channel_sums(&x, rows, cols));
        assert_eq!(many, one);
    }
}

//! The step's GEMM reports: the statistics records, channel summaries and non-finite counts of the
//! step's casts and GEMMs, copied to the host once a step (`Backend::take_reports`), and the
//! step's statistics slots freed.

use super::{CudaBackend, CudaError, PendingOp, SLOT_FLOATS, STAT_FIELDS, stat};
use crate::backend::{CastReport, GemmReport, Moments, StatsLevel};
use crate::tensor_stats::QuantError;

impl CudaBackend {
    pub(super) fn download_all(&mut self) -> Result<Vec<GemmReport>, CudaError> {
        let t0 = std::time::Instant::now();
        self.leave_step_graph()?;
        self.flush_stats()?;
        self.stat.reset();
        self.flush_channels()?;
        // Prefetched (`gemms_done`), these are summarised while the stream finishes the step.
        let chans = self.channel_summaries()?;
        let t1 = std::time::Instant::now();
        self.stream.synchronize()?;
        self.host_gap.synced();
        let t2 = std::time::Instant::now();
        if let Some(p) = self.prof.as_mut() {
            p.collect();
            p.add_host("reports.channels", t1 - t0);
            p.add_host("reports.wait", t2 - t1);
        }
        // Timed from here: the profiler's own collection above is not the reports' work.
        let t3 = std::time::Instant::now();
        let reports = self.download_reports(chans);
        if let Some(p) = self.prof.as_mut() {
            p.add_host("reports.host", t3.elapsed());
        }
        reports
    }

    /// The step's reports from its records and channel summaries, after the stream is
    /// synchronised (`download_all`): copies them, and frees the step's statistics slots.
    fn download_reports(&mut self, chans: Vec<Option<crate::channel_stats::ChannelStats>>) -> Result<Vec<GemmReport>, CudaError> {
        let ns = self.next_slot;
        let ng = self.next_gemm;
        let recs = if ns > 0 { self.stream.clone_dtoh(&self.records.slice(0..ns * STAT_FIELDS))? } else { Vec::new() };
        let scales = if ns > 0 { self.stream.clone_dtoh(&self.scales.slice(0..ns * SLOT_FLOATS))? } else { Vec::new() };
        let nf = if ng > 0 { self.stream.clone_dtoh(&self.nonfinite.slice(0..ng))? } else { Vec::new() };
        if ng > 0 {
            let mut v = self.nonfinite.slice_mut(0..ng);
            self.stream.memset_zeros(&mut v)?;
        }
        self.clear_slot_flags(ns)?;
        self.next_slot = 0;
        self.next_gemm = 0;
        self.expire_kept_casts();
        let pending = std::mem::take(&mut self.pending);
        let report = |p: PendingOp| -> CastReport {
            let r = &recs[p.slot * STAT_FIELDS..(p.slot + 1) * STAT_FIELDS];
            let amax = r[stat::AMAX] as f32;
            let scale = if p.fp8 { scales[p.slot * SLOT_FLOATS] } else { 1.0 };
            let moments = (p.level >= StatsLevel::Cheap).then(|| {
                let n = r[stat::COUNT];
                if n == 0.0 {
                    return Moments::default();
                }
                let mean = r[stat::SUM] / n;
                let var = (r[stat::SUMSQ] / n - mean * mean).max(0.0);
                let minabs = r[stat::MINABS];
                let dynamic_range_log2 = if amax > 0.0 && minabs.is_finite() { (amax as f64 / minabs).log2() } else { 0.0 };
                Moments { min: r[stat::MIN] as f32, max: r[stat::MAX] as f32, mean, std: var.sqrt(), dynamic_range_log2 }
            });
            // A2 is Σ dequant², B2 Σ x² (kernels/cast_stats.cuh).
            let quant_error = (p.level >= StatsLevel::Full).then(|| QuantError::from_sums(r[stat::D2], r[stat::DOT], r[stat::A2], r[stat::B2], r[stat::NP]));
            CastReport {
                role: Some(p.role),
                format: p.format,
                scale,
                amax,
                amax_used: p.given_amax.unwrap_or(amax),
                numel: p.numel,
                underflow: r[stat::UNDER] as u64,
                saturated: r[stat::SAT] as u64,
                nan: r[stat::NAN] as u64,
                inf: r[stat::INF] as u64,
                zeros: r[stat::ZEROS] as u64,
                moments,
                quant_error,
                channels: (p.level >= StatsLevel::Channels).then(|| chans.get(p.slot).copied().flatten()).flatten(),
                weight_motion: None,
                quantized: p.quantized,
                block_scales: None,
                blocks: None,
            }
        };
        Ok(pending.into_iter().map(|g| GemmReport { id: g.id, output_nonfinite: nf[g.gemm_slot], shadow: g.shadow, a: report(g.a), b: report(g.b) }).collect())
    }
}

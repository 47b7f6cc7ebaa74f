//! An opt-in profiler of the CUDA backend (`FP8SCOPE_PROFILE=1`): CUDA events around each
//! primitive give its GPU time, a host clock its launch-side time; the totals per primitive are
//! printed to stderr when the backend is dropped, leaving out the first steps (one-off costs). Off
//! by default: events cost a little.
//!
//! It also prints where the GPU waited for the host inside a step: the time between one top-level
//! span's end event and the next one's start, charged to the span that came after (any device
//! work queued outside a span would count there too; every primitive is spanned). The events
//! themselves leave a few µs a gap: an H200 step whose host had queued it all in advance still
//! reads 0.5 ms at llama-1b (bench/results/2026-12-03-host-wait).
//!
//! And where it waited between steps: from the last top-level span's end in one step to the first
//! one's start in the next (the host reading the step's reports, planning and launching the next),
//! beside the wall-clock time between the steps' synchronisations, so that the time a step takes
//! that no span accounts for shows.

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, sys};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Steps whose spans are dropped before the totals start.
const WARMUP_STEPS: u64 = 3;

pub struct Profiler {
    ctx: Arc<CudaContext>,
    pool: Vec<(CudaEvent, CudaEvent)>,
    open: Vec<(&'static str, usize)>,
    used: usize,
    gpu_ms: BTreeMap<&'static str, (f64, u64)>,
    host_ms: BTreeMap<&'static str, f64>,
    /// GPU ms between a top-level span's end and the next one's start (nothing queued between:
    /// the GPU waiting for the host's launches), by the span that follows, and how often.
    idle_ms: BTreeMap<&'static str, (f64, u64)>,
    /// The end event of the last step's last top-level span (taken out of the pool, so that it
    /// outlives the step), for the gap before this step's first.
    last_end: Option<CudaEvent>,
    /// GPU ms between steps (see `last_end`), and how many such gaps.
    between_ms: (f64, u64),
    /// Host clock at the last [`Profiler::collect`], and the wall ms between collects summed.
    last_collect: Option<Instant>,
    wall_ms: f64,
    steps: u64,
    /// Whether the warm-up steps have been dropped.
    warmed: bool,
    started: Instant,
}

impl Profiler {
    /// The profiler of `FP8SCOPE_PROFILE` (`settings.rs`).
    pub fn new(ctx: &Arc<CudaContext>) -> Profiler {
        Profiler {
            ctx: ctx.clone(),
            pool: Vec::new(),
            open: Vec::new(),
            used: 0,
            gpu_ms: BTreeMap::new(),
            host_ms: BTreeMap::new(),
            idle_ms: BTreeMap::new(),
            last_end: None,
            between_ms: (0.0, 0),
            last_collect: None,
            wall_ms: 0.0,
            steps: 0,
            warmed: false,
            started: Instant::now(),
        }
    }

    /// Records the start of `name`; returns its index for [`Profiler::end`].
    pub fn begin(&mut self, stream: &Arc<CudaStream>, name: &'static str) -> usize {
        if self.used == self.pool.len() {
            let mk = || self.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT));
            if let (Ok(a), Ok(b)) = (mk(), mk()) {
                self.pool.push((a, b));
            } else {
                return usize::MAX;
            }
        }
        let i = self.used;
        self.used += 1;
        let _ = self.pool[i].0.record(stream);
        self.open.push((name, i));
        i
    }

    pub fn end(&mut self, stream: &Arc<CudaStream>, i: usize, host: Duration) {
        if i == usize::MAX {
            return;
        }
        let _ = self.pool[i].1.record(stream);
        if let Some(pos) = self.open.iter().position(|&(_, j)| j == i) {
            let (name, _) = self.open[pos];
            *self.host_ms.entry(name).or_default() += host.as_secs_f64() * 1e3;
        }
    }

    /// Adds host-only time under `name` (no GPU work of its own: its GPU column reads 0).
    pub fn add_host(&mut self, name: &'static str, host: Duration) {
        self.gpu_ms.entry(name).or_default().1 += 1;
        *self.host_ms.entry(name).or_default() += host.as_secs_f64() * 1e3;
    }

    /// After a synchronisation: folds this step's event pairs into the totals.
    pub fn collect(&mut self) {
        let now = Instant::now();
        if let Some(t) = self.last_collect {
            self.wall_ms += (now - t).as_secs_f64() * 1e3;
        }
        self.last_collect = Some(now);
        let mut prev_top: Option<usize> = None;
        for &(name, i) in &self.open {
            if let Ok(ms) = self.pool[i].0.elapsed_ms(&self.pool[i].1) {
                let e = self.gpu_ms.entry(name).or_default();
                e.0 += ms as f64;
                e.1 += 1;
            }
            // Top-level spans follow one another on the stream with nothing between them, so
            // the time from one's end to the next one's start is time the GPU had nothing to do.
            if !name.contains('.') {
                if let Some(p) = prev_top
                    && let Ok(ms) = self.pool[p].1.elapsed_ms(&self.pool[i].0)
                    && ms > 0.0
                {
                    let e = self.idle_ms.entry(name).or_default();
                    e.0 += ms as f64;
                    e.1 += 1;
                }
                // The step's first top-level span: the gap since the last step's last one.
                if prev_top.is_none()
                    && let Some(end) = &self.last_end
                    && let Ok(ms) = end.elapsed_ms(&self.pool[i].0)
                {
                    self.between_ms.0 += ms.max(0.0) as f64;
                    self.between_ms.1 += 1;
                }
                prev_top = Some(i);
            }
        }
        // This step's last end event leaves the pool for the next step's gap; the event it
        // replaces (the last step's, or a new one) takes its place there.
        if let Some(p) = prev_top {
            let spare = match self.last_end.take() {
                Some(e) => Some(e),
                None => self.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).ok(),
            };
            if let Some(mut e) = spare {
                std::mem::swap(&mut self.pool[p].1, &mut e);
                self.last_end = Some(e);
            }
        }
        self.open.clear();
        self.used = 0;
        self.steps += 1;
        // The first steps carry one-off costs (cuBLASLt plans, scratch growth): left out.
        if !self.warmed && self.steps == WARMUP_STEPS {
            self.warmed = true;
            self.gpu_ms.clear();
            self.host_ms.clear();
            self.idle_ms.clear();
            self.between_ms = (0.0, 0);
            self.wall_ms = 0.0;
            self.steps = 0;
            self.started = Instant::now();
        }
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        let steps = self.steps.max(1) as f64;
        let mut rows: Vec<_> = self.gpu_ms.iter().collect();
        rows.sort_by(|a, b| b.1.0.partial_cmp(&a.1.0).unwrap_or(std::cmp::Ordering::Equal));
        eprintln!(
            "== CUDA backend profile: {} steps, {:.1} s wall; per step: GPU ms (event spans, nested spans overlap), host ms, calls",
            self.steps,
            self.started.elapsed().as_secs_f64()
        );
        let mut tot = (0.0, 0.0);
        for (name, (ms, n)) in rows {
            let h = self.host_ms.get(name).copied().unwrap_or(0.0);
            if !name.contains('.') {
                tot.0 += ms / steps;
                tot.1 += h / steps;
            }
            eprintln!("  {name:<24} {:>8.3} {:>8.3} {:>6.0}", ms / steps, h / steps, *n as f64 / steps);
        }
        eprintln!("  {:<24} {:>8.3} {:>8.3}", "total (top level)", tot.0, tot.1);
        let mut idle: Vec<_> = self.idle_ms.iter().collect();
        idle.sort_by(|a, b| b.1.0.partial_cmp(&a.1.0).unwrap_or(std::cmp::Ordering::Equal));
        let total: f64 = idle.iter().map(|(_, (ms, _))| ms).sum::<f64>() / steps;
        eprintln!("== GPU idle inside a step, waiting for the host's launches: {total:.3} ms a step; by the span it waited for: ms, gaps");
        for (name, (ms, n)) in idle.iter().take(12) {
            eprintln!("  {name:<24} {:>8.3} {:>6.0}", ms / steps, *n as f64 / steps);
        }
        let (between, gaps) = self.between_ms;
        if gaps > 0 {
            eprintln!(
                "== GPU idle between steps (last span's end to the next step's first start): {:.3} ms a step over {gaps} gaps; wall {:.3} ms a step (host clock between synchronisations) against {:.3} GPU ms in top-level spans",
                between / gaps as f64,
                self.wall_ms / steps,
                tot.0
            );
        }
    }
}

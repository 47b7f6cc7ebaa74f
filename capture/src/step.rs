//! The training step's phases, each named, and the ones that talk to the other ranks:
//!
//! 1. **forward** and 2. **backward**: [`Model::launch_step`] queues both (a device may capture
//!    them as one graph); the per-token losses and every rank's own gradients come out;
//! 3. **gradient reduction** ([`reduce_gradients`]): every rank's gradients summed in rank order;
//! 4. **amax reduction** ([`reduce_amaxes`]): delayed scaling's amaxes reduced over the ranks that
//!    share each scale, before they enter the histories;
//! 5. **optimizer** ([`optimizer`]): global-norm clip and AdamW.
//!
//! A rank of a data-parallel job computes its loss terms over its shard with the *global* batch's
//! count of supervised targets as the divisor, so its gradients are its share of the global mean's
//! gradient and their sum over the ranks is that gradient: no division by the number of ranks.
//! With one rank ([`crate::collective::OneRank`]) phases 3 and 4 do nothing, and the step is the
//! one it always was.

use crate::backend::{AdamW, Backend};
use crate::collective::{Collective, CollectiveError};
use crate::model::Model;
use fp8scope_schemas::config::RunConfig;
use fp8scope_schemas::names::{Role, Site};
use std::collections::HashSet;

/// The phases of a step, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Forward,
    Backward,
    GradientReduction,
    AmaxReduction,
    Optimizer,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::GradientReduction => "gradient reduction",
            Phase::AmaxReduction => "amax reduction",
            Phase::Optimizer => "optimizer",
        }
    }
}

/// A collective that failed in a phase of a step.
#[derive(Debug, thiserror::Error)]
#[error("step {step}, {}: {source}", phase.as_str())]
pub struct PhaseError {
    pub step: u32,
    pub phase: Phase,
    #[source]
    pub source: CollectiveError,
}

/// The step's mean loss over the global batch's `supervised` targets. One rank reads its own
/// per-token losses ([`Model::step_loss`]); several gather every rank's, in rank order (= the
/// global batch's row order), and sum them exactly as one rank would, so the loss is the one-rank
/// run's bit for bit wherever the per-token losses are.
pub fn step_loss<B: Backend, C: Collective + ?Sized>(be: &mut B, model: &mut Model<B>, coll: &mut C, supervised: usize, step: u32) -> Result<f64, PhaseError> {
    if coll.world_size() == 1 {
        return Ok(model.step_loss(be, supervised));
    }
    let local = be.download(&model.state.losses, 0, model.dims.n, 1);
    let all = coll.all_gather_f32(&local).map_err(|source| PhaseError { step, phase: Phase::Forward, source })?;
    Ok(all.iter().map(|&x| x as f64).sum::<f64>() / supervised.max(1) as f64)
}

/// Phase 3: every parameter's gradient ← the sum of every rank's, in rank order. The gradients go
/// through one flat buffer (one collective a step), carved in parameter order.
pub fn reduce_gradients<B: Backend, C: Collective + ?Sized>(be: &mut B, grads: &mut [B::Buf], coll: &mut C, step: u32) -> Result<(), PhaseError> {
    if coll.world_size() == 1 {
        return Ok(());
    }
    let lens: Vec<usize> = grads.iter().map(|g| be.len(g)).collect();
    let mut flat = Vec::with_capacity(lens.iter().sum());
    for (g, &n) in grads.iter().zip(&lens) {
        flat.extend(be.download(g, 0, n, 1));
    }
    coll.all_reduce_sum_f32(&mut flat).map_err(|source| PhaseError { step, phase: Phase::GradientReduction, source })?;
    let mut off = 0;
    for (g, &n) in grads.iter_mut().zip(&lens) {
        be.overwrite(g, &flat[off..off + n]);
        off += n;
    }
    Ok(())
}

/// Phase 4: this step's amaxes (sorted by tensor, the same list on every rank) ← their maximum
/// over the group when `reduce`, except the tensors of `local_sites`, which keep this rank's own.
pub fn reduce_amaxes<C: Collective + ?Sized>(amaxes: &mut [((Site, Role), f32)], coll: &mut C, reduce: bool, local_sites: &HashSet<Site>, step: u32) -> Result<(), PhaseError> {
    if coll.world_size() == 1 || !reduce || amaxes.is_empty() {
        return Ok(());
    }
    let mut buf: Vec<f32> = amaxes.iter().map(|&(_, a)| a).collect();
    coll.all_reduce_max_f32(&mut buf).map_err(|source| PhaseError { step, phase: Phase::AmaxReduction, source })?;
    for ((key, a), r) in amaxes.iter_mut().zip(buf) {
        if !local_sites.contains(&key.0) {
            *a = r;
        }
    }
    Ok(())
}

/// What the optimizer phase did.
pub struct Update {
    pub grad_norm: f64,
    pub lr: f64,
}

/// Phase 5: the global gradient norm (of the reduced gradients), the clip it implies, and AdamW
/// (skipped when the loss is not finite).
pub fn optimizer<B: Backend>(be: &mut B, model: &mut Model<B>, cfg: &RunConfig, step: u32, loss_finite: bool) -> Update {
    let grad_sumsq: f64 = be.sumsq_all(&model.state.grads);
    let grad_norm = grad_sumsq.sqrt();
    let clip = cfg.train.grad_clip;
    let grad_scale = if clip > 0.0 && grad_norm.is_finite() && grad_norm > clip { (clip / grad_norm) as f32 } else { 1.0 };
    let lr = crate::train::lr_at(cfg, step);
    let h = AdamW {
        lr: lr as f32,
        beta1: cfg.train.beta1 as f32,
        beta2: cfg.train.beta2 as f32,
        eps: cfg.train.eps as f32,
        weight_decay: cfg.train.weight_decay as f32,
        t: step,
        grad_scale,
    };
    if loss_finite {
        let s = &mut model.state;
        be.adamw_all(&mut s.params, &s.grads, &mut s.adam_m, &mut s.adam_v, &h);
    }
    Update { grad_norm, lr }
}

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
/// over the group, for the tensors whose `over` entry is set; the others keep this rank's own.
/// (Every rank of the group passes the whole list, so that the collective is one call a step.)
pub fn reduce_amaxes<C: Collective + ?Sized>(amaxes: &mut [((Site, Role), f32)], over: &[bool], coll: &mut C, step: u32) -> Result<(), PhaseError> {
    if coll.world_size() == 1 || !over.iter().any(|&o| o) {
        return Ok(());
    }
    let mut buf: Vec<f32> = amaxes.iter().map(|&(_, a)| a).collect();
    coll.all_reduce_max_f32(&mut buf).map_err(|source| PhaseError { step, phase: Phase::AmaxReduction, source })?;
    for (((_, a), r), &o) in amaxes.iter_mut().zip(buf).zip(over) {
        if o {
            *a = r;
        }
    }
    Ok(())
}

/// The squared global gradient norm. One rank: Σ g² over every parameter. Under tensor parallelism
/// (`tp` of more than one rank), the sharded parameters' Σ g² of every rank of the group, added in
/// rank order, plus the replicated parameters' once (each rank holds the same): Megatron-LM's norm.
pub fn grad_sumsq<B: Backend, C: Collective + ?Sized>(be: &mut B, model: &Model<B>, tp: &mut C, step: u32) -> Result<f64, PhaseError> {
    let grads = &model.state.grads;
    if tp.world_size() == 1 {
        return Ok(be.sumsq_all(grads));
    }
    let sharded = crate::model::tp::sharded_params(&model.dims);
    let (mut mine, mut replicated) = (0.0f64, 0.0f64);
    for (g, &s) in grads.iter().zip(&sharded) {
        let x = be.sumsq(g);
        if s { mine += x } else { replicated += x }
    }
    // The f64 travels exactly as four 16-bit pieces, each an f32 integer (a gather copies them).
    let bits = mine.to_bits();
    let pieces: Vec<f32> = (0..4).map(|i| ((bits >> (16 * i)) & 0xFFFF) as f32).collect();
    let all = tp.all_gather_f32(&pieces).map_err(|source| PhaseError { step, phase: Phase::Optimizer, source })?;
    let shares = all.chunks(4).map(|p| f64::from_bits(p.iter().enumerate().fold(0u64, |acc, (i, &x)| acc | ((x as u64) << (16 * i)))));
    Ok(shares.sum::<f64>() + replicated)
}

/// What the optimizer phase did.
pub struct Update {
    pub grad_norm: f64,
    pub lr: f64,
}

/// Phase 5: the global gradient norm (of the reduced gradients, over the tensor-parallel group
/// `tp`: [`grad_sumsq`]), the clip it implies, and AdamW (skipped when the loss is not finite).
pub fn optimizer<B: Backend, C: Collective + ?Sized>(
    be: &mut B,
    model: &mut Model<B>,
    cfg: &RunConfig,
    step: u32,
    loss_finite: bool,
    tp: &mut C,
) -> Result<Update, PhaseError> {
    let grad_norm = grad_sumsq(be, model, tp, step)?.sqrt();
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
    Ok(Update { grad_norm, lr })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::collective::{OneRank, ThreadGroup};
    use fp8scope_schemas::names::Module;

    /// Two ranks' gradients through one flat buffer: each parameter ends as rank 0's + rank 1's, on
    /// both ranks; one rank leaves them as they are.
    #[test]
    fn gradients_are_summed_over_the_ranks_parameter_by_parameter() {
        let out: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
            let hs: Vec<_> = ThreadGroup::new(2)
                .into_iter()
                .map(|mut c| {
                    s.spawn(move || {
                        let r = c.rank() as f32;
                        let mut be = CpuBackend::new();
                        let mut grads = vec![vec![1.0 + r, 2.0], vec![10.0 * r; 3]];
                        reduce_gradients(&mut be, &mut grads, &mut c, 1).expect("reduce");
                        c.close();
                        grads
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank")).collect()
        });
        for g in out {
            assert_eq!(g, vec![vec![3.0, 4.0], vec![10.0; 3]]);
        }
        let mut grads = vec![vec![1.5f32]];
        reduce_gradients(&mut CpuBackend::new(), &mut grads, &mut OneRank, 1).expect("one rank");
        assert_eq!(grads, vec![vec![1.5]]);
    }

    /// The gradient norm of a tensor-parallel pair of `tiny` shards: the sharded parameters' Σg² of
    /// both ranks plus the replicated ones' once, against the same sum over the whole model's
    /// gradients (the shards put back together) in f64; one rank is Σg² of everything.
    #[test]
    fn the_gradient_norm_counts_each_shard_once_and_each_replica_once() {
        use crate::model::{Dims, Model};
        let whole = Dims::from_model(&crate::config::preset("tiny").expect("tiny").model());
        let fill = |p: usize, i: usize| ((p * 31 + i * 17) % 97) as f32 * 1e-3 - 0.04;
        let full: Vec<Vec<f32>> = crate::model::param_sizes(&whole).iter().enumerate().map(|(p, &n)| (0..n).map(|i| fill(p, i)).collect()).collect();
        let want: f64 = full.iter().flatten().map(|&g| g as f64 * g as f64).sum();
        let got: Vec<f64> = std::thread::scope(|s| {
            let hs: Vec<_> = ThreadGroup::new(2)
                .into_iter()
                .map(|mut c| {
                    let full = full.clone();
                    s.spawn(move || {
                        let mut be = CpuBackend::new();
                        let local = whole.shard(2, c.rank() as usize).expect("tiny splits in two");
                        let mut model = Model::new(&mut be, local, 0, None);
                        model.state.grads = crate::model::tp::shard_params(full, &whole, &local);
                        let x = grad_sumsq(&mut be, &model, &mut c, 1).expect("norm");
                        c.close();
                        x
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank")).collect()
        });
        for x in &got {
            assert!(((x - want) / want).abs() < 1e-12, "{x} vs {want}");
        }
        assert_eq!(got[0].to_bits(), got[1].to_bits(), "both ranks hold the same norm");
        let mut be = CpuBackend::new();
        let mut model = Model::new(&mut be, whole, 0, None);
        model.state.grads = full;
        assert!(((grad_sumsq(&mut be, &model, &mut OneRank, 1).expect("one rank") - want) / want).abs() < 1e-12);
    }

    /// The amaxes' maximum over the ranks where `over` says so (not for the second tensor here), and
    /// none where it says none (--amax-reduce none).
    #[test]
    fn amaxes_take_the_group_maximum_where_asked() {
        let (a, b) = (Site::new(0, Module::Qkv), Site::new(1, Module::Fc2));
        let out: Vec<(Vec<f32>, Vec<f32>)> = std::thread::scope(|s| {
            let hs: Vec<_> = ThreadGroup::new(2)
                .into_iter()
                .map(|mut c| {
                    s.spawn(move || {
                        let r = c.rank() as f32;
                        let mine = vec![((a, Role::Activation), 1.0 + r), ((b, Role::Gradient), 5.0 - r)];
                        let mut reduced = mine.clone();
                        reduce_amaxes(&mut reduced, &[true, false], &mut c, 1).expect("reduce");
                        let mut kept = mine.clone();
                        reduce_amaxes(&mut kept, &[false, false], &mut c, 1).expect("none");
                        c.close();
                        (reduced.iter().map(|x| x.1).collect(), kept.iter().map(|x| x.1).collect())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank")).collect()
        });
        assert_eq!(out[0], (vec![2.0, 5.0], vec![1.0, 5.0]));
        assert_eq!(out[1], (vec![2.0, 4.0], vec![2.0, 4.0]));
    }
}

//! Tensor parallelism in the Megatron layout: what each rank of a tensor-parallel group holds of
//! the model, and the all-reduce the forward and backward make across the group.
//!
//! - **qkv and fc1 are column-parallel**: rank r of T holds output rows of their weights (and
//!   biases): the query heads [r·NH/T, (r+1)·NH/T), the key and value heads [r·KVH/T, (r+1)·KVH/T)
//!   (grouped-query attention keeps NH/KVH queries per key), fc1's features [r·F/T, (r+1)·F/T) —
//!   for the Llama family of gate and of up each, so that SwiGLU's gate and up of a feature are on
//!   one rank and the activation stays local.
//! - **proj and fc2 are row-parallel**: rank r holds the input columns that match its heads and
//!   features; each rank's GEMM gives a partial sum of the output, and the group all-reduces it in
//!   the forward. Their biases are replicated and added once, by the group's rank 0, in its GEMM.
//! - In the backward, the input gradient (dgrad) of each column-parallel GEMM is a partial sum
//!   over the ranks' heads or features: the group all-reduces it before the norm's backward.
//! - **Replicated**: the norms, the embedding, the lm_head and the row-parallel biases, with the
//!   same values and the same gradients on every rank of the group (their inputs are the
//!   all-reduced tensors), so the gradients need no reduction over the group.
//!
//! The all-reduce of a GEMM's BF16 output sums the ranks' values in f32, in rank order, and rounds
//! the sum to BF16 once (NCCL's BF16 all-reduce of two ranks rounds the same; with more it rounds
//! after each partial sum).

use super::Dims;
use super::params::{Layout, param_names};
use crate::backend::Backend;
use crate::collective::{Collective, CollectiveError};
use fp8scope_schemas::config::Arch;
use fp8scope_schemas::names::{Module, Role};

impl Dims {
    /// Rank `rank`'s share of these (whole-model) dims over `tp` ranks, or why the shape does not
    /// split: the attention heads, the key/value heads and the MLP's features must each divide by
    /// `tp`.
    pub fn shard(&self, tp: usize, rank: usize) -> Result<Dims, String> {
        if tp <= 1 {
            return Ok(*self);
        }
        let kv = if self.kvh == self.nh { String::new() } else { format!(", key/value heads {}", self.kvh) };
        if !self.nh.is_multiple_of(tp) || !self.kvh.is_multiple_of(tp) || !self.f.is_multiple_of(tp) {
            return Err(format!(
                "--tp {tp}: the model does not split over {tp} ranks: attention heads {}{kv} and MLP features {} must each be a multiple of {tp}",
                self.nh, self.f
            ));
        }
        Ok(Dims { nh: self.nh / tp, kvh: self.kvh / tp, f: self.f / tp, tp, tp_rank: rank, ..*self })
    }

    /// The whole model's dims (these, when not sharded).
    pub fn unsharded(&self) -> Dims {
        Dims { nh: self.nh * self.tp, kvh: self.kvh * self.tp, f: self.f * self.tp, tp: 1, tp_rank: 0, ..*self }
    }
}

/// Whether `role` of `module`'s GEMMs is the same tensor on every rank of the tensor-parallel group
/// (the activation entering a column-parallel GEMM, the gradient entering a row-parallel one), as
/// opposed to a shard of one logical tensor (every weight, the others).
pub fn replicated(module: Module, role: Role) -> bool {
    match role {
        Role::Activation => matches!(module, Module::Qkv | Module::Fc1),
        Role::Gradient => matches!(module, Module::Proj | Module::Fc2),
        _ => false,
    }
}

/// The rows [start, start + len) of a column-parallel weight (or its bias) that rank `r` holds, for
/// `module` of the whole-model dims `d` over `tp` ranks: the ranges in the order they are stacked.
fn column_rows(d: &Dims, module: Module, tp: usize, r: usize) -> Vec<(usize, usize)> {
    let part = |start: usize, total: usize| (start + r * total / tp, total / tp);
    match module {
        Module::Qkv => {
            let (q, kv) = (d.nh * d.hd, d.kvh * d.hd);
            vec![part(0, q), part(q, kv), part(q + kv, kv)]
        }
        Module::Fc1 => match d.arch {
            Arch::Gpt => vec![part(0, d.f)],
            Arch::Llama => vec![part(0, d.f), part(d.f, d.f)],
        },
        _ => Vec::new(),
    }
}

/// The columns [start, start + len) of a row-parallel weight (m rows of k) that rank `r` holds.
fn row_cols(d: &Dims, module: Module, tp: usize, r: usize) -> (usize, usize) {
    let k = d.linear(module).k;
    (r * k / tp, k / tp)
}

/// Rank `local.tp_rank`'s shard of every parameter of the whole model `full` (of dims `whole`), in
/// the flat order of `local`'s layout. Parameters that are not sharded are kept whole.
pub fn shard_params(full: Vec<Vec<f32>>, whole: &Dims, local: &Dims) -> Vec<Vec<f32>> {
    let (tp, r) = (local.tp, local.tp_rank);
    let lay = Layout::of(whole);
    let mut out = full;
    for l in 0..whole.l {
        for m in Module::ALL {
            let (w, b) = lay.linear(l, m);
            let ld = whole.linear(m);
            match m {
                Module::Qkv | Module::Fc1 => {
                    let rows = column_rows(whole, m, tp, r);
                    out[w] = rows.iter().flat_map(|&(s, n)| out[w][s * ld.k..(s + n) * ld.k].to_vec()).collect();
                    if let Some(b) = b {
                        out[b] = rows.iter().flat_map(|&(s, n)| out[b][s..s + n].to_vec()).collect();
                    }
                }
                Module::Proj | Module::Fc2 => {
                    let (c0, n) = row_cols(whole, m, tp, r);
                    out[w] = out[w].chunks(ld.k).flat_map(|row| row[c0..c0 + n].to_vec()).collect();
                }
            }
        }
    }
    debug_assert_eq!(out.iter().map(Vec::len).collect::<Vec<_>>(), super::param_sizes(local));
    out
}

/// Per parameter (flat order): whether it is sharded over the tensor-parallel group (a weight or a
/// column-parallel bias), so that its gradient's square sum is a share of the global norm's.
pub fn sharded_params(d: &Dims) -> Vec<bool> {
    let lay = Layout::of(d);
    let mut out = vec![false; param_names(d).len()];
    for l in 0..d.l {
        for m in Module::ALL {
            let (w, b) = lay.linear(l, m);
            out[w] = true;
            if let (Some(b), Module::Qkv | Module::Fc1) = (b, m) {
                out[b] = true;
            }
        }
    }
    out
}

/// The tensor-parallel group as the forward and backward use it: an all-reduce of a buffer. The
/// first collective that fails is kept (the step goes on without reducing; its results are not
/// used) and returned by [`TpLink::finish`].
pub struct TpLink<'a> {
    coll: &'a mut dyn Collective,
    error: Option<CollectiveError>,
}

impl<'a> TpLink<'a> {
    pub fn new(coll: &'a mut dyn Collective) -> Self {
        TpLink { coll, error: None }
    }

    /// Whether the group has more than one rank.
    pub fn active(&self) -> bool {
        self.coll.world_size() > 1
    }

    /// This rank's index in the group.
    pub fn rank(&self) -> u32 {
        self.coll.rank()
    }

    /// `buf` ← the sum over the group's ranks, in rank order, rounded to BF16 (a GEMM's output).
    pub fn all_reduce_bf16<B: Backend>(&mut self, be: &mut B, buf: &mut B::Buf) {
        if !self.active() || self.error.is_some() {
            return;
        }
        let n = be.len(buf);
        let mut host = be.download(buf, 0, n, 1);
        if let Err(e) = self.coll.all_reduce_sum_f32(&mut host) {
            self.error = Some(e);
            return;
        }
        for x in host.iter_mut() {
            *x = half::bf16::from_f32(*x).to_f32();
        }
        be.overwrite(buf, &host);
    }

    /// The first collective that failed, if any.
    pub fn finish(self) -> Result<(), CollectiveError> {
        self.error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::param_sizes;

    fn dims(arch: Arch, nh: usize, kvh: usize) -> Dims {
        let (c, hd) = (nh * 4, 4);
        Dims { arch, v: 16, c, f: 12, nh, kvh, hd, l: 2, b: 1, t: 2, n: 2, causal: true, tied: false, rope_theta: 1e4, eps: 1e-5, tp: 1, tp_rank: 0 }
    }

    /// Each weight's elements numbered by (row, column); the shards of every rank, put back
    /// together in the layout's order, are the whole weight, each element once.
    #[test]
    fn the_shards_of_every_rank_make_the_whole_model() {
        for (arch, nh, kvh, tp) in [(Arch::Gpt, 4, 4, 2), (Arch::Llama, 4, 2, 2), (Arch::Llama, 8, 4, 4)] {
            let whole = dims(arch, nh, kvh);
            let full: Vec<Vec<f32>> = param_sizes(&whole).iter().enumerate().map(|(p, &n)| (0..n).map(|i| (p * 100_000 + i) as f32).collect()).collect();
            let shards: Vec<Vec<Vec<f32>>> = (0..tp).map(|r| shard_params(full.clone(), &whole, &whole.shard(tp, r).expect("divides"))).collect();
            let lay = Layout::of(&whole);
            let sharded = sharded_params(&whole);
            for (p, whole_p) in full.iter().enumerate() {
                if !sharded[p] {
                    assert!(shards.iter().all(|s| &s[p] == whole_p), "{arch:?} param {p} replicated");
                    continue;
                }
                let mut got: Vec<f32> = shards.iter().flat_map(|s| s[p].clone()).collect();
                got.sort_by(f32::total_cmp);
                assert_eq!(&got, whole_p, "{arch:?} param {p}: every element once");
            }
            // qkv of rank 1: its first row is query head nh/tp's first row, then its first key row.
            let (w, _) = lay.linear(0, Module::Qkv);
            let (c, hd) = (whole.c, whole.hd);
            let r1 = &shards[1][w];
            assert_eq!(r1[0], full[w][(nh / tp) * hd * c]);
            assert_eq!(r1[(nh / tp) * hd * c], full[w][(nh * hd + (kvh / tp) * hd) * c]);
            // fc2 of rank 1: row 0 starts at column F/tp.
            let (w, _) = lay.linear(0, Module::Fc2);
            assert_eq!(shards[1][w][0], full[w][whole.f / tp]);
            if arch == Arch::Llama {
                // fc1 of rank 1: gate rows [F/tp, 2F/tp), then up rows [F + F/tp, …).
                let (w, _) = lay.linear(0, Module::Fc1);
                let f = whole.f;
                assert_eq!(shards[1][w][0], full[w][(f / tp) * c]);
                assert_eq!(shards[1][w][(f / tp) * c], full[w][(f + f / tp) * c]);
            }
        }
    }

    /// Two ranks' buffers all-reduced: each element the f64 sum of the two rounded once to BF16 (the
    /// f32 sum of two BF16 values is exact but for the rare carry past f32's 24 bits, and BF16's
    /// rounding of it is then the reference's); a group of one leaves the buffer as it is.
    #[test]
    fn the_all_reduce_is_the_sum_rounded_once_to_bf16() {
        use crate::backend::cpu::CpuBackend;
        use crate::collective::{OneRank, ThreadGroup};
        let vals = |r: usize| -> Vec<f32> { (0..64).map(|i| half::bf16::from_f32(((i * 7 + r * 13) % 29) as f32 * 0.37 - 5.1).to_f32()).collect() };
        let out: Vec<Vec<f32>> = std::thread::scope(|s| {
            let hs: Vec<_> = ThreadGroup::new(2)
                .into_iter()
                .map(|mut c| {
                    s.spawn(move || {
                        let mut be = CpuBackend::new();
                        let mut buf = vals(c.rank() as usize);
                        let mut link = TpLink::new(&mut c);
                        link.all_reduce_bf16(&mut be, &mut buf);
                        link.finish().expect("all-reduce");
                        c.close();
                        buf
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank")).collect()
        });
        let want: Vec<f32> = vals(0).iter().zip(vals(1)).map(|(&a, b)| half::bf16::from_f64(a as f64 + b as f64).to_f32()).collect();
        assert_eq!(out[0], want);
        assert_eq!(out[1], want);
        let mut one = vals(0);
        TpLink::new(&mut OneRank).all_reduce_bf16(&mut CpuBackend::new(), &mut one);
        assert_eq!(one, vals(0));
    }

    #[test]
    fn shapes_that_do_not_divide_are_refused_in_one_line() {
        let d = dims(Arch::Llama, 4, 2);
        assert_eq!(d.shard(2, 1).expect("divides").unsharded().nh, 4);
        let e = d.shard(4, 0).unwrap_err();
        assert!(e.contains("key/value heads 2") && e.contains("multiple of 4") && !e.contains('\n'), "{e}");
        assert!(dims(Arch::Gpt, 4, 4).shard(3, 0).unwrap_err().contains("attention heads 4"));
    }

    #[test]
    fn replicated_inputs_are_the_column_parallel_activations_and_the_row_parallel_gradients() {
        let rep: Vec<(Module, Role)> =
            Module::ALL.iter().flat_map(|&m| [Role::Activation, Role::Weight, Role::Gradient].map(|r| (m, r))).filter(|&(m, r)| replicated(m, r)).collect();
        assert_eq!(rep, vec![(Module::Qkv, Role::Activation), (Module::Proj, Role::Gradient), (Module::Fc1, Role::Activation), (Module::Fc2, Role::Gradient)]);
    }
}

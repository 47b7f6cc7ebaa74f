//! The weights' FP8 casts of a step in one launch (`kernels/cast.cu`: `cast_weights_l{L}_f{F}`,
//! over a multi-tensor table): [`crate::backend::Backend::cast_weights`], before the forward's
//! first GEMM. The CPU reference casts each weight at its GEMM (`layers/matmul.rs`), as this
//! backend did before: each weight's fprop cast it with the dual kernel (`cast.rs`), writing W
//! for the fprop and keeping Wᵀ for the dgrad, one launch a weight, 112 a llama-1b step.
//!
//! Here every weight whose cast is known before the forward (an FP8 cast with a given scale, no
//! fault, no shadow GEMM beside it) is cast by one launch, which gives each weight the blocks its
//! own launch would have had (`cast.rs`: `tiled_cast_grid`): its codes, scale slot, statistics partials
//! and channel partials are that launch's bit for bit. W lands in a buffer of the site's own
//! ([`WeightCast`]), which the fprop takes ([`CudaBackend::cast_weight_taken`]) when its cast is
//! the one made here (same key, same statistics level); Wᵀ in the site's kept cast, as the fprop
//! would have left it. A weight cast otherwise (current scaling, BF16, a fault, a shadow GEMM, a
//! step whose plan differs) is cast at its GEMM as before.
//!
//! `FP8SCOPE_WEIGHT_CASTS=each` turns it off (each weight cast at its GEMM, as before), for a
//! side-by-side measurement in one binary; `batched` (the default) leaves it on.
//!
//! The statistics and channel partials wait for their batched reductions (`stat_batch.rs`,
//! `channels.rs`), which must not run before the launch that writes them: a launch takes the
//! weights registered since the last one as soon as the next one would start a new batch.

use super::cast::{self, CastKey, CastUse, level_code};
use super::multi_tensor::StepTables;
use super::{CAST_THREADS, CudaBackend, CudaError, DevBuf, STAT_FIELDS, cfg, fmt_code, grow, kernels, op_type};
use crate::backend::operands::operand_shapes;
use crate::backend::{GemmCall, OperandCast, OperandFault, ScaleSource, StatsLevel};
use cudarc::driver::{CudaSlice, PushKernelArg};
use fp8scope_schemas::names::{Gemm, Module, Role};
use std::collections::HashMap;

/// Words of an entry of the kernel's table (kernels/cast.cu: CW_WORDS); the layout is
/// [`Entry::words`]'s.
const WORDS: usize = 12;

/// A weight cast before the forward, for its site's fprop: the codes of W in its own layout.
pub(super) struct WeightCast {
    key: CastKey,
    codes: CudaSlice<u8>,
    slot: usize,
    level: StatsLevel,
    /// False once the fprop took it, or the step's reports were taken.
    live: bool,
}

/// The weight casts of the step, by site (layer, module), and the tables of its launches (one a
/// launch, so that from the second step on each is uploaded no more).
pub(super) struct WeightCasts {
    /// Whether the weights are cast before the forward at all (`FP8SCOPE_WEIGHT_CASTS`).
    pub batched: bool,
    by_site: HashMap<(u32, Module), WeightCast>,
    tables: StepTables,
    /// Fprops that took their weight's cast from here so far (`weight_casts_taken`).
    taken: u64,
}

impl WeightCasts {
    /// The weights' casts, batched (one launch a step) or each on its own.
    pub fn new(batched: bool) -> WeightCasts {
        WeightCasts { batched, by_site: HashMap::new(), tables: StepTables::default(), taken: 0 }
    }
}

/// Whether the weights' casts are batched, as `FP8SCOPE_WEIGHT_CASTS` says: `batched` (or unset)
/// or `each` (None: unset).
pub(super) fn batched(value: Option<&str>) -> Result<bool, CudaError> {
    match value.map(str::trim) {
        None | Some("batched") => Ok(true),
        Some("each") => Ok(false),
        Some(v) => Err(CudaError::Setting(format!(
            "FP8SCOPE_WEIGHT_CASTS={v}: expected batched (one launch for the step's FP8 weights, the default) or each (each weight cast at its GEMM)"
        ))),
    }
}

/// One weight of a launch (kernels/cast.cu: CW_* words).
struct Entry {
    blocks: usize,
    rows: usize,
    cols: usize,
    scale: f32,
    /// x, out, out_t, partials, ch_sq, ch_amax, slot (0: none).
    ptrs: [u64; 7],
}

impl Entry {
    fn words(&self, first: usize) -> [u64; WORDS] {
        let [x, out, out_t, parts, ch_sq, ch_amax, slot] = self.ptrs;
        let shape = self.rows as u64 | ((self.cols as u64) << 32);
        [first as u64, self.blocks as u64, shape, u64::from(self.scale.to_bits()), x, out, out_t, parts, ch_sq, ch_amax, slot, 0]
    }
}

/// A launch being gathered: its statistics level and format, and its entries.
struct Launch {
    level: StatsLevel,
    fmt: i32,
    entries: Vec<Entry>,
}

/// The scale of a weight cast this module takes: an FP8 cast of a given scale, no fault, no
/// shadow GEMM (which casts the weight again, from the buffer).
fn given_scale(call: &GemmCall) -> Option<f32> {
    match call.cast_b {
        OperandCast::Fp8Tensor { scale: ScaleSource::Given { scale, .. }, .. }
            if call.id.gemm == Gemm::Fprop && !call.shadow && call.fault_b == OperandFault::NONE =>
        {
            Some(scale)
        }
        _ => None,
    }
}

impl CudaBackend {
    /// See [`crate::backend::Backend::cast_weights`]: the FP8 weights of given scales cast in one
    /// launch a statistics level and format (one, in a step), the others left to their GEMMs.
    pub(super) fn cast_weights_impl(&mut self, calls: &[(GemmCall, &DevBuf)]) -> Result<(), CudaError> {
        let mut launch: Option<Launch> = None;
        self.weights.tables.restart();
        for (call, w) in calls {
            let Some(scale) = given_scale(call) else { continue };
            let ty = op_type(call.cast_b)?;
            let fmt = fmt_code(ty);
            let (rows, cols) = operand_shapes(Gemm::Fprop, call.dims)[1];
            if w.is_bf16() || w.len() != rows * cols || rows == 0 || cols == 0 {
                continue;
            }
            // Every weight of the forward's GEMMs is recorded (`linear`'s report), at the step's level.
            let level = call.stats;
            let channels = level >= StatsLevel::Channels;
            let grid = self.tiled_cast_grid(rows, cols, None, channels, level) as usize;
            // With channels the grid is the one whose channel slots `column_targets` reserves.
            let chunks = if channels { cast::channel_slots(rows, cols, grid, None) } else { 0 };
            // A launch of another kind, or one whose partials the next weight's would send to
            // their reduction before it ran, goes first.
            let fits = |me: &Self, l: &Launch| l.level == level && l.fmt == fmt && me.stat_room(grid) && (!channels || me.channel_room(cols, chunks));
            if let Some(l) = launch.take_if(|l| !fits(self, l)) {
                self.launch_weight_casts(l)?;
            }
            let at = CastUse { site: (call.id.layer, call.id.module), role: Role::Weight, transposed: false, share: true, column_sums: false };
            let key = CastKey::new(self.ptr(w.raw()), rows, cols, fmt, call.cast_b, call.fault_b);
            let slot = self.alloc_slot()?;
            let out_t = self.keep_cast(at, key, rows * cols, Some(slot), true, level, false)?;
            let out = self.weight_codes(at.site, key, rows * cols, slot, level)?;
            let rec_ptr = self.ptr(&self.records) + (slot * STAT_FIELDS * 8) as u64;
            let (parts, _) = self.deferred_stats(grid as u32, level, Some(slot), rec_ptr)?;
            let (fused, _, _) = self.column_targets(rows, cols, None, level, channels.then_some(slot), false)?;
            let (ch_sq, ch_amax) = fused.map(|t| (t.part_sq, t.part_amax)).unwrap_or((0, 0));
            let ptrs = [self.ptr(w.raw()), out, out_t, parts, ch_sq, ch_amax, self.slot_ptr(Some(slot))];
            launch.get_or_insert_with(|| Launch { level, fmt, entries: Vec::new() }).entries.push(Entry { blocks: grid, rows, cols, scale, ptrs });
        }
        if let Some(l) = launch {
            self.launch_weight_casts(l)?;
        }
        Ok(())
    }

    /// The site's buffer for W's codes, grown to `bytes` and holding the cast of `key` from now on.
    fn weight_codes(&mut self, site: (u32, Module), key: CastKey, bytes: usize, slot: usize, level: StatsLevel) -> Result<u64, CudaError> {
        if !self.weights.by_site.contains_key(&site) {
            let codes = self.stream.alloc_zeros(bytes)?;
            self.weights.by_site.insert(site, WeightCast { key, codes, slot, level, live: false });
        }
        let stream = self.stream.clone();
        let c = self.weights.by_site.get_mut(&site).expect("inserted above");
        grow(&stream, &mut c.codes, bytes)?;
        (c.key, c.slot, c.level, c.live) = (key, slot, level, true);
        Ok(self.ptr(&self.weights.by_site[&site].codes))
    }

    /// One launch of `cast_weights_l{L}_f{F}` over `l`'s entries, from the step's next table.
    fn launch_weight_casts(&mut self, l: Launch) -> Result<(), CudaError> {
        let name = kernels::cast_weights_kernel(level_code(l.level), l.fmt as usize)
            .ok_or_else(|| CudaError::Unsupported("a BF16 weight in the FP8 weights' launch".into()))?;
        let mut host = Vec::with_capacity(l.entries.len() * WORDS);
        let mut first = 0;
        for e in &l.entries {
            host.extend_from_slice(&e.words(first));
            first += e.blocks;
        }
        let stream = self.stream.clone();
        let t = self.weights.tables.upload_next(&stream, host, l.entries.len(), first)?;
        self.span("gemm.cast_weights", |me| launch!(me, name, cfg((t.blocks, 1, 1), CAST_THREADS), t.table, t.count))
    }

    /// The codes of W and their slot, if the weight of `at` was cast before the forward as a cast
    /// of `key` at `level` would cast it (`report`: the fprop records it, as every forward GEMM
    /// does); the fprop then takes them instead of casting.
    pub(super) fn cast_weight_taken(&mut self, key: CastKey, at: CastUse, level: StatsLevel, report: bool) -> Option<(u64, usize)> {
        if at.role != Role::Weight || at.transposed || !at.share || !report {
            return None;
        }
        let c = self.weights.by_site.get_mut(&at.site)?;
        if !(c.live && c.key == key && c.level == level) {
            return None;
        }
        c.live = false;
        let slot = c.slot;
        self.weights.taken += 1;
        Some((self.ptr(&self.weights.by_site[&at.site].codes), slot))
    }

    /// How many fprops took their weight's cast from the launch before the forward so far: for the
    /// tests that hold both ways to the same bits.
    pub fn weight_casts_taken(&self) -> u64 {
        self.weights.taken
    }

    /// Whether the step's FP8 weights are cast before the forward (`FP8SCOPE_WEIGHT_CASTS`); the
    /// tests set it to compare both ways in one process.
    pub fn set_weight_casts_batched(&mut self, batched: bool) {
        self.weights.batched = batched;
    }

    /// Ends the step's weight casts (their slots are about to be reused).
    pub(super) fn expire_weight_casts(&mut self) {
        for c in self.weights.by_site.values_mut() {
            c.live = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::Family;
    use super::*;

    #[test]
    fn the_table_is_laid_out_as_the_kernel_reads_it() {
        for (name, value) in [
            ("CW_WORDS", WORDS),
            ("CW_START", 0),
            ("CW_BLOCKS", 1),
            ("CW_SHAPE", 2),
            ("CW_SCALE", 3),
            ("CW_X", 4),
            ("CW_OUT", 5),
            ("CW_OUT_T", 6),
            ("CW_PARTS", 7),
            ("CW_CH_SQ", 8),
            ("CW_CH_AMAX", 9),
            ("CW_SLOT", 10),
        ] {
            assert_eq!(Family::Cast.define(name), value, "{name}");
        }
        let e = Entry { blocks: 7, rows: 3072, cols: 2048, scale: 0.5, ptrs: [10, 11, 12, 13, 14, 15, 16] };
        let w = e.words(40);
        assert_eq!(w[..4], [40, 7, 3072 | (2048 << 32), u64::from(0.5f32.to_bits())]);
        assert_eq!(w[4..11], [10, 11, 12, 13, 14, 15, 16]);
    }

    #[test]
    fn the_switch_takes_batched_or_each_and_refuses_anything_else() {
        assert!(batched(None).unwrap());
        assert!(batched(Some("batched")).unwrap());
        assert!(!batched(Some(" each ")).unwrap());
        let e = batched(Some("all")).unwrap_err().to_string();
        assert!(e.contains("FP8SCOPE_WEIGHT_CASTS=all") && e.contains("batched") && e.contains("each"), "{e}");
    }

    #[test]
    fn only_fp8_fprops_of_a_given_scale_without_fault_or_shadow_are_taken() {
        use crate::backend::{GemmId, LinearDims};
        use crate::fp8::Fp8Format;
        let dims = LinearDims { n: 8, k: 4, m: 6 };
        let given = OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Given { scale: 2.0, amax_used: 1.0 } };
        let call = |gemm, cast_b, shadow, fault_b| GemmCall { cast_b, shadow, fault_b, ..GemmCall::bf16(GemmId { layer: 1, module: Module::Fc1, gemm }, dims) };
        assert_eq!(given_scale(&call(Gemm::Fprop, given, false, OperandFault::NONE)), Some(2.0));
        assert_eq!(given_scale(&call(Gemm::Dgrad, given, false, OperandFault::NONE)), None);
        assert_eq!(given_scale(&call(Gemm::Fprop, given, true, OperandFault::NONE)), None);
        let fault = OperandFault { scale_mult: 4.0, ..OperandFault::NONE };
        assert_eq!(given_scale(&call(Gemm::Fprop, given, false, fault)), None);
        assert_eq!(given_scale(&call(Gemm::Fprop, OperandCast::Bf16, false, OperandFault::NONE)), None);
        let current = OperandCast::Fp8Tensor { format: Fp8Format::E4M3, scale: ScaleSource::Current { margin: 0 } };
        assert_eq!(given_scale(&call(Gemm::Fprop, current, false, OperandFault::NONE)), None);
    }
}

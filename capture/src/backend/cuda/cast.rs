//! GEMM operand casts on the GPU: picking the cast kernel of `kernels/cast.cu` and its grid, and
//! casting each operand once per step where the model uses it twice.
//!
//! Every tensor a linear layer multiplies appears in two of its three GEMMs, once in its own layout
//! and once transposed (cuBLASLt's FP8 GEMMs take only the TN layout): the activation X in fprop
//! and (as Xᵀ) in wgrad, the weight W in fprop and (as Wᵀ) in dgrad, the gradient dY in dgrad and
//! (as dYᵀ) in wgrad. For FP8, the first use casts with the *dual* kernel, which writes both
//! layouts from one read, and keeps the transpose; for BF16 (which cuBLASLt multiplies in any
//! layout) the first use writes its own layout once, into the kept buffer, and the second use reads
//! it transposed. The kept cast carries the cast's scale and statistics slot, and the second use
//! takes it instead of casting again — when it would cast exactly the same way (same source
//! buffer, shape, format, scale, planted fault, statistics no richer). The model guarantees what
//! makes this sound: within a step, the operand of a given role at a given site is one tensor.
//! Kept casts expire when the step's reports are taken. The FP8 weights of delayed scaling are
//! cast before the forward, all in one launch (`weight_casts.rs`), which leaves each fprop its W
//! and each dgrad its kept Wᵀ, the codes and statistics of the dual cast here.

use super::blas::{OpType, Operand};
use super::channels::ChannelTarget;
use super::kernels::{self, CastLayout};
use super::{
    CAST_GRID_MAX, CAST_THREADS, CudaBackend, CudaError, DevBuf, PendingGemm, PendingOp, SLOT_FLOATS, STAT_FIELDS, Side, cfg, fmt_code, grid_for, grow, op_type,
};
use crate::backend::operands::{operand_shapes, outlier_indices};
use crate::backend::{CastReport, GemmCall, OperandCast, OperandFault, ScaleSource, StatsLevel};
use cudarc::driver::{CudaSlice, PushKernelArg};
use fp8scope_schemas::names::{Gemm, Module, Role};

/// Rows and columns of a tile of the transposed and dual casts (kernels/cast.cu: TILE).
const CAST_TILE: usize = 64;

/// Blocks of a cast kernel at statistics level `level` that fit on one SM (kernels/cast.cu:
/// CAST_MIN_BLOCKS, which caps the kernels' registers for it).
fn cast_blocks_per_sm(level: usize) -> usize {
    match level {
        0 => 4,
        1 => 3,
        _ => 2,
    }
}

/// Blocks for a cast of `rows × cols` at statistics level `level` on `sms` SMs (`most` caps them;
/// 0: the defaults). A straight cast takes one block per 4096 values (16 per thread), up to 8 per
/// SM; a transposed or dual cast one per 64 × 64 tile, up to as many as are resident at once
/// (each block strides over the tiles, loading its next tile while it casts the current one), and
/// with `channels` (it sums the per-channel statistics) a multiple of the column tiles where that
/// idles few blocks ([`column_aligned`]).
fn cast_grid(rows: usize, cols: usize, transpose: bool, channels: bool, level: usize, sms: usize, most: usize) -> u32 {
    let g = if transpose {
        tiled_grid(rows, cols, channels, if most > 0 { most } else { sms * cast_blocks_per_sm(level) }, most > 0)
    } else {
        (rows * cols).div_ceil(4096).min(if most > 0 { most } else { 8 * sms })
    };
    g.clamp(1, CAST_GRID_MAX) as u32
}

/// Blocks of a computed-source cast of launch kind `kind`: as [`cast_grid`]'s tiled casts, as many
/// resident on an SM as the plain casts' (kernels/cast.cu caps their registers alike). With
/// SRC_DSWIGLU_PAIRS the blocks stride over the tiles of the gate half, each a run of its own
/// (never column-aligned: [`channel_slots`]); with SRC_DSWIGLU_PAIR_RUNS over the same tiles, the
/// grid aligned to the gate half's column tiles as a plain cast's is to its own.
fn cast_src_grid(rows: usize, cols: usize, kind: i32, channels: bool, level: usize, sms: usize, most: usize) -> u32 {
    let resident = if most > 0 { most } else { sms * cast_blocks_per_sm(level) };
    let g = if kind == SRC_DSWIGLU_PAIRS {
        tiled_grid(rows, cols / 2, false, resident, true)
    } else if kind == SRC_DSWIGLU_PAIR_RUNS {
        tiled_grid(rows, cols / 2, channels, resident, most > 0)
    } else {
        tiled_grid(rows, cols, channels, resident, most > 0)
    };
    g.clamp(1, CAST_GRID_MAX) as u32
}

/// A tiled cast's blocks: one per tile, up to `resident`; with `channels`, and unless the count
/// was `given`, a multiple of the column tiles where that idles few blocks ([`column_aligned`]).
fn tiled_grid(rows: usize, cols: usize, channels: bool, resident: usize, given: bool) -> usize {
    let g = (rows.div_ceil(CAST_TILE) * cols.div_ceil(CAST_TILE)).min(resident);
    if channels && !given { column_aligned(g, cols.div_ceil(CAST_TILE)) } else { g }
}

/// `g` blocks rounded down to a multiple of `tiles_c` column tiles when that leaves at most 1/32 of
/// them idle (384 of an H200's 396 at 2048, 3072, 4096 or 8192 columns), else `g`. With such a
/// grid each block of kernels/cast.cu's `cast_transposed` strides down one column tile, and sums
/// its per-channel partials over all its tiles, writing them once instead of once a tile; the
/// reduction then reads `g / tiles_c` slots a column instead of one per row tile
/// ([`channel_slots`]).
fn column_aligned(g: usize, tiles_c: usize) -> usize {
    let aligned = g / tiles_c * tiles_c;
    if aligned > 0 && (g - aligned) * 32 <= g { aligned } else { g }
}

/// The channel partials' slots a column takes in a tiled cast of `rows × cols` over `grid` blocks
/// (at most one a tile). kernels/cast.cu's `cast_transposed` writes a slot at the end of each run
/// of a block's consecutive tiles in one column tile, into the row tile of the run's first tile:
/// a run is a block's every tile when the grid is a multiple of the column tiles (its first row
/// tile is then `block / tiles_c`, below `grid / tiles_c`), else one tile (every row tile), as
/// always for a computed source of launch kind SRC_DSWIGLU_PAIRS (`src`).
pub(super) fn channel_slots(rows: usize, cols: usize, grid: usize, src: Option<i32>) -> usize {
    // SRC_DSWIGLU_PAIR_RUNS strides over the gate half's column tiles.
    let tiles_c = if src == Some(SRC_DSWIGLU_PAIR_RUNS) { (cols / 2).div_ceil(CAST_TILE) } else { cols.div_ceil(CAST_TILE) };
    if grid.is_multiple_of(tiles_c) && src != Some(SRC_DSWIGLU_PAIRS) { grid / tiles_c } else { rows.div_ceil(CAST_TILE) }
}

/// Where a cast is for: the GEMM site and the operand's role in it, whether the GEMM takes it
/// transposed, and whether its cast may be shared with the site's other GEMM (not for the BF16
/// shadow GEMMs, which cast the same operands differently).
#[derive(Clone, Copy)]
pub(super) struct CastUse {
    pub site: (u32, Module),
    pub role: Role,
    pub transposed: bool,
    pub share: bool,
    /// Sum the columns of the BF16 codes as they are cast, when the cast is kept in its own
    /// layout (a gradient dY whose bias gradient the site's wgrad takes next: `GemmCall::a_column_sums`).
    pub column_sums: bool,
}

/// What a cast reads: the f32 values of a buffer, or values computed as they are read
/// (`kernels/cast_src.cuh`: CastSrc, one of its SRC_* kinds) from the saved inputs of the layer that
/// would otherwise write them to a buffer first: an activation function's (`Computed`, from BF16
/// inputs) or a normalization's (`Normed`, from its f32 input and saved row statistics); `like` is
/// that buffer, left unwritten, whose address keys the cast as its own would (so the site's other
/// GEMM, reading `like`, takes the kept cast).
#[derive(Clone, Copy)]
pub(super) enum CastInput<'a> {
    Buf(&'a CudaSlice<f32>),
    /// A buffer that holds BF16 values already, taken as the BF16 operand as it is (no cast, no
    /// fault, nothing recorded): the lm_head's backward reads the cross-entropy's BF16 gradient so.
    Held(&'a DevBuf),
    Computed {
        kind: i32,
        h: &'a DevBuf,
        b: Option<&'a DevBuf>,
        like: &'a DevBuf,
    },
    Normed(NormSrc<'a>),
}

/// A normalization computed as its output is cast (kernels/cast_src.cuh: SRC_RMSNORM, SRC_LAYERNORM):
/// its input `x` (rows × cols), gain and (LayerNorm) shift per column, rstd and (LayerNorm) mean
/// per row, all f32; `like` stands for its unwritten output.
#[derive(Clone, Copy)]
pub(super) struct NormSrc<'a> {
    pub x: &'a DevBuf,
    pub gain: &'a DevBuf,
    pub shift: Option<&'a DevBuf>,
    pub rstd: &'a DevBuf,
    pub mean: Option<&'a DevBuf>,
    pub like: &'a DevBuf,
}

impl NormSrc<'_> {
    /// Its CastSrc kind: LayerNorm with a mean, RMSNorm without.
    fn kind(&self) -> i32 {
        if self.mean.is_some() { SRC_LAYERNORM } else { SRC_RMSNORM }
    }

    /// Whether its inputs are what the kernels read: every buffer f32, a shift exactly with a mean.
    pub(super) fn computable(&self) -> bool {
        let f32s = [Some(self.x), Some(self.gain), self.shift, Some(self.rstd), self.mean].into_iter().flatten().all(|b| !b.is_bf16());
        f32s && self.shift.is_some() == self.mean.is_some()
    }
}

/// CastSrc kinds (kernels/cast_src.cuh: SRC_*).
pub(super) const SRC_SWIGLU: i32 = 1;
pub(super) const SRC_DSWIGLU: i32 = 2;
pub(super) const SRC_GELU: i32 = 3;
pub(super) const SRC_DGELU: i32 = 4;
/// SRC_DSWIGLU cast by pairs of tiles, a gate tile and its up tile from one read of the inputs
/// (kernels/cast_src.cuh: SRC_DSWIGLU_PAIRS): the launch kind of SRC_DSWIGLU when each half of the
/// operand is a whole number of tiles ([`launch_kind`]).
const SRC_DSWIGLU_PAIRS: i32 = 5;
/// SRC_DSWIGLU_PAIRS with its channel partials added over a block's run of tiles, as a plain
/// cast's are, instead of leaving once a tile (kernels/cast_src.cuh: SRC_DSWIGLU_PAIR_RUNS): fewer
/// slots to write and reduce. Taken with `FP8SCOPE_PAIR_RUNS=1` ([`pair_runs_from`]); off by
/// default, since on an H100 it was no faster (bench/BENCHMARKS.md, thirty-fourth pass).
const SRC_DSWIGLU_PAIR_RUNS: i32 = 9;
/// A normalization's output (kernels/cast_src.cuh: SRC_RMSNORM, SRC_LAYERNORM; [`NormSrc`]).
const SRC_RMSNORM: i32 = 6;
const SRC_LAYERNORM: i32 = 7;
/// A tensor held in a BF16 buffer, each value widened to f32 as it is read (kernels/cast.cu:
/// SRC_BF16): the attention's output, GPT's dqkv (`bf16_operands.rs`).
pub(super) const SRC_BF16: i32 = 8;

/// Whether the tiled BF16 cast of launch kind `src` (None: a buffer's values) can sum its codes'
/// columns (kernels/cast.cu: COLSUM, the kinds a gradient with a bias is cast as).
fn column_sums_of(src: Option<i32>) -> bool {
    matches!(src, None | Some(SRC_DGELU) | Some(SRC_BF16))
}

/// The kernel kind a computed source of `kind` casting `cols` columns launches as (`pair_runs`:
/// the paired kind whose channel partials add up over runs of tiles).
fn launch_kind(kind: i32, cols: usize, pair_runs: bool) -> i32 {
    match kind == SRC_DSWIGLU && cols.is_multiple_of(2 * CAST_TILE) {
        true if pair_runs => SRC_DSWIGLU_PAIR_RUNS,
        true => SRC_DSWIGLU_PAIRS,
        false => kind,
    }
}

/// Whether SwiGLU's backward takes SRC_DSWIGLU_PAIR_RUNS, as `FP8SCOPE_PAIR_RUNS` says: 1, or 0
/// (or unset) for SRC_DSWIGLU_PAIRS.
pub(super) fn pair_runs_from(value: Option<&str>) -> Result<bool, CudaError> {
    match value.map(str::trim) {
        None | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(CudaError::Setting(format!(
            "FP8SCOPE_PAIR_RUNS={v}: expected 1 (SwiGLU's backward cast adds its channel partials over runs of tiles) or 0 (one tile a run, the default)"
        ))),
    }
}

/// Whether the cast kernels of a computed source take `kind` for an operand of `cols` columns from
/// `h` and `b`: BF16 inputs (the kernels load 4 BF16 values at once) and rows (of each half, for
/// SwiGLU's backward) of a multiple of 4 values.
pub(super) fn computable(kind: i32, cols: usize, h: &DevBuf, b: Option<&DevBuf>) -> bool {
    let width = if kind == SRC_DSWIGLU { cols / 2 } else { cols };
    let even = kind != SRC_DSWIGLU || cols.is_multiple_of(2);
    h.is_bf16() && b.is_none_or(|b| b.is_bf16()) && even && width % 4 == 0
}

impl CastInput<'_> {
    /// The profiler's name for a cast of this input: `gemm.cast`, or for a computed source
    /// `gemm.cast_<kind>` (so that a profile shows what each computed cast costs).
    pub(super) fn span_name(&self) -> &'static str {
        match *self {
            CastInput::Buf(_) => "gemm.cast",
            CastInput::Held(_) => "gemm.operand_held",
            CastInput::Computed { kind: SRC_SWIGLU, .. } => "gemm.cast_swiglu",
            CastInput::Computed { kind: SRC_DSWIGLU, .. } => "gemm.cast_dswiglu",
            CastInput::Computed { kind: SRC_GELU, .. } => "gemm.cast_gelu",
            CastInput::Computed { kind: SRC_BF16, .. } => "gemm.cast_bf16",
            CastInput::Computed { .. } => "gemm.cast_dgelu",
            CastInput::Normed(n) if n.mean.is_some() => "gemm.cast_layernorm",
            CastInput::Normed(_) => "gemm.cast_rmsnorm",
        }
    }

    /// For a computed source cast as `cols` columns, its kernel's kind ([`launch_kind`]).
    fn launch_kind(&self, cols: usize, pair_runs: bool) -> Option<i32> {
        match *self {
            CastInput::Computed { kind, .. } => Some(launch_kind(kind, cols, pair_runs)),
            CastInput::Normed(n) => Some(n.kind()),
            CastInput::Buf(_) | CastInput::Held(_) => None,
        }
    }

    /// The computed source's inputs in the kernel's order (h, b, gain, shift, rstd, mean), 0 for
    /// those its kind does not read.
    fn src_ptrs(&self, be: &CudaBackend) -> [u64; 6] {
        let p = |b: Option<&DevBuf>| b.map(|b| be.ptr(b.raw())).unwrap_or(0);
        match *self {
            CastInput::Buf(_) | CastInput::Held(_) => [0; 6],
            CastInput::Computed { h, b, .. } => [p(Some(h)), p(b), 0, 0, 0, 0],
            CastInput::Normed(n) => [0, 0, p(Some(n.gain)), p(n.shift), p(Some(n.rstd)), p(n.mean)],
        }
    }

    /// The computed source's inputs checked against the cast's rows × cols.
    fn check(&self, rows: usize, cols: usize) -> Result<(), CudaError> {
        if let CastInput::Normed(n) = *self {
            let lens = (n.x.len(), n.gain.len(), n.shift.map(|b| b.len()), n.rstd.len(), n.mean.map(|b| b.len()));
            let want = (rows * cols, cols, n.shift.map(|_| cols), rows, n.mean.map(|_| rows));
            if !n.computable() || lens != want {
                return Err(CudaError::Unsupported(format!(
                    "a normalization computed in the cast of {rows} x {cols}: f32 inputs of (x, gain, shift, rstd, mean) = {want:?} values needed, {lens:?} given"
                )));
            }
            return Ok(());
        }
        let CastInput::Computed { kind, h, b, .. } = *self else { return Ok(()) };
        let n = rows * cols;
        let (want_h, want_b) = match kind {
            SRC_SWIGLU => (2 * n, None),
            SRC_DSWIGLU if cols.is_multiple_of(2) => (n, Some(n / 2)),
            SRC_GELU => (n, None),
            SRC_DGELU => (n, Some(n)),
            SRC_BF16 => (n, None),
            _ => return Err(CudaError::Unsupported(format!("computed cast source {kind} of {rows} x {cols}"))),
        };
        if !computable(kind, cols, h, b) {
            return Err(CudaError::Unsupported(format!(
                "computed cast source {kind} of {rows} x {cols}: needs BF16 inputs and rows of a multiple of 4 values"
            )));
        }
        let b_len = b.map(|b| b.len());
        if h.len() != want_h || b_len != want_b {
            return Err(CudaError::Unsupported(format!(
                "computed cast source {kind} of {rows} x {cols}: inputs of {} and {b_len:?} values, {want_h} and {want_b:?} needed",
                h.len()
            )));
        }
        Ok(())
    }
}

/// The scale a cast multiplies by, bit for bit.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ScaleKey {
    None,
    Given(u32),
    Current(i32),
}

/// What decides a cast's codes and statistics: equal keys cast equal bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct CastKey {
    src: u64,
    rows: usize,
    cols: usize,
    fmt: i32,
    scale: ScaleKey,
    scale_mult: u32,
    outlier_factor: u32,
    overflow_nan: bool,
}

impl CastKey {
    pub(super) fn new(src: u64, rows: usize, cols: usize, fmt: i32, how: OperandCast, fault: OperandFault) -> CastKey {
        let scale = match how {
            OperandCast::Fp8Tensor { scale: ScaleSource::Given { scale, .. }, .. } => ScaleKey::Given(scale.to_bits()),
            OperandCast::Fp8Tensor { scale: ScaleSource::Current { margin }, .. } => ScaleKey::Current(margin),
            _ => ScaleKey::None,
        };
        CastKey {
            src,
            rows,
            cols,
            fmt,
            scale,
            scale_mult: fault.scale_mult.to_bits(),
            outlier_factor: fault.outlier_factor.to_bits(),
            overflow_nan: fault.overflow_nan,
        }
    }
}

/// A cast kept from the GEMM that cast the operand for the site's other GEMM, which takes it
/// transposed: FP8 codes in the transposed layout (cuBLASLt's FP8 GEMMs read only the TN layout),
/// or BF16 values in the operand's own layout (`straight`), which a BF16 GEMM reads transposed.
pub(super) struct KeptCast {
    key: CastKey,
    codes: CudaSlice<u8>,
    /// The address of the codes when they are not in `codes`: the BF16 buffer a BF16 cast of it
    /// left as it is ([`CudaBackend::cast_bf16_as_is`]).
    held: Option<u64>,
    /// The scale (and, if `recorded`, statistics) slot of the cast.
    slot: Option<usize>,
    recorded: bool,
    level: StatsLevel,
    /// False once the step's reports are taken (the slots are reused then).
    live: bool,
    /// The codes lie in the operand's own layout (BF16), not transposed (FP8).
    straight: bool,
    /// The slots of the codes' column sums the cast wrote to `CudaBackend::column_sums` (kernels/cast.cu:
    /// tile_column_sums), when it summed them (a `straight` cast only).
    column_slots: Option<usize>,
}

/// Kept casts by (layer, module, role); one entry for all gradients (see [`CudaBackend::cast`]).
pub(super) type KeptCasts = std::collections::HashMap<(u32, Module, Role), KeptCast>;

pub(super) fn level_code(level: StatsLevel) -> usize {
    match level {
        StatsLevel::Amax => 0,
        StatsLevel::Cheap | StatsLevel::Channels => 1,
        StatsLevel::Full => 2,
    }
}

/// Where a use's kept cast lives. A gradient's two GEMMs (dgrad, then wgrad) run back to back, so
/// all sites share one kept gradient; activations and weights wait from the forward to the
/// backward, one per site.
fn kept_key(at: CastUse) -> (u32, Module, Role) {
    if at.role == Role::Gradient { (0, Module::Qkv, Role::Gradient) } else { (at.site.0, at.site.1, at.role) }
}

/// Whether each operand (a, b) of a GEMM of kind `gemm` is cast transposed for cuBLASLt's TN
/// layout.
pub(super) fn operands_transposed(gemm: Gemm) -> [bool; 2] {
    match gemm {
        Gemm::Fprop => [false, false],
        Gemm::Dgrad => [false, true],
        Gemm::Wgrad => [true, true],
    }
}

impl CudaBackend {
    /// The kept cast that a cast of `key` for `at` takes instead of casting, if there is one: the
    /// site's other GEMM cast the same tensor in the same way this step, with statistics at least
    /// as rich as a `report` at `level` needs.
    fn usable_kept(&self, key: CastKey, at: CastUse, level: StatsLevel, report: bool) -> Option<&KeptCast> {
        let k = self.kept.get(&kept_key(at))?;
        let same = k.live && k.key == key && (!report || (k.recorded && k.level >= level));
        (at.share && at.transposed && same).then_some(k)
    }

    /// Whether the model GEMM `call` (`Backend::gemm`) would take operand `operand` (0: a, 1: b),
    /// whose source is `x`, from a kept cast rather than read `x`. Not when a BF16 shadow GEMM
    /// runs beside it (the shadow casts `x` again), nor while an error is kept.
    pub(super) fn reuses_kept_cast_impl(&self, call: &GemmCall, operand: usize, x: &DevBuf) -> bool {
        if self.error.is_some() || call.shadow || operand > 1 {
            return false;
        }
        let (rows, cols) = operand_shapes(call.id.gemm, call.dims)[operand];
        let at = CastUse {
            site: (call.id.layer, call.id.module),
            role: call.id.gemm.operands()[operand],
            transposed: operands_transposed(call.id.gemm)[operand],
            share: true,
            column_sums: false,
        };
        let (how, fault) = if operand == 0 { (call.cast_a, call.fault_a) } else { (call.cast_b, call.fault_b) };
        let Ok(ty) = op_type(how) else { return false };
        // A BF16 buffer's cast is keyed by its own address, as an f32 buffer's is (`bf16_operands.rs`).
        let key = CastKey::new(self.ptr(x.raw()), rows, cols, fmt_code(ty), how, fault);
        self.usable_kept(key, at, call.stats, true).is_some()
    }

    /// Casts `x` (rows × cols, row-major) for a GEMM — transposed if `at.transposed` — into the
    /// scratch of `side`, or takes the site's kept cast of it. With `report`, the statistics land
    /// in a slot, returned for the step's report.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn cast(
        &mut self,
        x: CastInput,
        rows: usize,
        cols: usize,
        at: CastUse,
        how: OperandCast,
        fault: OperandFault,
        level: StatsLevel,
        report: bool,
        side: Side,
    ) -> Result<(Operand, Option<usize>), CudaError> {
        let ty = op_type(how)?;
        let fmt = fmt_code(ty);
        x.check(rows, cols)?;
        if let CastInput::Held(b) = x {
            // In its own layout: held transposed for a use that takes it transposed.
            if ty.is_fp8() || fault != OperandFault::NONE || report || !b.is_bf16() || b.len() < rows * cols {
                return Err(CudaError::Unsupported(format!(
                    "a buffer of {} {} values taken as a {rows} x {cols} GEMM operand as it is (only BF16 values, for a BF16 operand with no fault and nothing recorded)",
                    b.len(),
                    if b.is_bf16() { "BF16" } else { "f32" }
                )));
            }
            return Ok((self.prepared(ty, self.ptr(b.raw()), None, at.transposed), None));
        }
        let key = CastKey::new(self.input_ptr(x), rows, cols, fmt, how, fault);
        let kept_key = kept_key(at);
        if let Some(k) = self.usable_kept(key, at, level, report) {
            let p = self.prepared(ty, self.kept_ptr(k), k.slot, k.straight);
            return Ok((p, k.slot.filter(|_| report)));
        }
        // A weight cast with the others before the forward (`weight_casts.rs`).
        if let Some((ptr, slot)) = self.cast_weight_taken(key, at, level, report) {
            return Ok((self.prepared(ty, ptr, Some(slot), false), Some(slot).filter(|_| report)));
        }
        if let CastInput::Computed { kind: SRC_BF16, h, .. } = x
            && !ty.is_fp8()
            && fault == OperandFault::NONE
        {
            return self.cast_bf16_as_is(x, h, rows, cols, at, key, how, level, report);
        }
        // The first of a site's two uses keeps its cast for the second: FP8 codes transposed,
        // written beside the straight ones by the dual kernel; BF16 values in the operand's own
        // layout only, written once straight into the kept buffer.
        let keep = at.share && !at.transposed;
        let straight_keep = keep && !ty.is_fp8();
        let layout = match (at.transposed, keep && ty.is_fp8()) {
            (true, _) => CastLayout::Transposed,
            (false, true) => CastLayout::Both,
            (false, false) => CastLayout::Straight,
        };
        let bytes = rows * cols * ty.bytes();
        // A scale slot is needed for FP8 operands even when nothing is reported.
        let slot = if report || ty.is_fp8() { Some(self.alloc_slot()?) } else { None };
        let kept_dst = if keep { self.keep_cast(at, key, bytes, slot, report, level, straight_keep)? } else { 0 };
        let dst = match side {
            _ if straight_keep => kept_dst,
            Side::P => {
                grow(&self.stream, &mut self.op_p, bytes)?;
                self.ptr(&self.op_p)
            }
            Side::Q => {
                grow(&self.stream, &mut self.op_q, bytes)?;
                self.ptr(&self.op_q)
            }
        };
        let (out, out_t) = match layout {
            CastLayout::Straight => (dst, 0),
            CastLayout::Transposed => (0, dst),
            CastLayout::Both => (dst, kept_dst),
        };
        let reported = slot.filter(|_| report);
        // The per-channel statistics of a recorded cast: computed by the cast kernel itself when it
        // tiles (transposed and dual casts), in a pass of their own for any other straight cast. A
        // kept BF16 cast that records them takes the tiled kernel, writing its own layout only
        // (the dual kernel without a transpose): the same statistics, from one read.
        let channels = reported.filter(|_| level >= StatsLevel::Channels && rows > 0 && cols > 0);
        let src = x.launch_kind(cols, self.pair_runs);
        // The codes' column sums: by the tiled kernel, into slots of `column_sums` (the kept cast
        // says how many, for the site's wgrad: `kept_column_sums`).
        let sums = at.column_sums && straight_keep && column_sums_of(src) && rows > 0 && cols > 0;
        // A computed source has only the tiled kernel (which writes each layout given).
        let kernel = if src.is_some() || (straight_keep && (channels.is_some() || sums)) { CastLayout::Both } else { layout };
        let tiled_channels = channels.filter(|_| kernel != CastLayout::Straight);
        let (fused, sums_ptr, slots) = self.column_targets(rows, cols, src, level, tiled_channels, sums)?;
        if sums {
            self.kept.get_mut(&kept_key).expect("a straight kept cast is kept").column_slots = Some(slots);
        }
        self.launch_cast(x, rows, cols, kernel, fmt, how, fault, level, reported, slot, out, out_t, fused, sums_ptr)?;
        // The partials wait for a batched reduction (channels.rs: flush_channels).
        if let (Some(s), None) = (channels, fused) {
            let CastInput::Buf(x) = x else { unreachable!("a computed source's channel statistics come from its tiled kernel") };
            self.span("gemm.cast.channels", |me| me.launch_channel_stats(x, rows, cols, fault, s))?
        }
        Ok((self.prepared(ty, dst, slot, false), reported))
    }

    /// Makes the kept cast of `at`'s site and role the one of `key` (its slot, whether it is
    /// `recorded` and at which `level`, whether its codes lie `straight`), live for the site's
    /// other GEMM, with room for `bytes` of codes; returns the codes' device address, for the cast
    /// to write them there.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn keep_cast(
        &mut self,
        at: CastUse,
        key: CastKey,
        bytes: usize,
        slot: Option<usize>,
        recorded: bool,
        level: StatsLevel,
        straight: bool,
    ) -> Result<u64, CudaError> {
        let kept_key = kept_key(at);
        if !self.kept.contains_key(&kept_key) {
            let codes = self.stream.alloc_zeros(bytes)?;
            self.kept.insert(kept_key, KeptCast { key, codes, held: None, slot, recorded, level, live: false, straight, column_slots: None });
        }
        let stream = self.stream.clone();
        let k = self.kept.get_mut(&kept_key).expect("inserted above");
        grow(&stream, &mut k.codes, bytes)?;
        (k.key, k.slot, k.recorded, k.level, k.live, k.straight, k.column_slots, k.held) = (key, slot, recorded, level, true, straight, None, None);
        Ok(self.ptr(&self.kept[&kept_key].codes))
    }

    /// The slots of the column sums of the cast behind operand `p`, if it is the kept cast for `at`
    /// and summed them as it cast (`CastUse::column_sums`): `column_sums` holds them, slot-major.
    pub(super) fn kept_column_sums(&self, at: CastUse, p: &Operand) -> Option<usize> {
        let k = self.kept.get(&kept_key(at))?;
        (k.live && self.kept_ptr(k) == p.ptr).then_some(k.column_slots?)
    }

    /// The per-column targets of a tiled cast of `rows × cols` (launch kind `src`): the channel
    /// partials of a recorded cast (`channels`: its slot) and the codes' column sums (`sums`, into
    /// `column_sums`), with the slots a column takes in them, those of the cast's grid
    /// (column-aligned where it can be: [`channel_slots`]); 0 and None for what is not summed.
    pub(super) fn column_targets(
        &mut self,
        rows: usize,
        cols: usize,
        src: Option<i32>,
        level: StatsLevel,
        channels: Option<usize>,
        sums: bool,
    ) -> Result<(Option<ChannelTarget>, u64, usize), CudaError> {
        let slots = if channels.is_some() || sums { channel_slots(rows, cols, self.tiled_cast_grid(rows, cols, src, true, level) as usize, src) } else { 0 };
        let fused = match channels {
            Some(s) => Some(self.channel_target(cols, slots, s)?),
            None => None,
        };
        let sums_ptr = if sums {
            grow(&self.stream, &mut self.column_sums, slots * cols)?;
            self.ptr(&self.column_sums)
        } else {
            0
        };
        Ok((fused, sums_ptr, slots))
    }

    /// Device address of a kept cast's codes.
    fn kept_ptr(&self, k: &KeptCast) -> u64 {
        k.held.unwrap_or_else(|| self.ptr(&k.codes))
    }

    /// The BF16 cast of a BF16 buffer `h` (`x`, a computed source of kind SRC_BF16) with no fault:
    /// its codes are the buffer's own bits, so nothing is written, and the GEMM reads the buffer
    /// (transposed for a use that takes it so). The kernel runs only for what the cast would have
    /// taken beside the codes: the statistics of a `report` (and their per-channel partials) and
    /// the column sums of a gradient whose bias gradient the site's wgrad takes next. The first of
    /// a site's two uses keeps it for the second, as any BF16 cast.
    #[allow(clippy::too_many_arguments)]
    fn cast_bf16_as_is(
        &mut self,
        x: CastInput,
        h: &DevBuf,
        rows: usize,
        cols: usize,
        at: CastUse,
        key: CastKey,
        how: OperandCast,
        level: StatsLevel,
        report: bool,
    ) -> Result<(Operand, Option<usize>), CudaError> {
        let ptr = self.ptr(h.raw());
        let slot = if report { Some(self.alloc_slot()?) } else { None };
        let keep = at.share && !at.transposed;
        let sums = at.column_sums && keep && rows > 0 && cols > 0;
        let channels = slot.filter(|_| level >= StatsLevel::Channels && rows > 0 && cols > 0);
        let (fused, sums_ptr, slots) = self.column_targets(rows, cols, x.launch_kind(cols, self.pair_runs), level, channels, sums)?;
        if keep {
            let column_slots = sums.then_some(slots);
            match self.kept.get_mut(&kept_key(at)) {
                Some(k) => {
                    (k.key, k.held, k.slot, k.recorded, k.level, k.live, k.straight, k.column_slots) =
                        (key, Some(ptr), slot, report, level, true, true, column_slots);
                }
                None => {
                    let codes = self.stream.alloc_zeros(1)?;
                    self.kept.insert(
                        kept_key(at),
                        KeptCast { key, codes, held: Some(ptr), slot, recorded: report, level, live: true, straight: true, column_slots },
                    );
                }
            }
        }
        if slot.is_some() || sums {
            self.launch_cast(x, rows, cols, CastLayout::Both, fmt_code(OpType::Bf16), how, OperandFault::NONE, level, slot, slot, 0, 0, fused, sums_ptr)?;
        }
        Ok((self.prepared(OpType::Bf16, ptr, slot, at.transposed), slot))
    }

    /// The address that keys a cast of `x`: its buffer's, or for a computed source the buffer it
    /// stands for.
    fn input_ptr(&self, x: CastInput) -> u64 {
        match x {
            CastInput::Buf(b) => self.ptr(b),
            CastInput::Held(b) => self.ptr(b.raw()),
            CastInput::Computed { like, .. } | CastInput::Normed(NormSrc { like, .. }) => self.ptr(like.raw()),
        }
    }

    /// Blocks of the tiled cast kernel (transposed, dual, or computed-source of launch kind `src`)
    /// for `rows × cols`, with `channels` when it sums the per-channel statistics.
    pub(super) fn tiled_cast_grid(&self, rows: usize, cols: usize, src: Option<i32>, channels: bool, level: StatsLevel) -> u32 {
        let sms = self.info.parallelism.max(1) as usize;
        if let Some(kind) = src {
            cast_src_grid(rows, cols, kind, channels, level_code(level), sms, self.cast_grid)
        } else {
            cast_grid(rows, cols, true, channels, level_code(level), sms, self.cast_grid)
        }
    }

    /// Device address of scale slot `slot` (0 for none).
    pub(super) fn slot_ptr(&self, slot: Option<usize>) -> u64 {
        slot.map(|s| self.ptr(&self.scales) + (s * SLOT_FLOATS * 4) as u64).unwrap_or(0)
    }

    /// A cast operand at `ptr` for cuBLASLt, dequantised through `slot`'s inverse scale.
    pub(super) fn prepared(&self, ty: OpType, ptr: u64, slot: Option<usize>, transposed: bool) -> Operand {
        Operand { ty, ptr, transposed, slot: self.slot_ptr(slot) }
    }

    /// Launches the cast kernel(s) of one cast: for current scaling an amax pass first, whose last
    /// block writes the scale to the slot.
    #[allow(clippy::too_many_arguments)]
    fn launch_cast(
        &mut self,
        x: CastInput,
        rows: usize,
        cols: usize,
        layout: CastLayout,
        fmt: i32,
        how: OperandCast,
        fault: OperandFault,
        level: StatsLevel,
        record: Option<usize>,
        slot: Option<usize>,
        out: u64,
        out_t: u64,
        channels: Option<ChannelTarget>,
        ch_sum: u64,
    ) -> Result<(), CudaError> {
        let (ch_sq, ch_amax) = channels.map(|t| (t.part_sq, t.part_amax)).unwrap_or((0, 0));
        // Either per-column sum makes the grid column-aligned (`tiled_grid`).
        let aligned = channels.is_some() || ch_sum != 0;
        let rec_ptr = record.map(|s| self.ptr(&self.records) + (s * STAT_FIELDS * 8) as u64).unwrap_or(0);
        let slot_ptr = self.slot_ptr(slot);
        let sms = self.info.parallelism.max(1) as usize;
        let mut o = [u64::MAX; 4];
        if fault.outlier_factor != 1.0 {
            for (j, i) in outlier_indices(rows * cols).enumerate() {
                o[j] = i as u64;
            }
        }
        let xp = match x {
            CastInput::Buf(b) => self.ptr(b),
            CastInput::Held(_) => return Err(CudaError::Unsupported("internal: a held BF16 operand reached a cast kernel".into())),
            CastInput::Computed { .. } => 0,
            CastInput::Normed(n) => self.ptr(n.x.raw()),
        };
        let (mut scale_arg, mut mode) = (1.0f32, 0i32);
        let [hp, bp, gp, sp, rp, mp] = x.src_ptrs(self);
        if let OperandCast::Fp8Tensor { scale, .. } = how {
            match scale {
                ScaleSource::Given { scale, .. } => scale_arg = scale,
                ScaleSource::Current { margin } => {
                    // The amax pass (scale_mode 2, nothing written): its last block reduces the
                    // amax and writes the scale the cast below reads. A computed source's pass is
                    // its own kernel at the amax level: the same values, so the same amax.
                    let (parts, counter) = (self.ptr(&self.partials), self.ptr(&self.cast_counter));
                    if let Some(kind) = x.launch_kind(cols, self.pair_runs) {
                        let grid = self.tiled_cast_grid(rows, cols, Some(kind), false, StatsLevel::Amax);
                        #[rustfmt::skip]
                        launch!(self, kernels::cast_src_kernel(kind, 0, fmt as usize), cfg((grid, 1, 1), CAST_THREADS), xp, rows as i32, cols as i32, 1.0f32, 2i32,
                            slot_ptr, 0u64, 0u64, parts, 0u64, counter, margin, fault.scale_mult, 0i32, o[0], o[1], o[2], o[3], fault.outlier_factor, 0u64, 0u64,
                            0u64, hp, bp, gp, sp, rp, mp)?;
                    } else {
                        let grid = cast_grid(rows, cols, false, false, 0, sms, self.cast_grid);
                        #[rustfmt::skip]
                        launch!(self, kernels::cast_kernel(0, fmt as usize, CastLayout::Straight), cfg((grid, 1, 1), CAST_THREADS), xp, rows as i32, cols as i32, 1.0f32, 2i32,
                            slot_ptr, 0u64, 0u64, parts, 0u64, counter, margin, fault.scale_mult, 0i32, o[0], o[1], o[2], o[3], fault.outlier_factor, 0u64, 0u64, 0u64)?;
                    }
                    mode = 1;
                }
            }
        }
        if let Some(kind) = x.launch_kind(cols, self.pair_runs) {
            if level > StatsLevel::Channels {
                return Err(CudaError::Unsupported("a computed cast source is cast without the quantization error".into()));
            }
            let grid = self.tiled_cast_grid(rows, cols, Some(kind), aligned, level);
            let (parts, counter) = self.deferred_stats(grid, level, record, rec_ptr)?;
            #[rustfmt::skip]
            launch!(self, kernels::cast_src_kernel(kind, level_code(level), fmt as usize), cfg((grid, 1, 1), CAST_THREADS), xp, rows as i32, cols as i32, scale_arg, mode,
                slot_ptr, out, out_t, parts, rec_ptr, counter, 0i32, fault.scale_mult, fault.overflow_nan as i32, o[0], o[1], o[2], o[3], fault.outlier_factor, ch_sq, ch_amax,
                ch_sum, hp, bp, gp, sp, rp, mp)?;
            return Ok(());
        }
        let grid = cast_grid(rows, cols, layout != CastLayout::Straight, aligned, level_code(level), sms, self.cast_grid);
        let (parts, counter) = self.deferred_stats(grid, level, record, rec_ptr)?;
        #[rustfmt::skip]
        launch!(self, kernels::cast_kernel(level_code(level), fmt as usize, layout), cfg((grid, 1, 1), CAST_THREADS), xp, rows as i32, cols as i32, scale_arg, mode,
            slot_ptr, out, out_t, parts, rec_ptr, counter, 0i32, fault.scale_mult, fault.overflow_nan as i32, o[0], o[1], o[2], o[3], fault.outlier_factor, ch_sq, ch_amax, ch_sum)?;
        Ok(())
    }

    /// The partials and counter arguments of a cast kernel whose statistics wait for the batched
    /// reduction ([`super::stat_batch`]): arena room when the cast is recorded (at `rec_ptr`),
    /// none (0) when it is not; no counter, so that no block of the cast reduces them.
    pub(super) fn deferred_stats(&mut self, grid: u32, level: StatsLevel, record: Option<usize>, rec_ptr: u64) -> Result<(u64, u64), CudaError> {
        let parts = if record.is_some() { self.stat_target(grid as usize, level_code(level), rec_ptr)? } else { 0 };
        Ok((parts, 0))
    }

    /// Ends the kept casts' life: the step's slots are about to be reused.
    pub(super) fn expire_kept_casts(&mut self) {
        for k in self.kept.values_mut() {
            k.live = false;
        }
        self.expire_weight_casts();
    }

    /// The FP8 bytes of a cast operand at `p`, row-major in the operand's own layout (rows × cols)
    /// even when `p` holds its transpose. Synchronises (dumps only).
    pub(super) fn operand_bytes(&self, p: &Operand, rows: usize, cols: usize, transposed: bool) -> Result<Vec<u8>, CudaError> {
        let n = rows * cols;
        let mut bytes = vec![0u8; n];
        self.leave_step_graph()?;
        self.stream.synchronize()?;
        // SAFETY: p.ptr is a live device allocation of at least n bytes (an operand cast's codes),
        // and the stream is idle.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut bytes, p.ptr) }?;
        if !transposed {
            return Ok(bytes);
        }
        let mut q = vec![0u8; n];
        for i in 0..rows {
            for j in 0..cols {
                q[i * cols + j] = bytes[j * rows + i];
            }
        }
        Ok(q)
    }

    /// Casts `x` (rows × cols) as `how` says and returns the output bytes (BF16 bits little-endian,
    /// or FP8 codes; transposed if asked) and the cast report: the path every GEMM operand takes,
    /// exposed for the tests that hold it against the CPU emulation.
    #[allow(clippy::too_many_arguments)]
    pub fn cast_for_test(
        &mut self,
        x: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        transpose: bool,
        how: OperandCast,
        fault: OperandFault,
        level: StatsLevel,
    ) -> Result<(Vec<u8>, CastReport), CudaError> {
        let at = CastUse { site: (0, Module::Qkv), role: Role::Activation, transposed: transpose, share: false, column_sums: false };
        let (p, slot) = self.cast(CastInput::Buf(x), rows, cols, at, how, fault, level, true, Side::P)?;
        let slot = slot.expect("a reported cast has a slot");
        let bytes = self.stream.clone_dtoh(&self.op_p.slice(0..rows * cols * p.ty.bytes()))?;
        let given = match how {
            OperandCast::Fp8Tensor { scale: ScaleSource::Given { amax_used, .. }, .. } => Some(amax_used),
            _ => None,
        };
        self.queue_test_report(p.ty, slot, rows * cols, level, given);
        let mut reports = self.download_all()?;
        let r = reports.pop().map(|g| g.a).unwrap_or_default();
        Ok((bytes, r))
    }

    /// Casts each of `xs` (buffer, rows, cols) as one step would, all queued before one download
    /// (so that their channel reductions are batched and the record columns may grow while they
    /// wait), and returns their reports in order. With `prefetch_after` = Some(k), the channel
    /// records go to the host after the k-th cast, as `Backend::gemms_done` sends them.
    pub fn casts_for_test(
        &mut self,
        xs: &[(&CudaSlice<f32>, usize, usize)],
        transpose: bool,
        how: OperandCast,
        level: StatsLevel,
        prefetch_after: Option<usize>,
    ) -> Result<Vec<CastReport>, CudaError> {
        let at = CastUse { site: (0, Module::Qkv), role: Role::Activation, transposed: transpose, share: false, column_sums: false };
        for (i, &(x, rows, cols)) in xs.iter().enumerate() {
            if prefetch_after == Some(i) {
                self.prefetch_channels()?;
            }
            let (p, slot) = self.cast(CastInput::Buf(x), rows, cols, at, how, OperandFault::NONE, level, true, Side::P)?;
            self.queue_test_report(p.ty, slot.expect("a reported cast has a slot"), rows * cols, level, None);
        }
        if prefetch_after == Some(xs.len()) {
            self.prefetch_channels()?;
        }
        Ok(self.download_all()?.into_iter().map(|g| g.a).collect())
    }

    /// Queues the report of a test's cast in `slot` as a GEMM's (its operand a and b both), for
    /// `download_all`.
    fn queue_test_report(&mut self, ty: OpType, slot: usize, numel: usize, level: StatsLevel, given_amax: Option<f32>) {
        let op = || PendingOp { slot, role: Role::Activation, format: ty.name(), fp8: ty.is_fp8(), level, given_amax, numel: numel as u64, quantized: None };
        let gemm_slot = self.next_gemm;
        self.next_gemm += 1;
        let id = crate::backend::GemmId { layer: 0, module: Module::Qkv, gemm: Gemm::Fprop };
        self.pending.push(PendingGemm { id, a: op(), b: op(), gemm_slot, shadow: None });
    }

    /// Caps the blocks of the cast kernels at `most` (1..=`CAST_GRID_MAX`), for benchmarks; 0
    /// restores the defaults.
    pub fn set_cast_grid(&mut self, most: usize) {
        self.cast_grid = most.min(CAST_GRID_MAX);
    }

    /// Whether SwiGLU's backward cast adds its channel partials over runs of tiles
    /// (`FP8SCOPE_PAIR_RUNS`); the tests set it to compare both kernels in one process.
    pub fn set_pair_runs(&mut self, on: bool) {
        self.pair_runs = on;
    }

    /// GPU microseconds per cast of `x` (rows × cols) as `how` says, averaged over `reps` casts
    /// timed with CUDA events (after one warm-up cast): the cast kernels' speed on their own, for
    /// `cuda_layers`' throughput table. `dual` casts to both layouts at once.
    #[allow(clippy::too_many_arguments)]
    pub fn time_cast(
        &mut self,
        x: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        transpose: bool,
        dual: bool,
        how: OperandCast,
        level: StatsLevel,
        reps: usize,
    ) -> Result<f64, CudaError> {
        let ev = || self.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT));
        let (a, b) = (ev()?, ev()?);
        let at = CastUse { site: (u32::MAX, Module::Qkv), role: Role::Activation, transposed: transpose && !dual, share: dual, column_sums: false };
        self.cast(CastInput::Buf(x), rows, cols, at, how, OperandFault::NONE, level, true, Side::P)?;
        a.record(&self.stream)?;
        for _ in 0..reps {
            self.cast(CastInput::Buf(x), rows, cols, at, how, OperandFault::NONE, level, true, Side::P)?;
        }
        self.flush_channels()?;
        b.record(&self.stream)?;
        self.stream.synchronize()?;
        self.clear_slot_flags(self.next_slot)?;
        self.next_slot = 0;
        self.chan.reset();
        self.expire_kept_casts();
        Ok(a.elapsed_ms(&b)? as f64 * 1e3 / reps.max(1) as f64)
    }

    /// GPU microseconds per in-place BF16 rounding of `x` (a plain read-and-write pass of 8 bytes
    /// per value): the memory bandwidth the casts are measured against.
    pub fn time_copy(&mut self, x: &mut CudaSlice<f32>, reps: usize) -> Result<f64, CudaError> {
        let ev = || self.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT));
        let (a, b) = (ev()?, ev()?);
        let n = x.len();
        let xp = self.ptr(x);
        launch!(self, "round_bf16_fwd", grid_for(n, 256), xp, n as u64)?;
        a.record(&self.stream)?;
        for _ in 0..reps {
            launch!(self, "round_bf16_fwd", grid_for(n, 256), xp, n as u64)?;
        }
        b.record(&self.stream)?;
        self.stream.synchronize()?;
        Ok(a.elapsed_ms(&b)? as f64 * 1e3 / reps.max(1) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::{
        CAST_GRID_MAX, CAST_TILE, SRC_DSWIGLU, SRC_DSWIGLU_PAIR_RUNS, SRC_DSWIGLU_PAIRS, cast_src_grid, channel_slots, column_aligned, launch_kind,
        pair_runs_from,
    };

    /// Walks every block of a tiled cast of `n` tiles, `tiles_c` a row, over `g` blocks, as
    /// kernels/cast.cu's `cast_transposed` does: block b takes tiles b, b + g, b + 2g, ... in
    /// row-major order, and a run of its consecutive tiles in one column tile ends where the next
    /// is in another column tile or past the last (so every tile is a run of its own unless g is a
    /// multiple of tiles_c). At each run's end calls `run_end(slot, tc)`, the slot being the row
    /// tile of the run's first tile; returns how often each tile was cast.
    fn walk_runs(n: usize, tiles_c: usize, g: usize, mut run_end: impl FnMut(usize, usize)) -> Vec<u32> {
        let mut cast = vec![0u32; n];
        for b in 0..g {
            let mut t = b;
            let mut run_tr = None;
            while t < n {
                cast[t] += 1;
                let (tr, tc) = (t / tiles_c, t % tiles_c);
                let first = *run_tr.get_or_insert(tr);
                let next = t + g;
                if next >= n || next % tiles_c != tc {
                    run_end(first, tc);
                    run_tr = None;
                }
                t = next;
            }
        }
        cast
    }

    /// Every tile of a tiled cast is cast once and every (column tile, slot) below
    /// `channel_slots` written once ([`walk_runs`]).
    #[test]
    fn every_channel_slot_of_a_tiled_cast_is_written_once() {
        let shapes: [(usize, usize); 9] = [(1, 1), (64, 64), (100, 3000), (2048, 2048), (8192, 2048), (8192, 5632), (2048, 32000), (8192, 11264), (130, 70)];
        for (rows, cols) in shapes {
            let (tiles_r, tiles_c) = (rows.div_ceil(CAST_TILE), cols.div_ceil(CAST_TILE));
            let n = tiles_r * tiles_c;
            for resident in [1usize, 2, 3, 7, 132, 264, 396, 528, 1056, CAST_GRID_MAX] {
                for g in [resident.min(n), column_aligned(resident.min(n), tiles_c)] {
                    let slots = channel_slots(rows, cols, g, None);
                    let mut written = vec![0u32; tiles_c * slots];
                    let cast = walk_runs(n, tiles_c, g, |first, tc| {
                        assert!(first < slots, "{rows}x{cols} over {g}: slot {first} of {slots}");
                        written[tc * slots + first] += 1;
                    });
                    assert!(cast.iter().all(|&c| c == 1), "{rows}x{cols} over {g}: a tile cast twice or never");
                    assert!(written.iter().all(|&w| w == 1), "{rows}x{cols} over {g}: slots written {written:?}");
                }
            }
        }
    }

    /// The pairs kernel of SwiGLU's backward (kernels/cast_src.cuh: SRC_DSWIGLU_PAIRS) strides over the
    /// gate half's tiles and casts each with its pair in the up half, one run a tile: every tile
    /// of the operand is cast once, and every (column tile, row tile) slot written once.
    #[test]
    fn every_channel_slot_of_a_paired_cast_is_written_once() {
        assert_eq!(launch_kind(SRC_DSWIGLU, 2 * 8192, false), SRC_DSWIGLU_PAIRS);
        assert_eq!(launch_kind(SRC_DSWIGLU, 2 * 80, false), SRC_DSWIGLU, "halves not a whole number of tiles");
        for (rows, cols) in [(64usize, 128usize), (130, 256), (8192, 16384), (2048, 11264)] {
            let (tiles_r, tiles_c) = (rows.div_ceil(CAST_TILE), cols.div_ceil(CAST_TILE));
            let half = tiles_c / 2;
            for (sms, most) in [(132, 0), (1, 0), (132, 7), (132, 1)] {
                let g = cast_src_grid(rows, cols, SRC_DSWIGLU_PAIRS, true, 1, sms, most) as usize;
                let slots = channel_slots(rows, cols, g, Some(SRC_DSWIGLU_PAIRS));
                assert_eq!(slots, tiles_r);
                let mut written = vec![0u32; tiles_c * slots];
                for b in 0..g {
                    let mut t = b;
                    while t < tiles_r * half {
                        let (tr, tc) = (t / half, t % half);
                        written[tc * slots + tr] += 1;
                        written[(tc + half) * slots + tr] += 1;
                        t += g;
                    }
                }
                assert!(written.iter().all(|&w| w == 1), "{rows}x{cols} over {g}: slots written {written:?}");
            }
        }
    }

    /// The pairs kernel whose channel partials add up over runs (SRC_DSWIGLU_PAIR_RUNS) walked as
    /// kernels/cast.cu's `cast_transposed` walks it: over the gate half's tiles, a run the block's
    /// consecutive tiles in one column pair, its partials written at its end into the slot of its
    /// first tile's row tile, for the gate tile's columns and the up tile's. Every tile is cast
    /// once and every (column tile, slot) below `channel_slots` written once; with a column-aligned
    /// grid a column takes a few slots instead of one a row tile.
    #[test]
    fn every_channel_slot_of_a_paired_cast_over_runs_is_written_once() {
        assert_eq!(launch_kind(SRC_DSWIGLU, 2 * 8192, true), SRC_DSWIGLU_PAIR_RUNS);
        assert_eq!(launch_kind(SRC_DSWIGLU, 2 * 80, true), SRC_DSWIGLU, "halves not a whole number of tiles");
        assert_eq!((pair_runs_from(None).unwrap(), pair_runs_from(Some("0")).unwrap(), pair_runs_from(Some(" 1")).unwrap()), (false, false, true));
        assert!(pair_runs_from(Some("yes")).unwrap_err().to_string().contains("FP8SCOPE_PAIR_RUNS=yes: expected 1"));
        for (rows, cols) in [(64usize, 128usize), (130, 256), (8192, 16384), (2048, 11264), (8192, 11264)] {
            let (tiles_r, tiles_c) = (rows.div_ceil(CAST_TILE), cols.div_ceil(CAST_TILE));
            let half = tiles_c / 2;
            let n = tiles_r * half;
            for (sms, most, channels) in [(132, 0, true), (1, 0, true), (132, 7, true), (132, 1, true), (132, 0, false)] {
                let g = cast_src_grid(rows, cols, SRC_DSWIGLU_PAIR_RUNS, channels, 1, sms, most) as usize;
                let slots = channel_slots(rows, cols, g, Some(SRC_DSWIGLU_PAIR_RUNS));
                let mut written = vec![0u32; tiles_c * slots];
                // Over the gate half's tiles; each run's end writes the gate columns and the up ones.
                let cast = walk_runs(n, half, g, |first, tc| {
                    assert!(first < slots, "{rows}x{cols} over {g}: slot {first} of {slots}");
                    written[tc * slots + first] += 1;
                    written[(tc + half) * slots + first] += 1;
                });
                assert!(cast.iter().all(|&c| c == 1), "{rows}x{cols} over {g}: a tile cast twice or never");
                assert!(written.iter().all(|&w| w == 1), "{rows}x{cols} over {g}: slots written {written:?}");
                // An aligned grid: one slot a block of a column pair, not one a row tile.
                let aligned = g.is_multiple_of(half);
                assert_eq!(slots, if aligned { g / half } else { tiles_r }, "{rows}x{cols} over {g}");
            }
        }
        // llama-1b's dY of fc1 (8192 tokens, 2 x 8192 wide) on an H200 at the cheap level: 384 blocks
        // of 128 column tiles, 3 slots a column instead of 128.
        let g = cast_src_grid(8192, 16384, SRC_DSWIGLU_PAIR_RUNS, true, 1, 132, 0) as usize;
        assert_eq!((g, channel_slots(8192, 16384, g, Some(SRC_DSWIGLU_PAIR_RUNS))), (384, 3));
    }

    /// A grid is aligned to the column tiles only where that idles at most 1/32 of its blocks, and
    /// then each block's partials leave once (one slot a block of a column tile).
    #[test]
    fn a_column_aligned_grid_idles_few_blocks() {
        // An H200: 132 SMs, 3 blocks each at the cheap level.
        for (cols, want) in [(2048, 384), (3072, 384), (4096, 384), (8192, 384), (5632, 396), (11264, 396), (16384, 396), (64, 396)] {
            let g = column_aligned(396, cols / CAST_TILE);
            assert_eq!(g, want, "{cols} columns");
            let slots = channel_slots(8192, cols, g, None);
            assert_eq!(slots, if g.is_multiple_of(cols / CAST_TILE) { g / (cols / CAST_TILE) } else { 128 }, "{cols} columns");
        }
    }
}

//! Attention on the GPU: the launchers of `kernels/flash_attention.cu` (fused, the default) and of
//! `kernels/attention.cu` (unfused: cuBLAS batched GEMMs around a softmax kernel, kept for head
//! sizes the fused kernels do not take and for side-by-side measurement with
//! `FP8SCOPE_ATTENTION=unfused`). The CPU reference is `capture/src/layers/attention.rs`.
//!
//! The fused path reads q, k, v (and, backward, dout) where they lie when they are BF16 rows (GPT's
//! qkv and proj's dgrad output: [`HeadTensor`] gives the kernels each head's strides), and splits
//! them into per-head BF16 matrices in one pass each otherwise (f32 rows); it streams their tiles
//! through shared memory (cp.async, double-buffered) and writes the output rows directly (f32, or
//! BF16 into a 16-bit buffer: the values are BF16 numbers either way): no
//! (T x T) buffer and no merge pass; it saves one
//! base-2 log-sum-exp per query row (B, NH, T) for the backward, which recomputes the
//! probabilities tile by tile: `flash_bwd_delta` (the softmax correction term), `flash_bwd_dkdv`
//! (one block per key tile and kv head, looping over the group's query heads, so GQA needs no
//! atomics) and `flash_bwd_dq`. Every sum runs in a fixed order: reruns are bit-identical.

use super::blas::Batched;
use super::{CudaBackend, CudaError, DevBuf, cfg, grid_for, grow};
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DeviceRepr, PushKernelArg};
use std::collections::HashMap;
use std::sync::Arc;

/// Head sizes the fused kernels are instantiated for (kernels/flash_attention.cu: FA_ENTRY).
pub const FLASH_HEAD_SIZES: [usize; 5] = [16, 32, 64, 96, 128];
/// Threads per block and query rows (or keys) per tile of the fused kernels.
const FLASH_THREADS: u32 = 128;
const FLASH_TILE: usize = 64;
/// Rows of `flash_bwd_delta` a warp sums (kernels/flash_attention.cu: FA_DELTA_ROWS).
const FLASH_DELTA_ROWS: u32 = 4;

/// The fused kernels' entry points, in the order `kernels::Family::FlashAttention` lists them.
pub const FLASH_KERNELS: [&str; 16] = [
    "flash_fwd_d16",
    "flash_bwd_dkdv_d16",
    "flash_bwd_dq_d16",
    "flash_fwd_d32",
    "flash_bwd_dkdv_d32",
    "flash_bwd_dq_d32",
    "flash_fwd_d64",
    "flash_bwd_dkdv_d64",
    "flash_bwd_dq_d64",
    "flash_fwd_d96",
    "flash_bwd_dkdv_d96",
    "flash_bwd_dq_d96",
    "flash_fwd_d128",
    "flash_bwd_dkdv_d128",
    "flash_bwd_dq_d128",
    "flash_bwd_delta",
];

fn flash_names(d: usize) -> Option<[&'static str; 3]> {
    let i = FLASH_HEAD_SIZES.iter().position(|&x| x == d)?;
    Some([FLASH_KERNELS[3 * i], FLASH_KERNELS[3 * i + 1], FLASH_KERNELS[3 * i + 2]])
}

/// The fused forward, dK/dV and dQ kernels of head size `d`, or the error of a head size without
/// them.
fn flash_kernels(d: usize) -> Result<[&'static str; 3], CudaError> {
    flash_names(d).ok_or_else(|| CudaError::Unsupported(format!("no fused attention kernel for head size {d}")))
}

/// Whether the fused kernels take attention of `c` channels over `nh` heads (its head size is one
/// of [`FLASH_HEAD_SIZES`]).
fn has_fused_kernel(c: usize, nh: usize) -> bool {
    nh > 0 && c.is_multiple_of(nh) && FLASH_HEAD_SIZES.contains(&(c / nh))
}

/// Why attention of `c` channels over `nh` heads runs unfused on the GPU, in one line for the
/// user, or None when it runs fused (`fused_enabled`: FP8SCOPE_ATTENTION is not `unfused`).
pub fn unfused_attention_note(c: usize, nh: usize, fused_enabled: bool) -> Option<String> {
    let cost = "slower, and it keeps the (B, heads, T, T) probabilities in GPU memory";
    if !fused_enabled {
        return Some(format!("attention runs unfused (FP8SCOPE_ATTENTION=unfused): {cost}"));
    }
    if has_fused_kernel(c, nh) {
        return None;
    }
    let sizes = FLASH_HEAD_SIZES.map(|d| d.to_string()).join(", ");
    Some(format!("attention runs unfused: head size {c}/{nh} has no fused kernel (sizes {sizes}): {cost}"))
}

/// Query tiles (of 64 rows) per block of the fused forward and dQ kernels for head size `d`
/// (flash_attention.cu: `FA_MT_FWD`, `FA_MT_DQ`): both take two up to d = 64, where a warp that
/// owns one tile's rows waits on its shared-memory reads, and one above, where two tiles'
/// registers would spill.
pub fn flash_query_tiles(d: usize) -> QueryTiles {
    let two_up_to_64 = if d <= 64 { 2 } else { 1 };
    QueryTiles { fwd: two_up_to_64, dq: two_up_to_64 }
}

/// The grid of a fused kernel: one block per (head, batch, tile), the tile the slowest index so
/// that the kernel can start its heaviest tiles first (flash_attention.cu says why). The tiles go
/// on the grid's z, which holds at most 65535.
fn flash_grid(heads: usize, b: usize, tiles: usize, smem: u32) -> Result<cudarc::driver::LaunchConfig, CudaError> {
    if tiles > 65535 || b > 65535 {
        return Err(CudaError::Unsupported(format!(
            "fused attention over {tiles} tiles of {FLASH_TILE} tokens and batch {b}: the grid holds at most 65535 of each"
        )));
    }
    let mut lc = cfg((heads as u32, b as u32, tiles as u32), FLASH_THREADS);
    lc.shared_mem_bytes = smem;
    Ok(lc)
}

/// Query tiles per block of the forward and of dQ ([`flash_query_tiles`]).
#[derive(Clone, Copy, Debug)]
pub struct QueryTiles {
    pub fwd: usize,
    pub dq: usize,
}

/// Dynamic shared memory of the fused forward, dK/dV and dQ kernels for head size `d`, in bytes
/// (mirrors the carving at the top of each kernel in flash_attention.cu: BF16 tiles of 64 rows of
/// d + 8; the forward holds its query tiles and two buffers each of k and v, dK/dV two resident
/// tiles and two buffers each of q and dout, dQ its query tiles' q and dout and two buffers each
/// of k and v).
pub fn flash_smem(d: usize) -> [u32; 3] {
    let tile = FLASH_TILE * (d + 8) * 2;
    let mt = flash_query_tiles(d);
    [((mt.fwd + 4) * tile) as u32, (6 * tile) as u32, ((2 * mt.dq + 4) * tile) as u32]
}

/// The launch of `attention_split_fwd` / `_bwd` (kernels/attention.cu: split_heads) over `rows`
/// rows of `w` values with head size `hs`: 128 threads of V columns each across a row (V = 8 when
/// `hs` is a multiple of 8, else 1), and the rows strided over at most 65535 blocks down.
pub(super) fn split_grid(rows: usize, w: usize, hs: usize) -> cudarc::driver::LaunchConfig {
    let per_thread = if hs.is_multiple_of(8) { 8 } else { 1 };
    cfg(((w / per_thread).div_ceil(128) as u32, rows.clamp(1, 65535) as u32, 1), 128)
}

/// Lets each fused kernel use the shared memory it needs (above the 48 KiB default).
pub fn configure(funcs: &HashMap<&'static str, CudaFunction>) -> Result<(), CudaError> {
    for d in FLASH_HEAD_SIZES {
        for (name, bytes) in flash_names(d).into_iter().flatten().zip(flash_smem(d)) {
            let f = funcs.get(name).ok_or(CudaError::MissingKernel(name))?;
            f.set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32)?;
        }
    }
    Ok(())
}

/// Where the fused kernels read a (B, heads, T, HS) BF16 tensor (flash_attention.cu: `FaTensor`):
/// element (b, h, t, d) at `ptr` + 2 (b · batch + h · head + t · row + d) bytes. Within a batch the
/// kernels add offsets in 32 bits, so the constructors refuse a batch that spans 2³² values or more.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct HeadTensor {
    ptr: u64,
    batch: i64,
    head: u32,
    row: u32,
}

// SAFETY: plain data with the C layout of `FaTensor` (a pointer, an i64, two u32: 24 bytes, no
// padding), passed by value as a kernel argument.
unsafe impl DeviceRepr for HeadTensor {}

impl HeadTensor {
    fn new(ptr: u64, batch: usize, head: usize, row: usize, span: usize) -> Result<HeadTensor, CudaError> {
        if span > u32::MAX as usize {
            return Err(CudaError::Unsupported(format!("fused attention over {span} values a batch (at most 2³² − 1)")));
        }
        Ok(HeadTensor { ptr, batch: batch as i64, head: head as u32, row: row as u32 })
    }

    /// `heads` head-major (T, HS) matrices a batch at `ptr`, as the split kernels write them.
    pub(super) fn head_major(ptr: u64, heads: usize, t: usize, hs: usize) -> Result<HeadTensor, CudaError> {
        Self::new(ptr, heads * t * hs, t * hs, hs, heads * t * hs)
    }

    /// Heads read in place from BF16 rows (B, T, `w`) at `ptr`: head h's values are the `hs`
    /// columns from `col0` + h · hs.
    pub(super) fn in_rows(ptr: u64, t: usize, w: usize, col0: usize, hs: usize) -> Result<HeadTensor, CudaError> {
        Self::new(ptr + 2 * col0 as u64, t * w, hs, w, t * w)
    }
}

/// The fused kernels' q (B, NH, T, HS), k and v (B, KVH, T, HS).
#[derive(Clone, Copy, Debug)]
pub(super) struct Heads {
    pub q: HeadTensor,
    pub k: HeadTensor,
    pub v: HeadTensor,
}

impl Heads {
    /// Head-major q, k and v at the device pointers `(q, k, v)`, as the split kernels write them.
    pub(super) fn head_major((q, k, v): (u64, u64, u64), shape: &AttentionShape) -> Result<Heads, CudaError> {
        let (t, hs) = (shape.t, shape.c / shape.nh);
        Ok(Heads {
            q: HeadTensor::head_major(q, shape.nh, t, hs)?,
            k: HeadTensor::head_major(k, shape.kvh, t, hs)?,
            v: HeadTensor::head_major(v, shape.kvh, t, hs)?,
        })
    }
}

/// Whether the fused kernels can read the heads of `buf` in place: BF16 rows whose 16-byte chunks
/// (`cp.async`'s) are aligned, which a head size that is a multiple of 8 keeps at every row and
/// head.
fn readable_in_place(buf: &DevBuf, ptr: u64, hs: usize) -> bool {
    buf.is_bf16() && ptr.is_multiple_of(16) && hs.is_multiple_of(8)
}

/// The shape of one attention call: batch, sequence, channels (NH · head size), query and kv
/// heads, and whether it is causal.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub b: usize,
    pub t: usize,
    pub c: usize,
    pub nh: usize,
    pub kvh: usize,
    pub causal: bool,
}

/// The attention path's state: which path runs, and the unfused path's scratch.
pub struct AttentionState {
    /// Whether the fused kernels run (unless FP8SCOPE_ATTENTION=unfused, or the head size has no
    /// fused kernel).
    pub fused: bool,
    pub(super) q16: CudaSlice<u16>,
    pub(super) k16: CudaSlice<u16>,
    pub(super) v16: CudaSlice<u16>,
    pub(super) dy16: CudaSlice<u16>,
    pub(super) att16: CudaSlice<u16>,
    pub(super) dpre16: CudaSlice<u16>,
    pub(super) y32: CudaSlice<f32>,
    pub(super) dq32: CudaSlice<f32>,
    pub(super) dk32: CudaSlice<f32>,
    /// Tensors the fused kernels have read in place from BF16 rows so far (q, k, v or dout: one
    /// each), for tests to tell the two ways apart.
    pub(super) in_place: u64,
}

impl AttentionState {
    /// `fused`: the fused kernels (`FP8SCOPE_ATTENTION` not `unfused`).
    pub fn new(s: &Arc<CudaStream>, fused: bool) -> Result<AttentionState, CudaError> {
        Ok(AttentionState {
            fused,
            q16: s.alloc_zeros(1)?,
            k16: s.alloc_zeros(1)?,
            v16: s.alloc_zeros(1)?,
            dy16: s.alloc_zeros(1)?,
            att16: s.alloc_zeros(1)?,
            dpre16: s.alloc_zeros(1)?,
            y32: s.alloc_zeros(1)?,
            dq32: s.alloc_zeros(1)?,
            dk32: s.alloc_zeros(1)?,
            in_place: 0,
        })
    }
}

impl CudaBackend {
    /// cuBLAS's batched BF16 product `g` (the unfused attention): run now, or recorded while the
    /// step is recorded into CUDA graphs (`step_graph/`).
    fn blas_gemm(&self, g: Batched, a: u64, b: u64, c: u64) -> Result<(), CudaError> {
        if !self.record_op(|| super::step_graph::Op::Blas { g, a, b, c })? {
            self.blas.gemm_bf16_f32(g, a, b, c)?;
        }
        Ok(())
    }

    /// Chooses the fused kernels (the default) or the unfused path, for measuring one against
    /// the other in one process.
    pub fn set_fused_attention(&mut self, on: bool) {
        self.attn.fused = on;
    }

    /// How many q, k, v and dout tensors the fused kernels have read in place from BF16 rows so far,
    /// without a split pass.
    pub fn attention_reads_in_place(&self) -> u64 {
        self.attn.in_place
    }

    /// Whether attention of C = `c` over `nh` heads runs fused.
    pub(super) fn attention_fused(&self, c: usize, nh: usize) -> bool {
        self.attn.fused && has_fused_kernel(c, nh)
    }

    /// [`unfused_attention_note`] for this backend: why attention of C = `c` over `nh` heads will
    /// run unfused, or None.
    pub fn attention_note(&self, c: usize, nh: usize) -> Option<String> {
        unfused_attention_note(c, nh, self.attn.fused)
    }

    /// See `Backend::attention_saved_len`.
    pub(super) fn attention_saved(&self, b: usize, t: usize, c: usize, nh: usize) -> usize {
        if self.attention_fused(c, nh) { b * nh * t } else { b * nh * t * t }
    }

    pub(super) fn attention_fwd_impl(&mut self, out: &mut DevBuf, att: &mut CudaSlice<f32>, qkv: &DevBuf, shape: AttentionShape) -> Result<(), CudaError> {
        let AttentionShape { c, nh, .. } = shape;
        if !self.attention_fused(c, nh) {
            return self.attention_fwd_unfused(out, att, qkv, shape);
        }
        let heads = self.flash_heads(qkv, &shape)?;
        self.flash_fwd(out, att, heads, shape)
    }

    /// The fused forward (`flash_fwd_d{HS}`) from q (B,NH,T,HS), k, v (B,KVH,T,HS) in BF16 where
    /// `heads` says: out (B,T,C, f32 or BF16 values), and att = the log-sum-exp of each query row.
    pub(super) fn flash_fwd(&mut self, out: &mut DevBuf, att: &mut CudaSlice<f32>, heads: Heads, shape: AttentionShape) -> Result<(), CudaError> {
        let AttentionShape { b, t, c, nh, kvh, causal } = shape;
        let (hs, _) = Self::attention_heads(c, nh, kvh)?;
        Self::check_len("attention's saved log-sum-exp", att.len(), b * nh * t)?;
        Self::check_len("attention's output", out.len(), b * t * c)?;
        let [fwd, _, _] = flash_kernels(hs)?;
        let scale = 1.0 / (hs as f32).sqrt();
        let Heads { q, k, v } = heads;
        let (outp, out16, lsep) = (self.ptr(out.raw()), out.is_bf16() as i32, self.ptr(att));
        let lc = flash_grid(nh, b, t.div_ceil(FLASH_TILE * flash_query_tiles(hs).fwd), flash_smem(hs)[0])?;
        let (ti, nhi, kvhi) = (t as i32, nh as i32, kvh as i32);
        launch!(self, fwd, lc, outp, out16, lsep, q, k, v, ti, nhi, kvhi, scale, causal as i32)
    }

    /// q, k, v as the fused kernels read them, after checking the head counts: in place when qkv
    /// holds BF16 rows, else split from its f32 rows into the attention scratch
    /// (`attention_split_fwd`).
    fn flash_heads(&mut self, qkv: &DevBuf, shape: &AttentionShape) -> Result<Heads, CudaError> {
        let AttentionShape { b, t, c, nh, kvh, .. } = *shape;
        let (hs, _) = Self::attention_heads(c, nh, kvh)?;
        let w = (nh + 2 * kvh) * hs;
        let qkvp = self.ptr(qkv.raw());
        if !readable_in_place(qkv, qkvp, hs) {
            let split = self.attention_split(qkv, b, t, nh, kvh, hs)?;
            return Heads::head_major(split, shape);
        }
        Self::check_len("qkv", qkv.len(), b * t * w)?;
        self.attn.in_place += 3;
        Ok(Heads {
            q: HeadTensor::in_rows(qkvp, t, w, 0, hs)?,
            k: HeadTensor::in_rows(qkvp, t, w, nh * hs, hs)?,
            v: HeadTensor::in_rows(qkvp, t, w, (nh + kvh) * hs, hs)?,
        })
    }

    /// dout (B,NH,T,HS) as the fused kernels read it: in place when it holds BF16 rows, else split
    /// from its f32 rows into the attention scratch (`attention_split_bwd`).
    fn flash_dout(&mut self, dout: &DevBuf, b: usize, t: usize, nh: usize, hs: usize) -> Result<HeadTensor, CudaError> {
        let doutp = self.ptr(dout.raw());
        if !readable_in_place(dout, doutp, hs) {
            let dy = self.attention_split_dout(dout, b, t, nh, hs)?;
            return HeadTensor::head_major(dy, nh, t, hs);
        }
        Self::check_len("attention's dout", dout.len(), b * t * nh * hs)?;
        self.attn.in_place += 1;
        HeadTensor::in_rows(doutp, t, nh * hs, 0, hs)
    }

    /// q (B,NH,T,HS), k, v (B,KVH,T,HS) as BF16 from the qkv rows (f32 or BF16 storage), into the
    /// attention scratch (one pass, `attention_split_fwd`); returns their device pointers.
    fn attention_split(&mut self, qkv: &DevBuf, b: usize, t: usize, nh: usize, kvh: usize, hs: usize) -> Result<(u64, u64, u64), CudaError> {
        let nq = b * nh * t * hs;
        for buf in [&mut self.attn.q16, &mut self.attn.k16, &mut self.attn.v16] {
            grow(&self.stream, buf, nq)?;
        }
        let (q, k, v, qkvp) = (self.ptr(&self.attn.q16), self.ptr(&self.attn.k16), self.ptr(&self.attn.v16), self.ptr(qkv.raw()));
        let (bi, ti, nhi, kvhi, hsi) = (b as i32, t as i32, nh as i32, kvh as i32, hs as i32);
        launch!(self, "attention_split_fwd", split_grid(b * t, (nh + 2 * kvh) * hs, hs), q, k, v, qkvp, qkv.is_bf16() as i32, bi, ti, nhi, kvhi, hsi)?;
        Ok((q, k, v))
    }

    /// dy (B,NH,T,HS) as BF16 from the dout rows (f32 or BF16 storage), into the attention scratch
    /// (one pass, `attention_split_bwd`); returns its device pointer.
    fn attention_split_dout(&mut self, dout: &DevBuf, b: usize, t: usize, nh: usize, hs: usize) -> Result<u64, CudaError> {
        let n = b * nh * t * hs;
        grow(&self.stream, &mut self.attn.dy16, n)?;
        let (dy, doutp) = (self.ptr(&self.attn.dy16), self.ptr(dout.raw()));
        let (bi, ti, nhi, hsi) = (b as i32, t as i32, nh as i32, hs as i32);
        launch!(self, "attention_split_bwd", split_grid(b * t, nh * hs, hs), dy, doutp, dout.is_bf16() as i32, bi, ti, nhi, hsi)?;
        Ok(dy)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_bwd_impl(
        &mut self,
        dqkv: &mut DevBuf,
        datt: &mut CudaSlice<f32>,
        dout: &DevBuf,
        out: &DevBuf,
        qkv: &DevBuf,
        att: &CudaSlice<f32>,
        shape: AttentionShape,
    ) -> Result<(), CudaError> {
        let AttentionShape { c, nh, .. } = shape;
        if !self.attention_fused(c, nh) {
            return self.attention_bwd_unfused(dqkv, datt, dout, qkv, att, shape);
        }
        let heads = self.flash_heads(qkv, &shape)?;
        self.flash_bwd(dqkv, datt, dout, out, att, heads, shape, 0)
    }

    /// The fused backward from the forward's q, k, v (BF16, where `heads` says), its output and
    /// log-sum-exp: dout read in place or split ([`Self::flash_dout`]), the correction term into `datt`
    /// (`flash_bwd_delta`), then `flash_bwd_dkdv_d{HS}` and `flash_bwd_dq_d{HS}` into dqkv (B,T,W).
    /// With `rope_tab` (the device pointer of the RoPE table, or 0 for none) dq and dk are rotated
    /// back as they are stored: dqkv is then the gradient before the rotation, whose values are not
    /// BF16 numbers (dqkv must then hold f32 values). `out` and dqkv hold f32 or BF16 values.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn flash_bwd(
        &mut self,
        dqkv: &mut DevBuf,
        datt: &mut CudaSlice<f32>,
        dout: &DevBuf,
        out: &DevBuf,
        att: &CudaSlice<f32>,
        heads: Heads,
        shape: AttentionShape,
        rope_tab: u64,
    ) -> Result<(), CudaError> {
        let AttentionShape { b, t, c, nh, kvh, causal } = shape;
        let (hs, _) = Self::attention_heads(c, nh, kvh)?;
        Self::check_len("attention's saved log-sum-exp", att.len(), b * nh * t)?;
        Self::check_len("attention's backward scratch", datt.len(), b * nh * t)?;
        Self::check_len("attention's output", out.len(), b * t * c)?;
        Self::check_len("attention's dqkv", dqkv.len(), b * t * (nh + 2 * kvh) * hs)?;
        if rope_tab != 0 && dqkv.is_bf16() {
            return Err(CudaError::Unsupported("RoPE's rotation at the attention's store into a BF16 dqkv (the rotated values are not BF16 numbers)".into()));
        }
        let [_, dkdv, dq] = flash_kernels(hs)?;
        let scale = 1.0 / (hs as f32).sqrt();
        let Heads { q, k, v } = heads;
        let dy = self.flash_dout(dout, b, t, nh, hs)?;
        let (dqkvp, dqkv16, deltap, lsep) = (self.ptr(dqkv.raw()), dqkv.is_bf16() as i32, self.ptr(datt), self.ptr(att));
        let (doutp, dout16, outp, out16) = (self.ptr(dout.raw()), dout.is_bf16() as i32, self.ptr(out.raw()), out.is_bf16() as i32);
        let (bi, ti, nhi, kvhi, hsi) = (b as i32, t as i32, nh as i32, kvh as i32, hs as i32);
        let rows = u32::try_from(b * t * nh)
            .map_err(|_| CudaError::Unsupported(format!("fused attention over {b} x {t} x {nh} (batch, tokens, heads) rows: at most 2^32 - 1")))?;
        launch!(self, "flash_bwd_delta", cfg((rows.div_ceil(8 * FLASH_DELTA_ROWS), 1, 1), 256), deltap, doutp, dout16, outp, out16, bi, ti, nhi, hsi)?;
        let [_, dkdv_smem, dq_smem] = flash_smem(hs);
        let lc = flash_grid(kvh, b, t.div_ceil(FLASH_TILE), dkdv_smem)?;
        launch!(self, dkdv, lc, dqkvp, dqkv16, q, k, v, dy, lsep, deltap, ti, nhi, kvhi, scale, causal as i32, rope_tab)?;
        let lc = flash_grid(nh, b, t.div_ceil(FLASH_TILE * flash_query_tiles(hs).dq), dq_smem)?;
        launch!(self, dq, lc, dqkvp, dqkv16, q, k, v, dy, lsep, deltap, ti, nhi, kvhi, scale, causal as i32, rope_tab)
    }

    fn check_len(what: &str, got: usize, need: usize) -> Result<(), CudaError> {
        if got < need {
            return Err(CudaError::Unsupported(format!("{what} holds {got} floats; {need} are needed (size it with Backend::attention_saved_len)")));
        }
        Ok(())
    }

    /// Checks attention's head counts; returns (hs, rep = NH/KVH).
    pub(super) fn attention_heads(c: usize, nh: usize, kvh: usize) -> Result<(usize, usize), CudaError> {
        if nh == 0 || kvh == 0 || !c.is_multiple_of(nh) || !nh.is_multiple_of(kvh) {
            return Err(CudaError::Unsupported(format!("attention with C = {c}, NH = {nh}, KVH = {kvh} (NH must divide C and KVH divide NH)")));
        }
        Ok((c / nh, nh / kvh))
    }

    fn attention_fwd_unfused(&mut self, out: &mut DevBuf, att: &mut CudaSlice<f32>, qkv: &DevBuf, shape: AttentionShape) -> Result<(), CudaError> {
        let AttentionShape { b, t, c, nh, kvh, causal } = shape;
        let (hs, rep) = Self::attention_heads(c, nh, kvh)?;
        let (bh, groups) = (b * nh, b * kvh);
        let nq = bh * t * hs;
        grow(&self.stream, &mut self.attn.att16, bh * t * t)?;
        grow(&self.stream, &mut self.attn.y32, nq)?;
        let (q, k, v) = self.attention_split(qkv, b, t, nh, kvh, hs)?;
        let (a16, y) = (self.ptr(&self.attn.att16), self.ptr(&self.attn.y32));
        Self::check_len("attention's output", out.len(), b * t * c)?;
        let (attp, outp, out16) = (self.ptr(att), self.ptr(out.raw()), out.is_bf16() as i32);
        let (bi, ti, nhi, hsi) = (b as i32, t as i32, nh as i32, hs as i32);
        let scale = 1.0 / (hs as f32).sqrt();
        // preatt = scale · q kᵀ, into att (the softmax runs in place).
        self.blas_gemm(Batched::attention_scores(t, hs, groups, rep, scale), k, q, attp)?;
        let rows = (bh * t) as u64;
        launch!(self, "attention_softmax_fwd", cfg((((bh * t) as u32).div_ceil(8), 1, 1), 256), attp, a16, attp, rows, ti, causal as i32)?;
        // y = att v.
        self.blas_gemm(Batched::attention_values(t, hs, groups, rep, false, 1.0), v, a16, y)?;
        launch!(self, "attention_merge_fwd", grid_for(nq, 256), outp, out16, y, bi, ti, nhi, hsi)?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn attention_bwd_unfused(
        &mut self,
        dqkv: &mut DevBuf,
        datt: &mut CudaSlice<f32>,
        dout: &DevBuf,
        qkv: &DevBuf,
        att: &CudaSlice<f32>,
        shape: AttentionShape,
    ) -> Result<(), CudaError> {
        let AttentionShape { b, t, c, nh, kvh, causal } = shape;
        let (hs, rep) = Self::attention_heads(c, nh, kvh)?;
        let (bh, groups) = (b * nh, b * kvh);
        let nq = bh * t * hs;
        let nkv = groups * t * hs;
        let na = bh * t * t;
        grow(&self.stream, &mut self.attn.att16, na)?;
        grow(&self.stream, &mut self.attn.dpre16, na)?;
        for buf in [&mut self.attn.y32, &mut self.attn.dq32, &mut self.attn.dk32] {
            grow(&self.stream, buf, nq)?;
        }
        let (q, k, v) = self.attention_split(qkv, b, t, nh, kvh, hs)?;
        let dy = self.attention_split_dout(dout, b, t, nh, hs)?;
        let (a16, dp16) = (self.ptr(&self.attn.att16), self.ptr(&self.attn.dpre16));
        let (dv, dq, dk) = (self.ptr(&self.attn.y32), self.ptr(&self.attn.dq32), self.ptr(&self.attn.dk32));
        Self::check_len("attention's dqkv", dqkv.len(), b * t * (nh + 2 * kvh) * hs)?;
        let (attp, dattp, dqkvp, dqkv16) = (self.ptr(att), self.ptr(datt), self.ptr(dqkv.raw()), dqkv.is_bf16() as i32);
        let (bi, ti, nhi, kvhi, hsi) = (b as i32, t as i32, nh as i32, kvh as i32, hs as i32);
        let scale = 1.0 / (hs as f32).sqrt();
        // datt = dy vᵀ
        self.blas_gemm(Batched::attention_scores(t, hs, groups, rep, 1.0), v, dy, dattp)?;
        let rows = (bh * t) as u64;
        launch!(self, "attention_softmax_bwd", cfg((((bh * t) as u32).div_ceil(8), 1, 1), 256), dp16, a16, attp, dattp, rows, ti, causal as i32)?;
        // dv = attᵀ dy, summed over the kv head's query heads.
        self.blas_gemm(Batched::attention_values(t, hs, groups, rep, true, 1.0), dy, a16, dv)?;
        // dq = scale · dpre k
        self.blas_gemm(Batched::attention_values(t, hs, groups, rep, false, scale), k, dp16, dq)?;
        // dk = scale · dpreᵀ q, summed over the kv head's query heads.
        self.blas_gemm(Batched::attention_values(t, hs, groups, rep, true, scale), q, dp16, dk)?;
        launch!(self, "attention_merge_bwd", grid_for(nq + nkv, 256), dqkvp, dqkv16, dq, dk, dv, bi, ti, nhi, kvhi, hsi)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every fused kernel fits the shared memory one block may opt into on a Hopper SM (227 KiB),
    /// and every head size it lists has its three entry points; other sizes take the unfused path.
    #[test]
    fn every_fused_kernel_fits_one_sm_and_has_its_entry_points() {
        for d in FLASH_HEAD_SIZES {
            let smem = flash_smem(d);
            assert!(smem.iter().all(|&b| b <= 227 * 1024), "head size {d}: {smem:?} bytes");
            let names = flash_names(d).expect("listed head size");
            assert!(names.iter().all(|n| n.ends_with(&format!("_d{d}"))), "{names:?}");
        }
        assert!(flash_names(80).is_none() && flash_names(256).is_none());
    }

    /// The query tiles per block the launchers size their grids and shared memory for are the
    /// kernel's own (the defaults of FA_MT_FWD and FA_MT_DQ, `((D) <= N ? A : B)`).
    #[test]
    fn the_query_tiles_per_block_match_the_kernel() {
        let src = include_str!("../../../../kernels/flash_attention.cu");
        let tiles = |name: &str, d: usize| -> usize {
            let def = src
                .lines()
                .find_map(|l| l.strip_prefix(&format!("#define {name}(D) ")))
                .unwrap_or_else(|| panic!("no default #define {name}(D) in flash_attention.cu"));
            let bare: String = def.chars().filter(|&c| c != '(' && c != ')').collect();
            let f: Vec<&str> = bare.split(['?', ':']).map(str::trim).collect();
            let bound = f.first().and_then(|c| c.strip_prefix("D <=")).and_then(|n| n.trim().parse::<usize>().ok());
            let bound = bound.unwrap_or_else(|| panic!("{name}: {def} is not ((D) <= N ? A : B)"));
            f[if d <= bound { 1 } else { 2 }].parse().unwrap_or_else(|_| panic!("{name}: {def}"))
        };
        for d in FLASH_HEAD_SIZES {
            let mt = flash_query_tiles(d);
            assert_eq!(mt.fwd, tiles("FA_MT_FWD", d), "forward, head size {d}");
            assert_eq!(mt.dq, tiles("FA_MT_DQ", d), "dQ, head size {d}");
        }
    }

    /// `flash_bwd_delta`'s grid covers the rows the kernel gives each warp (FA_DELTA_ROWS).
    #[test]
    fn the_delta_rows_per_warp_match_the_kernel() {
        use super::super::kernels::Family;
        assert_eq!(Family::FlashAttention.define("FA_DELTA_ROWS"), FLASH_DELTA_ROWS as usize);
    }

    /// A head's element (b, h, t, d) lies where the kernels look for it in both layouts, the
    /// struct has `FaTensor`'s 24-byte C layout, and a batch past 32-bit offsets is refused.
    #[test]
    fn head_tensors_address_both_layouts_and_refuse_what_32_bits_cannot_reach() {
        assert_eq!(std::mem::size_of::<HeadTensor>(), 24);
        assert_eq!(std::mem::align_of::<HeadTensor>(), 8);
        // The element offset (in values) of (b, h, t, d), as flash_attention.cu computes it.
        let at = |x: &HeadTensor, base: u64, b: i64, h: u32, t: u32, d: u32| ((x.ptr - base) / 2) as i64 + b * x.batch + (h * x.head + t * x.row + d) as i64;
        let (nh, kvh, t, hs) = (4usize, 2usize, 5usize, 16usize);
        let w = (nh + 2 * kvh) * hs;
        let base = 1 << 20;
        // qkv rows (B, T, W): q head h at columns h·hs, k head g at (NH + g)·hs, v at (NH + KVH + g)·hs.
        let q = HeadTensor::in_rows(base, t, w, 0, hs).unwrap();
        let k = HeadTensor::in_rows(base, t, w, nh * hs, hs).unwrap();
        let v = HeadTensor::in_rows(base, t, w, (nh + kvh) * hs, hs).unwrap();
        let row = |b: usize, tt: usize| ((b * t + tt) * w) as i64;
        assert_eq!(at(&q, base, 1, 3, 2, 7), row(1, 2) + (3 * hs + 7) as i64);
        assert_eq!(at(&k, base, 1, 1, 4, 0), row(1, 4) + ((nh + 1) * hs) as i64);
        assert_eq!(at(&v, base, 0, 0, 0, 15), row(0, 0) + ((nh + kvh) * hs + 15) as i64);
        // Head-major (B, H, T, HS), as the split kernels write it.
        let hm = HeadTensor::head_major(base, nh, t, hs).unwrap();
        assert_eq!(at(&hm, base, 1, 2, 3, 4), (((nh + 2) * t + 3) * hs + 4) as i64);
        // A batch of 2^32 values or more cannot be addressed with the kernels' 32-bit offsets.
        assert!(HeadTensor::in_rows(base, 1 << 16, 1 << 16, 0, 64).is_err());
        assert!(HeadTensor::head_major(base, 1 << 10, 1 << 16, 64).is_err());
        assert!(HeadTensor::in_rows(base, (1 << 16) - 1, 1 << 16, 0, 64).is_ok());
    }

    /// A head size without a fused kernel, or the switch, is said in one line; the fused sizes
    /// say nothing.
    #[test]
    fn the_unfused_path_is_announced_with_its_reason() {
        assert_eq!(unfused_attention_note(2048, 32, true), None);
        assert_eq!(unfused_attention_note(768, 12, true), None);
        let odd = unfused_attention_note(960, 12, true).expect("head size 80 is not fused");
        assert!(odd.contains("head size 960/12") && odd.contains("16, 32, 64, 96, 128"), "{odd}");
        let off = unfused_attention_note(2048, 32, false).expect("switched off");
        assert!(off.contains("FP8SCOPE_ATTENTION=unfused"), "{off}");
        assert!(!odd.contains('\n') && !off.contains('\n'));
    }
}

//! The CUDA backend: the same primitives as the CPU reference, on an NVIDIA GPU of compute
//! capability ≥ 8.9 (FP8 tensor cores), through cudarc with dynamic loading.
//!
//! - Kernels: `kernels/*.cu`, one file per layer family, compiled by NVRTC at start-up to a CUBIN
//!   for the GPU found ([`kernels`]). Each family's launchers have a file here named after its
//!   kernel file, with methods named after the kernels they launch (`layernorm_fwd_impl` launches
//!   `layernorm_fwd`): `embedding.rs`, `layernorm.rs`, `rmsnorm.rs`, `gelu.rs`, `swiglu.rs`,
//!   `rope.rs` (the RoPE kernels of attention.cu), `attention.rs` (the fused flash-style kernels and
//!   the unfused fallback), `residual.rs`, `loss.rs`, `adamw.rs`, `stats.rs` (reductions) and
//!   `channels.rs` (per-channel statistics). `primitives.rs` is the [`Backend`] impl over them:
//!   a profiler span, the launcher, and the error handling below. `matmul.rs` runs the linear
//!   layers' GEMMs (beside `layers/matmul.rs`), `gemm_output.rs` what follows a GEMM in its output
//!   (`kernels/gemm_output.cu`), `bias_grad.rs` the bias gradients (`kernels/bias_grad.cu`),
//!   `reports.rs` copies the step's reports to the host, `weight_casts.rs` casts the step's FP8
//!   weights in one launch before the forward (`Backend::cast_weights`), `step_graph/` launches
//!   the step's forward and backward as CUDA graphs (on by default; `FP8SCOPE_GRAPH=0` turns them off:
//!   every launch below is recorded instead while a step is);
//!   this file keeps the backend's state, its scale slots and `round_bf16_fwd`, a kernel of cast.cu.
//! - Errors: a primitive cannot return one, so the backend keeps the first ([`CudaBackend`]'s
//!   `error`), returns a harmless value in place of the result, and skips the device work of every
//!   later primitive until [`Backend::take_error`] hands the error over; the training loop checks
//!   it once per step and stops the run with it.
//! - Linear-layer GEMMs: cuBLASLt with FP8 (E4M3/E5M2, in the TN layout) or BF16 operands and FP32
//!   accumulation, writing BF16 D into the layer's buffer with the bias in cuBLASLt's epilogue
//!   (`gemm_output.rs`; a pass over D only for f32 outputs, accumulation and planted NaNs).
//!   Operands are cast by the `cast_fwd_*` kernels, which also transpose where dgrad and wgrad need
//!   it and reduce the cast statistics in the same pass; each operand is cast once per step for its
//!   two GEMMs ([`cast`]). Scales stay on the device: a delayed scale is a
//!   kernel argument written to a device slot, a current scale is computed on the device from the
//!   amax, and cuBLASLt reads the dequantisation factor through a device pointer.
//! - Statistics land in device records, one per operand cast (and, from the cheap level on, the
//!   operand's per-channel sums: [`channels`]); [`Backend::take_reports`] copies them to the host
//!   once per step (the only synchronisation a step needs besides the loss and the
//!   gradient norm).
//! - Determinism: no floating-point atomics; every reduction is a fixed-order tree; cuBLASLt plans
//!   are cached per shape so a shape always runs the same algorithm.

pub mod blas;
mod buffer;
mod host_gap;
pub mod kernel_cache;
mod kernel_units;
pub mod kernels;
pub mod precompiled;
mod prof;

pub use buffer::DevBuf;

use crate::backend::{AdamW, Backend, GemmCall, GemmReport, LinearDims, OperandCast, ShadowError, StatsLevel};
use crate::fp8::Fp8Format;
use blas::{Blas, Lt, OpType};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig, PushKernelArg};
use fp8scope_schemas::manifest::DeviceInfo;
use fp8scope_schemas::names::Role;
use std::collections::HashMap;
use std::sync::Arc;

/// What can go wrong in the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no usable CUDA GPU: {0}")]
    NoDevice(String),
    #[error("GPU {name} has compute capability {major}.{minor}; FP8 GEMMs need 8.9 or newer")]
    OldGpu { name: String, major: i32, minor: i32 },
    #[error("the CUDA library {0} could not be loaded")]
    MissingLibrary(&'static str),
    #[error("NVRTC could not compile kernels/{file}: {log}")]
    Compile { file: &'static str, log: String },
    #[error("kernel {0} is missing from its module")]
    MissingKernel(&'static str),
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    #[error("{what} failed: {status}")]
    Blas { what: &'static str, status: String },
    #[error("not supported on the CUDA backend: {0}")]
    Unsupported(String),
    #[error("{0}")]
    Setting(String),
}

/// The GPU the backend would use (GPU 0): (name, (major, minor)), or why there is none.
pub fn probe_gpu() -> Result<(String, (i32, i32)), CudaError> {
    probe_gpu_at(0)
}

/// GPU `ordinal` (as the driver numbers the visible GPUs): (name, (major, minor)), or why there is
/// none.
pub fn probe_gpu_at(ordinal: usize) -> Result<(String, (i32, i32)), CudaError> {
    // SAFETY: only tries to dlopen the driver library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaError::NoDevice("the CUDA driver (libcuda.so) is not installed".into()));
    }
    let n = CudaContext::device_count().map_err(|e| CudaError::NoDevice(format!("{e}")))?;
    if n < 1 {
        return Err(CudaError::NoDevice("the driver sees no GPU".into()));
    }
    if ordinal >= n as usize {
        return Err(CudaError::NoDevice(format!("GPU {ordinal} asked for, the driver sees {n} (0 to {})", n - 1)));
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::NoDevice(format!("{e}")))?;
    let name = ctx.name()?;
    let cc = ctx.compute_capability()?;
    Ok((name, cc))
}

/// The kernels' code of an operand format (`FMT_*`), from the contract's `KERNEL_FORMATS`.
fn fmt_code(t: OpType) -> i32 {
    let tag = match t {
        OpType::Bf16 => "BF16",
        OpType::E4M3 => "E4M3",
        OpType::E5M2 => "E5M2",
    };
    let format = kernel_units::element_formats::KERNEL_FORMATS.iter().find(|f| f.tag == tag);
    format.map(|f| f.code as i32).unwrap_or_else(|| unreachable!("the contract has no kernel format {tag}"))
}

fn op_type(cast: OperandCast) -> Result<OpType, CudaError> {
    match cast {
        OperandCast::Bf16 => Ok(OpType::Bf16),
        OperandCast::Fp8Tensor { format, .. } => Ok(match format {
            Fp8Format::E4M3 => OpType::E4M3,
            Fp8Format::E5M2 => OpType::E5M2,
        }),
        OperandCast::Fp8Block { .. } => Err(CudaError::Unsupported("the block recipe (per-tile scales)".into())),
        OperandCast::Mxfp8 { .. } => Err(CudaError::Unsupported("the mxfp8 recipe".into())),
        OperandCast::Nvfp4 { .. } => Err(CudaError::Unsupported("the nvfp4 recipe".into())),
    }
}

/// Fields of a statistics record (kernels/cast_stats.cuh: STAT_FIELDS).
const STAT_FIELDS: usize = 17;
/// Floats per scale slot (kernels/common.cuh: SLOT_FLOATS): scale at 0, its inverse at SLOT_INV;
/// 32 bytes keep both 16-byte aligned, as cuBLASLt needs of scale pointers.
const SLOT_FLOATS: usize = 8;
const SLOT_INV: usize = 4;
mod stat {
    pub const COUNT: usize = 0;
    pub const SUM: usize = 1;
    pub const SUMSQ: usize = 2;
    pub const MIN: usize = 3;
    pub const MAX: usize = 4;
    pub const AMAX: usize = 5;
    pub const MINABS: usize = 6;
    pub const UNDER: usize = 7;
    pub const SAT: usize = 8;
    pub const NAN: usize = 9;
    pub const INF: usize = 10;
    pub const ZEROS: usize = 11;
    pub const D2: usize = 12;
    pub const DOT: usize = 13;
    pub const A2: usize = 14;
    pub const B2: usize = 15;
    pub const NP: usize = 16;
}

/// Operand casts a step may record (2 per GEMM); 12 layers × 12 GEMMs need 288.
const MAX_SLOTS: usize = 8192;
/// Rows of the cast partials: the largest grid of a cast kernel (`cast::cast_grid`).
const CAST_GRID_MAX: usize = 2048;
const CAST_THREADS: u32 = 256;
const REDUCE_GRID: usize = 264;

/// Tokens on the device, with the positions of each distinct token for the embedding backward.
pub struct CudaTokens {
    ids: CudaSlice<u32>,
    uniq: CudaSlice<u32>,
    offsets: CudaSlice<u32>,
    positions: CudaSlice<u32>,
    n_uniq: usize,
}

/// An operand cast queued for the step's reports.
struct PendingOp {
    slot: usize,
    role: Role,
    format: &'static str,
    fp8: bool,
    level: StatsLevel,
    given_amax: Option<f32>,
    numel: u64,
    quantized: Option<Vec<u8>>,
}

struct PendingGemm {
    id: crate::backend::GemmId,
    a: PendingOp,
    b: PendingOp,
    gemm_slot: usize,
    shadow: Option<ShadowError>,
}

/// Which operand scratch buffer a cast writes to.
#[derive(Clone, Copy)]
enum Side {
    P,
    Q,
}

pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    funcs: HashMap<&'static str, CudaFunction>,
    lt: Lt,
    blas: Blas,
    info: DeviceInfo,
    // Operand scratch (cast GEMM operands), GEMM output scratch, statistics.
    op_p: CudaSlice<u8>,
    op_q: CudaSlice<u8>,
    d_tmp: CudaSlice<f32>,
    partials: CudaSlice<f64>,
    /// Chunk sums of the bias gradient's column sums ([`CudaBackend::bias_grad`]).
    colsum_partial: CudaSlice<f64>,
    /// BF16 GEMM operands widened to f32 for the casts that read only f32 (operand a, b;
    /// `bf16_operands.rs`), allocated on first use.
    widened: [Option<CudaSlice<f32>>; 2],
    /// BF16 GEMM operands widened so far (`bf16_operands_widened`).
    widened_operands: u64,
    /// The kept gradient cast's column sums, slot-major (`cast.rs`: `CastUse::column_sums`).
    column_sums: CudaSlice<f64>,
    /// Bias gradients taken from a cast's column sums so far (`bias_grads_from_column_sums`).
    fused_bias_grads: u64,
    records: CudaSlice<f64>,
    scales: CudaSlice<f32>,
    nonfinite: CudaSlice<u64>,
    red: CudaSlice<f64>,
    counter: CudaSlice<u64>,
    cast_counter: CudaSlice<u32>,
    next_slot: usize,
    next_gemm: usize,
    /// Most blocks of a cast kernel (0: the defaults of `cast::cast_grid`; benchmarks set it).
    cast_grid: usize,
    /// SwiGLU's backward cast by pairs of tiles with its channel partials over runs of tiles
    /// (`cast.rs`: SRC_DSWIGLU_PAIR_RUNS) instead of one tile a run (`FP8SCOPE_PAIR_RUNS=1`).
    pair_runs: bool,
    /// Shared memory bytes `crossentropy_smem_fwd` may take (0: the GPU refused; [`loss`]).
    loss_row_smem: usize,
    /// Shared memory bytes `crossentropy_split_fwd` may take (0: refused, or turned off by a test).
    loss_split_smem: usize,
    /// Transposed casts kept for the second GEMM of their site ([`cast`]).
    kept: cast::KeptCasts,
    /// The step's weights cast before the forward, in one launch ([`weight_casts`]).
    weights: weight_casts::WeightCasts,
    /// Per-channel statistics of the step's recorded casts ([`channels`]).
    chan: channels::ChannelRecords,
    /// The recorded casts' statistics partials, waiting for their batched reduction ([`stat_batch`]).
    stat: stat_batch::StatArena,
    pending: Vec<PendingGemm>,
    /// GEMM shapes cuBLASLt runs only with BF16 output.
    bf16_out: std::collections::HashSet<gemm_output::ShapeKey>,
    /// GEMM shapes whose bias cuBLASLt's epilogue refuses ([`gemm_output`]).
    bias_refused: std::collections::HashSet<gemm_output::ShapeKey>,
    /// A bias rounded to BF16 for cuBLASLt's epilogue, and its RISKY flag ([`gemm_output`]).
    bias16: CudaSlice<f32>,
    bias_flag: CudaSlice<u32>,
    prof: Option<prof::Profiler>,
    /// The host's time from a step's last synchronisation to the next step's first launch
    /// ([`host_gap`], printed with `FP8SCOPE_VERBOSE=1`).
    host_gap: host_gap::HostGap,
    /// The hold queued at the start of each step's forward, ns ([`probe`]; 0: none).
    /// The environment's settings, read once when the backend opened.
    settings: settings::CudaSettings,
    /// Which attention path runs, and the unfused path's scratch ([`attention`]).
    attn: attention::AttentionState,
    /// Per-chunk column sums of the LayerNorm and RMSNorm weight gradients.
    ln_partial: CudaSlice<f32>,
    /// The RoPE cos/sin table of `layers::rope::rope_table` for (T, HD, theta's bits) ([`rope`]).
    rope_tab: Option<((usize, usize, u32), CudaSlice<f32>)>,
    /// The multi-tensor tables of AdamW, the gradient norm and the zeroing ([`multi_tensor`]).
    mt_adamw: multi_tensor::TensorTable,
    mt_sumsq: multi_tensor::TensorTable,
    mt_zero: multi_tensor::TensorTable,
    /// The step's forward and backward as CUDA graphs ([`step_graph`]; on unless `FP8SCOPE_GRAPH=0`
    /// or the profiler).
    /// Shared, not `&mut`: `launch!` records into it from launchers that hold `&self`.
    graph: std::cell::RefCell<step_graph::StepGraphs>,
    /// The stream the step graphs are captured on, made at the first capture.
    graph_stream: std::cell::OnceCell<Arc<CudaStream>>,
    /// The first error of a primitive since the last [`Backend::take_error`], as
    /// "`primitive`: what failed"; while it is kept, primitives skip their device work.
    error: Option<String>,
}

fn grid_for(n: usize, threads: u32) -> LaunchConfig {
    let blocks = n.div_ceil(threads as usize).clamp(1, 132 * 16) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: grid, block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

/// Launches kernel `$name` with `$cfg`; every argument is passed by value (device pointers as u64).
macro_rules! launch {
    ($self:ident, $name:expr, $cfg:expr $(, $arg:expr)* $(,)?) => {{
        (|| -> Result<(), CudaError> {
            // While a step is recorded into graphs (step_graph/), the launch is recorded instead.
            if $self.graph.borrow().is_recording() {
                let func = $self.func($name)?.cu_function();
                #[allow(unused_mut)]
                let mut args = $crate::backend::cuda::step_graph::ArgWords::default();
                $( args.push(&$arg); )*
                let cfg: cudarc::driver::LaunchConfig = $cfg;
                if $self.record_op(|| $crate::backend::cuda::step_graph::Op::Kernel($crate::backend::cuda::step_graph::KernelOp::new($name, func, cfg, args)))? {
                    return Ok(());
                }
            }
            let f = $self.func($name)?;
            let mut b = $self.stream.launch_builder(f);
            $( let a = $arg; b.arg(&a); )*
            // SAFETY: the argument list matches the kernel's signature in kernels/*.cu (checked by
            // the GPU tests), and every pointer is a live allocation of the size the kernel indexes.
            unsafe { b.launch($cfg) }.map(|_| ()).map_err(CudaError::from)
        })()
    }};
}

mod attention;
mod cast;
mod channels;
mod gemm_output;
pub mod settings;
mod stat_batch;
pub mod step_graph;

fn grow<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + 'static>(
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<T>,
    n: usize,
) -> Result<(), CudaError> {
    if buf.len() < n {
        // The old buffer outlives the recorded ops that may still name it (step_graph/).
        step_graph::defer_drop(std::mem::replace(buf, stream.alloc_zeros::<T>(n.next_power_of_two())?));
    }
    Ok(())
}

/// Every kernel the backend launches, loaded from its family's CUBIN for `arch`: the ones embedded
/// at build time ([`precompiled`]), or, when the binary has none for this GPU or the driver refuses
/// them, NVRTC's ([`kernels::compile_all`]); `settings.precompiled` false takes NVRTC's always.
/// `FP8SCOPE_VERBOSE=1` says which and how long it took.
fn load_kernels(ctx: &Arc<CudaContext>, arch: &str, settings: &settings::CudaSettings) -> Result<HashMap<&'static str, CudaFunction>, CudaError> {
    let load = |precompiled: bool| -> Result<(HashMap<&'static str, CudaFunction>, usize), CudaError> {
        let includes =
            if precompiled && kernels::Family::ALL.iter().all(|&f| precompiled::cubin(arch, f).is_some()) { Vec::new() } else { kernels::nvrtc_setup() };
        let mut funcs = HashMap::new();
        let mut embedded = 0;
        for (fam, cubin, origin) in kernels::compile_all(arch, &includes, precompiled)? {
            let module = ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin.as_ref().clone()))?;
            for &k in fam.kernels() {
                let f = module.load_function(k).map_err(|_| CudaError::MissingKernel(k))?;
                funcs.insert(k, f);
            }
            embedded += (origin == kernels::CubinOrigin::Precompiled) as usize;
        }
        Ok((funcs, embedded))
    };
    let t = std::time::Instant::now();
    let (funcs, embedded) = match load(settings.precompiled) {
        Err(e) if settings.precompiled && !precompiled::archs().is_empty() => {
            eprintln!("fp8scope: the kernels compiled at build time did not load ({e}); compiling them with NVRTC");
            load(false)?
        }
        r => r?,
    };
    if settings.verbose {
        let nvrtc = precompiled::NVRTC_VERSION.map(|(a, b)| format!(" by NVRTC {a}.{b}")).unwrap_or_default();
        eprintln!(
            "fp8scope: kernels for {arch} ready in {:.2} s: {embedded} of {} families compiled at build time{nvrtc}, the rest by NVRTC now or from its disk cache",
            t.elapsed().as_secs_f64(),
            kernels::Family::ALL.len()
        );
    }
    Ok(funcs)
}

impl CudaBackend {
    /// Opens GPU 0, checks it can run FP8 GEMMs, compiles the kernels and creates the BLAS handles.
    /// Its work goes to the context's default stream.
    pub fn new() -> Result<CudaBackend, CudaError> {
        Self::open(0, false)
    }

    /// [`CudaBackend::new`] on GPU `ordinal`; with `shared`, on a stream of its own: for one of
    /// several ranks that share the GPU (the threads of `--dp` / `--tp` on one GPU), whose work
    /// must neither wait for nor be ordered behind the other ranks' on the legacy default stream.
    pub fn open(ordinal: usize, shared: bool) -> Result<CudaBackend, CudaError> {
        let (name, (major, minor)) = probe_gpu_at(ordinal)?;
        if (major, minor) < (8, 9) {
            return Err(CudaError::OldGpu { name, major, minor });
        }
        // Every setting is checked before the GPU is touched.
        let settings = settings::CudaSettings::from_env()?;
        let ctx = CudaContext::new(ordinal)?;
        // One stream: cudarc's per-buffer event tracking would only add work.
        // SAFETY: every buffer of this backend is used on this one stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = if shared { ctx.new_stream()? } else { ctx.default_stream() };
        let arch = format!("sm_{major}{minor}");
        let funcs = load_kernels(&ctx, &arch, &settings)?;
        attention::configure(&funcs)?;
        let (loss_row_smem, loss_split_smem) = loss::configure(&funcs)?;
        let lt = Lt::new(&stream, settings.verbose)?;
        let blas = Blas::new(&stream)?;
        let sms = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let info = DeviceInfo { kind: "cuda".into(), name, compute_capability: Some(format!("{major}.{minor}")), parallelism: sms as u32, block_gemm: None };
        let prof = settings.profile.then(|| prof::Profiler::new(&ctx));
        let s = &stream;
        Ok(CudaBackend {
            op_p: s.alloc_zeros(1 << 20)?,
            op_q: s.alloc_zeros(1 << 20)?,
            d_tmp: s.alloc_zeros(1 << 16)?,
            partials: s.alloc_zeros(CAST_GRID_MAX * STAT_FIELDS)?,
            colsum_partial: s.alloc_zeros(1)?,
            widened: [None, None],
            widened_operands: 0,
            column_sums: s.alloc_zeros(1)?,
            fused_bias_grads: 0,
            cast_grid: 0,
            pair_runs: settings.pair_runs,
            loss_row_smem,
            loss_split_smem,
            kept: Default::default(),
            weights: weight_casts::WeightCasts::new(settings.weight_casts_batched),
            chan: channels::ChannelRecords::new(s)?,
            stat: stat_batch::StatArena::new(s)?,
            records: s.alloc_zeros(MAX_SLOTS * STAT_FIELDS)?,
            scales: s.alloc_zeros(MAX_SLOTS * SLOT_FLOATS)?,
            cast_counter: s.alloc_zeros(1)?,
            nonfinite: s.alloc_zeros(MAX_SLOTS)?,
            red: s.alloc_zeros(REDUCE_GRID * 1024 + 1)?,
            counter: s.alloc_zeros(1)?,
            attn: attention::AttentionState::new(s, settings.attention_fused)?,
            ln_partial: s.alloc_zeros(1)?,
            rope_tab: None,
            mt_adamw: Default::default(),
            mt_sumsq: Default::default(),
            mt_zero: Default::default(),
            graph: std::cell::RefCell::new(step_graph::StepGraphs::new(settings.graphs, settings.verbose)),
            host_gap: host_gap::HostGap::new(settings.verbose),
            graph_stream: std::cell::OnceCell::new(),
            error: None,
            next_slot: 0,
            next_gemm: 0,
            pending: Vec::new(),
            bf16_out: Default::default(),
            bias_refused: Default::default(),
            bias16: s.alloc_zeros(1 << 12)?,
            bias_flag: s.alloc_zeros(1)?,
            prof,
            settings,
            ctx,
            stream,
            funcs,
            lt,
            blas,
            info,
        })
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Bytes of device memory in use now (the driver's view: total − free).
    pub fn memory_used(&self) -> Option<usize> {
        self.ctx.mem_get_info().ok().map(|(free, total)| total - free)
    }

    /// Runs `f` inside a profiler span named `name` (a no-op unless FP8SCOPE_PROFILE is set).
    fn span<T>(&mut self, name: &'static str, f: impl FnOnce(&mut Self) -> T) -> T {
        if self.prof.is_none() {
            return f(self);
        }
        let stream = self.stream.clone();
        let t = std::time::Instant::now();
        let i = self.prof.as_mut().map(|p| p.begin(&stream, name)).unwrap_or(usize::MAX);
        let r = f(self);
        if let Some(p) = self.prof.as_mut() {
            p.end(&stream, i, t.elapsed());
        }
        r
    }

    /// Runs primitive `name`'s device work `f` unless an error is kept already; keeps `f`'s error
    /// (the first one) and returns None in place of its result.
    fn guarded<T>(&mut self, name: &'static str, f: impl FnOnce(&mut Self) -> Result<T, CudaError>) -> Option<T> {
        if self.error.is_some() {
            return None;
        }
        match f(self) {
            Ok(v) => Some(v),
            Err(e) => {
                // One line: the run's error message is this.
                let msg = format!("{name}: {e}");
                self.error = Some(msg.split_whitespace().collect::<Vec<_>>().join(" "));
                None
            }
        }
    }

    /// [`Self::guarded`] inside the profiler span `name`.
    fn spanned<T>(&mut self, name: &'static str, f: impl FnOnce(&mut Self) -> Result<T, CudaError>) -> Option<T> {
        self.guarded(name, |me| me.span(name, f))
    }

    /// The buffer a failed `zeros` or `upload` returns: empty, and owning no device memory (no
    /// device work runs while an error is kept, so no kernel ever sees it).
    fn placeholder<T>(&self) -> CudaSlice<T> {
        // SAFETY: a null pointer of length 0 is never read or written through; event tracking is
        // off (`new`), so no events are created for it.
        unsafe { self.stream.upgrade_device_ptr(0, 0) }
    }

    /// Forgets the step's queued reports and statistics slots: after an error their records on the
    /// device are incomplete, and the next step starts from slot 0 again.
    fn forget_step(&mut self) {
        self.pending.clear();
        self.next_slot = 0;
        self.next_gemm = 0;
        self.chan.reset();
        self.stat.reset();
        self.expire_kept_casts();
    }

    /// `data` rounded to BF16 (to nearest even) and uploaded into a BF16 buffer, two values a word
    /// (the first in the lower half), as the kernels read one: for tests of the 16-bit paths.
    pub fn upload_bf16(&mut self, data: &[f32]) -> Result<DevBuf, CudaError> {
        let bits = |x: Option<&f32>| x.map_or(0u32, |&x| u32::from(half::bf16::from_f32(x).to_bits()));
        let words: Vec<f32> = data.chunks(2).map(|c| f32::from_bits(bits(c.first()) | (bits(c.get(1)) << 16))).collect();
        let mem = if words.is_empty() { self.stream.alloc_zeros::<f32>(1)? } else { self.stream.clone_htod(&words)? };
        Ok(DevBuf::bf16(mem, data.len()))
    }

    /// `len` values of `buf` from `offset` on, `stride` apart, copied to the host.
    fn download_impl(&mut self, buf: &DevBuf, offset: usize, len: usize, stride: usize) -> Result<Vec<f32>, CudaError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        // A step recorded into CUDA graphs stops recording: its ops must run before the read.
        self.leave_step_graph()?;
        let end = offset + (len - 1) * stride + 1;
        if end > buf.len() {
            return Err(CudaError::Unsupported(format!("download of {len} values {stride} apart from {offset} on: the buffer holds {}", buf.len())));
        }
        let v = if buf.is_bf16() {
            // The whole words that hold values offset..end, two BF16 values per word.
            let words = self.stream.clone_dtoh(&buf.raw().slice(offset / 2..end.div_ceil(2)))?;
            let skip = offset % 2;
            words
                .iter()
                .flat_map(|w| {
                    let b = w.to_bits();
                    [f32::from_bits(b << 16), f32::from_bits(b & 0xffff_0000)]
                })
                .skip(skip)
                .take(end - offset)
                .collect()
        } else {
            self.stream.clone_dtoh(&buf.slice(offset..end))?
        };
        Ok(match stride {
            1 => v,
            0 => vec![v[0]; len],
            _ => v.into_iter().step_by(stride).collect(),
        })
    }

    fn func(&self, name: &'static str) -> Result<&CudaFunction, CudaError> {
        self.funcs.get(name).ok_or(CudaError::MissingKernel(name))
    }

    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _g) = s.device_ptr(&self.stream);
        p
    }

    fn alloc_slot(&mut self) -> Result<usize, CudaError> {
        if self.next_slot >= MAX_SLOTS {
            return Err(CudaError::Unsupported(format!("more than {MAX_SLOTS} operand casts in one step")));
        }
        self.next_slot += 1;
        Ok(self.next_slot - 1)
    }

    /// Every element of `x` rounded to BF16 in place (`round_bf16_fwd`, a kernel of cast.cu, whose
    /// launchers are in `cast.rs`; the CPU reference is `backend/cpu/cast.rs`'s `round_bf16_inplace`).
    fn round_bf16_fwd_impl(&mut self, x: &mut CudaSlice<f32>) -> Result<(), CudaError> {
        let n = x.len();
        let p = self.ptr(x);
        launch!(self, "round_bf16_fwd", grid_for(n, 256), p, n as u64)
    }
}

// After the macros above, which they use.
mod activation_gemm;
mod adamw;
mod bf16_operands;
mod bias_grad;
mod embedding;
mod gelu;
mod gemm_tuning;
mod layernorm;
mod loss;
mod matmul;
mod multi_tensor;
mod norm_gemm;
mod primitives;
mod probe;
mod reports;
mod residual;
mod rmsnorm;
mod rope;
mod rope_attention;
pub mod shadow_error;
mod stats;
mod swiglu;
mod weight_casts;

//! The step's forward and backward as CUDA graphs (`FP8SCOPE_GRAPH=1`; off by default).
//!
//! A step of a kind seen before (the same [`crate::model::StepPlan::graph_signature`]: statistics
//! level and planted faults, no dumps) is not launched op by op. Its device work is recorded
//! instead: every kernel launch (`launch!`), cuBLASLt and cuBLAS product and zeroing becomes an
//! [`Op`], and every [`segment_ops`] ops (8 at the step's start, then up to [`SEGMENT_OPS`]), and
//! at the end of the backward, the segment is launched as one graph:
//!
//! - the first time a segment is seen, it is captured (the ops issued in capture mode on a stream
//!   of its own: the backend's is the legacy default stream, which cannot be captured),
//!   instantiated and launched on the backend's stream; the graph node of each kernel is kept;
//! - the next times, the recorded ops are compared with the graph's. Where the same kernels,
//!   products and zeroings come in the same order, and only the kernels' arguments or launch
//!   shapes differ (a delayed scale, a table uploaded anew, 1/supervised, the embedding
//!   backward's block a distinct token), those nodes get them (`cuGraphExecKernelNodeSetParams`)
//!   and the graph is launched again; any other difference captures the segment again.
//!
//! So a graphed step runs the very launches, with the very arguments, an ungraphed step would, and
//! every bit is to be the same: `capture/tests/cuda_graph.rs` holds whole runs both ways to it,
//! and `bench/compare_builds.sh` does on a binary (`bench/env_bin.sh … FP8SCOPE_GRAPH=1`).
//! Segments let the GPU start a step while the host still records its rest, as it does op by op.
//!
//! The first step of each kind runs ungraphed, so that every GEMM shape is tuned and every buffer
//! has its size before a step is recorded. While recording, nothing may wait for the device, and
//! host-side effects run at once: a table uploaded (its kernel's argument then points at the new
//! one), a scratch buffer grown (the old one is kept alive until the step's last segment is
//! launched: [`defer_drop`]). A buffer whose contents a growth must carry (the channel records)
//! refuses to grow while recording ([`recording`]).

use super::blas::{Batched, LtCall};
use super::{CudaBackend, CudaError};
use cudarc::driver::sys;
use cudarc::driver::{CudaGraph, DeviceRepr, LaunchConfig};
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};

/// Ops a graph segment holds at most: a llama-1b step is about a dozen segments.
pub(super) const SEGMENT_OPS: usize = 64;

/// Ops segment `index` of a step holds: 8, 16, 32, then [`SEGMENT_OPS`], so that the GPU, idle
/// between steps, waits for the recording of 8 ops before the step starts, not of 64.
pub(super) fn segment_ops(index: usize) -> usize {
    (8usize << index.min(3)).min(SEGMENT_OPS)
}

/// Why the step graphs and the profiler do not go together.
pub(super) const PROFILED: &str = "FP8SCOPE_GRAPH=1 and FP8SCOPE_PROFILE=1 cannot be combined: the profiler times each launch, a graph launches many at once";

/// Whether `FP8SCOPE_GRAPH` turns the step graphs on: unset or `0` off, `1` on.
pub(super) fn graphs_from(v: Option<&str>) -> Result<bool, CudaError> {
    match v.map(str::trim) {
        None | Some("" | "0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(CudaError::Setting(format!("FP8SCOPE_GRAPH={other}: expected 1 (the step in CUDA graphs) or 0 (launch by launch)"))),
    }
}

thread_local! {
    /// Whether a step is being recorded on this thread (the backend's thread).
    static RECORDING: Cell<bool> = const { Cell::new(false) };
    /// Buffers replaced while recording, freed once the step's segments are launched.
    static DEFERRED: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// Whether a step is being recorded (a buffer that must carry its contents when it grows refuses
/// to grow then).
pub(super) fn recording() -> bool {
    RECORDING.with(Cell::get)
}

/// Drops `old` now, or, while a step is recorded, once its segments are launched: recorded ops
/// that are not launched yet may still name its memory.
pub(super) fn defer_drop<T: 'static>(old: T) {
    if recording() {
        DEFERRED.with(|d| d.borrow_mut().push(Box::new(old)));
    }
}

/// A kernel's arguments, each in whole words (so that each is 8-byte aligned), one after the other.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct ArgWords {
    words: Vec<u64>,
    /// Where each argument starts in `words`.
    starts: Vec<u32>,
}

impl ArgWords {
    /// Appends the bytes of `v`, zero-padded to whole words.
    pub fn push<T: DeviceRepr>(&mut self, v: &T) {
        let n = std::mem::size_of::<T>();
        let at = self.words.len();
        self.starts.push(at as u32);
        self.words.resize(at + n.div_ceil(8).max(1), 0);
        // SAFETY: v is plain data of n bytes (DeviceRepr: passed to kernels by value), and the
        // words from `at` on hold at least n bytes.
        unsafe { std::ptr::copy_nonoverlapping(v as *const T as *const u8, self.words[at..].as_mut_ptr() as *mut u8, n) };
    }

    /// The words of argument `i`.
    #[cfg(test)]
    fn arg(&self, i: usize) -> &[u64] {
        let end = self.starts.get(i + 1).map_or(self.words.len(), |&e| e as usize);
        &self.words[self.starts[i] as usize..end]
    }
}

/// One recorded kernel launch.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct KernelOp {
    pub name: &'static str,
    pub func: sys::CUfunction,
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub smem: u32,
    pub args: ArgWords,
}

impl KernelOp {
    pub fn new(name: &'static str, func: sys::CUfunction, cfg: LaunchConfig, args: ArgWords) -> KernelOp {
        KernelOp { name, func, grid: cfg.grid_dim, block: cfg.block_dim, smem: cfg.shared_mem_bytes, args }
    }

    /// Pointers to the arguments, as cuLaunchKernel and the graph nodes take them (valid while
    /// `self` is).
    fn params(&self) -> Vec<*mut std::ffi::c_void> {
        self.args.starts.iter().map(|&i| self.args.words[i as usize..].as_ptr() as *mut std::ffi::c_void).collect()
    }
}

/// One op of a step's device work, as recorded.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Op {
    Kernel(KernelOp),
    /// A cuBLASLt product.
    Lt(LtCall),
    /// A cuBLAS strided-batched product (the unfused attention).
    Blas { g: Batched, a: u64, b: u64, c: u64 },
    /// `bytes` zero bytes at `ptr`.
    Zero { ptr: u64, bytes: usize },
}

/// How a segment's recorded ops compare with those its graph was captured from.
#[derive(Debug, PartialEq)]
pub(super) enum Match {
    /// The same ops, arguments included.
    Same,
    /// The same ops but for the arguments or launch shapes of these kernels (indices into the
    /// ops).
    Patch(Vec<usize>),
    /// Another sequence: the segment must be captured again.
    Differs,
}

/// Compares `new` with the ops `old` a graph was captured from.
pub(super) fn compare(old: &[Op], new: &[Op]) -> Match {
    if old.len() != new.len() {
        return Match::Differs;
    }
    let mut patch = Vec::new();
    for (i, (o, n)) in old.iter().zip(new).enumerate() {
        match (o, n) {
            (Op::Kernel(a), Op::Kernel(b)) => {
                // A node keeps its function (and so its arguments' sizes); its arguments and its
                // launch shape may change (the embedding's backward takes a block a distinct token).
                if (a.func, &a.args.starts) != (b.func, &b.args.starts) {
                    return Match::Differs;
                }
                if a != b {
                    patch.push(i);
                }
            }
            (a, b) if a == b => {}
            _ => return Match::Differs,
        }
    }
    if patch.is_empty() { Match::Same } else { Match::Patch(patch) }
}

/// A captured segment: its ops, the graph node of each kernel op (None for the others), and the
/// instantiated graph.
struct Segment {
    ops: Vec<Op>,
    nodes: Vec<Option<sys::CUgraphNode>>,
    graph: CudaGraph,
}

/// What the step graphs did, for the tests and `FP8SCOPE_VERBOSE`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphCounts {
    /// Steps recorded into graphs.
    pub graphed_steps: u64,
    /// Steps launched op by op (a dump step, or the first of its kind).
    pub ungraphed_steps: u64,
    /// Segments captured (a new one, or one whose ops changed).
    pub captured: u64,
    /// Segments launched again from their graph.
    pub replayed: u64,
    /// Kernel nodes given new arguments before a replay.
    pub patched_nodes: u64,
}

/// The step being recorded.
struct Recording {
    signature: u64,
    segment: usize,
    ops: Vec<Op>,
}

/// The backend's step graphs: on or off, the kinds of step seen, the captured segments by
/// (signature, index), the step being recorded, the stream segments are captured on.
pub(super) struct StepGraphs {
    pub enabled: bool,
    /// A stream of its own (the backend's is the legacy default stream, which cannot be
    /// captured); made at the first capture. The graphs are launched on the backend's stream.
    capture_stream: Option<std::sync::Arc<cudarc::driver::CudaStream>>,
    seen: HashSet<u64>,
    segments: HashMap<(u64, usize), Segment>,
    rec: Option<Recording>,
    pub counts: GraphCounts,
    /// Why the graphs were turned off mid-run, if they were ([`CudaBackend::flush_segment`]).
    failure: Option<String>,
}

impl Drop for StepGraphs {
    fn drop(&mut self) {
        if (self.enabled || self.failure.is_some()) && std::env::var_os("FP8SCOPE_VERBOSE").is_some_and(|v| v != "0") {
            let c = self.counts;
            eprintln!(
                "CUDA graphs: {} steps graphed, {} launched op by op; {} segments captured, {} replayed, {} kernel nodes patched",
                c.graphed_steps, c.ungraphed_steps, c.captured, c.replayed, c.patched_nodes
            );
        }
    }
}

impl StepGraphs {
    pub fn new(enabled: bool) -> StepGraphs {
        StepGraphs { enabled, capture_stream: None, seen: HashSet::new(), segments: HashMap::new(), rec: None, counts: GraphCounts::default(), failure: None }
    }

    pub fn is_recording(&self) -> bool {
        self.rec.is_some()
    }
}

impl CudaBackend {
    /// Turns the step graphs on or off (`FP8SCOPE_GRAPH`); the tests compare both ways in one
    /// process. Forgets every graph. Refused while the profiler is on.
    pub fn set_step_graphs(&mut self, on: bool) -> Result<(), CudaError> {
        if on && self.prof.is_some() {
            return Err(CudaError::Setting(PROFILED.into()));
        }
        self.graph = RefCell::new(StepGraphs::new(on));
        Ok(())
    }

    /// What the step graphs did so far.
    pub fn step_graph_counts(&self) -> GraphCounts {
        self.graph.borrow().counts
    }

    /// Why the step graphs were turned off mid-run (the run went on launch by launch), if they
    /// were.
    pub fn step_graph_failure(&self) -> Option<String> {
        self.graph.borrow().failure.clone()
    }

    /// Starts a step's forward and backward: recorded into graphs when they are on, the step has
    /// a signature, a step of that signature ran before, and no error is kept.
    pub(super) fn begin_step_work_impl(&mut self, signature: Option<u64>) {
        let g = self.graph.get_mut();
        if !g.enabled || self.error.is_some() {
            return;
        }
        match signature {
            Some(s) if g.seen.contains(&s) => {
                g.rec = Some(Recording { signature: s, segment: 0, ops: Vec::new() });
                g.counts.graphed_steps += 1;
                RECORDING.with(|r| r.set(true));
            }
            Some(s) => {
                g.seen.insert(s);
                g.counts.ungraphed_steps += 1;
            }
            None => g.counts.ungraphed_steps += 1,
        }
    }

    /// Ends the step's forward and backward: launches the last segment, then frees the buffers
    /// replaced while recording. After an error nothing recorded is launched.
    pub(super) fn end_step_work_impl(&mut self) {
        if !self.graph.get_mut().is_recording() {
            return;
        }
        if self.error.is_none() {
            self.guarded("step graph", |me| me.flush_segment());
        }
        self.graph.get_mut().rec = None;
        RECORDING.with(|r| r.set(false));
        DEFERRED.with(|d| d.borrow_mut().clear());
    }

    /// Records `op` while a step is recorded (launching the segment once it holds
    /// [`segment_ops`]); returns false when no step is, for the caller to issue it now.
    pub(super) fn record_op(&self, op: impl FnOnce() -> Op) -> Result<bool, CudaError> {
        let full = {
            let mut g = self.graph.borrow_mut();
            let Some(rec) = g.rec.as_mut() else { return Ok(false) };
            rec.ops.push(op());
            rec.ops.len() >= segment_ops(rec.segment)
        };
        if full {
            self.flush_segment()?;
        }
        Ok(true)
    }

    /// Launches the recorded ops as the step's next segment: its graph, patched, or a new capture.
    /// Should the graph fail (a capture the driver refuses, say), the ops are launched one by one
    /// instead, as an ungraphed step would, the graphs are turned off for the rest of the run,
    /// and stderr says why in one line ([`CudaBackend::step_graph_failure`]).
    fn flush_segment(&self) -> Result<(), CudaError> {
        let (key, ops, enabled) = {
            let mut g = self.graph.borrow_mut();
            let enabled = g.enabled;
            let Some(rec) = g.rec.as_mut() else { return Ok(()) };
            if rec.ops.is_empty() {
                return Ok(());
            }
            let key = (rec.signature, rec.segment);
            rec.segment += 1;
            (key, std::mem::take(&mut rec.ops), enabled)
        };
        if enabled {
            match self.launch_segment(key, &ops) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    let mut g = self.graph.borrow_mut();
                    let why = format!("CUDA graphs: {e}; the run goes on launch by launch");
                    eprintln!("{why}");
                    (g.enabled, g.failure) = (false, Some(why));
                    g.segments.clear();
                }
            }
        }
        for op in &ops {
            self.issue(op, self.stream.cu_stream())?;
        }
        Ok(())
    }

    /// [`Self::flush_segment`]'s graph path: nothing of `ops` has run when it fails.
    fn launch_segment(&self, key: (u64, usize), ops: &[Op]) -> Result<(), CudaError> {
        // The raw driver calls below need the context current, as cudarc's own calls make it.
        self.ctx.bind_to_thread()?;
        let mut guard = self.graph.borrow_mut();
        let g = &mut *guard;
        let found = g.segments.get(&key).map(|s| match compare(&s.ops, ops) {
            // A kernel whose node the capture could not name is captured again instead.
            Match::Patch(idx) if idx.iter().any(|&i| s.nodes[i].is_none()) => Match::Differs,
            m => m,
        });
        let replay = matches!(found, Some(Match::Same | Match::Patch(_)));
        match found {
            Some(Match::Same) => {}
            Some(Match::Patch(idx)) => {
                let seg = g.segments.get_mut(&key).expect("compared above");
                for &i in &idx {
                    let (Op::Kernel(k), Some(node)) = (&ops[i], seg.nodes[i]) else {
                        unreachable!("compare patches kernels only, and only those with a node")
                    };
                    let mut params = k.params();
                    let p = sys::CUDA_KERNEL_NODE_PARAMS {
                        func: k.func,
                        gridDimX: k.grid.0,
                        gridDimY: k.grid.1,
                        gridDimZ: k.grid.2,
                        blockDimX: k.block.0,
                        blockDimY: k.block.1,
                        blockDimZ: k.block.2,
                        sharedMemBytes: k.smem,
                        kernelParams: params.as_mut_ptr(),
                        extra: std::ptr::null_mut(),
                        kern: std::ptr::null_mut(),
                        ctx: std::ptr::null_mut(),
                    };
                    // SAFETY: node is a kernel node of the graph exec's graph, params point at
                    // arguments of the kernel's signature (the same function as captured), live
                    // for the call; the driver copies them.
                    unsafe { sys::cuGraphExecKernelNodeSetParams_v2(seg.graph.cu_graph_exec(), node, &p) }.result()?;
                }
                g.counts.patched_nodes += idx.len() as u64;
                seg.ops = ops.to_vec();
            }
            Some(Match::Differs) | None => {
                if g.capture_stream.is_none() {
                    g.capture_stream = Some(self.ctx.new_stream()?);
                }
                let stream = g.capture_stream.as_ref().expect("made above");
                let seg = self.capture(ops.to_vec(), stream)?;
                g.segments.insert(key, seg);
                g.counts.captured += 1;
            }
        }
        g.counts.replayed += u64::from(replay);
        // SAFETY: the exec is live (kept in segments); the stream is the backend's.
        unsafe { sys::cuGraphLaunch(g.segments[&key].graph.cu_graph_exec(), self.stream.cu_stream()) }.result()?;
        Ok(())
    }

    /// Captures `ops` into a graph: each issued on `stream` in capture mode, each kernel's node
    /// taken from the capture as it is added.
    fn capture(&self, ops: Vec<Op>, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<Segment, CudaError> {
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
        let mut nodes = Vec::with_capacity(ops.len());
        let mut issued = Ok(());
        for op in &ops {
            if let Err(e) = self.issue(op, stream.cu_stream()) {
                issued = Err(e);
                break;
            }
            // A kernel's node, for its arguments to be patched (None if the driver does not name
            // it: the segment is then captured again whenever they change).
            nodes.push(if matches!(op, Op::Kernel(_)) { last_captured_node(stream.cu_stream()).ok() } else { None });
        }
        // The capture ends whatever happened, so that the stream is usable again.
        let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        issued?;
        let graph = graph?.ok_or_else(|| CudaError::Unsupported("a captured graph segment came back empty".into()))?;
        Ok(Segment { ops, nodes, graph })
    }

    /// Issues one op on `stream` (capturing).
    fn issue(&self, op: &Op, stream: sys::CUstream) -> Result<(), CudaError> {
        match op {
            Op::Kernel(k) => {
                let mut params = k.params();
                // SAFETY: k was recorded from a launch of this function with these arguments
                // (`launch!`), whose pointers are live allocations of the step.
                unsafe {
                    sys::cuLaunchKernel(
                        k.func,
                        k.grid.0,
                        k.grid.1,
                        k.grid.2,
                        k.block.0,
                        k.block.1,
                        k.block.2,
                        k.smem,
                        stream,
                        params.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                }
                .result()?;
                Ok(())
            }
            Op::Lt(c) => self.lt.execute_on(c, stream),
            Op::Blas { g, a, b, c } => self.blas.gemm_bf16_f32_on(*g, *a, *b, *c, stream),
            Op::Zero { ptr, bytes } => {
                // SAFETY: ptr is a live allocation of at least `bytes` bytes (a buffer of the step).
                unsafe { cudarc::driver::result::memset_d8_async(*ptr, 0, *bytes, stream) }?;
                Ok(())
            }
        }
    }
}

/// The node the capture on `stream` added last: the one the stream's next work would depend on.
fn last_captured_node(stream: sys::CUstream) -> Result<sys::CUgraphNode, CudaError> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: sys::cuuint64_t = 0;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut edges: *const sys::CUgraphEdgeData = std::ptr::null();
    let mut n: usize = 0;
    // SAFETY: every out-pointer is a live local; the stream is capturing.
    unsafe { sys::cuStreamGetCaptureInfo_v3(stream, &mut status, &mut id, &mut graph, &mut deps, &mut edges, &mut n) }.result()?;
    if n != 1 || deps.is_null() {
        return Err(CudaError::Unsupported(format!("a captured kernel left {n} dependencies instead of its own node")));
    }
    // SAFETY: the driver returned n = 1 node handles at deps, valid until the next capture call.
    Ok(unsafe { *deps })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(f: usize, grid: u32, args: &[u64]) -> Op {
        let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut words = ArgWords::default();
        for a in args {
            words.push(a);
        }
        Op::Kernel(KernelOp::new("k", f as sys::CUfunction, cfg, words))
    }

    /// The same ops match; a kernel's changed argument or grid is patched (its index); another
    /// function, argument count, zeroing or op count is a new capture.
    #[test]
    fn recorded_ops_match_patch_or_differ() {
        let old = vec![kernel(1, 4, &[10, 20]), Op::Zero { ptr: 64, bytes: 8 }, kernel(2, 8, &[30])];
        assert_eq!(compare(&old, &old.clone()), Match::Same);
        let scaled = vec![kernel(1, 4, &[10, 21]), Op::Zero { ptr: 64, bytes: 8 }, kernel(2, 8, &[31])];
        assert_eq!(compare(&old, &scaled), Match::Patch(vec![0, 2]));
        let regrid = vec![kernel(1, 5, &[10, 20]), Op::Zero { ptr: 64, bytes: 8 }, kernel(2, 8, &[30])];
        assert_eq!(compare(&old, &regrid), Match::Patch(vec![0]));
        for other in [
            vec![kernel(3, 4, &[10, 20]), Op::Zero { ptr: 64, bytes: 8 }, kernel(2, 8, &[30])],
            vec![kernel(1, 4, &[10]), Op::Zero { ptr: 64, bytes: 8 }, kernel(2, 8, &[30])],
            vec![kernel(1, 4, &[10, 20]), Op::Zero { ptr: 72, bytes: 8 }, kernel(2, 8, &[30])],
            vec![kernel(1, 4, &[10, 20]), kernel(2, 8, &[30])],
            vec![kernel(1, 4, &[10, 20]), kernel(1, 4, &[10, 20]), kernel(2, 8, &[30])],
        ] {
            assert_eq!(compare(&old, &other), Match::Differs, "{other:?}");
        }
    }

    /// An argument's words hold its bytes, the rest zero: 4-byte values in the low half, a struct
    /// in as many words as it needs; each argument starts on a word of its own, and the kernel's
    /// parameter pointers point there.
    #[test]
    fn arguments_become_whole_words() {
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Three {
            a: u64,
            b: u64,
            c: u32,
        }
        // SAFETY: plain data, as a kernel's struct argument.
        unsafe impl DeviceRepr for Three {}
        let mut w = ArgWords::default();
        w.push(&7u64);
        w.push(&-1i32);
        w.push(&1.5f32);
        w.push(&Three { a: 1, b: 2, c: 3 });
        w.push(&9u8);
        assert_eq!(w.arg(0), &[7]);
        assert_eq!(w.arg(1), &[0xffff_ffff]);
        assert_eq!(w.arg(2), &[u64::from(1.5f32.to_bits())]);
        assert_eq!(w.arg(3), &[1, 2, 3]);
        assert_eq!(w.arg(4), &[9]);
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
        let k = KernelOp::new("k", std::ptr::null_mut(), cfg, w);
        let p = k.params();
        assert_eq!(p.len(), 5);
        // SAFETY: each pointer points at its argument's first word, live while k is.
        assert_eq!(unsafe { *(p[3] as *const [u64; 3]) }, [1, 2, 3]);
        assert_eq!(unsafe { *(p[2] as *const f32) }, 1.5);
    }

    /// Segments grow from 8 ops to 64 and stay there.
    #[test]
    fn segments_start_small() {
        assert_eq!((0..6).map(segment_ops).collect::<Vec<_>>(), vec![8, 16, 32, 64, 64, 64]);
    }

    /// `FP8SCOPE_GRAPH`: unset, empty or 0 off; 1 on; anything else a clear error.
    #[test]
    fn the_setting_is_one_or_zero() {
        assert!(!graphs_from(None).unwrap());
        assert!(!graphs_from(Some("0")).unwrap());
        assert!(graphs_from(Some("1")).unwrap());
        let e = graphs_from(Some("yes")).unwrap_err().to_string();
        assert!(e.contains("FP8SCOPE_GRAPH=yes"), "{e}");
    }
}

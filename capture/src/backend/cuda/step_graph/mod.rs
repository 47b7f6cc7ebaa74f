//! The step's forward and backward as CUDA graphs (on by default; `FP8SCOPE_GRAPH=0` turns them off,
//! and so does the profiler, `FP8SCOPE_PROFILE=1`, which times each launch).
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
//! and `bench/compare_builds.sh` does on a binary (`bench/env_bin.sh … FP8SCOPE_GRAPH=0`),
//! and `bench/graph_check.sh` over the recipes and recording paths.
//! Segments let the GPU start a step while the host still records its rest, as it does op by op.
//!
//! The first step of each kind runs ungraphed, so that every GEMM shape is tuned and every buffer
//! has its size before a step is recorded. While recording, host-side effects run at once: a
//! table uploaded (its kernel's argument then points at the new one), a scratch buffer grown (the
//! old one is kept alive until the step's last segment is launched: [`defer_drop`]). Work that
//! must run at once (a read of the device, a GEMM shape's first timing, the channel records grown
//! with their contents) makes the step leave its recording first ([`StepGraphs::leave`]): what
//! it recorded is launched, and its rest runs launch by launch. Should a graph fail (a capture
//! the driver refuses), its segment's ops are issued one by one and the run goes on launch by
//! launch ([`StepGraphs::flush`]).
//!
//! This file is the bookkeeping, whatever the device ([`SegmentDevice`]; the tests drive it with a
//! fake one); `device.rs` is the CUDA side (capture, patch, launch) and the backend's entry points.

mod device;

use super::CudaError;
use super::blas::{Batched, LtCall};
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

/// Whether the step graphs are on, from `FP8SCOPE_GRAPH` and whether the profiler is: on by
/// default, off with `0`; the profiler, which times each launch, turns the default off and
/// refuses an explicit `1`.
pub(super) fn graphs_from(v: Option<&str>, profiled: bool) -> Result<bool, CudaError> {
    match v.map(str::trim) {
        None | Some("") => Ok(!profiled),
        Some("0") => Ok(false),
        Some("1") if profiled => Err(CudaError::Setting(PROFILED.into())),
        Some("1") => Ok(true),
        Some(other) => Err(CudaError::Setting(format!("FP8SCOPE_GRAPH={other}: expected 1 (the step in CUDA graphs, the default) or 0 (launch by launch)"))),
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
    Blas {
        g: Batched,
        a: u64,
        b: u64,
        c: u64,
    },
    /// `bytes` zero bytes at `ptr`.
    Zero {
        ptr: u64,
        bytes: usize,
    },
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

/// A graph node's handle.
pub(super) type Node = sys::CUgraphNode;

/// What the step graphs need of the device: the CUDA backend's (`device.rs`), or the tests' fake.
pub(super) trait SegmentDevice {
    type Graph;
    /// Captures `ops` into a graph ready to launch, with the node of each kernel op (None for the
    /// others, or where the driver does not name it). Nothing runs.
    fn capture(&self, ops: &[Op]) -> Result<(Self::Graph, Vec<Option<Node>>), CudaError>;
    /// Gives kernel node `node` of `graph` the launch `k`.
    fn patch(&self, graph: &Self::Graph, node: Node, k: &KernelOp) -> Result<(), CudaError>;
    /// Launches `graph` on the backend's stream.
    fn launch(&self, graph: &Self::Graph) -> Result<(), CudaError>;
    /// Issues `op` on the backend's stream now, as an ungraphed step would.
    fn issue(&self, op: &Op) -> Result<(), CudaError>;
}

/// A captured segment: its ops, the graph node of each kernel op (None for the others), and the
/// graph.
struct Segment<G> {
    ops: Vec<Op>,
    nodes: Vec<Option<Node>>,
    graph: G,
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
    /// Graphed steps that left their recording mid-way, for work the host must do at once
    /// ([`StepGraphs::leave`]): the rest of each ran launch by launch.
    pub left_steps: u64,
}

/// The step being recorded.
struct Recording {
    signature: u64,
    segment: usize,
    ops: Vec<Op>,
}

/// The backend's step graphs: on or off, the kinds of step seen, the captured segments by
/// (signature, index), the step being recorded.
pub(super) struct StepGraphs<G = CudaGraph> {
    enabled: bool,
    seen: HashSet<u64>,
    segments: HashMap<(u64, usize), Segment<G>>,
    rec: Option<Recording>,
    counts: GraphCounts,
    /// Why the graphs were turned off mid-run, if they were ([`StepGraphs::flush`]).
    failure: Option<String>,
    verbose: bool,
}

impl<G> Drop for StepGraphs<G> {
    fn drop(&mut self) {
        if (self.enabled || self.failure.is_some()) && self.verbose {
            let c = self.counts;
            eprintln!(
                "CUDA graphs: {} steps graphed ({} of them left mid-step), {} launched op by op; {} segments captured, {} replayed, {} kernel nodes patched",
                c.graphed_steps, c.left_steps, c.ungraphed_steps, c.captured, c.replayed, c.patched_nodes
            );
        }
    }
}

impl<G> StepGraphs<G> {
    /// `verbose`: say the counts on stderr when dropped (`FP8SCOPE_VERBOSE`).
    pub fn new(enabled: bool, verbose: bool) -> StepGraphs<G> {
        StepGraphs { enabled, verbose, seen: HashSet::new(), segments: HashMap::new(), rec: None, counts: GraphCounts::default(), failure: None }
    }

    pub fn is_recording(&self) -> bool {
        self.rec.is_some()
    }

    pub fn counts(&self) -> GraphCounts {
        self.counts
    }

    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// A step's forward and backward start; returns whether they are recorded: graphs on, a
    /// signature, and a step of that signature before (which ran launch by launch).
    pub fn begin(&mut self, signature: Option<u64>) -> bool {
        if !self.enabled {
            return false;
        }
        match signature {
            Some(s) if self.seen.contains(&s) => {
                self.rec = Some(Recording { signature: s, segment: 0, ops: Vec::new() });
                self.counts.graphed_steps += 1;
                true
            }
            Some(s) => {
                self.seen.insert(s);
                self.counts.ungraphed_steps += 1;
                false
            }
            None => {
                self.counts.ungraphed_steps += 1;
                false
            }
        }
    }

    /// Records `op`; returns whether the segment is full ([`segment_ops`]) and must be flushed.
    /// False, and nothing recorded, when no step is.
    pub fn push(&mut self, op: Op) -> bool {
        match self.rec.as_mut() {
            Some(rec) => {
                rec.ops.push(op);
                rec.ops.len() >= segment_ops(rec.segment)
            }
            None => false,
        }
    }

    /// The step's recording ends (its last segment flushed, or dropped after an error).
    pub fn end(&mut self) {
        self.rec = None;
    }

    /// Stops recording the step mid-way, for work that must run at once (a read of the device, a
    /// GEMM shape's first timing, a buffer grown with its contents): the segments before are
    /// launched already, the ops of the one being recorded are issued one by one, and the rest
    /// of the step runs launch by launch. Its kind stays graphed: the next step of it, whose
    /// shapes and sizes this one settled, is recorded again.
    pub fn leave<D: SegmentDevice<Graph = G>>(&mut self, dev: &D) -> Result<(), CudaError> {
        let Some(rec) = self.rec.take() else { return Ok(()) };
        self.counts.left_steps += 1;
        for op in &rec.ops {
            dev.issue(op)?;
        }
        Ok(())
    }

    /// Launches the recorded ops as the step's next segment: its graph, patched, or a new capture.
    /// Should the graph fail (a capture the driver refuses, say), the ops are issued one by one
    /// instead, as an ungraphed step's would be, the graphs are turned off for the rest of the
    /// run, and stderr says why in one line ([`StepGraphs::failure`]).
    pub fn flush<D: SegmentDevice<Graph = G>>(&mut self, dev: &D) -> Result<(), CudaError> {
        let enabled = self.enabled;
        let Some(rec) = self.rec.as_mut() else { return Ok(()) };
        if rec.ops.is_empty() {
            return Ok(());
        }
        let key = (rec.signature, rec.segment);
        rec.segment += 1;
        let ops = std::mem::take(&mut rec.ops);
        if enabled {
            match self.launch_segment(dev, key, &ops) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    let why = format!("CUDA graphs: {e}; the run goes on launch by launch");
                    eprintln!("{why}");
                    (self.enabled, self.failure) = (false, Some(why));
                    self.segments.clear();
                }
            }
        }
        for op in &ops {
            dev.issue(op)?;
        }
        Ok(())
    }

    /// [`Self::flush`]'s graph path: nothing of `ops` has run when it fails. Only the ops it
    /// keeps are copied: a patched kernel's, or a new capture's.
    fn launch_segment<D: SegmentDevice<Graph = G>>(&mut self, dev: &D, key: (u64, usize), ops: &[Op]) -> Result<(), CudaError> {
        let found = self.segments.get(&key).map(|s| match compare(&s.ops, ops) {
            // A kernel whose node the capture could not name is captured again instead.
            Match::Patch(idx) if idx.iter().any(|&i| s.nodes[i].is_none()) => Match::Differs,
            m => m,
        });
        match found {
            Some(Match::Same) => self.counts.replayed += 1,
            Some(Match::Patch(idx)) => {
                let seg = self.segments.get_mut(&key).expect("compared above");
                for &i in &idx {
                    let (Op::Kernel(k), Some(node)) = (&ops[i], seg.nodes[i]) else { unreachable!("compare patches kernels only, and only those with a node") };
                    dev.patch(&seg.graph, node, k)?;
                    seg.ops[i] = ops[i].clone();
                }
                self.counts.patched_nodes += idx.len() as u64;
                self.counts.replayed += 1;
            }
            Some(Match::Differs) | None => {
                let (graph, nodes) = dev.capture(ops)?;
                self.segments.insert(key, Segment { ops: ops.to_vec(), nodes, graph });
                self.counts.captured += 1;
            }
        }
        dev.launch(&self.segments[&key].graph)
    }
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

    /// A device that logs what it is asked to do; its captures fail from the `fail_from`-th on.
    struct Fake {
        log: RefCell<Vec<String>>,
        captures: Cell<usize>,
        fail_from: Option<usize>,
    }

    impl Fake {
        fn new(fail_from: Option<usize>) -> Fake {
            Fake { log: RefCell::new(Vec::new()), captures: Cell::new(0), fail_from }
        }

        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.log.borrow_mut())
        }
    }

    impl SegmentDevice for Fake {
        type Graph = usize;

        fn capture(&self, ops: &[Op]) -> Result<(usize, Vec<Option<Node>>), CudaError> {
            let n = self.captures.get();
            self.captures.set(n + 1);
            if self.fail_from.is_some_and(|f| n >= f) {
                return Err(CudaError::Unsupported("the driver refused".into()));
            }
            self.log.borrow_mut().push(format!("capture {n}: {} ops", ops.len()));
            Ok((n, ops.iter().enumerate().map(|(i, op)| matches!(op, Op::Kernel(_)).then_some((i + 1) as Node)).collect()))
        }

        fn patch(&self, graph: &usize, node: Node, k: &KernelOp) -> Result<(), CudaError> {
            self.log.borrow_mut().push(format!("patch {graph}: node {} grid {}", node as usize, k.grid.0));
            Ok(())
        }

        fn launch(&self, graph: &usize) -> Result<(), CudaError> {
            self.log.borrow_mut().push(format!("launch {graph}"));
            Ok(())
        }

        fn issue(&self, _op: &Op) -> Result<(), CudaError> {
            self.log.borrow_mut().push("issue".into());
            Ok(())
        }
    }

    /// A step of `n` kernels, the 11th with grid `grid` (as a scale that changes every step),
    /// through the graphs as the backend drives them; returns whether it was recorded.
    fn step(g: &mut StepGraphs<usize>, dev: &Fake, signature: Option<u64>, n: usize, grid: u32) -> bool {
        if !g.begin(signature) {
            return false;
        }
        for i in 0..n {
            if g.push(kernel(1 + i, if i == 10 { grid } else { 1 }, &[i as u64])) {
                g.flush(dev).expect("segment");
            }
        }
        g.flush(dev).expect("last segment");
        g.end();
        true
    }

    /// The first step of a kind runs launch by launch; the second is captured, 8 ops then the
    /// other 12; the third replays both, its one changed kernel patched (op 11: the second
    /// segment's third, node 3), and a fourth like it replays them unpatched; a dump step and another kind's first step are not recorded;
    /// a step whose ops changed captures its segment again.
    #[test]
    fn steps_of_a_kind_are_captured_once_then_replayed_and_patched() {
        let dev = Fake::new(None);
        let mut g = StepGraphs::<usize>::new(true, false);
        assert!(!step(&mut g, &dev, Some(1), 20, 5));
        assert!(dev.take().is_empty());
        assert!(step(&mut g, &dev, Some(1), 20, 5));
        assert_eq!(dev.take(), ["capture 0: 8 ops", "launch 0", "capture 1: 12 ops", "launch 1"]);
        assert!(step(&mut g, &dev, Some(1), 20, 6));
        assert_eq!(dev.take(), ["launch 0", "patch 1: node 3 grid 6", "launch 1"]);
        assert!(step(&mut g, &dev, Some(1), 20, 6));
        assert_eq!(dev.take(), ["launch 0", "launch 1"], "the patched launch is the graph's now");
        assert!(!step(&mut g, &dev, None, 20, 6), "a dump step");
        assert!(!step(&mut g, &dev, Some(2), 20, 6), "another kind's first step");
        assert!(step(&mut g, &dev, Some(1), 21, 6));
        assert_eq!(dev.take(), ["launch 0", "capture 2: 13 ops", "launch 2"]);
        assert_eq!(g.counts(), GraphCounts { graphed_steps: 4, ungraphed_steps: 3, captured: 3, replayed: 5, patched_nodes: 1, left_steps: 0 });
        assert_eq!(g.failure(), None);
    }

    /// A recorded step that must run work at once mid-way (a read, a GEMM shape's first timing)
    /// leaves its recording: the segment before is launched, the recorded ops of the one in
    /// progress are issued one by one, and nothing after is recorded. The next step of the kind
    /// is recorded again: it replays the segment captured before the leaving point and captures
    /// the rest.
    #[test]
    fn a_step_leaves_its_recording_for_work_that_runs_at_once() {
        let dev = Fake::new(None);
        let mut g = StepGraphs::<usize>::new(true, false);
        assert!(!step(&mut g, &dev, Some(1), 20, 5));
        assert!(g.begin(Some(1)));
        for i in 0..11 {
            if g.push(kernel(1 + i, if i == 10 { 5 } else { 1 }, &[i as u64])) {
                g.flush(&dev).expect("segment");
            }
        }
        g.leave(&dev).expect("leave");
        assert!(!g.is_recording());
        assert!(!g.push(kernel(12, 1, &[11])), "nothing is recorded after leaving");
        g.flush(&dev).expect("nothing to flush");
        g.end();
        assert_eq!(dev.take(), ["capture 0: 8 ops", "launch 0", "issue", "issue", "issue"]);
        assert!(step(&mut g, &dev, Some(1), 20, 5));
        assert_eq!(dev.take(), ["launch 0", "capture 1: 12 ops", "launch 1"]);
        let c = g.counts();
        assert_eq!((c.graphed_steps, c.left_steps, c.captured, c.replayed), (2, 1, 2, 1));
        assert_eq!(g.failure(), None);
    }

    /// Off, nothing is recorded, whatever the step.
    #[test]
    fn graphs_off_record_nothing() {
        let dev = Fake::new(None);
        let mut g = StepGraphs::<usize>::new(false, false);
        for _ in 0..3 {
            assert!(!step(&mut g, &dev, Some(1), 20, 5));
        }
        assert!(dev.take().is_empty());
        assert_eq!(g.counts(), GraphCounts::default());
    }

    /// A capture the device refuses: that segment's ops are issued one by one, the rest of the
    /// step's too, the graphs stay off from then on, and the failure says why.
    #[test]
    fn a_failed_capture_falls_back_to_launch_by_launch() {
        let dev = Fake::new(Some(1));
        let mut g = StepGraphs::<usize>::new(true, false);
        step(&mut g, &dev, Some(1), 20, 5);
        assert!(step(&mut g, &dev, Some(1), 20, 5));
        let mut want = vec!["capture 0: 8 ops".to_string(), "launch 0".into()];
        want.extend(std::iter::repeat_n("issue".to_string(), 12));
        assert_eq!(dev.take(), want);
        assert!(g.failure().is_some_and(|f| f.contains("the driver refused") && f.contains("launch by launch")), "{:?}", g.failure());
        assert!(!step(&mut g, &dev, Some(1), 20, 5), "off for the rest of the run");
        assert!(dev.take().is_empty());
    }

    /// `FP8SCOPE_GRAPH`: unset or empty on (off under the profiler), 0 off, 1 on (an error under
    /// the profiler), anything else a clear error.
    #[test]
    fn the_setting_is_on_by_default_and_off_under_the_profiler() {
        for v in [None, Some(""), Some("1")] {
            assert!(graphs_from(v, false).unwrap(), "{v:?}");
        }
        assert!(!graphs_from(Some("0"), false).unwrap());
        assert!(!graphs_from(None, true).unwrap(), "the profiler turns the default off");
        assert!(!graphs_from(Some("0"), true).unwrap());
        let e = graphs_from(Some("1"), true).unwrap_err().to_string();
        assert!(e.contains("FP8SCOPE_PROFILE=1 cannot be combined"), "{e}");
        let e = graphs_from(Some("yes"), false).unwrap_err().to_string();
        assert!(e.contains("FP8SCOPE_GRAPH=yes"), "{e}");
    }
}

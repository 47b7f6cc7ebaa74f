//! The step graphs' CUDA side: segments captured on a stream of their own (the backend's is the
//! legacy default stream, which cannot be captured) and launched on the backend's, kernel nodes
//! patched in place (`cuGraphExecKernelNodeSetParams`), ops issued now; and the backend's entry
//! points (the step's start and end, each op recorded, the settings and counts).

use super::{DEFERRED, GraphCounts, KernelOp, Node, Op, PROFILED, RECORDING, SegmentDevice, StepGraphs};
use crate::backend::cuda::{CudaBackend, CudaError};
use cudarc::driver::{CudaGraph, CudaStream, sys};
use std::cell::RefCell;
use std::sync::Arc;

/// The CUDA backend as a [`SegmentDevice`]: its stream, its libraries, and the stream segments
/// are captured on.
struct CudaSegments<'a> {
    be: &'a CudaBackend,
    capture: &'a Arc<CudaStream>,
}

impl SegmentDevice for CudaSegments<'_> {
    type Graph = CudaGraph;

    fn capture(&self, ops: &[Op]) -> Result<(CudaGraph, Vec<Option<Node>>), CudaError> {
        let stream = self.capture;
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
        let mut nodes = Vec::with_capacity(ops.len());
        let mut issued = Ok(());
        for op in ops {
            if let Err(e) = self.be.issue_on(op, stream.cu_stream()) {
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
        Ok((graph, nodes))
    }

    fn patch(&self, graph: &CudaGraph, node: Node, k: &KernelOp) -> Result<(), CudaError> {
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
        // SAFETY: node is a kernel node of the exec's graph, of the same function as k (compare);
        // params point at arguments of its signature, live for the call (the driver copies them).
        unsafe { sys::cuGraphExecKernelNodeSetParams_v2(graph.cu_graph_exec(), node, &p) }.result()?;
        Ok(())
    }

    fn launch(&self, graph: &CudaGraph) -> Result<(), CudaError> {
        // SAFETY: the exec is live (the caller keeps it); the stream is the backend's.
        unsafe { sys::cuGraphLaunch(graph.cu_graph_exec(), self.be.stream.cu_stream()) }.result()?;
        Ok(())
    }

    fn issue(&self, op: &Op) -> Result<(), CudaError> {
        self.be.issue_on(op, self.be.stream.cu_stream())
    }
}

/// The node the capture on `stream` added last: the one the stream's next work would depend on.
fn last_captured_node(stream: sys::CUstream) -> Result<Node, CudaError> {
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

/// The thread's side of a step's recording ends: nothing is recorded any more, and the buffers
/// replaced while it was are freed (after the ops that named them, already issued or dropped).
fn recording_ended() {
    RECORDING.with(|r| r.set(false));
    DEFERRED.with(|d| d.borrow_mut().clear());
}

impl CudaBackend {
    /// Turns the step graphs on or off (`FP8SCOPE_GRAPH`); the tests compare both ways in one
    /// process. Forgets every graph. Refused while the profiler is on.
    pub fn set_step_graphs(&mut self, on: bool) -> Result<(), CudaError> {
        if on && self.prof.is_some() {
            return Err(CudaError::Setting(PROFILED.into()));
        }
        self.graph = RefCell::new(StepGraphs::new(on, self.settings.verbose));
        Ok(())
    }

    /// What the step graphs did so far.
    pub fn step_graph_counts(&self) -> GraphCounts {
        self.graph.borrow().counts()
    }

    /// Why the step graphs were turned off mid-run (the run went on launch by launch), if they
    /// were.
    pub fn step_graph_failure(&self) -> Option<String> {
        self.graph.borrow().failure().map(str::to_string)
    }

    /// Starts a step's forward and backward: recorded into graphs when they are on, the step has
    /// a signature, a step of that signature ran before, and no error is kept.
    pub(in crate::backend::cuda) fn begin_step_work_impl(&mut self, signature: Option<u64>) {
        if self.error.is_none() && self.graph.get_mut().begin(signature) {
            RECORDING.with(|r| r.set(true));
        }
    }

    /// Ends the step's forward and backward: launches the last segment, then frees the buffers
    /// replaced while recording. After an error nothing recorded is launched.
    pub(in crate::backend::cuda) fn end_step_work_impl(&mut self) {
        if !self.graph.get_mut().is_recording() {
            return;
        }
        if self.error.is_none() {
            self.guarded("step graph", |me| me.flush_segment());
        }
        self.graph.get_mut().end();
        recording_ended();
    }

    /// Stops recording the step ([`StepGraphs::leave`]) if one is, so that the caller may run
    /// work at once: the recorded ops are issued (dropped after an error, as at the step's end),
    /// and the buffers replaced while recording freed after them.
    pub(in crate::backend::cuda) fn leave_step_graph(&self) -> Result<(), CudaError> {
        if !self.graph.borrow().is_recording() {
            return Ok(());
        }
        let left = if self.error.is_some() {
            self.graph.borrow_mut().end();
            Ok(())
        } else {
            self.ctx.bind_to_thread()?;
            self.graph.borrow_mut().leave(&CudaSegments { be: self, capture: self.capture_stream()? })
        };
        recording_ended();
        left
    }

    /// Records `op` while a step is recorded (launching the segment once it is full); returns
    /// false when no step is, for the caller to issue it now.
    pub(in crate::backend::cuda) fn record_op(&self, op: impl FnOnce() -> Op) -> Result<bool, CudaError> {
        let full = {
            let mut g = self.graph.borrow_mut();
            if !g.is_recording() {
                return Ok(false);
            }
            g.push(op())
        };
        if full {
            self.flush_segment()?;
        }
        Ok(true)
    }

    /// The recorded ops as the step's next segment ([`StepGraphs::flush`]).
    fn flush_segment(&self) -> Result<(), CudaError> {
        // The raw driver calls need the context current, as cudarc's own calls make it.
        self.ctx.bind_to_thread()?;
        self.graph.borrow_mut().flush(&CudaSegments { be: self, capture: self.capture_stream()? })
    }

    /// The stream graphs are captured on (made on first use).
    fn capture_stream(&self) -> Result<&std::sync::Arc<CudaStream>, CudaError> {
        Ok(match self.graph_stream.get() {
            Some(s) => s,
            None => {
                let s = self.ctx.new_stream()?;
                self.graph_stream.get_or_init(|| s)
            }
        })
    }

    /// Issues one op on `stream` now (the backend's, or the capturing one).
    fn issue_on(&self, op: &Op, stream: sys::CUstream) -> Result<(), CudaError> {
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

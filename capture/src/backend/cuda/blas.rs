//! GEMMs through cuBLASLt (the linear layers: FP8 or BF16 operands, FP32 accumulation and output)
//! and cuBLAS (attention's BF16 batched products), at the sys level: cudarc's safe `matmul` has
//! neither FP8 types nor scale pointers.
//!
//! Every linear-layer GEMM is issued in the one layout Hopper's FP8 GEMMs accept, TN: in row-major
//! words `D (rows × cols) = P (rows × k) · Q (cols × k)ᵀ`, both operands contiguous along k. The
//! cast kernels produce P and Q in that layout (transposing where dgrad and wgrad need it).
//! Plans (descriptor, layouts, chosen algorithm) are cached per shape and type, so a shape always
//! runs the same algorithm. The algorithm is the fastest of the heuristic's first 8, timed on the
//! shape's first call and remembered across runs in `gemm_tuning.rs`'s cache, so that reruns on
//! one machine stay bit-identical (`FP8SCOPE_GEMM_TUNE=0`: the heuristic's first choice).

use super::CudaError;
use super::gemm_tuning::TuneCache;
use cudarc::cublas::sys as bs;
use cudarc::cublaslt::sys as lt;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

/// Element type of a GEMM operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpType {
    Bf16,
    E4M3,
    E5M2,
}

impl OpType {
    fn lt(self) -> lt::cudaDataType {
        match self {
            OpType::Bf16 => lt::cudaDataType_t::CUDA_R_16BF,
            OpType::E4M3 => lt::cudaDataType_t::CUDA_R_8F_E4M3,
            OpType::E5M2 => lt::cudaDataType_t::CUDA_R_8F_E5M2,
        }
    }
    pub fn is_fp8(self) -> bool {
        self != OpType::Bf16
    }
    /// The format's name in the run's tables.
    pub fn name(self) -> &'static str {
        match self {
            OpType::Bf16 => "bf16",
            OpType::E4M3 => crate::fp8::Fp8Format::E4M3.name(),
            OpType::E5M2 => crate::fp8::Fp8Format::E5M2.name(),
        }
    }
    pub fn bytes(self) -> usize {
        if self == OpType::Bf16 { 2 } else { 1 }
    }
}

/// cuBLAS's status as [`ck`] takes cuBLASLt's (the libraries' status types are distinct).
fn ck_blas(st: bs::cublasStatus_t, what: &'static str) -> Result<(), CudaError> {
    if st == bs::cublasStatus_t::CUBLAS_STATUS_SUCCESS { Ok(()) } else { Err(CudaError::Blas { what, status: format!("{st:?}") }) }
}

fn ck(st: lt::cublasStatus_t, what: &'static str) -> Result<(), CudaError> {
    if st == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS { Ok(()) } else { Err(CudaError::Blas { what, status: format!("{st:?}") }) }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    rows: u64,
    cols: u64,
    k: u64,
    p: OpType,
    q: OpType,
    /// D in BF16 instead of F32.
    d_bf16: bool,
    /// P held transposed in memory (k × rows row-major); Q likewise (k × cols). BF16 only:
    /// cuBLASLt's FP8 GEMMs take the TN layout alone.
    p_t: bool,
    q_t: bool,
    /// FP8 only: cuBLASLt's fast accumulation (no periodic promotion of the partial sums to FP32).
    fast: bool,
    /// A BF16 bias vector (one value a column of D) added by cuBLASLt's epilogue; BF16 D only.
    bias: bool,
}

/// How an operand of [`Lt::prepare`] lies in memory: `ptr` to `ty` values, dequantised through the
/// f32 at `inv` when FP8; `transposed` when it holds the transpose of the row-major matrix the
/// product names (allowed for BF16 operands only).
#[derive(Clone, Copy, Debug)]
pub struct Operand {
    pub ptr: u64,
    pub ty: OpType,
    pub transposed: bool,
    /// The cast's scale slot (kernels/cast.cu: its RISKY flag and dequantisation factor), 0 for an
    /// operand taken as it is.
    pub slot: u64,
}

impl Operand {
    /// Device address of the dequantisation factor cuBLASLt reads for an FP8 operand.
    pub fn inv(&self) -> u64 {
        self.slot + (super::SLOT_INV * 4) as u64
    }
}

/// A product of [`Lt::prepare`]: its plan's key and its device addresses (operands, their
/// dequantisation factors, D, the bias or 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LtCall {
    key: Key,
    p: u64,
    p_inv: u64,
    q: u64,
    q_inv: u64,
    d: u64,
    bias: u64,
}

/// A cuBLASLt error with the product it refused, in one line.
fn describe(key: &Key, p_t: bool, q_t: bool, e: CudaError) -> CudaError {
    match e {
        CudaError::Blas { what, status } => CudaError::Blas {
            what,
            status: format!(
                "{status} (D[{}x{}] = P[{}x{}]{} {:?} . Q[{}x{}]^T{} {:?}, D {}{}{})",
                key.rows,
                key.cols,
                key.rows,
                key.k,
                if p_t { " (held transposed)" } else { "" },
                key.p,
                key.cols,
                key.k,
                if q_t { " (held transposed)" } else { "" },
                key.q,
                if key.d_bf16 { "bf16" } else { "f32" },
                if key.fast { ", fast accumulation" } else { "" },
                if key.bias { ", BF16 bias in the epilogue" } else { "" }
            ),
        },
        e => e,
    }
}

struct Plan {
    desc: lt::cublasLtMatmulDesc_t,
    la: lt::cublasLtMatrixLayout_t,
    lb: lt::cublasLtMatrixLayout_t,
    ld: lt::cublasLtMatrixLayout_t,
    algo: lt::cublasLtMatmulAlgo_t,
    /// The heuristic's candidates, best first, until the plan's first call times them
    /// (`Lt::fastest`); empty when timed, cached or not tuning.
    untimed: Vec<lt::cublasLtMatmulAlgo_t>,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each handle was created by this plan and is destroyed once.
        unsafe {
            lt::cublasLtMatrixLayoutDestroy(self.la);
            lt::cublasLtMatrixLayoutDestroy(self.lb);
            lt::cublasLtMatrixLayoutDestroy(self.ld);
            lt::cublasLtMatmulDescDestroy(self.desc);
        }
    }
}

/// cuBLASLt handle, workspace and plan cache.
pub struct Lt {
    h: lt::cublasLtHandle_t,
    ws: CudaSlice<u8>,
    plans: HashMap<Key, Plan>,
    stream: Arc<CudaStream>,
    /// Timed algorithms (`gemm_tuning.rs`); None with `FP8SCOPE_GEMM_TUNE=0`: the heuristic's
    /// first choice, untimed.
    cache: Option<TuneCache>,
    /// Shapes timed so far (their candidates run on the device at once).
    timed: usize,
    /// Say each timed shape's choice on stderr (`FP8SCOPE_VERBOSE`).
    verbose: bool,
}

impl Drop for Lt {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: the handle was created in `new` and is destroyed once, after its plans.
        unsafe { lt::cublasLtDestroy(self.h) };
    }
}

fn set_desc<T>(d: lt::cublasLtMatmulDesc_t, a: lt::cublasLtMatmulDescAttributes_t, v: &T) -> Result<(), CudaError> {
    // SAFETY: v points at a live T of the size given.
    ck(unsafe { lt::cublasLtMatmulDescSetAttribute(d, a, v as *const T as *const c_void, std::mem::size_of::<T>()) }, "cublasLtMatmulDescSetAttribute")
}

impl Lt {
    pub fn new(stream: &Arc<CudaStream>, verbose: bool) -> Result<Lt, CudaError> {
        // SAFETY: only probes for the library.
        if !unsafe { lt::is_culib_present() } {
            return Err(CudaError::MissingLibrary("cuBLASLt (libcublasLt.so)"));
        }
        let mut h = std::ptr::null_mut();
        // SAFETY: h is written by cublasLtCreate.
        ck(unsafe { lt::cublasLtCreate(&mut h) }, "cublasLtCreate")?;
        let ws = stream.alloc_zeros::<u8>(32 << 20)?;
        // SAFETY: a plain query of the loaded library.
        let cache = TuneCache::from_env(&stream.context().name()?, unsafe { lt::cublasLtGetVersion() }).map_err(CudaError::Setting)?;
        Ok(Lt { h, ws, plans: HashMap::new(), stream: stream.clone(), cache, timed: 0, verbose })
    }

    fn plan(&mut self, key: Key) -> Result<&Plan, CudaError> {
        if !self.plans.contains_key(&key) {
            use lt::cublasLtMatmulDescAttributes_t as A;
            let mut desc = std::ptr::null_mut();
            // SAFETY: desc is written by the call.
            ck(
                unsafe { lt::cublasLtMatmulDescCreate(&mut desc, lt::cublasComputeType_t::CUBLAS_COMPUTE_32F, lt::cudaDataType_t::CUDA_R_32F) },
                "cublasLtMatmulDescCreate",
            )?;
            // Column-major: A = Q stored (k × cols, ld k) and taken transposed, B = P stored
            // (k × rows, ld k) taken as is; D (cols × rows, ld cols) = row-major (rows × cols). An
            // operand held transposed is stored (cols × k, ld cols) or (rows × k, ld rows) and
            // taken the other way.
            set_desc(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &i32::from(!key.q_t))?;
            set_desc(desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &i32::from(key.p_t))?;
            if key.fast {
                set_desc(desc, A::CUBLASLT_MATMUL_DESC_FAST_ACCUM, &1i8)?;
            }
            if key.bias {
                set_desc(desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS)?;
                set_desc(desc, A::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &lt::cudaDataType_t::CUDA_R_16BF)?;
            }
            let layout = |ty: lt::cudaDataType, r: u64, c: u64, ld: i64| -> Result<lt::cublasLtMatrixLayout_t, CudaError> {
                let mut l = std::ptr::null_mut();
                // SAFETY: l is written by the call.
                ck(unsafe { lt::cublasLtMatrixLayoutCreate(&mut l, ty, r, c, ld) }, "cublasLtMatrixLayoutCreate")?;
                Ok(l)
            };
            let la = if key.q_t { layout(key.q.lt(), key.cols, key.k, key.cols as i64)? } else { layout(key.q.lt(), key.k, key.cols, key.k as i64)? };
            let lb = if key.p_t { layout(key.p.lt(), key.rows, key.k, key.rows as i64)? } else { layout(key.p.lt(), key.k, key.rows, key.k as i64)? };
            let d_ty = if key.d_bf16 { lt::cudaDataType_t::CUDA_R_16BF } else { lt::cudaDataType_t::CUDA_R_32F };
            let ld = layout(d_ty, key.cols, key.rows, key.cols as i64)?;
            {
                // Scale pointers are set per call; a placeholder lets the heuristic plan for them.
                let (wsp, _g) = self.ws.device_ptr(&self.stream);
                if key.q.is_fp8() {
                    set_desc(desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &wsp)?;
                }
                if key.p.is_fp8() {
                    set_desc(desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &wsp)?;
                }
                if key.bias {
                    set_desc(desc, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &wsp)?;
                }
            }
            let mut pref = std::ptr::null_mut();
            // SAFETY: pref is written by the call, then configured and destroyed below.
            ck(unsafe { lt::cublasLtMatmulPreferenceCreate(&mut pref) }, "cublasLtMatmulPreferenceCreate")?;
            let wsz: u64 = self.ws.len() as u64;
            // SAFETY: wsz is a live u64.
            unsafe {
                lt::cublasLtMatmulPreferenceSetAttribute(
                    pref,
                    lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &wsz as *const u64 as *const c_void,
                    8,
                )
            };
            // As many proposals as are timed (one when nothing is timed).
            let wanted = self.cache.as_ref().map_or(1, |c| c.candidates).max(1);
            // SAFETY: a zeroed heuristic result is a valid out-parameter.
            let mut res: Vec<lt::cublasLtMatmulHeuristicResult_t> = vec![unsafe { std::mem::zeroed() }; wanted];
            let mut cnt = 0i32;
            // SAFETY: all handles are live; res has room for `wanted` results.
            let st = unsafe { lt::cublasLtMatmulAlgoGetHeuristic(self.h, desc, la, lb, ld, ld, pref, wanted as i32, res.as_mut_ptr(), &mut cnt) };
            // SAFETY: pref was created above.
            unsafe { lt::cublasLtMatmulPreferenceDestroy(pref) };
            // A cached algorithm is used once cuBLASLt confirms it for this plan.
            let ws_len = self.ws.len();
            let check = |algo: &lt::cublasLtMatmulAlgo_t| {
                // SAFETY: a zeroed heuristic result is a valid out-parameter; all handles are live.
                let mut r: lt::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
                let st = unsafe { lt::cublasLtMatmulAlgoCheck(self.h, desc, la, lb, ld, ld, algo, &mut r) };
                st == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS && r.workspaceSize <= ws_len
            };
            let cached = self.cache.as_ref().and_then(|c| c.get(&shape_name(&key))).map(|data| lt::cublasLtMatmulAlgo_t { data }).filter(check);
            let tuning = self.cache.is_some() && cached.is_none() && cnt > 1;
            let plan = Plan {
                desc,
                la,
                lb,
                ld,
                algo: cached.unwrap_or(res[0].algo),
                untimed: if tuning { res.iter().take(cnt as usize).map(|r| r.algo).collect() } else { Vec::new() },
            };
            ck(st, "cublasLtMatmulAlgoGetHeuristic")?;
            if cnt == 0 {
                return Err(CudaError::Blas { what: "cublasLtMatmulAlgoGetHeuristic", status: format!("no algorithm for {key:?}") });
            }
            self.plans.insert(key, plan);
        }
        Ok(&self.plans[&key])
    }

    /// The product D (rows × cols, row-major; f32, or BF16 with `d_bf16`) = P (rows × k) ·
    /// Q (cols × k)ᵀ, with FP8 operands multiplied by their device-side dequantisation factors,
    /// plus `bias` (a device pointer to `cols` BF16 values, 0 for none; BF16 D only) added in
    /// cuBLASLt's epilogue before D's rounding. With `fast` and an FP8 operand, the tensor cores
    /// accumulate in their own reduced precision (cuBLASLt's fast accumulation); BF16 products
    /// ignore it. Resolved to its plan and its algorithm, for [`Lt::execute`] to run (now, or in a
    /// CUDA graph of the step). A shape's first product times the heuristic's candidates on these
    /// operands; without `may_tune` (a step recorded into CUDA graphs, which must not run anything
    /// at once) it returns None instead, for the caller to stop recording and ask again.
    #[allow(clippy::too_many_arguments)]
    pub fn prepare(
        &mut self,
        rows: usize,
        cols: usize,
        k: usize,
        p: Operand,
        q: Operand,
        d: u64,
        d_bf16: bool,
        fast: bool,
        bias: u64,
        may_tune: bool,
    ) -> Result<Option<LtCall>, CudaError> {
        let (pt, qt) = (p.ty, q.ty);
        if (p.transposed && pt.is_fp8()) || (q.transposed && qt.is_fp8()) {
            return Err(CudaError::Unsupported("an FP8 GEMM operand held transposed (cuBLASLt takes FP8 in the TN layout only)".into()));
        }
        if bias != 0 && !d_bf16 {
            return Err(CudaError::Unsupported("a bias added in cuBLASLt's epilogue with f32 D".into()));
        }
        let key = Key {
            rows: rows as u64,
            cols: cols as u64,
            k: k as u64,
            p: pt,
            q: qt,
            d_bf16,
            p_t: p.transposed,
            q_t: q.transposed,
            fast: fast && (pt.is_fp8() || qt.is_fp8()),
            bias: bias != 0,
        };
        let call = LtCall { key, p: p.ptr, p_inv: p.inv(), q: q.ptr, q_inv: q.inv(), d, bias };
        let tuned = self.tune(&call, may_tune).map_err(|e| describe(&key, p.transposed, q.transposed, e))?;
        Ok(tuned.then_some(call))
    }

    /// How many GEMM shapes were timed so far (each ran its candidates on the device at once).
    pub fn shapes_timed(&self) -> usize {
        self.timed
    }

    /// Plans `c`'s shape, and times its candidates on `c`'s operands if it never ran; returns
    /// whether the shape's algorithm is settled (false: untimed, and `may_tune` forbade timing).
    fn tune(&mut self, c: &LtCall, may_tune: bool) -> Result<bool, CudaError> {
        self.plan(c.key)?;
        if self.plans[&c.key].untimed.is_empty() {
            return Ok(true);
        }
        if !may_tune {
            return Ok(false);
        }
        self.set_pointers(&self.plans[&c.key], c)?;
        let best = self.fastest(c.key, c.p, c.q, c.d)?;
        let plan = self.plans.get_mut(&c.key).expect("planned above");
        plan.algo = best;
        plan.untimed.clear();
        self.timed += 1;
        if let Some(cache) = &mut self.cache {
            cache.put(&shape_name(&c.key), best.data);
        }
        Ok(true)
    }

    /// The pointers of `c` that its plan's descriptor holds: the bias and the dequantisation
    /// factors.
    fn set_pointers(&self, plan: &Plan, c: &LtCall) -> Result<(), CudaError> {
        use lt::cublasLtMatmulDescAttributes_t as A;
        if c.key.bias {
            set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias)?;
        }
        if c.key.q.is_fp8() {
            set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &c.q_inv)?;
        }
        if c.key.p.is_fp8() {
            set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &c.p_inv)?;
        }
        Ok(())
    }

    /// Runs a prepared product on the stream.
    pub fn execute(&self, c: &LtCall) -> Result<(), CudaError> {
        self.execute_on(c, self.stream.cu_stream())
    }

    /// Runs a prepared product on `stream` (the stream a CUDA graph of the step is captured on).
    pub fn execute_on(&self, c: &LtCall, stream: cudarc::driver::sys::CUstream) -> Result<(), CudaError> {
        let plan = self.plans.get(&c.key).ok_or_else(|| CudaError::Unsupported("a cuBLASLt product without its plan".into()))?;
        self.set_pointers(plan, c)?;
        self.run_on(plan, &plan.algo, c.p, c.q, c.d, stream).map_err(|e| describe(&c.key, c.key.p_t, c.key.q_t, e))
    }

    /// Runs `plan` with `algo` on the stream.
    fn run(&self, plan: &Plan, algo: &lt::cublasLtMatmulAlgo_t, p: u64, q: u64, d: u64) -> Result<(), CudaError> {
        self.run_on(plan, algo, p, q, d, self.stream.cu_stream())
    }

    /// Runs `plan` with `algo` on `stream`.
    fn run_on(&self, plan: &Plan, algo: &lt::cublasLtMatmulAlgo_t, p: u64, q: u64, d: u64, stream: cudarc::driver::sys::CUstream) -> Result<(), CudaError> {
        let (ws, _g) = self.ws.device_ptr(&self.stream);
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: pointers are live device allocations of the sizes the plan describes; the
        // workspace is owned by self; all work is ordered on the stream.
        ck(
            unsafe {
                lt::cublasLtMatmul(
                    self.h,
                    plan.desc,
                    &alpha as *const f32 as *const c_void,
                    q as *const c_void,
                    plan.la,
                    p as *const c_void,
                    plan.lb,
                    &beta as *const f32 as *const c_void,
                    d as *const c_void,
                    plan.ld,
                    d as *mut c_void,
                    plan.ld,
                    algo,
                    ws as *mut c_void,
                    self.ws.len(),
                    stream as lt::cudaStream_t,
                )
            },
            "cublasLtMatmul",
        )
    }

    /// Times each of the heuristic's candidates for `key` on these operands (one call to warm up,
    /// then the median of 5) and returns the fastest; a candidate that fails to run is skipped.
    /// D is overwritten; the caller's call then writes it again.
    fn fastest(&self, key: Key, p: u64, q: u64, d: u64) -> Result<lt::cublasLtMatmulAlgo_t, CudaError> {
        let plan = &self.plans[&key];
        let ctx = self.stream.context();
        let mut best: Option<(f32, usize)> = None;
        let mut said = Vec::new();
        for (i, algo) in plan.untimed.iter().enumerate() {
            if self.run(plan, algo, p, q, d).is_err() {
                said.push(format!("#{i} fails"));
                continue;
            }
            let mut ms = Vec::with_capacity(5);
            for _ in 0..5 {
                let ev = || ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT));
                let (a, b) = (ev()?, ev()?);
                a.record(&self.stream)?;
                self.run(plan, algo, p, q, d)?;
                b.record(&self.stream)?;
                b.synchronize()?;
                ms.push(a.elapsed_ms(&b)?);
            }
            ms.sort_by(f32::total_cmp);
            let t = ms[2];
            said.push(format!("#{i} {:.1} µs", t * 1e3));
            if best.is_none_or(|(bt, _)| t < bt) {
                best = Some((t, i));
            }
        }
        let (_, i) = best.unwrap_or((0.0, 0));
        if self.verbose {
            eprintln!(
                "cuBLASLt tuning {}x{}x{} {:?}.{:?}{}: {} -> #{i}",
                key.rows,
                key.cols,
                key.k,
                key.p,
                key.q,
                if key.fast { " fast" } else { "" },
                said.join(", ")
            );
        }
        Ok(plan.untimed[i])
    }
}

/// A GEMM's entry in the algorithm cache: its shape, types, layouts and accumulation.
fn shape_name(key: &Key) -> String {
    // Without a bias, the name the cache used before the bias epilogue existed.
    format!("{key:?}").replace(", bias: false", "")
}

/// cuBLAS handle for attention's strided-batched BF16 products (f32 out).
pub struct Blas {
    blas: cudarc::cublas::CudaBlas,
    /// The stream the handle runs on.
    stream: Arc<CudaStream>,
}

/// One strided-batched GEMM in cuBLAS's column-major terms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Batched {
    pub ta: bool,
    pub tb: bool,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub alpha: f32,
    pub lda: i32,
    pub stride_a: i64,
    pub ldb: i32,
    pub stride_b: i64,
    pub ldc: i32,
    pub stride_c: i64,
    pub batch: i32,
}

impl Batched {
    /// Attention's (T × T) products per (sequence, kv head), from (T, hs) row-major operands:
    /// `alpha · a bᵀ` in row-major terms (preatt = scale · q kᵀ with a = q, b = k passed as
    /// (k, q); datt = dy vᵀ passed as (v, dy)). `b` holds one (T, hs) block per batch; `a` holds
    /// `rep` of them back to back — the query heads that share the kv head (grouped-query
    /// attention; rep = 1 for multi-head) — so each batch writes `rep` (T × T) blocks.
    pub fn attention_scores(t: usize, hs: usize, groups: usize, rep: usize, alpha: f32) -> Batched {
        let (ti, hsi, rt) = (t as i32, hs as i32, (rep * t) as i32);
        let (th, rth, rtt) = ((t * hs) as i64, (rep * t * hs) as i64, (rep * t * t) as i64);
        Batched {
            ta: true,
            tb: false,
            m: ti,
            n: rt,
            k: hsi,
            alpha,
            lda: hsi,
            stride_a: th,
            ldb: hsi,
            stride_b: rth,
            ldc: ti,
            stride_c: rtt,
            batch: groups as i32,
        }
    }

    /// Attention's (T, hs) products per (sequence, kv head), with the `rep` query heads of a kv
    /// head stacked as above: a (T, hs) operand times the (rep·T × T) probabilities (y = att v,
    /// dq = scale · dpre k: `rep` (T, hs) outputs per batch), or, when `t_square`, the stacked
    /// (rep·T, hs) operand times their transpose (dv = attᵀ dy, dk = scale · dpreᵀ q: one (T, hs)
    /// output per batch, summed over the group's query heads inside the GEMM's reduction).
    pub fn attention_values(t: usize, hs: usize, groups: usize, rep: usize, t_square: bool, alpha: f32) -> Batched {
        let (ti, hsi, rt) = (t as i32, hs as i32, (rep * t) as i32);
        let (th, rth, rtt) = ((t * hs) as i64, (rep * t * hs) as i64, (rep * t * t) as i64);
        let batch = groups as i32;
        if t_square {
            Batched { ta: false, tb: true, m: hsi, n: ti, k: rt, alpha, lda: hsi, stride_a: rth, ldb: ti, stride_b: rtt, ldc: hsi, stride_c: th, batch }
        } else {
            Batched { ta: false, tb: false, m: hsi, n: rt, k: ti, alpha, lda: hsi, stride_a: th, ldb: ti, stride_b: rtt, ldc: hsi, stride_c: rth, batch }
        }
    }
}

impl Blas {
    pub fn new(stream: &Arc<CudaStream>) -> Result<Blas, CudaError> {
        // SAFETY: only probes for the library.
        if !unsafe { bs::is_culib_present() } {
            return Err(CudaError::MissingLibrary("cuBLAS (libcublas.so)"));
        }
        let blas = cudarc::cublas::CudaBlas::new(stream.clone()).map_err(|e| CudaError::Blas { what: "cublasCreate", status: format!("{e:?}") })?;
        Ok(Blas { blas, stream: stream.clone() })
    }

    /// [`Blas::gemm_bf16_f32`] on `stream` (the stream a CUDA graph of the step is captured on),
    /// the handle's own stream set back after.
    pub fn gemm_bf16_f32_on(&self, g: Batched, a: u64, b: u64, c: u64, stream: cudarc::driver::sys::CUstream) -> Result<(), CudaError> {
        let set = |s: cudarc::driver::sys::CUstream| {
            // SAFETY: the handle is live; stream is a live stream of its context.
            ck_blas(unsafe { bs::cublasSetStream_v2(*self.blas.handle(), s as bs::cudaStream_t) }, "cublasSetStream")
        };
        set(stream)?;
        let r = self.gemm_bf16_f32(g, a, b, c);
        set(self.stream.cu_stream())?;
        r
    }

    /// C (f32) = alpha · op(A) · op(B), A and B BF16, column-major, batched with strides.
    pub fn gemm_bf16_f32(&self, g: Batched, a: u64, b: u64, c: u64) -> Result<(), CudaError> {
        let op = |t: bool| {
            if t { bs::cublasOperation_t::CUBLAS_OP_T } else { bs::cublasOperation_t::CUBLAS_OP_N }
        };
        let beta = 0.0f32;
        // SAFETY: a, b, c are live device allocations large enough for the strides and batch.
        let st = unsafe {
            bs::cublasGemmStridedBatchedEx(
                *self.blas.handle(),
                op(g.ta),
                op(g.tb),
                g.m,
                g.n,
                g.k,
                &g.alpha as *const f32 as *const c_void,
                a as *const c_void,
                bs::cudaDataType_t::CUDA_R_16BF,
                g.lda,
                g.stride_a,
                b as *const c_void,
                bs::cudaDataType_t::CUDA_R_16BF,
                g.ldb,
                g.stride_b,
                &beta as *const f32 as *const c_void,
                c as *mut c_void,
                bs::cudaDataType_t::CUDA_R_32F,
                g.ldc,
                g.stride_c,
                g.batch,
                bs::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                bs::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        ck_blas(st, "cublasGemmStridedBatchedEx")
    }
}

#[cfg(test)]
mod tests {
    use super::{Key, OpType, shape_name};

    fn key(bias: bool) -> Key {
        Key { rows: 8192, cols: 2048, k: 2048, p: OpType::E4M3, q: OpType::E4M3, d_bf16: true, p_t: false, q_t: false, fast: false, bias }
    }

    /// A GEMM without a bias keeps the algorithm-cache name it had before the bias epilogue
    /// existed (caches written then still apply); one with a bias gets a name of its own.
    #[test]
    fn the_cache_names_a_bias_gemm_apart_and_keeps_the_old_names() {
        assert_eq!(shape_name(&key(false)), "Key { rows: 8192, cols: 2048, k: 2048, p: E4M3, q: E4M3, d_bf16: true, p_t: false, q_t: false, fast: false }");
        assert!(shape_name(&key(true)).ends_with("fast: false, bias: true }"), "{}", shape_name(&key(true)));
    }
}

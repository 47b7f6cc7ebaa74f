//! What NVRTC compiles, shared by the build script (`capture/build.rs`, which compiles every kernel
//! ahead of time when NVRTC is there: `precompiled.rs`) and the run-time compiler (`kernels.rs`):
//! the kernel families and their translation units, NVRTC's options, and finding and calling NVRTC.
//!
//! It uses only `std`, `libc`, cudarc's NVRTC bindings and the contract's element formats
//! (`schemas/src/element_formats.rs`, included by path), so that the build script can include it
//! (`#[path]`) and both compile the same text with the same options.
//!
//! The kernels' formats come from that contract: `kernels/formats.cuh` is [`formats_header`]'s
//! text, generated from its `KERNEL_FORMATS` (the format codes, their constants, the conversions,
//! and `FOR_EACH_FMT` macros that instantiate a kernel per format) and held to it by a test, and
//! the names of the cast kernels are generated from the same list ([`cast_kernel_names`]).

use cudarc::nvrtc::{result as nr, sys as ns};
use std::ffi::{CString, c_char};
use std::fmt::Write as _;
use std::path::PathBuf;

#[path = "../../../../schemas/src/element_formats.rs"]
#[allow(dead_code)] // the formats the kernels do not cast to (E2M1, E8M0) come along
pub mod element_formats;
use element_formats::KERNEL_FORMATS;

/// The headers of `kernels/`, each pasted in place of its `#include` line ([`Family::translation_unit`]),
/// in this order: only `common.cuh` includes another, `formats.cuh`, which comes after it.
/// `formats.cuh` is generated from the quantization contract ([`formats_header`]) and committed, so
/// that tools reading `kernels/` as files find it; a test holds the file to the generator.
const HEADERS: [(&str, &str); 7] = [
    ("common.cuh", include_str!("../../../../kernels/common.cuh")),
    ("formats.cuh", include_str!("../../../../kernels/formats.cuh")),
    ("activations.cuh", include_str!("../../../../kernels/activations.cuh")),
    ("norms.cuh", include_str!("../../../../kernels/norms.cuh")),
    ("cast_stats.cuh", include_str!("../../../../kernels/cast_stats.cuh")),
    ("cast_tile.cuh", include_str!("../../../../kernels/cast_tile.cuh")),
    ("cast_src.cuh", include_str!("../../../../kernels/cast_src.cuh")),
];

/// A kernel family: one NVRTC program (a `.cu` file, or for `CastSrc` a part of one), one module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    Cast,
    CastSrc,
    GemmOutput,
    BiasGrad,
    Stats,
    Embedding,
    Residual,
    Gelu,
    LayerNorm,
    RmsNorm,
    SwiGlu,
    Attention,
    FlashAttention,
    Loss,
    AdamW,
    Probe,
}

impl Family {
    pub const ALL: [Family; 16] = [
        Family::Cast,
        Family::CastSrc,
        Family::GemmOutput,
        Family::BiasGrad,
        Family::Stats,
        Family::Embedding,
        Family::Residual,
        Family::Gelu,
        Family::LayerNorm,
        Family::RmsNorm,
        Family::SwiGlu,
        Family::Attention,
        Family::FlashAttention,
        Family::Loss,
        Family::AdamW,
        Family::Probe,
    ];

    pub fn file(self) -> &'static str {
        match self {
            Family::Cast | Family::CastSrc => "cast.cu",
            Family::GemmOutput => "gemm_output.cu",
            Family::BiasGrad => "bias_grad.cu",
            Family::Stats => "stats.cu",
            Family::Embedding => "embedding.cu",
            Family::Residual => "residual.cu",
            Family::Gelu => "gelu.cu",
            Family::LayerNorm => "layernorm.cu",
            Family::RmsNorm => "rmsnorm.cu",
            Family::SwiGlu => "swiglu.cu",
            Family::Attention => "attention.cu",
            Family::FlashAttention => "flash_attention.cu",
            Family::Loss => "loss.cu",
            Family::AdamW => "adamw.cu",
            Family::Probe => "probe.cu",
        }
    }

    pub fn source(self) -> &'static str {
        match self {
            Family::Cast | Family::CastSrc => include_str!("../../../../kernels/cast.cu"),
            Family::GemmOutput => include_str!("../../../../kernels/gemm_output.cu"),
            Family::BiasGrad => include_str!("../../../../kernels/bias_grad.cu"),
            Family::Stats => include_str!("../../../../kernels/stats.cu"),
            Family::Embedding => include_str!("../../../../kernels/embedding.cu"),
            Family::Residual => include_str!("../../../../kernels/residual.cu"),
            Family::Gelu => include_str!("../../../../kernels/gelu.cu"),
            Family::LayerNorm => include_str!("../../../../kernels/layernorm.cu"),
            Family::RmsNorm => include_str!("../../../../kernels/rmsnorm.cu"),
            Family::SwiGlu => include_str!("../../../../kernels/swiglu.cu"),
            Family::Attention => include_str!("../../../../kernels/attention.cu"),
            Family::FlashAttention => include_str!("../../../../kernels/flash_attention.cu"),
            Family::Loss => include_str!("../../../../kernels/loss.cu"),
            Family::AdamW => include_str!("../../../../kernels/adamw.cu"),
            Family::Probe => include_str!("../../../../kernels/probe.cu"),
        }
    }

    /// The value of `#define NAME VALUE` in this family's translation unit (its file, or a header it
    /// includes): for tests that hold the host's mirror of a kernel constant to the kernel's.
    #[cfg(test)]
    pub fn define(self, name: &str) -> usize {
        let unit = self.translation_unit();
        let line = unit.lines().find(|l| l.starts_with(&format!("#define {name} "))).unwrap_or_else(|| panic!("kernels/{} defines no {name}", self.file()));
        line.split_whitespace().nth(2).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("kernels/{}: {line}", self.file()))
    }

    /// The full translation unit NVRTC compiles: the family's file with the headers it includes
    /// pasted in ([`HEADERS`]; and, for [`Family::CastSrc`], `CAST_SRC_UNIT` defined first).
    pub fn translation_unit(self) -> String {
        let unit = if self == Family::CastSrc { "#define CAST_SRC_UNIT\n" } else { "" };
        let src = HEADERS.iter().fold(self.source().to_string(), |s, (name, text)| s.replace(&format!("#include \"{name}\""), text));
        unit.to_string() + &src
    }
}

/// The text of `formats.cuh`, generated from the contract's `KERNEL_FORMATS`:
/// - `FMT_<TAG>` (the format's code) and, for each FP8 format, `<TAG>_MAX` (its largest finite
///   value);
/// - `FOR_EACH_FMT(M, A)` / `FOR_EACH_FP8_FMT(M, A)`, which expand `M(A, F)` for every format code
///   F (every FP8 one), and `FOR_EACH_FMT2(M, A, B)` (`M(A, B, F)`): how the kernels instantiate
///   one kernel per format;
/// - `fmt_max`, `fmt_interp` (CUDA's `__nv_fp8_interpretation_t`), `fmt_overflow` (where a cast
///   that does not saturate leaves the finite range), `fmt_overflow_code` and `fmt_overflows_to_inf`
///   (the code it gives there: Inf, or NaN where the format has no Inf), `to_fp8` and `from_fp8`,
///   each with one case per FP8 format and a trap for any other code.
#[allow(dead_code)] // called by the test that holds kernels/formats.cuh to the contract
pub fn formats_header() -> String {
    let fp8: Vec<_> = KERNEL_FORMATS.iter().filter(|f| f.is_fp8()).collect();
    let mut h = String::from(
        "// Generated from schemas/src/element_formats.rs (KERNEL_FORMATS) by capture/src/backend/cuda/kernel_units.rs\n\
         // (formats_header): edit the contract, then regenerate this file with\n\
         //   FP8SCOPE_WRITE_FORMATS_CUH=1 cargo test --release -p fp8-capture --lib the_kernels_formats_come_from_the_contract\n",
    );
    for f in &KERNEL_FORMATS {
        let _ = writeln!(h, "#define FMT_{} {}", f.tag, f.code);
    }
    for f in &fp8 {
        let max = f.spec.map_or(0.0, |s| s.max_finite);
        let _ = writeln!(h, "#define {}_MAX {max:?}f", f.tag);
    }
    let each = |args: &str, codes: &mut dyn Iterator<Item = u8>| codes.map(|c| format!("M({args}, {c})")).collect::<Vec<_>>().join(" ");
    let _ = writeln!(h, "#define FMT_COUNT {}", KERNEL_FORMATS.len());
    let _ = writeln!(h, "#define FOR_EACH_FMT(M, A) {}", each("A", &mut KERNEL_FORMATS.iter().map(|f| f.code)));
    let _ = writeln!(h, "#define FOR_EACH_FMT2(M, A, B) {}", each("A, B", &mut KERNEL_FORMATS.iter().map(|f| f.code)));
    let _ = writeln!(h, "#define FOR_EACH_FP8_FMT(M, A) {}", each("A", &mut fp8.iter().map(|f| f.code)));
    let cases = |body: &dyn Fn(&element_formats::KernelFormat) -> String| {
        fp8.iter().map(|f| format!("    if (fmt == FMT_{}) return {};\n", f.tag, body(f))).collect::<String>()
    };
    let interp = |f: &element_formats::KernelFormat| f.cuda_fp8.unwrap_or("__NV_E4M3").to_string();
    let _ =
        write!(h, "__device__ __forceinline__ __nv_fp8_interpretation_t fmt_interp(int fmt) {{\n{}    __trap();\n    return __NV_E4M3;\n}}\n", cases(&interp));
    let _ = write!(h, "__device__ __forceinline__ float fmt_max(int fmt) {{\n{}    __trap();\n    return 0.0f;\n}}\n", cases(&|f| format!("{}_MAX", f.tag)));
    // Past the overflow threshold (max + half an ulp), a cast that does not saturate gives the
    // format's Inf, or its NaN where it has none (the planted overflow fault).
    let overflow = |f: &element_formats::KernelFormat| f.spec.map_or(0.0, |s| s.overflow_threshold());
    let _ = write!(
        h,
        "__device__ __forceinline__ float fmt_overflow(int fmt) {{\n{}    __trap();\n    return 0.0f;\n}}\n",
        cases(&|f| format!("{:?}f", overflow(f)))
    );
    let code = |f: &element_formats::KernelFormat| f.spec.and_then(|s| s.overflow_code()).unwrap_or(0);
    let _ =
        write!(h, "__device__ __forceinline__ u8 fmt_overflow_code(int fmt) {{\n{}    __trap();\n    return 0;\n}}\n", cases(&|f| format!("{:#04x}", code(f))));
    let inf = |f: &element_formats::KernelFormat| f.spec.is_some_and(|s| s.inf_code.is_some());
    let _ =
        write!(h, "__device__ __forceinline__ bool fmt_overflows_to_inf(int fmt) {{\n{}    __trap();\n    return false;\n}}\n", cases(&|f| inf(f).to_string()));
    let _ = write!(
        h,
        "// x -> FP8 byte: round to nearest even, saturate to +-max, NaN stays NaN (cvt.rn.satfinite).\n\
         __device__ __forceinline__ u8 to_fp8(float x, int fmt) {{\n{}    __trap();\n    return 0;\n}}\n",
        cases(&|f| format!("__nv_cvt_float_to_fp8(x, __NV_SATFINITE, {})", interp(f)))
    );
    let _ = write!(
        h,
        "__device__ __forceinline__ float from_fp8(u8 q, int fmt) {{\n{}    __trap();\n    return 0.0f;\n}}\n",
        cases(&|f| format!("__half2float(__half(__nv_cvt_fp8_to_halfraw(q, {})))", interp(f)))
    );
    h
}

/// The operand-cast kernels' names, generated from the contract's formats: `cast_fwd_l{L}_f{F}_t{T}`
/// for every statistics level L (0 to 2), format code F and layout T (0 to 2), in that nesting;
/// then cast.cu's other entry points; then `cast_weights_l{L}_f{F}` for every level and FP8
/// format. (`kernels.rs`: `cast_kernel` and `cast_weights_kernel` index it.)
pub fn cast_kernel_names() -> Vec<String> {
    let mut out = Vec::new();
    for l in 0..3 {
        for f in &KERNEL_FORMATS {
            out.extend((0..3).map(|t| format!("cast_fwd_l{l}_f{}_t{t}", f.code)));
        }
    }
    out.extend(["round_bf16_fwd", "cast_stats_reduce", "widen_bf16"].map(String::from));
    for l in 0..3 {
        out.extend(KERNEL_FORMATS.iter().filter(|f| f.is_fp8()).map(|f| format!("cast_weights_l{l}_f{}", f.code)));
    }
    out
}

/// The computed-source casts' names: `cast_src{K}_l{L}_f{F}` for every kind K (1 to 9), level L
/// (0 or 1) and format code F, in that nesting.
pub fn cast_src_kernel_names() -> Vec<String> {
    let mut out = Vec::new();
    for k in 1..=9 {
        for l in 0..2 {
            out.extend(KERNEL_FORMATS.iter().map(|f| format!("cast_src{k}_l{l}_f{}", f.code)));
        }
    }
    out
}

/// Directories searched for CUDA's headers, in order: `$CUDA_INCLUDE` (colon-separated),
/// `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include`; only those holding
/// `cuda_fp8.h` are kept.
pub fn include_dirs() -> Vec<String> {
    let mut cands: Vec<PathBuf> = Vec::new();
    if let Ok(v) = std::env::var("CUDA_INCLUDE") {
        cands.extend(v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(v) = std::env::var(var) {
            cands.push(PathBuf::from(v).join("include"));
        }
    }
    cands.push(PathBuf::from("/usr/local/cuda/include"));
    let mut out: Vec<String> = Vec::new();
    for c in cands {
        if c.join("cuda_fp8.h").is_file() {
            let s = c.display().to_string();
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}

/// Whether the NVRTC library can be loaded (cudarc panics on use otherwise).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { ns::is_culib_present() }
}

/// NVRTC's options for a CUBIN for `arch` with CUDA's headers from `includes`.
pub fn compile_options(arch: &str, includes: &[String]) -> Vec<String> {
    let mut opts: Vec<String> = includes.iter().map(|p| format!("--include-path={p}")).collect();
    opts.push(format!("--gpu-architecture={arch}"));
    opts.push("--std=c++17".into());
    opts
}

/// NVRTC's version (major, minor), or None when the library is absent or does not say.
pub fn nvrtc_version() -> Option<(i32, i32)> {
    if !nvrtc_present() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; the call writes two ints.
    unsafe { ns::nvrtcVersion(&mut major, &mut minor) }.result().ok().map(|_| (major, minor))
}

/// Compiles one family's translation unit to a CUBIN with `options`; the error is NVRTC's (with
/// its log).
pub fn compile_unit(family: Family, options: &[String]) -> Result<Vec<u8>, String> {
    if !nvrtc_present() {
        return Err("NVRTC (libnvrtc.so) cannot be loaded".into());
    }
    let src = CString::new(family.translation_unit()).map_err(|e| e.to_string())?;
    let name = CString::new(family.file()).map_err(|e| e.to_string())?;
    let prog = nr::create_program(&src, Some(&name)).map_err(|e| format!("{e:?}"))?;
    // SAFETY: prog is a live program; the options are plain strings.
    let r = unsafe { nr::compile_program(prog, options) };
    // SAFETY: prog is live; the log is read before the program is destroyed.
    let log = unsafe { nr::get_program_log(prog) }
        .map(|v| {
            let bytes: Vec<u8> = v.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        })
        .unwrap_or_default();
    if let Err(e) = r {
        // SAFETY: prog is live and destroyed once.
        unsafe { nr::destroy_program(prog).ok() };
        let hint =
            if !options.iter().any(|o| o.starts_with("--include-path=")) { " (no CUDA include directory found: set CUDA_INCLUDE or CUDA_HOME)" } else { "" };
        return Err(format!("{e:?}{hint}: {}", log.trim()));
    }
    let mut size = 0usize;
    // SAFETY: prog compiled successfully; buf has the size NVRTC reports.
    unsafe {
        ns::nvrtcGetCUBINSize(prog, &mut size).result().map_err(|e| format!("{e:?}"))?;
        let mut buf = vec![0u8; size];
        ns::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char).result().map_err(|e| format!("{e:?}"))?;
        nr::destroy_program(prog).map_err(|e| format!("{e:?}"))?;
        Ok(buf)
    }
}

/// `<site-packages>/nvidia/cu13` of the `nvidia-cuda-nvrtc` / `nvidia-cuda-runtime` wheels (NVRTC
/// and CUDA's headers without a CUDA toolkit), if `python3` can import them.
pub fn wheel_dir() -> Option<PathBuf> {
    let out = std::process::Command::new("python3").args(["-c", "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13'))"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    p.join("include").join("cuda_fp8.h").is_file().then_some(p)
}

/// Makes NVRTC loadable, from the PyPI wheel ([`wheel_dir`]) when the system has none, and returns
/// the include directories to compile with (the system's, then the wheel's). Empty when CUDA's
/// headers are nowhere; NVRTC may still be absent ([`nvrtc_present`]).
pub fn nvrtc_setup() -> Vec<String> {
    let mut includes = include_dirs();
    if let Some(dir) = wheel_dir() {
        if !nvrtc_present() {
            preload_nvrtc_from(&dir.join("lib"));
        }
        includes.push(dir.join("include").display().to_string());
    }
    includes
}

/// Makes NVRTC from a pip wheel (`nvidia-cuda-nvrtc`) loadable without `LD_LIBRARY_PATH`: loads
/// `<dir>/libnvrtc.so.13` (and its builtins) by absolute path, so that cudarc's later `dlopen` by
/// name finds the library already in the process. Returns whether the library is now present.
pub fn preload_nvrtc_from(dir: &std::path::Path) -> bool {
    for name in ["libnvrtc-builtins.so.13.0", "libnvrtc.so.13"] {
        let p = dir.join(name);
        if !p.is_file() {
            continue;
        }
        if let Ok(c) = CString::new(p.display().to_string()) {
            // SAFETY: dlopen of a shared library by path; the handle is kept for the process's life.
            unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        }
    }
    nvrtc_present()
}

/// A fingerprint of a translation unit's text (64-bit FNV-1a): the build script records it beside
/// each CUBIN it compiles, and the run time compares it with the unit it would compile now.
pub fn unit_fingerprint(unit: &str) -> u64 {
    unit.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

//! The CUDA sources of `kernels/`, embedded in the binary and compiled by NVRTC at start-up to a
//! CUBIN for the GPU found (cached per process, and on disk between runs: `kernel_cache.rs`), and
//! the table of kernel modules.
//!
//! Each `kernels/<family>.cu` is one NVRTC program; each `#include` of one of our headers
//! (`common.cuh`, `activations.cuh`, `norms.cuh`, and `cast.cu`'s parts `cast_stats.cuh`,
//! `cast_tile.cuh`, `cast_src.cuh`) is replaced by that file's text before compilation, so no
//! header search is needed for our own code. `cast.cu` is two: its plain casts ([`Family::Cast`]) and,
//! with `CAST_SRC_UNIT` defined, its computed-source casts ([`Family::CastSrc`]), compiled side by
//! side at start-up. NVRTC still
//! needs CUDA's headers (`cuda_fp8.h`, `cuda_bf16.h`): see [`include_dirs`].

use super::CudaError;
use super::kernel_cache::{KernelCache, KeyInputs};
use cudarc::nvrtc::{result as nr, sys as ns};
use std::ffi::{CString, c_char};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// The headers of `kernels/`, each pasted in place of its `#include` line ([`Family::translation_unit`]);
/// none includes another.
const HEADERS: [(&str, &str); 6] = [
    ("common.cuh", include_str!("../../../../kernels/common.cuh")),
    ("activations.cuh", include_str!("../../../../kernels/activations.cuh")),
    ("norms.cuh", include_str!("../../../../kernels/norms.cuh")),
    ("cast_stats.cuh", include_str!("../../../../kernels/cast_stats.cuh")),
    ("cast_tile.cuh", include_str!("../../../../kernels/cast_tile.cuh")),
    ("cast_src.cuh", include_str!("../../../../kernels/cast_src.cuh")),
];

/// The operand-cast kernels of `cast.cu` (one per statistics level, format and layout; see
/// [`cast_kernel`]) and its other entry points.
#[rustfmt::skip]
const CAST_KERNELS: [&str; 36] = [
    "cast_fwd_l0_f0_t0", "cast_fwd_l0_f0_t1", "cast_fwd_l0_f0_t2", "cast_fwd_l0_f1_t0", "cast_fwd_l0_f1_t1", "cast_fwd_l0_f1_t2", "cast_fwd_l0_f2_t0", "cast_fwd_l0_f2_t1", "cast_fwd_l0_f2_t2",
    "cast_fwd_l1_f0_t0", "cast_fwd_l1_f0_t1", "cast_fwd_l1_f0_t2", "cast_fwd_l1_f1_t0", "cast_fwd_l1_f1_t1", "cast_fwd_l1_f1_t2", "cast_fwd_l1_f2_t0", "cast_fwd_l1_f2_t1", "cast_fwd_l1_f2_t2",
    "cast_fwd_l2_f0_t0", "cast_fwd_l2_f0_t1", "cast_fwd_l2_f0_t2", "cast_fwd_l2_f1_t0", "cast_fwd_l2_f1_t1", "cast_fwd_l2_f1_t2", "cast_fwd_l2_f2_t0", "cast_fwd_l2_f2_t1", "cast_fwd_l2_f2_t2",
    "round_bf16_fwd", "cast_stats_reduce", "widen_bf16",
    "cast_weights_l0_f1", "cast_weights_l0_f2", "cast_weights_l1_f1", "cast_weights_l1_f2", "cast_weights_l2_f1", "cast_weights_l2_f2",
];

/// Which layouts a cast writes: the operand's own, its transpose, or both from one read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CastLayout {
    Straight = 0,
    Transposed = 1,
    Both = 2,
}

/// The cast kernel for statistics level `level` (0 amax and counts, 1 moments, 2 quantisation
/// error), format code `fmt` (0 BF16, 1 E4M3, 2 E5M2) and `layout`.
pub fn cast_kernel(level: usize, fmt: usize, layout: CastLayout) -> &'static str {
    CAST_KERNELS[level.min(2) * 9 + fmt.min(2) * 3 + layout as usize]
}

/// The multi-tensor kernel casting a step's FP8 weights (`cast.cu`: `cast_weights_l{L}_f{F}`) at
/// statistics level `level` (0 to 2) to FP8 format code `fmt` (1 E4M3, 2 E5M2); None for BF16.
pub fn cast_weights_kernel(level: usize, fmt: usize) -> Option<&'static str> {
    (fmt == 1 || fmt == 2).then(|| CAST_KERNELS[30 + level.min(2) * 2 + fmt - 1])
}

/// The computed-source casts of `cast.cu` (`cast_src{K}_l{L}_f{F}`: CastSrc kind K 1 to 9,
/// statistics level L 0 or 1, format F; see [`cast_src_kernel`]).
#[rustfmt::skip]
const CAST_SRC_KERNELS: [&str; 54] = [
    "cast_src1_l0_f0", "cast_src1_l0_f1", "cast_src1_l0_f2", "cast_src1_l1_f0", "cast_src1_l1_f1", "cast_src1_l1_f2",
    "cast_src2_l0_f0", "cast_src2_l0_f1", "cast_src2_l0_f2", "cast_src2_l1_f0", "cast_src2_l1_f1", "cast_src2_l1_f2",
    "cast_src3_l0_f0", "cast_src3_l0_f1", "cast_src3_l0_f2", "cast_src3_l1_f0", "cast_src3_l1_f1", "cast_src3_l1_f2",
    "cast_src4_l0_f0", "cast_src4_l0_f1", "cast_src4_l0_f2", "cast_src4_l1_f0", "cast_src4_l1_f1", "cast_src4_l1_f2",
    "cast_src5_l0_f0", "cast_src5_l0_f1", "cast_src5_l0_f2", "cast_src5_l1_f0", "cast_src5_l1_f1", "cast_src5_l1_f2",
    "cast_src6_l0_f0", "cast_src6_l0_f1", "cast_src6_l0_f2", "cast_src6_l1_f0", "cast_src6_l1_f1", "cast_src6_l1_f2",
    "cast_src7_l0_f0", "cast_src7_l0_f1", "cast_src7_l0_f2", "cast_src7_l1_f0", "cast_src7_l1_f1", "cast_src7_l1_f2",
    "cast_src8_l0_f0", "cast_src8_l0_f1", "cast_src8_l0_f2", "cast_src8_l1_f0", "cast_src8_l1_f1", "cast_src8_l1_f2",
    "cast_src9_l0_f0", "cast_src9_l0_f1", "cast_src9_l0_f2", "cast_src9_l1_f0", "cast_src9_l1_f1", "cast_src9_l1_f2",
];

/// The cast kernel of a computed source of kind `kind` (`cast_src.cuh`: SRC_*, 1 to 9) at statistics
/// level `level` (0 or 1: the levels it is compiled for) and format code `fmt` (as
/// [`cast_kernel`]'s).
pub fn cast_src_kernel(kind: i32, level: usize, fmt: usize) -> &'static str {
    CAST_SRC_KERNELS[(kind.clamp(1, 9) as usize - 1) * 6 + level.min(1) * 3 + fmt.min(2)]
}

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

    /// The kernels (entry points) the backend loads from this family.
    pub fn kernels(self) -> &'static [&'static str] {
        match self {
            Family::Cast => &CAST_KERNELS,
            Family::CastSrc => &CAST_SRC_KERNELS,
            Family::GemmOutput => &["gemm_epilogue", "gemm_nonfinite_count", "bias_to_bf16", "slot_flags_clear"],
            Family::BiasGrad => &["rowsum_dequant", "colsum_bf16_partial", "colsum_bf16_reduce"],
            Family::Stats => {
                &["sumsq_partial", "sumsq_multi", "zero_multi", "sum_partials", "count_nonfinite", "channel_stats_partial", "channel_stats_reduce"]
            }
            Family::Embedding => &["embedding_fwd", "embedding_bwd"],
            Family::Residual => &["residual_fwd", "residual_bwd"],
            Family::Gelu => &["gelu_fwd", "gelu_bwd"],
            Family::LayerNorm => &["layernorm_fwd", "layernorm_add_stats", "layernorm_bwd", "layernorm_bwd_reduce"],
            Family::RmsNorm => &["rmsnorm_fwd", "rmsnorm_add_stats", "rmsnorm_bwd", "rmsnorm_bwd_reduce"],
            Family::SwiGlu => &["swiglu_fwd", "swiglu_bwd"],
            Family::Attention => &[
                "attention_split_fwd",
                "attention_softmax_fwd",
                "attention_merge_fwd",
                "attention_split_bwd",
                "attention_softmax_bwd",
                "attention_merge_bwd",
                "rope_fwd",
                "rope_split_fwd",
                "rope_bwd",
            ],
            Family::FlashAttention => &super::attention::FLASH_KERNELS,
            Family::Loss => &["crossentropy_fwd", "crossentropy_smem_fwd", "crossentropy_split_fwd"],
            Family::AdamW => &["adamw_fwd", "adamw_multi"],
            Family::Probe => &["hold_device"],
        }
    }

    /// The full translation unit NVRTC compiles: the family's file with the headers it includes
    /// pasted in ([`HEADERS`]; and, for [`Family::CastSrc`], `CAST_SRC_UNIT` defined first).
    pub fn translation_unit(self) -> String {
        let unit = if self == Family::CastSrc { "#define CAST_SRC_UNIT\n" } else { "" };
        let src = HEADERS.iter().fold(self.source().to_string(), |s, (name, text)| s.replace(&format!("#include \"{name}\""), text));
        unit.to_string() + &src
    }
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

/// Compiles one family to a CUBIN for `arch` (e.g. `sm_90`).
pub fn compile_cubin(family: Family, arch: &str, includes: &[String]) -> Result<Vec<u8>, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::MissingLibrary("NVRTC (libnvrtc.so)"));
    }
    let fail = |msg: String| CudaError::Compile { file: family.file(), log: msg };
    let src = CString::new(family.translation_unit()).map_err(|e| fail(e.to_string()))?;
    let name = CString::new(family.file()).map_err(|e| fail(e.to_string()))?;
    let prog = nr::create_program(&src, Some(&name)).map_err(|e| fail(format!("{e:?}")))?;
    let opts = compile_options(arch, includes);
    // SAFETY: prog is a live program; the options are plain strings.
    let r = unsafe { nr::compile_program(prog, &opts) };
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
        let hint = if includes.is_empty() { " (no CUDA include directory found: set CUDA_INCLUDE or CUDA_HOME)" } else { "" };
        return Err(fail(format!("{e:?}{hint}: {}", log.trim())));
    }
    let mut size = 0usize;
    // SAFETY: prog compiled successfully; buf has the size NVRTC reports.
    let cubin = unsafe {
        ns::nvrtcGetCUBINSize(prog, &mut size).result().map_err(|e| fail(format!("{e:?}")))?;
        let mut buf = vec![0u8; size];
        ns::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char).result().map_err(|e| fail(format!("{e:?}")))?;
        nr::destroy_program(prog).map_err(|e| fail(format!("{e:?}")))?;
        buf
    };
    Ok(cubin)
}

type CubinCache = Mutex<Vec<(String, Family, std::sync::Arc<Vec<u8>>)>>;

/// Compiles (once per process, per architecture) every family to CUBIN, the families in parallel
/// (each NVRTC program is single-threaded; `cast.cu`, the largest, bounds the wall time), or reads
/// the CUBINs an earlier run kept on disk for the same sources, compiler and target
/// ([`super::kernel_cache`]).
pub fn compile_all(arch: &str, includes: &[String]) -> Result<Vec<(Family, std::sync::Arc<Vec<u8>>)>, CudaError> {
    static CACHE: OnceLock<CubinCache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(Vec::new()));
    let cached = |f: Family| cache.lock().ok().and_then(|c| c.iter().find(|(a, g, _)| a == arch && *g == f).map(|(_, _, b)| b.clone()));
    let disk = KernelCache::from_env();
    let version = nvrtc_version();
    let options = compile_options(arch, includes);
    let (disk, options) = (&disk, &options);
    // One family's CUBIN: from the disk cache when NVRTC says its version, else compiled.
    let build = move |f: Family| match version {
        Some(nvrtc_version) => {
            disk.get_or_compile(&KeyInputs { family: f, arch, nvrtc_version, options }, || compile_cubin(f, arch, includes)).map(|(cubin, _)| cubin)
        }
        None => compile_cubin(f, arch, includes),
    };
    // The cached families as they are, the others each on its own thread.
    let compiled: Vec<(Family, Result<std::sync::Arc<Vec<u8>>, CudaError>)> = std::thread::scope(|s| {
        let jobs: Vec<_> = Family::ALL.iter().map(|&f| (f, cached(f).ok_or_else(|| s.spawn(move || build(f))))).collect();
        jobs.into_iter()
            .map(|(f, job)| {
                let bin = match job {
                    Ok(hit) => Ok(hit),
                    Err(thread) => match thread.join() {
                        Ok(r) => r.map(std::sync::Arc::new),
                        Err(_) => Err(CudaError::Compile { file: f.file(), log: "the compiling thread panicked".into() }),
                    },
                };
                (f, bin)
            })
            .collect()
    });
    let mut out = Vec::new();
    for (f, r) in compiled {
        let bin = r?;
        if let Ok(mut c) = cache.lock()
            && !c.iter().any(|(a, g, _)| a == arch && *g == f)
        {
            c.push((arch.to_string(), f, bin.clone()));
        }
        out.push((f, bin));
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_follow_their_parameters() {
        for level in 0..3 {
            for fmt in 0..3 {
                for (layout, t) in [(CastLayout::Straight, 0), (CastLayout::Transposed, 1), (CastLayout::Both, 2)] {
                    assert_eq!(cast_kernel(level, fmt, layout), format!("cast_fwd_l{level}_f{fmt}_t{t}"));
                }
                let weights = cast_weights_kernel(level, fmt);
                assert_eq!(weights.map(str::to_string), (fmt > 0).then(|| format!("cast_weights_l{level}_f{fmt}")));
            }
        }
        for kind in 1..=8 {
            for level in 0..2 {
                for fmt in 0..3 {
                    assert_eq!(cast_src_kernel(kind, level, fmt), format!("cast_src{kind}_l{level}_f{fmt}"));
                }
            }
        }
    }
}

//! What NVRTC compiles, shared by the build script (`capture/build.rs`, which compiles every kernel
//! ahead of time when NVRTC is there: `precompiled.rs`) and the run-time compiler (`kernels.rs`):
//! the kernel families and their translation units, NVRTC's options, and finding and calling NVRTC.
//!
//! It uses only `std`, `libc` and cudarc's NVRTC bindings, so that the build script can include it
//! (`#[path]`) and both compile the same text with the same options.

use cudarc::nvrtc::{result as nr, sys as ns};
use std::ffi::{CString, c_char};
use std::path::PathBuf;

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

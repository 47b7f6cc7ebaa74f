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
use super::kernel_units::compile_unit;
pub use super::kernel_units::{Family, compile_options, include_dirs, nvrtc_present, nvrtc_setup, nvrtc_version, preload_nvrtc_from, wheel_dir};
use std::sync::{LazyLock, Mutex, OnceLock};

/// The operand-cast kernels of `cast.cu` (one per statistics level, format of the contract and
/// layout; see [`cast_kernel`]) and its other entry points, named from the contract's formats
/// ([`super::kernel_units::cast_kernel_names`]).
static CAST_KERNELS: LazyLock<Vec<&'static str>> = LazyLock::new(|| leak_names(super::kernel_units::cast_kernel_names()));

/// The computed-source casts of `cast.cu` (`cast_src{K}_l{L}_f{F}`: CastSrc kind K 1 to 9,
/// statistics level L 0 or 1, format F; see [`cast_src_kernel`]).
static CAST_SRC_KERNELS: LazyLock<Vec<&'static str>> = LazyLock::new(|| leak_names(super::kernel_units::cast_src_kernel_names()));

/// Names made once per process, for the life of the process (the kernel tables hold `&'static str`).
fn leak_names(names: Vec<String>) -> Vec<&'static str> {
    names.into_iter().map(|n| &*n.leak()).collect()
}

/// How many formats the kernels are instantiated for (the contract's `KERNEL_FORMATS`).
const N_FMT: usize = super::kernel_units::element_formats::KERNEL_FORMATS.len();

/// Which layouts a cast writes: the operand's own, its transpose, or both from one read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CastLayout {
    Straight = 0,
    Transposed = 1,
    Both = 2,
}

/// The cast kernel for statistics level `level` (0 amax and counts, 1 moments, 2 quantisation
/// error), format code `fmt` (the contract's: 0 BF16, 1 E4M3, 2 E5M2) and `layout`.
pub fn cast_kernel(level: usize, fmt: usize, layout: CastLayout) -> &'static str {
    assert!(fmt < N_FMT, "format code {fmt}: the kernels know {N_FMT}");
    CAST_KERNELS[level.min(2) * N_FMT * 3 + fmt * 3 + layout as usize]
}

/// The multi-tensor kernel casting a step's FP8 weights (`cast.cu`: `cast_weights_l{L}_f{F}`) at
/// statistics level `level` (0 to 2) to the FP8 format of code `fmt`; None for BF16.
pub fn cast_weights_kernel(level: usize, fmt: usize) -> Option<&'static str> {
    let fp8 = || super::kernel_units::element_formats::KERNEL_FORMATS.iter().filter(|f| f.is_fp8());
    let i = fp8().position(|f| f.code as usize == fmt)?;
    Some(CAST_KERNELS[N_FMT * 9 + 3 + level.min(2) * fp8().count() + i])
}

/// The cast kernel of a computed source of kind `kind` (`cast_src.cuh`: SRC_*, 1 to 9) at statistics
/// level `level` (0 or 1: the levels it is compiled for) and format code `fmt` (as
/// [`cast_kernel`]'s).
pub fn cast_src_kernel(kind: i32, level: usize, fmt: usize) -> &'static str {
    assert!(fmt < N_FMT, "format code {fmt}: the kernels know {N_FMT}");
    CAST_SRC_KERNELS[(kind.clamp(1, 9) as usize - 1) * 2 * N_FMT + level.min(1) * N_FMT + fmt]
}

impl Family {
    /// The kernels (entry points) the backend loads from this family.
    pub fn kernels(self) -> &'static [&'static str] {
        match self {
            Family::Cast => CAST_KERNELS.as_slice(),
            Family::CastSrc => CAST_SRC_KERNELS.as_slice(),
            Family::GemmOutput => &["gemm_epilogue", "gemm_nonfinite_count", "bias_to_bf16", "slot_flags_clear"],
            Family::BiasGrad => &["rowsum_dequant", "colsum_bf16_partial", "colsum_bf16_reduce"],
            Family::Stats => &[
                "sumsq_partial",
                "sumsq_multi",
                "zero_multi",
                "sum_partials",
                "count_nonfinite",
                "output_error_partial",
                "channel_stats_partial",
                "channel_stats_reduce",
            ],
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
}

/// Compiles one family to a CUBIN for `arch` (e.g. `sm_90`) with NVRTC.
pub fn compile_cubin(family: Family, arch: &str, includes: &[String]) -> Result<Vec<u8>, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::MissingLibrary("NVRTC (libnvrtc.so)"));
    }
    compile_unit(family, &compile_options(arch, includes)).map_err(|log| CudaError::Compile { file: family.file(), log })
}

type CubinCache = Mutex<Vec<(String, Family, std::sync::Arc<Vec<u8>>)>>;

/// Where a family's CUBIN came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CubinOrigin {
    /// Compiled at build time and embedded ([`super::precompiled`]).
    Precompiled,
    /// Compiled by NVRTC in this process, or read from the disk cache an earlier run kept.
    Nvrtc,
}

/// Every family's CUBIN for `arch`: the embedded one when `precompiled` is on and the binary has it
/// ([`super::precompiled`]), else compiled (once per process, per architecture) with NVRTC, the
/// families in parallel (each NVRTC program is single-threaded; `cast.cu`, the largest, bounds the
/// wall time), or read from the CUBINs an earlier run kept on disk for the same sources, compiler
/// and target ([`super::kernel_cache`]).
pub fn compile_all(arch: &str, includes: &[String], precompiled: bool) -> Result<Vec<(Family, std::sync::Arc<Vec<u8>>, CubinOrigin)>, CudaError> {
    static CACHE: OnceLock<CubinCache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(Vec::new()));
    let cached = |f: Family| cache.lock().ok().and_then(|c| c.iter().find(|(a, g, _)| a == arch && *g == f).map(|(_, _, b)| b.clone()));
    let embedded = |f: Family| if precompiled { super::precompiled::cubin(arch, f).map(|b| std::sync::Arc::new(b.to_vec())) } else { None };
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
    // The embedded and in-process families as they are, the others each on its own thread.
    type Job<'s> = Result<(std::sync::Arc<Vec<u8>>, CubinOrigin), std::thread::ScopedJoinHandle<'s, Result<Vec<u8>, CudaError>>>;
    let compiled: Vec<(Family, Result<(std::sync::Arc<Vec<u8>>, CubinOrigin), CudaError>)> = std::thread::scope(|s| {
        let jobs: Vec<(Family, Job)> = Family::ALL
            .iter()
            .map(|&f| {
                let ready = embedded(f).map(|b| (b, CubinOrigin::Precompiled)).or_else(|| cached(f).map(|b| (b, CubinOrigin::Nvrtc)));
                (f, ready.ok_or_else(|| s.spawn(move || build(f))))
            })
            .collect();
        jobs.into_iter()
            .map(|(f, job)| {
                let bin = match job {
                    Ok(ready) => Ok(ready),
                    Err(thread) => match thread.join() {
                        Ok(r) => r.map(|b| (std::sync::Arc::new(b), CubinOrigin::Nvrtc)),
                        Err(_) => Err(CudaError::Compile { file: f.file(), log: "the compiling thread panicked".into() }),
                    },
                };
                (f, bin)
            })
            .collect()
    });
    let mut out = Vec::new();
    for (f, r) in compiled {
        let (bin, origin) = r?;
        if origin == CubinOrigin::Nvrtc
            && let Ok(mut c) = cache.lock()
            && !c.iter().any(|(a, g, _)| a == arch && *g == f)
        {
            c.push((arch.to_string(), f, bin.clone()));
        }
        out.push((f, bin, origin));
    }
    Ok(out)
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
        for kind in 1..=9 {
            for level in 0..2 {
                for fmt in 0..3 {
                    assert_eq!(cast_src_kernel(kind, level, fmt), format!("cast_src{kind}_l{level}_f{fmt}"));
                }
            }
        }
        assert_eq!(CAST_KERNELS.len(), 36);
        assert_eq!(CAST_SRC_KERNELS.len(), 54);
    }

    /// The generated `formats.cuh` holds the contract's constants: the values the kernels had
    /// written by hand before (codes, largest values, overflow thresholds and codes), and a case of
    /// every conversion per FP8 format.
    #[test]
    fn the_kernels_formats_come_from_the_contract() {
        let h = super::super::kernel_units::formats_header();
        // kernels/formats.cuh, committed for the tools that read kernels/ as files, is the
        // generator's text.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/formats.cuh");
        if std::env::var_os("FP8SCOPE_WRITE_FORMATS_CUH").is_some() {
            std::fs::write(&path, &h).expect("write kernels/formats.cuh");
        }
        let committed = std::fs::read_to_string(&path).expect("kernels/formats.cuh");
        assert!(
            committed == h,
            "kernels/formats.cuh differs from what schemas/src/element_formats.rs generates now; regenerate it with\n  \
             FP8SCOPE_WRITE_FORMATS_CUH=1 cargo test --release -p fp8-capture --lib the_kernels_formats_come_from_the_contract\nand rebuild"
        );
        for line in [
            "#define FMT_BF16 0",
            "#define FMT_E4M3 1",
            "#define FMT_E5M2 2",
            "#define E4M3_MAX 448.0f",
            "#define E5M2_MAX 57344.0f",
            "#define FOR_EACH_FMT(M, A) M(A, 0) M(A, 1) M(A, 2)",
            "#define FOR_EACH_FP8_FMT(M, A) M(A, 1) M(A, 2)",
            "    if (fmt == FMT_E4M3) return 464.0f;",
            "    if (fmt == FMT_E5M2) return 61440.0f;",
            "    if (fmt == FMT_E4M3) return 0x7f;",
            "    if (fmt == FMT_E5M2) return 0x7c;",
            "    if (fmt == FMT_E4M3) return false;",
            "    if (fmt == FMT_E5M2) return true;",
            "    if (fmt == FMT_E5M2) return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);",
        ] {
            assert!(h.lines().any(|l| l == line), "formats.cuh lacks `{line}`:\n{h}");
        }
        // Every unit that includes common.cuh gets it, and no hand-written constant is left.
        for fam in Family::ALL {
            let unit = fam.translation_unit();
            assert!(!unit.contains("#include \"formats.cuh\""), "{}: formats.cuh not pasted", fam.file());
            for stale in ["464.0f :", "61440.0f", "? __NV_E4M3 :"] {
                assert!(!unit.contains(stale) || h.contains(stale), "{}: a hand-written format constant `{stale}`", fam.file());
            }
        }
    }
}

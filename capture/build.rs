//! Compiles every CUDA kernel of `kernels/` to CUBINs at build time, when NVRTC is there (a CUDA
//! toolkit, or the PyPI wheels `nvidia-cuda-nvrtc` and `nvidia-cuda-runtime`), for the
//! architectures in `FP8SCOPE_PRECOMPILE` (default `sm_89,sm_90,sm_100`; `none` compiles none).
//! The CUBINs are embedded in the binary (`src/backend/cuda/precompiled.rs`), so that a GPU run
//! starts without compiling; NVRTC at run time, with its disk cache, stays the fallback.
//!
//! A kernel that does not compile fails the build with NVRTC's log (`cargo clippy` skips the
//! compilation: lints need the table's shape only). An architecture this NVRTC
//! does not know is left out with a warning, as is everything when no NVRTC is found.

#[path = "src/backend/cuda/kernel_units.rs"]
#[allow(dead_code)]
mod kernel_units;

use kernel_units::Family;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The architectures compiled when `FP8SCOPE_PRECOMPILE` is not set: those fp8scope supports (FP8
/// tensor cores: Ada, Hopper, Blackwell).
const DEFAULT_PRECOMPILED_ARCHS: &str = "sm_89,sm_90,sm_100";

fn main() {
    println!("cargo:rerun-if-changed=../kernels");
    println!("cargo:rerun-if-changed=src/backend/cuda/kernel_units.rs");
    println!("cargo:rerun-if-changed=../schemas/src/element_formats.rs");
    for var in ["FP8SCOPE_PRECOMPILE", "CUDA_HOME", "CUDA_PATH", "CUDA_INCLUDE"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let requested = std::env::var("FP8SCOPE_PRECOMPILE").unwrap_or_else(|_| DEFAULT_PRECOMPILED_ARCHS.to_string());
    let archs: Vec<String> = requested.split(',').map(str::trim).filter(|a| !a.is_empty() && *a != "none").map(str::to_string).collect();
    // Lints need the table's shape, not the CUBINs: clippy's build gets an empty table.
    let linting = std::env::var("RUSTC_WORKSPACE_WRAPPER").is_ok_and(|w| w.contains("clippy-driver"));
    let (version, cubins) = if archs.is_empty() || linting { (None, Vec::new()) } else { compile(&archs, &out) };
    std::fs::write(out.join("precompiled_table.rs"), table(version, &cubins)).expect("write precompiled_table.rs");
}

/// One compiled CUBIN: its architecture, family, the fingerprint of the unit it came from, and its file.
struct Compiled {
    arch: String,
    family: Family,
    fingerprint: u64,
    path: PathBuf,
}

/// Compiles every family for every architecture NVRTC knows, on `NUM_JOBS` threads, the longest
/// units first. Returns NVRTC's version and the CUBINs, written under `out/kernels/`.
fn compile(archs: &[String], out: &Path) -> (Option<(i32, i32)>, Vec<Compiled>) {
    let includes = kernel_units::nvrtc_setup();
    let Some(version) = kernel_units::nvrtc_version().filter(|_| !includes.is_empty()) else {
        println!(
            "cargo:warning=fp8-capture: no NVRTC or CUDA headers found (a CUDA toolkit, or `pip install nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96`); \
             the kernels will be compiled when a GPU run starts"
        );
        return (None, Vec::new());
    };
    // The architectures this NVRTC accepts, tried on the smallest family.
    let known: Vec<&String> = archs
        .iter()
        .filter(|arch| match kernel_units::compile_unit(Family::Probe, &kernel_units::compile_options(arch, &includes)) {
            Ok(_) => true,
            Err(e) => {
                println!(
                    "cargo:warning=fp8-capture: NVRTC {}.{} cannot compile for {arch}; not precompiled ({})",
                    version.0,
                    version.1,
                    e.lines().next().unwrap_or("")
                );
                false
            }
        })
        .collect();
    let mut jobs: Vec<(&String, Family)> = known.iter().flat_map(|&a| Family::ALL.iter().map(move |&f| (a, f))).collect();
    jobs.sort_by_key(|&(_, f)| (f != Family::CastSrc, std::cmp::Reverse(f.translation_unit().len())));
    let queue = Mutex::new(jobs.into_iter());
    let done = Mutex::new(Vec::new());
    let threads = std::env::var("NUM_JOBS").ok().and_then(|n| n.parse::<usize>().ok()).unwrap_or(1).max(1);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let Some((arch, family)) = queue.lock().unwrap().next() else { break };
                    let unit = family.translation_unit();
                    let cubin = kernel_units::compile_unit(family, &kernel_units::compile_options(arch, &includes))
                        .unwrap_or_else(|log| panic!("kernels/{} does not compile for {arch}: {log}", family.file()));
                    let dir = out.join("kernels").join(arch);
                    std::fs::create_dir_all(&dir).expect("create the CUBIN folder");
                    let path = dir.join(format!("{family:?}.cubin"));
                    std::fs::write(&path, cubin).expect("write a CUBIN");
                    done.lock().unwrap().push(Compiled { arch: arch.clone(), family, fingerprint: kernel_units::unit_fingerprint(&unit), path });
                }
            });
        }
    });
    let mut done = done.into_inner().unwrap();
    done.sort_by_key(|c| (c.arch.clone(), Family::ALL.iter().position(|&f| f == c.family)));
    (Some(version), done)
}

/// The Rust table of the embedded CUBINs (`precompiled.rs` includes it).
fn table(version: Option<(i32, i32)>, cubins: &[Compiled]) -> String {
    let mut s = String::from("// Generated by capture/build.rs: the CUBINs compiled at build time.\n");
    writeln!(s, "/// The NVRTC (major, minor) that compiled them; None when none was found at build time.").unwrap();
    writeln!(s, "pub const NVRTC_VERSION: Option<(i32, i32)> = {version:?};").unwrap();
    writeln!(s, "/// (architecture, family, fingerprint of its translation unit, CUBIN).").unwrap();
    writeln!(s, "pub static CUBINS: &[(&str, Family, u64, &[u8])] = &[").unwrap();
    for c in cubins {
        writeln!(s, "    ({:?}, Family::{:?}, {:#x}, include_bytes!({:?})),", c.arch, c.family, c.fingerprint, c.path.display().to_string()).unwrap();
    }
    s.push_str("];\n");
    s
}

//! Helpers shared by the CUDA tests: finding NVRTC and CUDA's headers from the PyPI wheels when no
//! CUDA toolkit is installed, and opening the GPU or saying, visibly, that the test is skipped.
#![allow(dead_code)]

use fp8_capture::backend::cuda::{CudaBackend, kernels};
use std::path::PathBuf;

/// `<site-packages>/nvidia/cu13` of the `nvidia-cuda-nvrtc` / `nvidia-cuda-runtime` wheels, if
/// python3 can import them.
pub fn wheel_dir() -> Option<PathBuf> {
    let out = std::process::Command::new("python3").args(["-c", "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13'))"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    p.join("include").join("cuda_fp8.h").is_file().then_some(p)
}

/// Makes NVRTC loadable (from the wheel if needed) and returns the include directories to use.
/// Panics with the fix when neither a CUDA install nor the wheels are there.
pub fn nvrtc_setup() -> Vec<String> {
    let mut includes = kernels::include_dirs();
    if let Some(dir) = wheel_dir() {
        if !kernels::nvrtc_present() {
            kernels::preload_nvrtc_from(&dir.join("lib"));
        }
        includes.push(dir.join("include").display().to_string());
    }
    assert!(
        kernels::nvrtc_present() && !includes.is_empty(),
        "NVRTC or CUDA's headers not found: install them with `python3 -m pip install -r tests/requirements.txt` \
         (nvidia-cuda-nvrtc==13.0.88, nvidia-cuda-runtime==13.0.96) or set CUDA_HOME"
    );
    includes
}

/// The GPU backend, or None after printing `SKIPPED: no GPU (why)`.
pub fn gpu(test: &str) -> Option<CudaBackend> {
    if let Err(e) = fp8_capture::gpu_usable() {
        println!("SKIPPED: no GPU ({test}: {e})");
        return None;
    }
    match CudaBackend::new() {
        Ok(be) => Some(be),
        Err(e) => panic!("a GPU is present but the CUDA backend failed to start: {e}"),
    }
}

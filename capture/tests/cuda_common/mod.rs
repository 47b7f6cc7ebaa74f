//! Helpers shared by the CUDA tests: finding NVRTC and CUDA's headers from the PyPI wheels when no
//! CUDA toolkit is installed, and opening the GPU or saying, visibly, that the test is skipped.
#![allow(dead_code)]

use fp8_capture::backend::cuda::{CudaBackend, kernels};

/// Makes NVRTC loadable (from the PyPI wheel if needed) and returns the include directories to
/// use. Panics with the fix when neither a CUDA install nor the wheels are there.
pub fn nvrtc_setup() -> Vec<String> {
    let includes = kernels::nvrtc_setup();
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

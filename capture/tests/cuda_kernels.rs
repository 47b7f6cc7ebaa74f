//! Every CUDA kernel compiles for sm_90 through NVRTC — in CI too, where there is no GPU: NVRTC and
//! CUDA's headers then come from the PyPI wheels that tests/requirements.txt installs.

mod cuda_common;

use fp8_capture::backend::cuda::kernels::{Family, compile_cubin};

#[test]
fn every_kernel_file_compiles_to_an_sm90_cubin_with_nvrtc() {
    let includes = cuda_common::nvrtc_setup();
    for fam in Family::ALL {
        let t = std::time::Instant::now();
        let cubin = compile_cubin(fam, "sm_90", &includes).unwrap_or_else(|e| panic!("{e}"));
        // An ELF image, not an empty or PTX answer.
        assert!(
            cubin.len() > 1000 && cubin.starts_with(b"\x7fELF"),
            "{}: not a CUBIN ({} bytes)",
            fam.file(),
            cubin.len()
        );
        println!("{:<14} {:>7} bytes  {:>5.0} ms", fam.file(), cubin.len(), t.elapsed().as_secs_f64() * 1e3);
    }
}

#[test]
fn every_kernel_the_backend_loads_is_defined_in_its_file_with_its_family_name() {
    for fam in Family::ALL {
        let src = fam.source();
        for k in fam.kernels() {
            let decl = format!(" {k}(");
            assert!(src.contains(&decl) && src.contains("extern \"C\" __global__"), "{}: no kernel {k}", fam.file());
        }
    }
}

//! fp8-capture: trains a transformer with FP8 GEMMs (CUDA or exact CPU emulation) and records the run.
pub mod layers;

//! fp8-capture: trains a transformer with FP8 GEMMs (on CUDA, or on the CPU through an exact
//! emulation of the FP8 casts) and records what the casts do, step by step.
pub mod fp8;

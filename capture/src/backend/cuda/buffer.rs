//! The CUDA backend's buffer ([`DevBuf`]): f32 values, or — for a tensor whose every value is a
//! BF16 number ([`crate::backend::Backend::zeros_bf16`]: a GEMM's output, which the GEMM rounds to
//! BF16) — the same values in 16 bits each. The 16-bit form loses nothing and halves the memory
//! and the bytes its readers move: llama-1b saves fc1's output, (N, 2F), in it, 4.3 GB less.
//!
//! A kernel launcher that reads or writes a BF16 buffer says so with [`DevBuf::is_bf16`] and
//! [`DevBuf::raw`]; every other launcher takes the buffer as the `CudaSlice<f32>` it derefs to,
//! and the deref refuses a BF16 buffer (a launcher that cannot read one must never see one).

use cudarc::driver::CudaSlice;
use std::ops::{Deref, DerefMut};

/// A device buffer of `len` values, stored as f32 or as BF16.
pub struct DevBuf {
    /// f32: `len` words. BF16: `len.div_ceil(2)` words, each holding two BF16 values (little-endian).
    mem: CudaSlice<f32>,
    len: usize,
    bf16: bool,
}

impl DevBuf {
    /// A buffer of f32 values.
    pub fn f32(mem: CudaSlice<f32>) -> DevBuf {
        let len = mem.len();
        DevBuf { mem, len, bf16: false }
    }

    /// A buffer of `len` BF16 values in `mem` (at least `len.div_ceil(2)` words).
    pub fn bf16(mem: CudaSlice<f32>, len: usize) -> DevBuf {
        assert!(mem.len() >= len.div_ceil(2), "a BF16 buffer of {len} values needs {} words, has {}", len.div_ceil(2), mem.len());
        DevBuf { mem, len, bf16: true }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the values are stored as BF16.
    pub fn is_bf16(&self) -> bool {
        self.bf16
    }

    /// The memory, whichever the storage (for launchers that handle both).
    pub fn raw(&self) -> &CudaSlice<f32> {
        &self.mem
    }

    pub fn raw_mut(&mut self) -> &mut CudaSlice<f32> {
        &mut self.mem
    }
}

impl Deref for DevBuf {
    type Target = CudaSlice<f32>;

    fn deref(&self) -> &CudaSlice<f32> {
        assert!(!self.bf16, "internal: a BF16 buffer reached a kernel that reads only f32");
        &self.mem
    }
}

impl DerefMut for DevBuf {
    fn deref_mut(&mut self) -> &mut CudaSlice<f32> {
        assert!(!self.bf16, "internal: a BF16 buffer reached a kernel that writes only f32");
        &mut self.mem
    }
}

//! Token embedding on the GPU: the launchers of `kernels/embedding.cu` (the CPU reference is
//! `layers/embedding.rs`), and the upload of a batch's tokens, which also groups their positions
//! by token for the backward. The forward gathers one row of `wte` per token; the backward adds
//! each distinct token's rows of dout in position order, one thread per (token, column), so it
//! needs no atomics and reruns bit-identically.

use super::{CudaBackend, CudaError, CudaTokens, cfg, grid_for};
use cudarc::driver::{CudaSlice, PushKernelArg};

/// Threads per block of both kernels.
const THREADS: u32 = 256;

impl CudaBackend {
    /// The tokens on the device, with the positions of each distinct token (counting sort, in
    /// position order within a token) for `embedding_bwd`.
    pub(super) fn upload_tokens_impl(&mut self, tokens: &[u32]) -> Result<CudaTokens, CudaError> {
        let mut order: Vec<u32> = (0..tokens.len() as u32).collect();
        order.sort_by_key(|&i| (tokens[i as usize], i));
        let mut uniq = Vec::new();
        let mut offsets = Vec::new();
        for (j, &i) in order.iter().enumerate() {
            let t = tokens[i as usize];
            if uniq.last() != Some(&t) {
                uniq.push(t);
                offsets.push(j as u32);
            }
        }
        offsets.push(order.len() as u32);
        let s = &self.stream;
        let up = |v: &[u32]| -> Result<CudaSlice<u32>, CudaError> { Ok(if v.is_empty() { s.alloc_zeros::<u32>(1) } else { s.clone_htod(v) }?) };
        Ok(CudaTokens { ids: up(tokens)?, n_uniq: uniq.len(), uniq: up(&uniq)?, offsets: up(&offsets)?, positions: up(&order)? })
    }

    /// out (N, C) `=` wte[tokens].
    pub(super) fn embedding_fwd_impl(&mut self, out: &mut CudaSlice<f32>, tokens: &CudaTokens, wte: &CudaSlice<f32>, c: usize) -> Result<(), CudaError> {
        let n = out.len().checked_div(c).ok_or_else(|| CudaError::Unsupported("embedding_fwd with C = 0".into()))?;
        let (o, t, w) = (self.ptr(out), self.ptr(&tokens.ids), self.ptr(wte));
        launch!(self, "embedding_fwd", grid_for(n * c, THREADS), o, t, w, n as u64, c as i32)
    }

    /// dwte (V, C) `+=` the rows of dout (N, C) gathered by token.
    pub(super) fn embedding_bwd_impl(&mut self, dwte: &mut CudaSlice<f32>, dout: &CudaSlice<f32>, tokens: &CudaTokens, c: usize) -> Result<(), CudaError> {
        if tokens.n_uniq == 0 {
            return Ok(());
        }
        let (d, g, u, o, p) = (self.ptr(dwte), self.ptr(dout), self.ptr(&tokens.uniq), self.ptr(&tokens.offsets), self.ptr(&tokens.positions));
        launch!(self, "embedding_bwd", cfg((tokens.n_uniq as u32, (c as u32).div_ceil(THREADS), 1), THREADS), d, g, u, o, p, c as i32)
    }
}

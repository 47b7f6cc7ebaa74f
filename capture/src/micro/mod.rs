//! Micro-scaled block formats, emulated bit for bit on the CPU: MXFP8 ([`mxfp8`]) and NVFP4
//! ([`nvfp4`]), with their scale and element encodings ([`e8m0`], [`e2m1`]) and NVFP4's random
//! Hadamard transform ([`rht`]). What each operand gets is the quantization contract's
//! (`fp8scope_schemas::quant`); the definitions follow Transformer Engine's code, cited per file.

pub mod e2m1;
pub mod e8m0;
pub mod mxfp8;
pub mod nvfp4;
pub mod rht;

/// Blocks of `tr × tc` over a `rows × cols` row-major matrix: their count along the columns and in all.
pub fn block_grid(rows: usize, cols: usize, tr: usize, tc: usize) -> (usize, usize) {
    let per_row = cols.div_ceil(tc);
    (per_row, rows.div_ceil(tr) * per_row)
}

/// The block of element (r, c).
#[inline]
pub fn block_of(r: usize, c: usize, tr: usize, tc: usize, per_row: usize) -> usize {
    (r / tr) * per_row + c / tc
}

/// max |x| of every block, NaN ignored and ±Inf kept (as `fmaxf` over |x| does in the kernels).
pub fn block_amax(x: &[f32], rows: usize, cols: usize, tr: usize, tc: usize) -> Vec<f32> {
    let (per_row, n) = block_grid(rows, cols, tr, tc);
    let mut amax = vec![0f32; n];
    for r in 0..rows {
        for c in 0..cols {
            let a = x[r * cols + c].abs();
            let b = &mut amax[block_of(r, c, tr, tc, per_row)];
            if a > *b {
                *b = a;
            }
        }
    }
    amax
}

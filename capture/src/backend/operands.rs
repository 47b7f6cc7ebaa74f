//! What both backends must agree on about a GEMM's operands, whatever the device: their row-major
//! shapes (which also fix what a *channel* is — a column of that layout) and the elements a planted
//! outlier fault multiplies. Neither backend owns these; both import them from here.

use super::LinearDims;
use fp8scope_schemas::names::Gemm;

/// Shapes (rows, cols) of operand A and B of a GEMM, row-major, as the model stores them:
/// fprop X (n×k), W (m×k); dgrad dY (n×m), W (m×k); wgrad dY (n×m), X (n×k). A column is a
/// channel: an input feature of X and W, an output feature of dY.
pub fn operand_shapes(gemm: Gemm, d: LinearDims) -> [(usize, usize); 2] {
    match gemm {
        Gemm::Fprop => [(d.n, d.k), (d.m, d.k)],
        Gemm::Dgrad => [(d.n, d.m), (d.m, d.k)],
        Gemm::Wgrad => [(d.n, d.m), (d.n, d.k)],
    }
}

/// Indices of the elements a planted outlier fault multiplies: four, spread over the tensor.
pub fn outlier_indices(numel: usize) -> impl Iterator<Item = usize> {
    (0..4).map(move |j| (j * numel / 4 + numel / 8).min(numel.saturating_sub(1))).filter(move |_| numel > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_role_has_one_shape_in_both_gemms_that_use_it() {
        let d = LinearDims { n: 6, k: 4, m: 10 };
        let [fx, fw] = operand_shapes(Gemm::Fprop, d);
        let [dg, dw] = operand_shapes(Gemm::Dgrad, d);
        let [wg, wx] = operand_shapes(Gemm::Wgrad, d);
        assert_eq!((fx, fw, dg), ((6, 4), (10, 4), (6, 10)));
        assert_eq!((wx, dw, wg), (fx, fw, dg), "the same tensor, the same layout, the same channels");
    }

    #[test]
    fn outliers_are_four_distinct_elements_when_there_is_room() {
        let v: Vec<usize> = outlier_indices(64).collect();
        assert_eq!(v, vec![8, 24, 40, 56]);
        assert_eq!(outlier_indices(0).count(), 0);
        assert!(outlier_indices(3).all(|i| i < 3));
    }
}

//! How close each GEMM's casts came to overflowing before a run went non-finite: the ground on
//! which `predict` shares a non-finite run's unbounded mass among GEMMs.
//!
//! Under delayed scaling a cast overflows when its operand's amax passes the amax its scale was
//! computed from: scale = (fp8_max / amax_used) / 2^margin, so a value past amax_used · 2^margin
//! overflows. With saturating casts that value is clamped; with non-saturating ones (`--overflow
//! nan`, PyTorch's plain `.to(float8)`) it becomes NaN and the run diverges. Routing the GEMM that
//! went non-finite first back to BF16 removes its overflow, but not that of every other GEMM whose
//! operands ran as close to their limit: one of them overflows in its turn (the `nan` scenario:
//! each kind routed alone still diverges). The **headroom ratio** of a GEMM is the largest
//! amax / (amax_used · 2^margin) of its operands over the steps up to the first non-finite one,
//! after warm-up (amax_used > 0), leaving out amaxes the NaN had already reached; a ratio at or
//! above [`AT_RISK_RATIO`] marks it at risk. The non-finite step itself counts: a run whose scales
//! leave warm-up at step 2 can diverge at step 2, and the ratios there (above 1 for every operand
//! that overflowed beside the first) are the only evidence it leaves.

use crate::analysis::locate::GemmId;
use crate::error::AnalyzeError;
use crate::load::{Run, f64s, i64s, strs};
use fp8scope_schemas::config::{Overflow, RecipeKind};
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::tables::col;
use polars::prelude::*;
use std::collections::BTreeMap;

/// The headroom ratio at or above which a GEMM of a non-saturating run is at risk of overflowing.
/// Delayed scaling predicts this step's amax from earlier ones; an operand whose amax came within
/// 5% of the limit in the steps recorded is one whose growth (a weight under Adam, an activation
/// whose tail widens) would carry it past the limit soon after, as the routed runs of the `nan`
/// scenario show.
pub const AT_RISK_RATIO: f64 = 0.95;

/// Whether the run's casts turn an overflow into NaN under a scale predicted from earlier steps
/// (delayed scaling with `--overflow nan`): the only runs where closeness to the limit predicts
/// divergence.
pub fn overflow_diverges(run: &Run) -> bool {
    let r = &run.manifest.config.recipe;
    r.kind == RecipeKind::Delayed && r.overflow == Overflow::Nan
}

/// Each GEMM's headroom ratio (see the module) over the steps up to `last`.
pub fn headroom_ratios(run: &Run, last: i64) -> Result<BTreeMap<GemmId, f64>, AnalyzeError> {
    if !run.has(Table::Stats)? {
        return Ok(BTreeMap::new());
    }
    let limit = 2f64.powi(run.manifest.config.recipe.margin);
    let lf = run
        .scan(Table::Stats, &[col::STEP, col::LAYER, col::MODULE, col::GEMM, col::AMAX, col::AMAX_USED])?
        .filter(col(col::STEP).lt_eq(lit(last)).and(col(col::AMAX_USED).gt(lit(0.0))))
        .group_by([col(col::LAYER), col(col::MODULE), col(col::GEMM)])
        .agg([(col(col::AMAX) / col(col::AMAX_USED)).max().alias("ratio")]);
    let df = run.collect(Table::Stats, lf)?;
    let e = |e: PolarsError| AnalyzeError::scan(&run.name, "stats", e);
    let (la, mo, ge, ra) =
        (i64s(&df, col::LAYER).map_err(e)?, strs(&df, col::MODULE).map_err(e)?, strs(&df, col::GEMM).map_err(e)?, f64s(&df, "ratio").map_err(e)?);
    let mut out = BTreeMap::new();
    for i in 0..df.height() {
        if let (Some(l), Some(m), Some(g), Some(r)) = (la[i], mo[i].clone(), ge[i].clone(), ra[i])
            && r.is_finite()
        {
            out.insert((l, m, g), r / limit);
        }
    }
    Ok(out)
}

//! The what-if chart ("which tensors would NVFP4 break?"): the run's last dumps cast as each
//! other format would cast them ([`crate::analysis::whatif`], fp8-capture's exact emulation), one
//! heatmap panel per format, each cell the worst cosine among a site's operands at a dump step.

use crate::analysis::whatif::{FORMATS, WhatIfRow, whatif};
use crate::error::AnalyzeError;
use crate::load::{Run, distinct_i64};
use crate::report::build::{grid, site_order};
use crate::report::heatmap;
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::tables::col;
use std::collections::BTreeMap;

/// The most recent dump steps the chart casts (each cast five ways on the CPU).
pub const MAX_STEPS: usize = 8;

/// A cosine below this is called out in the findings.
const BREAKS_BELOW: f64 = 0.99;

/// What the chart needs, and what it says in words.
pub struct WhatIfChart {
    pub panels: Vec<heatmap::Grid>,
    pub caption: String,
    /// A sentence for the findings when some format would cast an operand below [`BREAKS_BELOW`].
    pub finding: Option<String>,
}

/// How each format casts, for the panels' titles.
fn describe(format: &str) -> &'static str {
    match format {
        "e4m3" => "E4M3, per tensor",
        "e5m2" => "E5M2, per tensor",
        "mxfp8" => "MXFP8: E4M3, 1×32 E8M0 blocks",
        "nvfp4" => "NVFP4: E2M1, 1×16 E4M3 blocks (16×16 weights)",
        "block" => "block: E4M3, 1×128 / 128×128 tiles",
        _ => "",
    }
}

/// The chart of `run`'s whole 2-D dumps at its last [`MAX_STEPS`] dump steps; None when it has no
/// such dump.
pub fn whatif_chart(run: &Run) -> Result<Option<WhatIfChart>, AnalyzeError> {
    if !run.has(Table::Tensors)? {
        return Ok(None);
    }
    let steps: Vec<i64> = distinct_i64(run, Table::Tensors, col::STEP)?.into_iter().collect();
    let last = &steps[steps.len().saturating_sub(MAX_STEPS)..];
    if last.is_empty() {
        return Ok(None);
    }
    let (rows, _) = whatif(run, &FORMATS, last, None)?;
    if rows.is_empty() {
        return Ok(None);
    }
    let sites = site_order(&run.naming, rows.iter().map(|r| (r.layer, r.module.clone())));
    let mut panels = Vec::new();
    let mut worst: Vec<&WhatIfRow> = Vec::new();
    for format in FORMATS {
        let mine: Vec<&WhatIfRow> = rows.iter().filter(|r| r.format == format).collect();
        let mut v: BTreeMap<(i64, String, i64), f64> = BTreeMap::new();
        for r in &mine {
            let e = v.entry((r.layer, r.module.clone(), r.step)).or_insert(r.cosine);
            *e = if r.cosine.is_nan() || e.is_nan() { f64::NAN } else { e.min(r.cosine) };
        }
        if let Some(w) = mine.iter().min_by(|a, b| a.cosine.total_cmp(&b.cosine)) {
            worst.push(w);
        }
        panels.push(grid(&run.naming, format!("{format} ({})", describe(format)), &sites, last, &v));
    }
    let name = |r: &WhatIfRow| format!("{} at step {}", run.naming.tensor(r.layer, &r.module, &r.role), r.step);
    let worst_text: Vec<String> =
        worst.iter().map(|r| format!("{} {} (cosine {:.4}, underflow {:.2}%)", r.format, name(r), r.cosine, 100.0 * r.underflow_frac)).collect();
    let partial = rows.iter().any(|r| !r.whole);
    let caption = format!(
        "Each dumped operand of the last {} dump step(s) cast as each format would cast it (fp8-capture's exact CPU emulation; the per-tensor formats with current scaling): the cosine against the recorded values, the worst of a site's operands per step (rows: sites; columns: dump steps). Worst per format: {}.{}",
        last.len(),
        worst_text.join("; "),
        if partial { " Some dumps hold leading rows only: the per-tensor scales then come from those rows." } else { "" }
    );
    let broken: Vec<String> =
        worst.iter().filter(|r| r.cosine < BREAKS_BELOW).map(|r| format!("{} would cast {} with cosine {:.4}", r.format, name(r), r.cosine)).collect();
    let finding = (!broken.is_empty()).then(|| format!("What-if on the dumps: {} (below {BREAKS_BELOW}).", broken.join("; ")));
    Ok(Some(WhatIfChart { panels, caption, finding }))
}

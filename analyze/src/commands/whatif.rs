//! `whatif RUN [--formats e4m3,e5m2,mxfp8,nvfp4,block] [--step N] [--module M]`: what each format's
//! cast would do to the run's dumped tensors ([`crate::analysis::whatif`]), from any run with
//! whole dumps, on any machine.

use crate::analysis::whatif::{FORMATS, WhatIfRow, parse_formats, whatif};
use crate::commands::Outcome;
use crate::error::AnalyzeError;
use crate::load::{LoadOptions, Run};
use crate::output::{self, num, pct};
use clap::Args;
use fp8scope_schemas::layout::Table;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct WhatIfArgs {
    /// The run, recorded with dumps (`fp8-capture --dump-every N`; `--dump-max-elems` at least the
    /// largest tensor's size for whole ones).
    pub run: PathBuf,
    /// Formats to try, comma-separated: e4m3, e5m2 (per-tensor, current scaling), mxfp8, nvfp4,
    /// block.
    #[arg(long, default_value = "e4m3,e5m2,mxfp8,nvfp4,block")]
    pub formats: String,
    /// Only these dump steps (repeatable) [default: every dump step].
    #[arg(long = "step")]
    pub steps: Vec<i64>,
    /// Only this module (`fc2`, `qkv`, …).
    #[arg(long)]
    pub module: Option<String>,
    /// How many tensors to list per format, worst cosine first (the JSON holds every one).
    #[arg(long, default_value_t = 3)]
    pub top: usize,
}

/// The JSON of the command.
#[derive(Serialize)]
struct Report<'a> {
    run: &'a str,
    formats: &'a [&'static str],
    /// Dumps left out: strided samples, chunks past the first rows, or not 2-D.
    partial_dumps: usize,
    rows: &'a [WhatIfRow],
}

/// The command.
pub fn run(args: &WhatIfArgs, opts: LoadOptions, json: bool) -> Result<Outcome, AnalyzeError> {
    let formats = parse_formats(&args.formats).map_err(AnalyzeError::Usage)?;
    let run = Run::open(&args.run, opts)?;
    if !run.has(Table::Tensors)? {
        return Err(AnalyzeError::Missing { run: run.name.clone(), message: "has no dumped tensors; record it with --dump-every N".into() });
    }
    let (rows, partial) = whatif(&run, &formats, &args.steps, args.module.as_deref())?;
    if rows.is_empty() {
        return Err(AnalyzeError::Missing {
            run: run.name.clone(),
            message: format!(
                "has no dump of leading rows of a 2-D operand at the steps and module asked for ({partial} left out: strided samples, later chunks or not 2-D)"
            ),
        });
    }
    let stdout = if json {
        output::json_text(&Report { run: &run.name, formats: &formats, partial_dumps: partial, rows: &rows })
    } else {
        render(&run.name, &formats, &rows, partial, args.top)
    };
    Ok(Outcome::clean(stdout))
}

fn tensor_name(r: &WhatIfRow) -> String {
    format!("step {} layers.{}.{}.{}", r.step, r.layer, r.module, r.role)
}

fn render(run: &str, formats: &[&'static str], rows: &[WhatIfRow], partial: usize, top: usize) -> String {
    let tensors = rows.iter().filter(|r| r.format == formats[0]).count();
    let whole = rows.iter().filter(|r| r.format == formats[0] && r.whole).count();
    let mut s = format!("whatif: run '{run}', {tensors} dumped operand(s) cast as each format would cast them");
    if partial > 0 {
        s += &format!(" ({partial} dump(s) left out: strided samples, later chunks or not 2-D)");
    }
    s += "\n";
    if whole < tensors {
        s += &format!(
            "{} of them are leading rows, not the whole tensor: mxfp8 and block's 1×128 tiles are exact there; the per-tensor scales (e4m3, e5m2, nvfp4's FP32 tensor scale) and block's 128×128 weight tiles come from the rows dumped (record with --dump-max-elems at least the tensor's size for whole dumps)\n",
            tensors - whole
        );
    }
    s += "\n";
    let mut table = Vec::new();
    for &f in formats {
        let of: Vec<&WhatIfRow> = rows.iter().filter(|r| r.format == f).collect();
        let n = of.len().max(1) as f64;
        let mean_cos = of.iter().map(|r| r.cosine).sum::<f64>() / n;
        let worst = of.iter().min_by(|a, b| a.cosine.total_cmp(&b.cosine));
        let sqnrs: Vec<f64> = of.iter().filter_map(|r| r.sqnr_db).collect();
        let mean_sqnr = if sqnrs.is_empty() { "exact".to_string() } else { format!("{:.1}", sqnrs.iter().sum::<f64>() / sqnrs.len() as f64) };
        table.push(vec![
            f.to_string(),
            num(mean_cos),
            worst.map(|r| format!("{} ({})", num(r.cosine), tensor_name(r))).unwrap_or("-".into()),
            mean_sqnr,
            pct(of.iter().map(|r| r.underflow_frac).fold(0.0, f64::max)),
            pct(of.iter().map(|r| r.saturated_frac).fold(0.0, f64::max)),
        ]);
    }
    s += &output::table(&["format", "mean cosine", "worst cosine (tensor)", "mean SQNR dB", "max underflow", "max saturated"], &table);
    s += "\n";
    for &f in formats {
        let mut of: Vec<&WhatIfRow> = rows.iter().filter(|r| r.format == f).collect();
        of.sort_by(|a, b| a.cosine.total_cmp(&b.cosine));
        s += &format!("\n{f}: the {} worst tensor(s) by cosine\n", top.min(of.len()));
        for r in of.iter().take(top) {
            s += &format!(
                "  {} ({} of {} rows × {}): cosine {}, SQNR {}, underflow {}, saturated {}\n",
                tensor_name(r),
                r.rows,
                r.tensor_rows,
                r.cols,
                num(r.cosine),
                r.sqnr_db.map(|d| format!("{d:.1} dB")).unwrap_or("exact".into()),
                pct(r.underflow_frac),
                pct(r.saturated_frac)
            );
        }
    }
    s += &format!("\nformats known: {} (see `fp8-analyze whatif --help`)\n", FORMATS.join(", "));
    s
}

//! `predict RUN [--set NAME=GEMM,…]`: what each BF16 routing would recover, from the FP8 run's own
//! shadow GEMMs ([`crate::analysis::predict`]), before any routed run is recorded.

use crate::analysis::locate::locate;
use crate::analysis::overflow_risk::AT_RISK_RATIO;
use crate::analysis::params::DEFAULT_COSINE_THRESHOLD;
use crate::analysis::predict::{Prediction, RECIPE_WIDE_SHARE, SetPrediction, predict};
use crate::commands::Outcome;
use crate::error::AnalyzeError;
use crate::load::{LoadOptions, Run};
use crate::output::{self, num, pct};
use clap::Args;
use fp8scope_schemas::layout::Table;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct PredictArgs {
    /// The FP8 run, recorded with `--shadow` (and `--dump-every N`: shadow GEMMs run at dump steps).
    pub run: PathBuf,
    /// A set to predict, as NAME=GEMM,GEMM,… with GEMMs named as `locate` names them
    /// (`layers.1.fc2.dgrad`). Repeatable.
    #[arg(long = "set", value_name = "NAME=GEMMS")]
    pub sets: Vec<String>,
    /// How many GEMMs of the mass table to print (the JSON always holds every one).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
}

fn parse_set(s: &str) -> Result<(String, Vec<String>), AnalyzeError> {
    let (name, gemms) = s.split_once('=').ok_or_else(|| AnalyzeError::Usage(format!("--set {s}: expected NAME=GEMM,GEMM,… (e.g. mlp=layers.1.fc2.dgrad)")))?;
    let gemms: Vec<String> = gemms.split(',').map(str::trim).filter(|g| !g.is_empty()).map(str::to_string).collect();
    if name.is_empty() || gemms.is_empty() {
        return Err(AnalyzeError::Usage(format!("--set {s}: expected NAME=GEMM,GEMM,… (e.g. mlp=layers.1.fc2.dgrad)")));
    }
    Ok((name.to_string(), gemms))
}

/// The command.
pub fn run(args: &PredictArgs, opts: LoadOptions, json: bool) -> Result<Outcome, AnalyzeError> {
    let sets = args.sets.iter().map(|s| parse_set(s)).collect::<Result<Vec<_>, _>>()?;
    let run = Run::open(&args.run, opts)?;
    if !run.has(Table::Shadow)? {
        return Err(AnalyzeError::Missing {
            run: run.name.clone(),
            message: "has no shadow records to predict from; record it with --shadow --dump-every N".into(),
        });
    }
    let loc = locate(&run, None, DEFAULT_COSINE_THRESHOLD)?;
    for (name, gemms) in &sets {
        if let Some(g) = gemms.iter().find(|g| loc.rank_of(g).is_none()) {
            return Err(AnalyzeError::Usage(format!("--set {name}: {g} is not a GEMM of run '{}' with shadow records (e.g. layers.0.fc1.fprop)", run.name)));
        }
    }
    let p = predict(&loc, &run.manifest.config.model, &sets);
    let stdout = if json { output::json_text(&p) } else { render(&p, args.top) };
    Ok(Outcome::clean(stdout))
}

fn set_row(s: &SetPrediction) -> Vec<String> {
    let gemms = if s.gemms.len() <= 3 { s.gemms.join(",") } else { format!("{} GEMMs", s.gemms.len()) };
    vec![
        s.name.clone(),
        gemms,
        pct(s.recovery),
        pct(s.bound_recovery),
        pct(s.excess_recovery),
        s.signed_recovery.map(pct).unwrap_or_else(|| "-".into()),
        pct(s.bf16_flops_share),
    ]
}

fn render(p: &Prediction, top: usize) -> String {
    let mut s = format!(
        "predict: run '{}', from its shadow GEMMs: the share of the loss gap each set of GEMMs routed to BF16 would recover, \
         by its share of the first-order mass (bound Σ‖δ‖·‖dual‖; excess: the bound beyond each GEMM's own error floor; signed Σ⟨δ, dual⟩, its harmful part); \
         'recovers' is the {} share, which also ranks the GEMMs\n\n",
        p.run, p.ranked_by
    );
    let mut rows: Vec<Vec<String>> = p.sets.iter().map(set_row).collect();
    rows.push(set_row(&p.recommended));
    s += &output::table(&["set", "gemms", "recovers", "bound share", "excess share", "signed share", "BF16 FLOPs"], &rows);
    s += &format!(
        "\n\nrecommended: {} ({} GEMM(s) holding {} of the mass; {} of the GEMM FLOPs in BF16)\n\n",
        if p.recommended.gemms.is_empty() { "nothing (no mass)".to_string() } else { p.recommended.gemms.join(", ") },
        p.recommended.gemms.len(),
        pct(p.recommended.recovery),
        pct(p.recommended.bf16_flops_share)
    );
    let unbounded = p.masses.iter().filter(|m| m.bound.is_infinite()).count();
    if p.recipe_wide {
        s += &format!(
            "the run went non-finite with more than {:.0}% of its GEMMs within {:.0}% of their scale's limit up to that step: the scales failed, not one GEMM \
             (closeness no longer says which overflows next), so only every GEMM in BF16 recovers it. The cure to try is the recipe: current scaling, \
             or saturating casts (--overflow saturate).\n\n",
            100.0 * RECIPE_WIDE_SHARE,
            100.0 * (1.0 - AT_RISK_RATIO)
        );
    } else if unbounded > 1 {
        s += &format!(
            "the run went non-finite with casts that turn an overflow into NaN, and {unbounded} GEMMs ran within {:.0}% of their scale's limit up to that step \
             (amax / amax_used): routed alone, the others overflow in their turn, so a set recovers the run only with all of them. \
             Saturating casts (--overflow saturate, Transformer Engine's) or current scaling keep each overflow finite instead.\n\n",
            100.0 * (1.0 - AT_RISK_RATIO)
        );
    }
    let rows: Vec<Vec<String>> = p
        .masses
        .iter()
        .take(top)
        .enumerate()
        .map(|(i, m)| vec![(i + 1).to_string(), m.gemm_name.clone(), num(m.excess), num(m.bound), m.signed.map(num).unwrap_or_else(|| "-".into())])
        .collect();
    s += &output::table(&["#", "gemm", "excess mass", "bound mass", "harmful signed mass"], &rows);
    s.push('\n');
    s
}

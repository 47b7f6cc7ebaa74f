//! The verdict in words (`verdict.txt`, and triage's output without `--json`): the noise band,
//! the FP8 run's gap beside it, each batch of runs as a table, the culprits with their evidence,
//! the confirmation on the second seed, and how many runs the verdict rests on.

use super::method::{Found, SHORT_HISTORY, Triage, locate_rank};
use super::{Culprit, RunEntry, Verdict};
use crate::analysis::anomalies::AnomalyReport;
use crate::analysis::locate::{LocateReport, OperandEvidence};
use crate::analysis::noise::NoiseBand;
use crate::analysis::overflow_risk::AT_RISK_RATIO;
use crate::output::{self, band_ratio, num, pct};
use std::collections::BTreeSet;

fn describe_anomaly(r: &AnomalyReport) -> String {
    let mut parts = Vec::new();
    if let Some(s) = r.nonfinite.first_loss_step {
        parts.push(format!("the loss is non-finite from step {s}"));
    }
    if let Some(x) = &r.nonfinite.first_tensor {
        parts.push(format!("first non-finite tensor {} at step {}", x.tensor, x.step));
    }
    for s in r.counted_gap_spikes() {
        parts.push(format!(
            "a spike against the baseline from step {} peaking at {} (loss {} vs {}, gap {:+.1}%, z = {}{}), {}",
            s.start,
            s.peak,
            num(s.peak_loss),
            num(s.peak_base_loss),
            100.0 * s.peak_gap,
            num(s.peak_z),
            s.noise_band.map(|b| format!(", {}", band_ratio(Some(NoiseBand::ratio(s.peak_gap, b))))).unwrap_or_default(),
            output::back_in_band(s.recovery)
        ));
    }
    if let Some(d) = &r.drift {
        parts.push(format!("drift from step {} (confirmed at {}), final smoothed gap {:+.2}%", d.first_step, d.confirmed_step, 100.0 * d.final_gap));
    }
    if parts.is_empty() {
        if r.within_noise.is_empty() { "no anomaly".into() } else { format!("nothing beyond the noise band: {}", r.within_noise.join("; ")) }
    } else {
        parts.join("; ")
    }
}

fn gap_text(e: &RunEntry) -> String {
    match (e.outcome.status.as_str(), e.outcome.gap) {
        ("diverged", _) => format!("diverged at step {}", e.outcome.steps_completed),
        (_, Some(g)) => format!("{:+.2}%", 100.0 * g),
        (s, None) => s.to_string(),
    }
}

fn operands(ev: &[OperandEvidence]) -> String {
    ev.iter()
        .map(|e| {
            format!(
                "{}{} underflow {} saturated {} (amax {}, amax used {})",
                e.role,
                e.rank.map(|r| format!(" (rank {r})")).unwrap_or_default(),
                e.underflow_frac.map(pct).unwrap_or("-".into()),
                e.saturated_frac.map(pct).unwrap_or("-".into()),
                e.amax.map(num).unwrap_or("-".into()),
                e.amax_used.map(num).unwrap_or("-".into())
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The verdict's text. `found` and `pool` are None when the triage stopped before the bisection.
pub(super) fn render(v: &Verdict, t: &Triage, fp8: &AnomalyReport, loc: Option<&LocateReport>, found: Option<&Found>, pool: Option<&[Culprit]>) -> String {
    let mut s = format!("triage: runs under {}\n\n", t.out.display());
    let base = t.runs.iter().find(|e| e.outcome.purpose == "baseline");
    match &v.noise {
        Some(n) => {
            let reps: Vec<String> = t.runs.iter().filter(|e| e.outcome.purpose == "replica").map(|e| format!("{} {}", e.name, gap_text(e))).collect();
            s += &format!(
                "0. noise band: {} BF16 replica(s) of the baseline (initial weights jittered by half a BF16 ulp): {}; band {} in final loss{}; a gap counts past {} × the band\n",
                n.replicas.len(),
                reps.join(", "),
                pct(n.final_gap),
                n.horizontal_steps.map(|h| format!(", {h:.1} steps horizontally")).unwrap_or_default(),
                n.margin
            );
        }
        None => s += "0. noise band: not measured (--noise-runs 0): gaps are judged against the drift threshold alone\n",
    }
    s += &format!(
        "1. baseline (bf16) final loss {}; FP8 run final loss {} ({}): {}\n",
        base.and_then(|b| b.outcome.final_loss).map(num).unwrap_or("-".into()),
        t.entry("fp8").and_then(|e| e.outcome.final_loss).map(num).unwrap_or("-".into()),
        t.entry("fp8").map(gap_text).unwrap_or_default(),
        describe_anomaly(fp8)
    );
    if let Some(e) = &fp8.end_gap {
        s += &format!("   {}\n", output::end_gap_text(e));
    }
    let table_of = |purposes: &[&str], col: &str, what: &dyn Fn(&RunEntry) -> String| -> String {
        let rows: Vec<Vec<String>> = t
            .runs
            .iter()
            .filter(|e| purposes.contains(&e.outcome.purpose.as_str()))
            .map(|e| {
                vec![
                    e.name.clone(),
                    what(e),
                    e.outcome.status.clone(),
                    e.outcome.final_loss.map(num).unwrap_or("-".into()),
                    gap_text(e),
                    band_ratio(e.outcome.gap_band_ratio),
                    e.outcome.horizontal_steps.map(|h| format!("{h:+.1}")).unwrap_or("-".into()),
                    e.outcome.anomaly.clone().unwrap_or("none".into()),
                    match e.outcome.cured {
                        Some(true) => "yes".into(),
                        Some(false) => "no".into(),
                        None => "-".into(),
                    },
                ]
            })
            .collect();
        output::table(&["run", col, "status", "final loss", "gap", "gap / band", "steps behind", "anomaly", "cures"], &rows)
    };
    let flag_after = |e: &RunEntry, flag: &str| e.flags.iter().rposition(|f| f == flag).and_then(|i| e.flags.get(i + 1)).cloned().unwrap_or("-".into());

    if v.anomaly.is_none() {
        s += &format!("\n{}", table_of(&["baseline", "replica", "fp8"], "recipe", &|e| flag_after(e, "--recipe")));
        s += "\n\nverdict: ";
        if !v.mechanisms.is_empty() {
            s += &format!(
                "mechanism present, no loss anomaly yet — the statistics show an FP8 failure mechanism, but the loss has not moved beyond the threshold and the noise band{}:\n",
                if v.inconclusive { format!(" ({})", fp8.within_noise.join("; ")) } else { String::new() }
            );
            for m in v.mechanisms.iter().take(6) {
                s += &format!("  {m}\n");
            }
            if v.mechanisms.len() > 6 {
                s += &format!("  … and {} more (verdict.json lists them all)\n", v.mechanisms.len() - 6);
            }
            s += "A longer run, another seed or a larger model may turn it into a loss anomaly; `fp8-analyze anomalies` and the report show where.\n";
        } else if v.inconclusive {
            s += &format!(
                "inconclusive — the FP8 gap is within the run-to-run spread: {}. No culprit can be named from these runs; a longer run, a larger margin of FP8 error, or more replicas would tell.\n",
                fp8.within_noise.join("; ")
            );
        } else {
            s += "healthy — the FP8 run shows no spike, drift or non-finite value beyond the threshold and the noise band.\n";
        }
        s += &format!("the verdict rests on {} runs.\n", t.runs.len());
        return s;
    }
    if let Some((p, r)) = v.predicted.as_ref().and_then(|p| Some((p, p.recipe.as_ref()?))) {
        s += &format!(
            "\n2. predicted from the FP8 run's shadow GEMMs: the scales, not a GEMM: {} of its {} GEMMs ran within {:.0}% of their scale's limit (or went non-finite first) up to the non-finite step, \
             so no short list of GEMMs in BF16 keeps it finite; tested by one run with {} scaling:\n",
            r.at_risk,
            r.gemms,
            100.0 * (1.0 - AT_RISK_RATIO),
            r.tried
        );
        s += &table_of(&["predicted"], "recipe", &|e| flag_after(e, "--recipe"));
        if p.held {
            s += &format!(
                "\n\nverdict: {} caused by the recipe: delayed scaling's scales failed at once, and {} scaling cures the run. No GEMM alone is the cause; \
                 saturating casts (--overflow saturate) would keep each overflow finite instead.\n\
                 the verdict rests on {} runs (predicted, then tested by one).\n",
                v.anomaly.clone().unwrap_or_default(),
                r.tried,
                t.runs.len()
            );
            return s;
        }
        s += &format!("\n\n   not held: {} scaling does not cure the run either; the full method follows\n", r.tried);
    } else if let Some(p) = &v.predicted {
        s += &predicted_section(
            p,
            &table_of(&["predicted"], "routing", &|e| {
                let bf16 = flag_after(e, "--bf16-sites");
                if bf16 != "-" { format!("bf16 {bf16}") } else { format!("only fp8 {}", flag_after(e, "--fp8-sites")) }
            }),
        );
        if p.held && p.named.len() < p.suspects.len() {
            let names: Vec<String> = v.culprits.iter().map(Culprit::name).collect();
            let others: Vec<String> = p.suspects.iter().filter(|c| !p.named.contains(c)).map(Culprit::name).collect();
            s += &format!(
                "\nverdict: {} caused by {}: returning it alone to BF16 cures the run{}, with {} left in FP8; the suspects alone in FP8 bring the {} back.\n",
                v.anomaly.clone().unwrap_or_default(),
                names.join(", "),
                p.each_alone
                    .iter()
                    .find(|a| a.cures)
                    .and_then(|a| a.recovered)
                    .map(|r| format!(" (it recovers {:.1}% of the gap)", 100.0 * r))
                    .unwrap_or_default(),
                others.join(", "),
                p.reproduced.clone().unwrap_or_default()
            );
        } else if p.held {
            let names: Vec<String> = v.culprits.iter().map(Culprit::name).collect();
            s += &format!(
                "\nverdict: {} caused by {}: returning {} to BF16 cures the run{}, and {} alone in FP8 bring{} the {} back.\n",
                v.anomaly.clone().unwrap_or_default(),
                names.join(", "),
                if names.len() == 1 { "it" } else { "them" },
                p.recovered.map(|r| format!(" (it recovers {:.1}% of the gap)", 100.0 * r)).unwrap_or_default(),
                if names.len() == 1 { "it" } else { "they" },
                if names.len() == 1 { "s" } else { "" },
                p.reproduced.clone().unwrap_or_default()
            );
        }
        if p.held {
            for c in &v.culprits {
                if let Some((step, ev)) = t.spike_evidence.get(&c.name()) {
                    s += &format!("  {}: at the spike's first step, {step}: {}\n", c.name(), operands(ev));
                }
                if let Some((rank, of)) = locate_rank(loc, c) {
                    s += &format!("  {}: locate ranks it #{rank} of {of}\n", c.name());
                }
            }
            let tested = if p.each_alone.is_empty() { "two".to_string() } else { format!("two, then each suspect alone in BF16 by {}", p.each_alone.len()) };
            s += &format!(
                "current scaling and block scaling were not tried.\nthe verdict rests on {} runs (predicted, then tested by {tested}).\n",
                t.runs.len()
            );
            return s;
        }
    }
    let Some(f) = found else { return s };
    s += "\n2. each GEMM kind back to BF16:\n";
    s += &table_of(&["kind", "all-gemms"], "bf16 gemms", &|e| flag_after(e, "--bf16-gemms"));
    s.push('\n');
    if let (Some(tc), Some(e)) = (&f.top, t.entry("top-ranked")) {
        s += &format!(
            "   the top-ranked GEMM alone back to BF16 ({}): {} ({})\n",
            tc.name(),
            if f.top_cures { "cures the run, so no bisection is needed" } else { "does not cure the run" },
            gap_text(e)
        );
    }
    s += &format!(
        "\n   curing kinds: {}\n",
        if f.curing.is_empty() {
            "none alone; bisecting over every kind".to_string()
        } else {
            f.curing.iter().map(|g| g.as_str()).collect::<Vec<_>>().join(", ")
        }
    );
    let n_pool = pool.map_or(0, |p| p.len());
    s += &format!(
        "\n3. bisection over the sites of {} ({n_pool} candidates, ordered by {}, then {}; the top first):\n",
        f.kinds.iter().map(|g| g.as_str()).collect::<Vec<_>>().join(", "),
        if fp8.spiked() { "the saturation of each GEMM's casts at the spike's first step" } else { "the first non-finite GEMM" },
        if let Some(l) = loc { format!("locate's ranking by {}", l.ranked_by) } else { "execution order".into() }
    );
    if f.top_cures {
        s += "   not needed: the top-ranked GEMM cured alone\n";
    } else {
        s += &table_of(&["bisect"], "bf16 sites", &|e| flag_after(e, "--bf16-sites"));
        if let Some(b) = &f.bisect {
            s += &format!("\n   {} bisection run(s)\n", b.runs);
        }
    }
    s += "\n4. current scaling: ";
    match t.entry("current") {
        Some(e) => {
            s += &format!(
                "{} ({}, {})\n",
                if v.current_scaling_cures { "cures the run" } else { "does not cure the run" },
                gap_text(e),
                e.outcome.anomaly.clone().map(|a| format!("anomaly: {a}")).unwrap_or("no anomaly".into())
            )
        }
        None => {
            let fp8_flags = t.entry("fp8").map(|e| e.flags.clone()).unwrap_or_default();
            let uses_current = fp8_flags.windows(2).any(|w| w[0] == "--recipe" && w[1] == "current");
            s += if uses_current {
                "not tried (the FP8 run already uses it)\n"
            } else {
                "not tried (fp8-capture runs of several ranks, --dp or --tp, support delayed and bf16 only)\n"
            }
        }
    }
    // The block formats tried as cures.
    for (name, label) in [("block", "block scaling (1×128 / 128×128 tiles)"), ("mxfp8", "MXFP8 (E4M3 in 1×32 blocks, E8M0 scales)")] {
        if let Some(e) = t.entry(name) {
            s += &format!(
                "   {label}: {} ({}, {})\n",
                if e.outcome.cured == Some(true) { "cures the run" } else { "does not cure the run" },
                gap_text(e),
                e.outcome.anomaly.clone().map(|a| format!("anomaly: {a}")).unwrap_or("no anomaly".into())
            );
        }
    }
    if let Some(e) = t.entry("short-history") {
        let cures = e.outcome.cured == Some(true);
        s += &format!(
            "   delayed scaling with the max of a {SHORT_HISTORY}-step amax history: {} ({}, {}){}\n",
            if cures { "cures the run" } else { "does not cure the run" },
            gap_text(e),
            e.outcome.anomaly.clone().map(|a| format!("anomaly: {a}")).unwrap_or("no anomaly".into()),
            match (cures, t.fp8_most_recent) {
                (false, _) => "",
                (true, false) => " — the scale lags: the history remembers an amax the tensors no longer have",
                (true, true) => " — the scale lags: the previous step's amax alone did not foresee this step's values",
            }
        );
    }
    if let Some(cf) = &v.confirmation {
        s += &format!("\n5. confirmation on seed {}:\n", cf.seed);
        s += &table_of(&["confirm-baseline", "confirm-fp8", "confirm-culprits"], "bf16 sites", &|e| flag_after(e, "--bf16-sites"));
        s += &format!(
            "\n   {}\n",
            match (cf.held, &cf.anomaly, cf.cured) {
                (true, Some(a), _) =>
                    format!("held: the {a} reproduces on seed {} and returning the culprits to BF16 cures it there{}", cf.seed, recovered_text(cf.recovered)),
                (false, None, _) => format!("not held: the FP8 run of seed {} shows nothing beyond the noise band, so the anomaly does not reproduce", cf.seed),
                (false, Some(a), false) => format!(
                    "not held: the {a} reproduces on seed {} but returning the culprits to BF16 does not cure it there{} (the rule: ≥ 90% of the seed's own gap recovered, or no anomaly left and ≥ 50%)",
                    cf.seed,
                    recovered_text(cf.recovered)
                ),
                _ => "not held".into(),
            }
        );
    }
    for n in &f.notes {
        s += &format!("\nnote: {n}\n");
    }
    if let Some(cf) = v.confirmation.as_ref().filter(|c| v.inconclusive && c.anomaly.is_none()) {
        s += &format!(
            "\nverdict: inconclusive — the {} of seed {} does not reproduce on seed {} (its FP8 run ends within the noise band there), so it is one seed's excursion rather than a fault of the FP8 GEMMs; no culprit can be named. More replicas, another seed or a longer run would tell.\n",
            v.anomaly.clone().unwrap_or_default(),
            cf.seed.saturating_sub(1),
            cf.seed
        );
        s += &format!("the verdict rests on {} runs.\n", t.runs.len());
        return s;
    }
    s += &format!("\nverdict: {} ", v.anomaly.clone().unwrap_or_default());
    let complete = f.complete;
    let tested: Vec<Culprit> = v.confirmation.as_ref().map(|c| c.culprits.clone()).unwrap_or_else(|| v.culprits.clone());
    let names = |cs: &[Culprit]| cs.iter().map(Culprit::name).collect::<Vec<_>>().join(", ");
    if tested.is_empty() {
        s += "with no culprit set found.\n";
    } else if !complete {
        s += &format!(
            "with culprits in several GEMMs: the bisection found {} but these alone do not cure the run (see the notes); the fault is spread over the FP8 GEMMs, as a recipe problem is.\n",
            names(&tested)
        );
    } else if v.culprits.is_empty() {
        s += &format!(
            "with no confirmed culprit: returning {} to BF16 cured seed {} but the second seed did not confirm it (above), so the set is not reported as the cause.\n",
            names(&tested),
            v.confirmation.as_ref().map_or(0, |c| c.seed.saturating_sub(1))
        );
    } else {
        s +=
            &format!("caused by {}: returning {} to BF16 cures the run", names(&v.culprits), if v.culprits.len() == 1 { "it alone" } else { "these together" });
        let set = |sites: &str| sites.split(',').map(str::to_string).collect::<BTreeSet<String>>();
        let sites: BTreeSet<String> = v.culprits.iter().map(Culprit::site_flag).collect();
        if let Some(e) = t.runs.iter().rev().find(|e| {
            matches!(e.outcome.purpose.as_str(), "bisect" | "top-ranked") && e.outcome.cured == Some(true) && set(&flag_after(e, "--bf16-sites")) == sites
        }) {
            s += &format!(" ({}: gap {}, {})", e.name, gap_text(e), band_ratio(e.outcome.gap_band_ratio));
        }
        if let Some(cf) = &v.confirmation {
            s += &format!(", confirmed on seed {}{}", cf.seed, recovered_text(cf.recovered));
        }
        s += ".\n";
        for c in &v.culprits {
            if let Some((step, ev)) = t.spike_evidence.get(&c.name()) {
                s += &format!("  {}: at the spike's first step, {step}: {}\n", c.name(), operands(ev));
            }
            let Some((rank, of)) = locate_rank(loc, c) else { continue };
            let Some(g) = loc.and_then(|l| l.ranked.iter().find(|g| g.gemm_name == c.name())) else { continue };
            s += &format!(
                "  {}: locate ranks it #{rank} of {of} by {} ({} at step {}; 1 − cosine {} at step {}, first crossed {}{}); operands at step {}: {}",
                c.name(),
                loc.map_or("harm", |l| l.ranked_by),
                num(g.score),
                g.peak_step,
                num(g.peak_error),
                g.peak_error_step,
                output::opt(g.first_crossed),
                g.warmup_until.map(|w| format!(", after the warm-up to step {w}")).unwrap_or_default(),
                g.evidence.first().map(|e| e.step).unwrap_or(g.peak_step),
                operands(&g.evidence)
            );
            if !g.evidence_at_peak.is_empty() {
                s += &format!("; at the peak, step {}: {}", g.peak_step, operands(&g.evidence_at_peak));
            }
            s.push('\n');
        }
    }
    let current_tried = t.entry("current").is_some();
    s += &format!(
        "current scaling {}",
        match (current_tried, v.current_scaling_cures) {
            (_, true) => "cures it",
            (true, false) => "does not cure it",
            (false, false) => "was not tried",
        }
    );
    s += match v.block_scaling_cures {
        Some(true) => "; block scaling cures it",
        Some(false) => "; block scaling does not",
        None => "",
    };
    s += match v.mxfp8_cures {
        Some(true) => "; MXFP8 cures it",
        Some(false) => "; MXFP8 does not",
        None => "",
    };
    s += ".\n";
    let confirm = match &v.confirmation {
        Some(c) => format!("; the confirmation on seed {} {}", c.seed, if c.held { "held" } else { "did not hold" }),
        None if !v.culprits.is_empty() => "; not confirmed on a second seed (--no-confirm)".into(),
        None => String::new(),
    };
    s += &format!("the verdict rests on {} runs{confirm}.\n", t.runs.len());
    s
}

/// The section of the two-run test of the predicted culprits.
fn predicted_section(p: &super::PredictedTest, table: &str) -> String {
    let names: Vec<String> = p.suspects.iter().map(Culprit::name).collect();
    let mut s = format!(
        "\n2. predicted from the FP8 run's shadow GEMMs: {} (predicted to recover {} of the gap; {} of the GEMM FLOPs in BF16), tested by two runs:\n",
        names.join(", "),
        pct(p.predicted_recovery),
        pct(p.bf16_flops_share)
    );
    s += table;
    s += &format!(
        "\n   {}\n",
        match (p.cures, &p.reproduced) {
            (true, Some(a)) => format!("held: in BF16 they cure the run, alone in FP8 they bring the {a} back"),
            (false, Some(_)) => "not held: in BF16 they do not cure the run; the full method follows".to_string(),
            (true, None) => "not held: alone in FP8 they do not bring the anomaly back (they are not the whole cause); the full method follows".to_string(),
            (false, None) => "not held: they neither cure the run nor bring the anomaly back alone; the full method follows".to_string(),
        }
    );
    for a in &p.each_alone {
        s += &format!(
            "   {} alone in BF16: {}{}\n",
            a.culprit.name(),
            if a.cures { "cures the run" } else { "does not cure the run" },
            a.recovered.map(|r| format!(" (recovers {:.1}% of the gap)", 100.0 * r)).unwrap_or_default()
        );
    }
    s
}

/// ": they recover 97.6% of that seed's gap", or nothing when unknown.
fn recovered_text(r: Option<f64>) -> String {
    r.map(|r| format!(" (they recover {:.1}% of that seed's gap)", 100.0 * r)).unwrap_or_default()
}

//! `summary RUN`: its arguments and its rendering; the summary is [`crate::analysis::summary`].

use crate::analysis::summary::{Summary, TensorHealth, summarize};
use crate::commands::Outcome;
use crate::error::AnalyzeError;
use crate::load::{LoadOptions, Run};
use crate::output::{self, num, pct};
use clap::Args;
use fp8scope_schemas::config::RecipeKind;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct SummaryArgs {
    /// The run directory (holds run.json).
    pub run: PathBuf,
    /// How many tensors to list by underflow and by saturation.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
}

/// The command.
pub fn run(args: &SummaryArgs, opts: LoadOptions, json: bool) -> Result<Outcome, AnalyzeError> {
    let run = Run::open(&args.run, opts)?;
    let s = summarize(&run, args.top)?;
    let stdout = if json { output::json_text(&s) } else { render(&run, &s) };
    Ok(Outcome::clean(stdout))
}

/// `loss curve, dumps, shadow records`: what a run lacks, in words.
fn lacks_text(lacks: &[String]) -> String {
    lacks
        .iter()
        .map(|l| match l.as_str() {
            "loss" => "a loss curve",
            "dumps" => "dumped tensors",
            "shadow" => "shadow GEMM records",
            "events" => "events",
            other => other,
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn render(run: &Run, s: &Summary) -> String {
    let m = &run.manifest;
    let c = &m.config;
    let d = &c.model;
    let r = &c.recipe;
    let p = &s.provenance;
    let external = m.source.is_external();
    let mut o = format!("run '{}' ({})\n", s.run, s.dir);
    if external {
        o += &format!("  source     {} ({}); sites named by module path\n", p.source, p.framework.as_deref().unwrap_or("framework unknown"));
    }
    let lv = &s.liveness;
    o += &format!("  status     {}{}\n", lv.status, s.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default());
    if lv.world_size > 1 {
        let hosts: std::collections::BTreeSet<&str> = m.ranks.iter().map(|r| r.host.as_str()).chain(m.host.as_deref()).collect();
        o += &format!(
            "  ranks      {} on {} host(s){}; the loss below is rank {}'s, the tensors' health every rank's (--rank N reads another; `fp8-analyze ranks` compares them)\n",
            lv.world_size,
            hosts.len(),
            m.parallel
                .as_ref()
                .map(|p| format!(", {}", p.groups.iter().map(|g| format!("{} {}×{}", g.name, g.members.len(), g.size())).collect::<Vec<_>>().join(", ")))
                .unwrap_or_default(),
            output::opt(s.rank_view.map(|r| r.to_string()))
        );
        for r in lv.ranks.iter().filter(|r| lv.per_rank && r.status != "missing") {
            let steps = r.steps_completed.unwrap_or(0);
            let reason = r.reason.as_deref().unwrap_or("");
            if r.stopped {
                o += &format!("  rank {:<5} stopped without closing ({reason}) after step {steps}\n", r.rank);
            } else if r.status != "completed" {
                let why = if reason.is_empty() { String::new() } else { format!(": {reason}") };
                o += &format!("  rank {:<5} {} after step {steps}{why}\n", r.rank, r.status);
            }
        }
        if !lv.missing.is_empty() {
            o += &format!("  missing    ranks {} left nothing\n", crate::load::compact_ranks(&lv.missing));
        }
    }
    o += &format!("  steps      {} completed of {}, {} recorded\n", s.steps_completed, c.train.steps, s.steps_recorded);
    if external {
        let modules = m.origin.as_ref().map(|o| o.modules.clone()).unwrap_or_default();
        let shown: Vec<&str> = modules.iter().take(4).map(String::as_str).collect();
        o += &format!("  modules    {} ({}{})\n", modules.len(), shown.join(", "), if modules.len() > shown.len() { ", …" } else { "" });
    } else {
        let llama = match d.arch {
            fp8scope_schemas::config::Arch::Llama => format!(
                ", llama: KVH={} rope θ={} eps={}{}",
                d.kv_heads(),
                d.rope_theta.unwrap_or(0.0),
                d.norm_eps.unwrap_or(0.0),
                if d.tie_embeddings { ", tied embeddings" } else { "" }
            ),
            fp8scope_schemas::config::Arch::Gpt => String::new(),
        };
        o +=
            &format!("  model      {} (V={} C={} F={} NH={} L={} B={} T={}{llama})\n", c.preset, d.vocab, d.channels, d.ffn, d.heads, d.layers, d.batch, d.seq);
        if let Some(mc) = &c.model_config {
            o += &format!("  shape of   {mc}\n");
        }
    }
    o += &format!(
        "  recipe     {} format={:?} amax_history={} amax_algo={:?} margin={} accumulation={}\n",
        r.label(),
        r.format,
        r.amax_history,
        r.amax_algo,
        r.margin,
        r.accumulation.as_str()
    )
    .to_lowercase();
    if !r.cpu_accumulator.is_exact() {
        o += &format!("  accumulator {} (the CPU emulates Hopper's FP8 tensor cores in that accumulation)\n", r.cpu_accumulator.as_str());
    }
    // The switches of the micro-scaled recipes (fp8scope_schemas::quant), where they apply.
    for kind in r.kinds() {
        match kind {
            RecipeKind::Mxfp8 => o += &format!("  mxfp8      e8m0 scale rounding={}\n", r.mx_rounding.as_str()),
            RecipeKind::Nvfp4 => {
                let on = |off: bool| if off { "off" } else { "on" };
                o += &format!(
                    "  nvfp4      rht={} stochastic_rounding={} 2d_quantization={}\n",
                    on(r.nvfp4.disable_rht),
                    on(r.nvfp4.disable_stochastic_rounding),
                    on(r.nvfp4.disable_2d_quantization)
                );
            }
            _ => {}
        }
    }
    let rt = &c.routing;
    if !rt.fp8_sites.is_empty() {
        o += &format!("  fp8 only   sites=[{}] (every other GEMM in BF16)\n", rt.fp8_sites.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", "));
    }
    if !(rt.bf16_gemms.is_empty() && rt.bf16_layers.is_empty() && rt.bf16_sites.is_empty()) {
        let list = |v: Vec<String>| format!("[{}]", v.join(", "));
        o += &format!(
            "  bf16       gemms={} layers={:?} sites={}\n",
            list(rt.bf16_gemms.iter().map(|g| g.to_string()).collect()),
            rt.bf16_layers,
            list(rt.bf16_sites.iter().map(|s| s.to_string()).collect())
        );
        if rt.from_step.is_some() || rt.until_step.is_some() {
            o += &format!(
                "  schedule   bf16 routing from step {} until {}\n",
                rt.from_step.unwrap_or(0),
                rt.until_step.map(|u| format!("step {u}")).unwrap_or_else(|| "the end".into())
            );
        }
    }
    if external {
        o += "  data       external (not known to fp8scope)\n";
    } else {
        o += &format!(
            "  data       {}, seed {}, lr {}, entropy floor {}, ln V {}\n",
            format!("{:?}", c.data.kind).to_lowercase(),
            c.train.seed,
            c.train.lr,
            output::opt(m.data.entropy_floor.map(num)),
            num(m.data.ln_vocab)
        );
        if c.data.kind == fp8scope_schemas::config::DataKind::Text {
            let files = if c.data.paths.is_empty() { c.data.path.iter().cloned().collect() } else { c.data.paths.clone() };
            o += &format!(
                "  text       {} ({})\n",
                files.join(", "),
                c.data.tokenizer.as_deref().map_or("bytes as tokens".to_string(), |t| format!("tokenizer {t}"))
            );
        }
    }
    o += &format!("  device     {} ({}), started {}, ended {}\n", m.device.kind, m.device.name, m.started_at, output::opt(m.ended_at.as_deref()));
    for inj in &c.injections {
        o += &format!("  injection  {} {}:{} from step {} (magnitude {})\n", inj.kind, inj.site, inj.gemm, inj.step, inj.magnitude);
    }
    if let Some(sc) = &c.scenario {
        o += &format!("  scenario   {sc}\n");
    }
    if !p.lacks.is_empty() {
        o += &format!("  lacks      {}\n", lacks_text(&p.lacks));
    }
    if let Some(c) = &p.stats_caveat {
        o += &format!("  caveat     {c}\n");
    }
    for n in m.origin.iter().flat_map(|o| o.notes.iter()) {
        o += &format!("  note       {n}\n");
    }
    o += &format!("  final loss {}\n", output::opt(s.final_loss.map(num)));
    if s.checkpoints.is_empty() {
        o += "\nloss at checkpoints: none (the run lacks a loss curve)\n";
    } else {
        o += "\nloss at checkpoints\n";
        let rows: Vec<Vec<String>> = s.checkpoints.iter().map(|c| vec![c.at.to_string(), c.step.to_string(), num(c.loss)]).collect();
        o += &output::table(&["at", "step", "loss"], &rows);
        o.push('\n');
    }
    let health_rows = |v: &[TensorHealth]| -> Vec<Vec<String>> {
        v.iter()
            .map(|t| {
                vec![
                    t.tensor.clone(),
                    t.gemm.clone(),
                    pct(t.mean_underflow_frac),
                    pct(t.max_underflow_frac),
                    pct(t.mean_saturated_frac),
                    pct(t.max_saturated_frac),
                ]
            })
            .collect()
    };
    let headers = ["tensor", "gemm", "underflow mean", "underflow max", "saturated mean", "saturated max"];
    let rounded = if p.stats_decimals.is_some() { " (from statistics rounded by the run's logs: see caveat)" } else { "" };
    for (title, v) in [("worst by underflow", &s.worst_underflow), ("worst by saturation", &s.worst_saturation)] {
        o += &format!("\n{title}{rounded}:");
        if v.is_empty() {
            o += " none\n";
        } else {
            o.push('\n');
            o += &output::table(&headers, &health_rows(v));
            o.push('\n');
        }
    }
    if !s.events.is_empty() {
        o += "\nevents: ";
        o += &s.events.iter().map(|e| format!("{} {}", e.kind, e.count)).collect::<Vec<_>>().join(", ");
        o.push('\n');
    }
    if !s.skipped_parts.is_empty() {
        o += &format!("\nskipped {} bad part(s) (--lenient)\n", s.skipped_parts.len());
    }
    o
}

//! The training loop: data → forward/backward → global-norm clip → AdamW, with the recipe's scaling
//! updated after every step and every measurement handed to the writer thread. A non-finite loss
//! stops the run after that step is recorded in full (status `diverged`); an error of the device
//! backend stops it before that step records anything (status `crashed`, the error returned), the
//! steps before it closed into their tables first, so that nothing recorded is lost.
//!
//! The host works while the device runs: once a step's forward and backward are queued, the last
//! step's rows go to the writer and the next step's batch is made and uploaded, so that between
//! two steps the device waits only for the reports and the scales the next step needs.
//!
//! The step's phases (forward, backward, gradient reduction, amax reduction, optimizer) are in
//! [`crate::step`]; one loop serves a run of one rank ([`train`]) and each rank of a data-parallel
//! job ([`train_rank`], driven by [`crate::dist::driver`]), which trains on its shard of every
//! global batch and writes its own partition of every table.

use crate::backend::{Backend, GemmId, OperandCast, OperandFault, ScaleSource, StatsLevel};
use crate::collective::RankGroups;
use crate::config::is_fp8;
use crate::data::Data;
use crate::dist::weights::{WeightCast, WeightWatch};
use crate::dist::{DistFault, DistPlan};
use crate::flight::FlightRecorder;
use crate::model::{Dims, Model, StepPlan, TpLink};
use crate::recipe::Scaling;
use crate::record::rows;
use crate::record::writer::{RankWriting, StepRows, Writer};
use crate::replay::ReplayWatch;
use fp8scope_schemas::config::{DumpSample, InjectionKind, Overflow, RecipeKind, RunConfig};
use fp8scope_schemas::layout::RunDir;
use fp8scope_schemas::manifest::{DataInfo, Manifest, RunStatus};
use fp8scope_schemas::names::{Gemm, Module, Role, Site};
use fp8scope_schemas::ranks::{Parallel, RankInfo};
use fp8scope_schemas::tables::{EventRow, StepRow};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::{HashMap, HashSet};
use std::time::Instant;

/// How a training run ended, for the caller to print.
pub struct Outcome {
    pub manifest: Manifest,
    /// A rank planted to die: the step before which it stopped, writing nothing more.
    pub died_before: Option<u32>,
}

/// Learning rate at `step` (1-based): linear warm-up, then cosine decay to 10% of the peak.
pub fn lr_at(cfg: &RunConfig, step: u32) -> f64 {
    let t = &cfg.train;
    if step <= t.warmup_steps {
        return t.lr * step as f64 / t.warmup_steps.max(1) as f64;
    }
    let span = (t.steps.saturating_sub(t.warmup_steps)).max(1) as f64;
    let progress = ((step - t.warmup_steps) as f64 / span).min(1.0);
    t.lr * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()))
}

/// The faults of `cfg.injections` active at `step` on `id` (FP8 GEMMs only).
fn faults_at(cfg: &RunConfig, id: GemmId, step: u32) -> Option<(OperandFault, OperandFault, bool)> {
    let site = Site::new(id.layer, id.module);
    let mut fa = OperandFault::NONE;
    let mut fb = OperandFault::NONE;
    let mut nan = false;
    for inj in &cfg.injections {
        if inj.site != site || inj.gemm != id.gemm || step < inj.step {
            continue;
        }
        match inj.kind {
            InjectionKind::Overflow => {
                let m = 2f32.powf(inj.magnitude as f32);
                fa.scale_mult *= m;
                fb.scale_mult *= m;
            }
            InjectionKind::Underflow => {
                let m = 2f32.powf(-inj.magnitude as f32);
                fa.scale_mult *= m;
                fb.scale_mult *= m;
            }
            InjectionKind::Outlier => fa.outlier_factor *= inj.magnitude as f32,
            InjectionKind::Nan => nan |= step == inj.step,
            // Not a fault of the cast: the weight itself is moved before the step (`park_weights`).
            InjectionKind::Oscillation => {}
        }
    }
    (!fa.is_none() || !fb.is_none() || nan).then_some((fa, fb, nan))
}

struct Recording {
    dump_sites: HashSet<Site>,
    dump_roles: Vec<Role>,
}

fn recording(cfg: &RunConfig, n_layers: u32) -> anyhow::Result<Recording> {
    let dump_sites = if cfg.record.dump_every > 0 || cfg.record.flight_recorder > 0 {
        crate::selection::dumped_sites(&cfg.record.dump_layers, n_layers).map_err(|e| anyhow::anyhow!("--dump-layers: {e}"))?.into_iter().collect()
    } else {
        HashSet::new()
    };
    Ok(Recording { dump_sites, dump_roles: cfg.record.dump_roles.clone() })
}

/// Whether an expensive statistic taken every `every` statistics steps (0: never on its own) falls
/// on `step`: step 1, and every multiple of `stats_every · every` steps.
fn on_cadence(step: u32, stats_every: u32, every: u32) -> bool {
    every > 0 && (step == 1 || u64::from(step).is_multiple_of(u64::from(stats_every) * u64::from(every)))
}

/// `cast` with its given scale × `factor` (a planted corrupt scale; the amax it came from kept).
fn corrupted(cast: OperandCast, factor: f32) -> OperandCast {
    match cast {
        OperandCast::Fp8Tensor { format, scale: ScaleSource::Given { scale, amax_used } } => {
            OperandCast::Fp8Tensor { format, scale: ScaleSource::Given { scale: scale * factor, amax_used } }
        }
        other => other,
    }
}

/// Whether `step` is a dump step of `--dump-every` (step 1 and its multiples).
fn is_dump_step(r: &fp8scope_schemas::config::RecordConfig, step: u32) -> bool {
    r.dump_every > 0 && (step.is_multiple_of(r.dump_every) || step == 1)
}

/// The plan of `step`: its casts, planted faults, statistics level and dumps (a dump step, or one
/// of the steps after the flight recorder fired: `flight_writing`).
fn plan_step(cfg: &RunConfig, scaling: &Scaling, rec: &Recording, step: u32, n_layers: u32, rank: &RankFaults, flight_writing: bool) -> StepPlan {
    let r = &cfg.record;
    let stats_step = r.stats_every > 0 && (step.is_multiple_of(r.stats_every) || step == 1);
    let dump_step = is_dump_step(r, step);
    let full = dump_step || (stats_step && on_cadence(step, r.stats_every, r.quant_error_every));
    let channels = stats_step && on_cadence(step, r.stats_every, r.channel_stats_every);
    let stats = if full && stats_step {
        StatsLevel::Full
    } else if channels {
        StatsLevel::Channels
    } else if stats_step {
        StatsLevel::Cheap
    } else {
        StatsLevel::Amax
    };
    let mut casts = HashMap::new();
    let mut faults = HashMap::new();
    for layer in 0..n_layers {
        for module in Module::ALL {
            let site = Site::new(layer, module);
            for gemm in Gemm::ALL {
                let id = GemmId { layer, module, gemm };
                let [ra, rb] = gemm.operands();
                let mut ca = scaling.operand_cast(cfg, site, gemm, ra, step);
                let mut cb = scaling.operand_cast(cfg, site, gemm, rb, step);
                for &(s, role, from, factor) in &rank.scale_corrupt {
                    if s == site && step >= from {
                        if ra == role {
                            ca = corrupted(ca, factor);
                        }
                        if rb == role {
                            cb = corrupted(cb, factor);
                        }
                    }
                }
                casts.insert(id, (ca, cb));
                if is_fp8(cfg, site, gemm, step) {
                    let nonsat = cfg.recipe.overflow == Overflow::Nan;
                    let f = faults_at(cfg, id, step);
                    if f.is_some() || nonsat {
                        let (mut fa, mut fb, nan) = f.unwrap_or((OperandFault::NONE, OperandFault::NONE, false));
                        fa.overflow_nan = nonsat;
                        fb.overflow_nan = nonsat;
                        faults.insert(id, (fa, fb, nan));
                    }
                }
            }
        }
    }
    StepPlan {
        casts,
        faults,
        stats,
        dump_sites: if dump_step || flight_writing { rec.dump_sites.clone() } else { HashSet::new() },
        dump_roles: rec.dump_roles.clone(),
        dump_max_elems: r.dump_max_elems as usize,
        dump_strided: r.dump_sample == DumpSample::Strided,
        shadow: r.shadow,
        accumulation: cfg.recipe.accumulation,
    }
}

/// The backend's kept error, if any, as the run's error: one line, "CUDA backend: what failed".
fn check_backend<B: Backend>(be: &mut B) -> anyhow::Result<()> {
    match be.take_error() {
        Some(e) => anyhow::bail!("{} backend: {e}", be.kind().to_uppercase()),
        None => Ok(()),
    }
}

/// The batches of a run, made on the host and uploaded to the backend.
struct Batches<'a> {
    data: &'a Data,
    scenario: Option<&'a crate::scenario::Scenario>,
    seq: usize,
    vocab: u32,
    /// This rank's rows of the global batch: [first, first + rows).
    first_row: usize,
    rows: usize,
}

/// A step's batch on the backend: its inputs and targets, and how many targets count.
struct Staged<T> {
    inputs: T,
    targets: T,
    supervised: usize,
}

impl Batches<'_> {
    /// Step `step`'s batch (the scenario's tokens planted), this rank's rows of it uploaded; the
    /// count of supervised targets is the global batch's. A batch depends on the seed and the step
    /// alone, so it may be made ahead of its step.
    fn stage<B: Backend>(&self, be: &mut B, step: u32) -> Staged<B::Tokens> {
        let mut batch = self.data.batch(step);
        if let Some(s) = self.scenario {
            s.apply(step, self.seq, self.vocab, &mut batch);
        }
        let supervised = batch.targets.iter().filter(|&&t| t != crate::layers::IGNORE_TARGET).count();
        let (a, b) = (self.first_row * self.seq, (self.first_row + self.rows) * self.seq);
        Staged { inputs: be.upload_tokens(&batch.inputs[a..b]), targets: be.upload_tokens(&batch.targets[a..b]), supervised }
    }
}

/// What a finished step measured, before it becomes rows.
struct Finished {
    step: u32,
    loss: f64,
    grad_norm: f64,
    lr: f64,
    tokens: u64,
    step_ms: f64,
    stats: StatsLevel,
    reports: Vec<crate::backend::GemmReport>,
    dumps: Vec<crate::model::DumpCapture>,
    /// Faults of the ranks planted on this rank at this step, described (`injection` events).
    planted: Vec<String>,
    /// Why the flight recorder fired at this step, and the steps it writes (this one, launched
    /// again with the dumps, and the K after it).
    flight: Option<(String, (u32, u32))>,
    /// Each weight's forward cast (digest, what changed), for the casts table of several ranks.
    weights: HashMap<Site, WeightCast>,
    /// Why the step was launched again with every statistic (the anomaly replay), if it was.
    replayed: Option<String>,
}

/// Hands a finished step's rows to the writer (with an event when its loss is not finite), and
/// closes the tables' parts when `flush_every` says so.
fn record(writer: &mut Writer, f: Finished, flush_every: u32, casts: bool) -> anyhow::Result<()> {
    let Finished { step, loss, grad_norm, lr, tokens, step_ms, stats, reports, dumps, planted, flight, weights, replayed } = f;
    let mut rows_out = StepRows {
        step: Some(StepRow { step, loss, grad_norm, lr, tokens, step_ms, nonfinite_tensors: rows::count_nonfinite_tensors(&reports), rank: None }),
        ..Default::default()
    };
    if stats >= StatsLevel::Cheap {
        for r in &reports {
            rows_out.stats.extend(rows::stat_row(step, r, &r.a));
            rows_out.stats.extend(rows::stat_row(step, r, &r.b));
            if casts {
                rows_out.casts.extend(rows::cast_row(step, r, &r.a));
                if let Some(mut row) = rows::cast_row(step, r, &r.b) {
                    // Operand b of the fprop and the dgrad is the weight.
                    if let Some(w) = weights.get(&Site::new(r.id.layer, r.id.module)).filter(|_| row.role == Role::Weight) {
                        row.digest = Some(w.digest);
                        row.master_changed = w.master_changed;
                        row.forward_changed = w.forward_changed;
                    }
                    rows_out.casts.push(row);
                }
            }
        }
    }
    rows_out.events = rows::nonfinite_events(step, &reports);
    rows_out.shadow = rows::shadow_rows(step, &reports);
    rows_out.tensors = rows::tensor_rows(step, dumps, &reports);
    if let Some((why, (first, last))) = flight {
        rows_out.events.push(EventRow {
            step,
            kind: "flight_recorder".into(),
            layer: None,
            module: None,
            gemm: None,
            role: None,
            value: None,
            message: format!(
                "{why}: the step was launched again with the dumps and shadow GEMMs, which are written for steps {first}-{last} (as far as the run goes)"
            ),
            rank: None,
        });
    }
    if let Some(why) = replayed {
        let message = format!("{why}: the step was launched again with every statistic (per-channel statistics and quantization error)");
        rows_out.events.push(EventRow {
            step,
            kind: "full_statistics".into(),
            layer: None,
            module: None,
            gemm: None,
            role: None,
            value: None,
            message,
            rank: None,
        });
    }
    for message in planted {
        rows_out.events.push(EventRow { step, kind: "injection".into(), layer: None, module: None, gemm: None, role: None, value: None, message, rank: None });
    }
    if !loss.is_finite() {
        rows_out.events.push(EventRow {
            step,
            kind: "nonfinite_loss".into(),
            layer: None,
            module: None,
            gemm: None,
            role: None,
            value: Some(loss),
            message: format!("loss is {loss} at step {step}; training stopped"),
            rank: None,
        });
    }
    writer.rows(rows_out)?;
    if flush_every > 0 && step % flush_every == 0 {
        writer.flush(step)?;
    }
    Ok(())
}

/// The faults planted on one rank (none on a run of one rank).
#[derive(Default)]
struct RankFaults {
    /// (site, role, from step, factor): this rank's scale of that tensor × factor.
    scale_corrupt: Vec<(Site, Role, u32, f32)>,
    /// (site, from step): this rank's weight not refreshed after the optimizer step.
    stale_weight: Vec<(Site, u32)>,
    /// The step this rank stops before.
    dies_at: Option<u32>,
}

impl RankFaults {
    fn of(dist: &DistPlan, rank: u32) -> RankFaults {
        let mut f = RankFaults::default();
        for d in &dist.faults {
            match *d {
                DistFault::StaleWeight { rank: r, site, step } if r == rank => f.stale_weight.push((site, step)),
                DistFault::ScaleCorrupt { rank: r, site, role, step, factor } if r == rank => f.scale_corrupt.push((site, role, step, factor)),
                DistFault::RankDies { rank: r, step } if r == rank => f.dies_at = Some(f.dies_at.map_or(step, |s| s.min(step))),
                _ => {}
            }
        }
        f
    }
}

/// One rank of a job of several: who it is, how the job is split, and what goes in the manifest.
pub struct RankRole {
    pub writing: RankWriting,
    pub parallel: Parallel,
    pub ranks: Vec<RankInfo>,
}

/// Phases 1 and 2 of a step: its forward and backward queued together (under tensor parallelism
/// with the group's all-reduces inside), as one unit of step work; the dumps, and whether the
/// group's collectives held.
fn launch_step_work<B: Backend>(
    be: &mut B,
    model: &mut Model<B>,
    batch: &Staged<B::Tokens>,
    plan: &StepPlan,
    tp_group: &mut dyn crate::collective::Collective,
) -> (Vec<crate::model::DumpCapture>, Result<(), crate::collective::CollectiveError>) {
    be.begin_step_work(plan.graph_signature());
    let mut tp = TpLink::new(tp_group);
    let dumps = model.launch_step(be, &batch.inputs, &batch.targets, batch.supervised, plan, &mut tp);
    let done = tp.finish();
    be.end_step_work();
    be.gemms_done();
    (dumps, done)
}

/// The planted oscillations of `cfg` active at `step`: each site's weight parked at the rounding
/// boundaries of the grid its forward cast uses this step (`plan`), on the side of the step's
/// parity ([`crate::oscillation::park`]). Before the step's casts.
fn park_weights<B: Backend>(be: &mut B, model: &mut Model<B>, cfg: &RunConfig, plan: &StepPlan, step: u32) {
    let lay = crate::model::Layout::of(&model.dims);
    for inj in cfg.injections.iter().filter(|i| i.kind == InjectionKind::Oscillation && step >= i.step) {
        let id = GemmId { layer: inj.site.layer, module: inj.site.module, gemm: Gemm::Fprop };
        let Some(&(_, crate::backend::OperandCast::Fp8Tensor { format, scale: crate::backend::ScaleSource::Given { scale, .. } })) = plan.casts.get(&id) else {
            continue;
        };
        let w = &mut model.state.params[lay.linear(inj.site.layer as usize, inj.site.module).0];
        let n = be.len(w);
        let mut values = be.download(w, 0, n, 1);
        crate::oscillation::park(&mut values, format, scale, step.is_multiple_of(2), inj.magnitude);
        be.overwrite(w, &values);
    }
}

/// Trains as `cfg` says and records into `run` (which must be a fresh, empty directory).
pub fn train<B: Backend>(be: &mut B, cfg: &RunConfig, run: RunDir, name: String, quiet: bool) -> anyhow::Result<Outcome> {
    train_rank(be, cfg, run, name, quiet, &mut RankGroups::one(), &DistPlan::default(), None)
}

/// Trains one rank: alone (`role` None, [`RankGroups::one`]), or as rank `groups.rank` of a job of
/// `dist.dp` × `dist.tp` ranks: on its dp group's shard of every global batch of
/// `cfg.model.batch` rows, with its tp group's shard of every layer.
#[allow(clippy::too_many_arguments)]
pub fn train_rank<B: Backend>(
    be: &mut B,
    cfg: &RunConfig,
    run: RunDir,
    name: String,
    quiet: bool,
    groups: &mut RankGroups,
    dist: &DistPlan,
    role: Option<RankRole>,
) -> anyhow::Result<Outcome> {
    let m = &cfg.model;
    let (rank, world) = (groups.rank, groups.world);
    let (dp, dp_index) = (groups.dp.world_size(), groups.dp_index());
    // This rank's replica sees B/dp rows of each global batch of B, and its tp group's share of
    // every layer.
    let local_b = m.batch as usize / dp as usize;
    let dims = Dims::from_model(&fp8scope_schemas::config::ModelDims { batch: local_b as u32, ..m.clone() })
        .shard(groups.tp.world_size() as usize, groups.tp.rank() as usize)
        .map_err(|e| anyhow::anyhow!(e))?;
    let scenario = crate::scenario::of(cfg);
    let reserved = scenario.as_ref().map_or(0, |s| s.reserved_tokens());
    let data = Data::reserving(&cfg.data, m.vocab, reserved, m.batch, m.seq, cfg.train.seed)?;
    let rec = recording(cfg, m.layers)?;
    if role.is_some() && cfg.record.flight_recorder > 0 {
        // Its replay of a firing step would have to be agreed by every rank (their collectives).
        anyhow::bail!("--flight-recorder records a run of one rank; drop it, or use --dump-every, for a run of several");
    }
    let mut flight = (cfg.record.flight_recorder > 0).then(|| FlightRecorder::new(cfg.record.flight_recorder));
    // The anomaly replay's watch on the loss: where some statistics steps go without the full set
    // (`--channel-stats-every` or `--quant-error-every` above 1), on one rank (a replay on several
    // would have to be agreed by all).
    let mut replay =
        (role.is_none() && cfg.record.stats_every > 0 && (cfg.record.channel_stats_every != 1 || cfg.record.quant_error_every != 1)).then(ReplayWatch::default);
    let faults = RankFaults::of(dist, rank);
    let mut device = be.device_info();
    if cfg.recipe.kinds().iter().any(|k| matches!(k, RecipeKind::Block | RecipeKind::Mxfp8 | RecipeKind::Nvfp4)) {
        device.block_gemm = Some(if be.kind() == "cpu" { "emulated-cpu".into() } else { "cublaslt-block-scaling".into() });
    }
    let info = DataInfo { entropy_floor: data.entropy_floor, ln_vocab: (m.vocab as f64).ln() };
    let mut manifest = Manifest::new_running(name, cfg.clone(), device, info);
    let several = role.is_some();
    let initial = manifest.clone();
    let run_root = run.root().to_path_buf();
    let mut writer = match role {
        None => Writer::start(run, manifest)?,
        Some(r) => {
            manifest.world_size = Some(world);
            manifest.parallel = Some(r.parallel);
            manifest.ranks = r.ranks;
            Writer::start_rank(run, manifest, r.writing)?
        }
    };
    let mut model: Model<B> = Model::new(be, dims, cfg.train.seed, cfg.train.init_jitter);
    check_backend(be)?;
    if let Some(s) = &scenario {
        s.init_model(be, &mut model, &data.delimiters());
        check_backend(be)?;
    }
    let mut scaling = Scaling::new(cfg);
    // A resumed run starts from its checkpoint's weights, moments and histories.
    let first = match &cfg.train.resume_from {
        Some(r) => {
            crate::checkpoint::restore(be, &mut model, &mut scaling, std::path::Path::new(&r.run), r.step)?;
            check_backend(be)?;
            r.step + 1
        }
        None => 1,
    };

    let pb = if quiet { ProgressBar::hidden() } else { ProgressBar::new(cfg.train.steps as u64) };
    pb.set_style(ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}").unwrap_or_else(|_| ProgressStyle::default_bar()));
    pb.set_position(u64::from(first - 1));
    let mut losses: Vec<f64> = Vec::new();
    let mut status = RunStatus::Completed;
    let mut error = None;
    // A backend error in a step: it ends the loop, the tables are closed, then it is returned.
    let mut failure: Option<anyhow::Error> = None;
    let tokens = dims.n as u64;
    let batches = Batches { data: &data, scenario: scenario.as_ref(), seq: dims.t, vocab: m.vocab, first_row: dp_index as usize * local_b, rows: local_b };
    let mut watch: WeightWatch<B::Buf> = WeightWatch::new(faults.stale_weight.clone());
    // The device never waits for the host between steps for what the step does not need: the
    // next step's batch is made and uploaded, and the last step's rows are built and handed to
    // the writer, while the device runs a step (after its forward and backward are queued).
    let mut staged: Option<Staged<B::Tokens>> = None;
    let mut finished: Option<Finished> = None;
    // Host ms of each step's recording, printed with FP8SCOPE_PROFILE (the CUDA backend's profile).
    let mut record_ms: Vec<f64> = Vec::new();
    let started = Instant::now();
    for step in first..=cfg.train.steps {
        if faults.dies_at == Some(step) {
            // Planted: the rank stops here, closing nothing (its writer's buffered rows are lost, its
            // liveness file still says running, its collectives' handle goes without closing).
            pb.finish_and_clear();
            drop(writer);
            return Ok(Outcome { manifest: initial, died_before: Some(step) });
        }
        let t0 = Instant::now();
        let batch = match staged.take() {
            Some(b) => b,
            None => batches.stage(be, step),
        };
        let mut plan = plan_step(cfg, &scaling, &rec, step, m.layers, &faults, flight.as_ref().is_some_and(|f| f.writing(step)));
        park_weights(be, &mut model, cfg, &plan, step);
        // A job of several ranks records each weight's forward cast (and may plant a stale one).
        let weights = if several {
            watch.before_step(be, &mut model, &mut plan, step);
            watch.observe(be, &model, &plan, step)
        } else {
            HashMap::new()
        };
        // Phases 1 and 2: forward and backward, queued together (under tensor parallelism with the
        // group's all-reduces inside).
        let (mut dumps, tp_done) = launch_step_work(be, &mut model, &batch, &plan, &mut *groups.tp);
        if several {
            watch.restore(&mut model, step);
        }
        if let Some(f) = finished.take() {
            let t = Instant::now();
            record(&mut writer, f, cfg.record.flush_every, several)?;
            record_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        if step < cfg.train.steps {
            staged = Some(batches.stage(be, step + 1));
        }
        // The loss, then phases 3 (gradient reduction) and 5 (optimizer); a collective that fails
        // (another rank stopped) ends this rank as a crash.
        let mut loss = tp_done
            .map_err(|source| crate::step::PhaseError { step, phase: crate::step::Phase::Forward, source })
            .and_then(|_| crate::step::step_loss(be, &mut model, &mut *groups.dp, batch.supervised, step));
        // The anomaly replay: a step that fires the flight recorder's triggers (a non-finite value,
        // a saturation burst, a loss spike) is launched again before the optimizer runs (same
        // weights, same batch, same bits), with what it lacks: every statistic, when it was a
        // statistics step planned without the per-channel statistics or the quantization error
        // (`replay.rs`), and the dumps and shadow GEMMs, when the flight recorder is on and the step
        // dumps nothing yet (`flight.rs`).
        let mut replayed = None;
        let mut flight_fired = None;
        let mut early_reports = None;
        if let (Ok(l), true) = (&loss, replay.is_some() || flight.is_some()) {
            let reports = be.take_reports();
            let fired = flight.as_mut().and_then(|f| f.fires(step, *l, &reports).map(|why| (why, f.window(step))));
            let stats_why = replay.as_mut().and_then(|w| w.fires(step, *l, &reports, (StatsLevel::Cheap..StatsLevel::Full).contains(&plan.stats)));
            let dump_again = fired.is_some() && plan.dump_sites.is_empty();
            flight_fired = fired;
            if stats_why.is_some() || dump_again {
                be.repeat_step();
                if stats_why.is_some() {
                    plan.stats = StatsLevel::Full;
                }
                if dump_again {
                    plan.dump_sites = rec.dump_sites.clone();
                }
                let (again, tp_done) = launch_step_work(be, &mut model, &batch, &plan, &mut *groups.tp);
                dumps = again;
                loss = tp_done
                    .map_err(|source| crate::step::PhaseError { step, phase: crate::step::Phase::Forward, source })
                    .and_then(|_| crate::step::step_loss(be, &mut model, &mut *groups.dp, batch.supervised, step));
                replayed = stats_why;
            } else {
                early_reports = Some(reports);
            }
        }
        let reduced = loss
            .and_then(|loss| crate::step::reduce_gradients(be, &mut model.state.grads, &mut *groups.dp, step).map(|_| loss))
            .and_then(|loss| crate::step::optimizer(be, &mut model, cfg, step, loss.is_finite(), &mut *groups.tp).map(|u| (loss, u)));
        let (loss, crate::step::Update { grad_norm, lr }) = match reduced {
            Ok(l) => l,
            Err(e) => {
                groups.abort(&format!("{e:#}"));
                status = RunStatus::Crashed;
                error = Some(format!("{e:#}"));
                break;
            }
        };
        let finite = loss.is_finite();
        let reports = early_reports.unwrap_or_else(|| be.take_reports());
        // A failed primitive leaves the whole step unknown: stop before any of its rows is written.
        if let Err(e) = check_backend(be) {
            groups.abort(&format!("{e:#}"));
            status = RunStatus::Crashed;
            error = Some(format!("{e:#}"));
            failure = Some(e);
            break;
        }
        // Phase 4: the amaxes, reduced over the groups that share each scale, into the histories:
        // over tp, then over dp (a maximum, so the order changes nothing).
        let mut amaxes = scaling.step_amaxes(&reports);
        let (over_tp, over_dp): (Vec<bool>, Vec<bool>) = amaxes.iter().map(|&((site, role), _)| dist.amax_reduction(site, role, step)).unzip();
        let reduced = crate::step::reduce_amaxes(&mut amaxes, &over_tp, &mut *groups.tp, step)
            .and_then(|_| crate::step::reduce_amaxes(&mut amaxes, &over_dp, &mut *groups.dp, step));
        if let Err(e) = reduced {
            groups.abort(&format!("{e:#}"));
            status = RunStatus::Crashed;
            error = Some(format!("{e:#}"));
            break;
        }
        scaling.push_amaxes(&amaxes);
        if cfg.record.checkpoints_at(step) && finite && !several {
            crate::checkpoint::save(be, &model, &scaling, cfg, &run_root, step)?;
        }
        let step_ms = t0.elapsed().as_secs_f64() * 1e3;
        if step == first {
            let seconds = (crate::process_clock::seconds_since_start() * 100.0).round() / 100.0;
            writer.first_step(seconds)?;
            if std::env::var_os("FP8SCOPE_VERBOSE").is_some() {
                pb.suspend(|| eprintln!("fp8scope: the first step ended {seconds:.2} s after the process started"));
            }
        }
        let planted = dist
            .faults
            .iter()
            .filter(|d| {
                d.step() == step
                    && match d {
                        DistFault::AmaxLocal { .. } | DistFault::AmaxDpOnly { .. } => true,
                        DistFault::ScaleCorrupt { rank: r, .. } | DistFault::StaleWeight { rank: r, .. } => *r == rank,
                        DistFault::RankDies { .. } => false,
                    }
            })
            .map(DistFault::describe)
            .collect();
        let f = Finished { step, loss, grad_norm, lr, tokens, step_ms, stats: plan.stats, reports, dumps, planted, flight: flight_fired, weights, replayed };
        losses.push(loss);
        let tok_s = tokens as f64 * dp as f64 * (step - first + 1) as f64 / started.elapsed().as_secs_f64();
        pb.set_message(format!("loss {loss:.4}  {tok_s:.0} tok/s"));
        pb.inc(1);
        if !quiet && (step % 50 == 0 || !finite) {
            pb.suspend(|| println!("step {step:>4}  loss={loss:.4}"));
        }
        if !finite {
            record(&mut writer, f, cfg.record.flush_every, several)?;
            status = RunStatus::Diverged;
            error = Some(format!("non-finite loss at step {step}"));
            writer.flush(step)?;
            break;
        }
        if crate::interrupt::requested() {
            record(&mut writer, f, cfg.record.flush_every, several)?;
            status = RunStatus::Crashed;
            error = Some(format!("interrupted by a signal after step {step}"));
            pb.suspend(|| eprintln!("interrupted: stopping after step {step} (again to quit at once)"));
            break;
        }
        finished = Some(f);
    }
    // The last step's rows (or, after a failure, those of the step before it).
    if let Some(f) = finished.take() {
        record(&mut writer, f, cfg.record.flush_every, several)?;
    }
    pb.finish_and_clear();
    if std::env::var_os("FP8SCOPE_PROFILE").is_some_and(|v| v != "0") && !record_ms.is_empty() {
        record_ms.sort_by(f64::total_cmp);
        eprintln!(
            "== training loop: a step's rows took {:.3} ms to build and hand to the writer (host, median of {} steps; overlapped with the next step)",
            record_ms[record_ms.len() / 2],
            record_ms.len()
        );
    }
    // A resumed run counts the checkpoint's steps as done.
    let done = first - 1 + losses.len() as u32;
    let tail = &losses[losses.len().saturating_sub(20)..];
    let final_loss = (!tail.is_empty() && tail.iter().all(|l| l.is_finite())).then(|| tail.iter().sum::<f64>() / tail.len() as f64);
    let manifest = writer.finish(status, done, final_loss, error)?;
    // Every rank ends a completed or diverged run at the same step; a crashed one leaves without
    // closing, which releases any rank still waiting in a collective.
    if status != RunStatus::Crashed {
        groups.close();
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(Outcome { manifest, died_before: None }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::cli::{Cli, Command};
    use clap::Parser;
    use fp8scope_schemas::layout::Table;

    /// Trains `tiny` with delayed scaling on `be` with `extra` flags into a fresh run directory;
    /// returns the directory (kept alive by the guard), the run's path and the run's result.
    fn run_tiny(be: &mut CpuBackend, extra: &[&str]) -> (tempfile::TempDir, std::path::PathBuf, anyhow::Result<Outcome>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("run");
        let mut argv: Vec<String> = ["fp8-capture", "train", "--preset", "tiny", "--recipe", "delayed"].iter().map(|s| s.to_string()).collect();
        argv.extend(extra.iter().map(|s| s.to_string()));
        argv.extend(["--out".to_string(), out.display().to_string()]);
        let Command::Train(t) = Cli::try_parse_from(argv).expect("flags parse").command else { panic!("not train") };
        let cfg = t.validate("cpu").expect("valid flags").config;
        std::fs::create_dir_all(&out).expect("run dir");
        let r = train(be, &cfg, RunDir::new(&out), "t".into(), true);
        (dir, out, r)
    }

    /// The `step` column of a batch of any table.
    fn step_column(b: &arrow::record_batch::RecordBatch) -> Vec<u32> {
        let c = b.column_by_name("step").expect("step column");
        c.as_any().downcast_ref::<arrow::array::Int64Array>().expect("i64 steps").values().iter().map(|&v| v as u32).collect()
    }

    /// The steps table's step column, part by part in the order the parts were written.
    fn steps_by_part(out: &std::path::Path) -> Vec<Vec<u32>> {
        let mut parts = RunDir::new(out).parts(Table::Steps).expect("steps parts");
        parts.sort();
        parts.iter().map(|p| fp8scope_schemas::parts::read_part(p, Table::Steps).expect("steps part").iter().flat_map(step_column).collect()).collect()
    }

    /// A step's rows reach the writer while the next step runs: every step is still recorded once,
    /// in order, and each flushed part closes at its step (parts of 4, 4 and 1 over 9 steps with
    /// `--flush-every 4`), with every step's statistics.
    #[test]
    fn each_step_is_recorded_once_and_flushed_at_its_step() {
        let (_dir, out, r) = run_tiny(&mut CpuBackend::new(), &["--steps", "9", "--flush-every", "4"]);
        r.expect("run");
        assert_eq!(steps_by_part(&out), vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8], vec![9]]);
        let m = Manifest::read(&out).expect("manifest");
        assert_eq!((m.status, m.steps_completed), (RunStatus::Completed, 9));
        // Every step's statistics rows, as many for each step (the same casts every step).
        let stats = fp8scope_schemas::parts::read_table(&RunDir::new(&out), Table::Stats).expect("stats table");
        let mut per_step = std::collections::BTreeMap::new();
        for st in stats.iter().flat_map(step_column) {
            *per_step.entry(st).or_insert(0usize) += 1;
        }
        assert_eq!(per_step.keys().copied().collect::<Vec<_>>(), (1..=9).collect::<Vec<u32>>());
        let first = per_step[&1];
        assert!(first > 0 && per_step.values().all(|&n| n == first), "statistics rows per step: {per_step:?}");
        assert_eq!(m.rows.stats, 9 * first as u64);
    }

    /// The stats table of a run, concatenated in the order written.
    fn stats_table(out: &std::path::Path) -> arrow::record_batch::RecordBatch {
        let batches = fp8scope_schemas::parts::read_table(&RunDir::new(out), Table::Stats).expect("stats table");
        arrow::compute::concat_batches(&batches[0].schema(), &batches).expect("one batch")
    }

    /// `--channel-stats-every 4` (with `--quant-error-every 0`, so that only the cadence decides):
    /// the channel columns are filled at steps 1, 4, 8 and 12 of 12, null at the others, and equal
    /// to an every-step run's where filled; every other column equals the every-step run's, bit for
    /// bit (the channel statistics change nothing else). `--channel-stats-every 0` leaves them
    /// null but at the dump step.
    #[test]
    fn channel_statistics_follow_their_cadence_and_change_no_other_column() {
        use arrow::array::Array;
        let base = ["--steps", "12", "--quant-error-every", "0"];
        let (_d1, every, r) = run_tiny(&mut CpuBackend::new(), &base);
        r.expect("every-step run");
        let (_d2, sparse, r) = run_tiny(&mut CpuBackend::new(), &[&base[..], &["--channel-stats-every", "4"]].concat());
        r.expect("every-4 run");
        assert_eq!(Manifest::read(&sparse).expect("manifest").config.record.channel_stats_every, 4);
        let (a, b) = (stats_table(&every), stats_table(&sparse));
        assert_eq!(a.schema(), b.schema());
        assert_eq!(a.num_rows(), b.num_rows());
        let steps = step_column(&b);
        for name in [fp8scope_schemas::tables::col::AMAX_CHANNEL, fp8scope_schemas::tables::col::TOP_CHANNEL_SQ_FRAC] {
            let (ca, cb) = (a.column_by_name(name).expect("column"), b.column_by_name(name).expect("column"));
            assert_eq!(ca.null_count(), 0, "{name}: every step of the every-step run");
            for (i, &st) in steps.iter().enumerate() {
                let due = [1, 4, 8, 12].contains(&st);
                assert_eq!(cb.is_valid(i), due, "{name} at step {st}");
                if due {
                    assert!(ca.slice(i, 1).as_ref() == cb.slice(i, 1).as_ref(), "{name} at step {st}: the every-step run's value");
                }
            }
        }
        for (i, field) in a.schema().fields().iter().enumerate() {
            if !field.name().contains("channel") {
                assert!(a.column(i).as_ref() == b.column(i).as_ref(), "{}: the same with and without the channel statistics", field.name());
            }
        }
        // 0: none but at the dump step (step 1 here, and 10).
        let (_d3, dumps, r) = run_tiny(&mut CpuBackend::new(), &[&base[..], &["--channel-stats-every", "0", "--dump-every", "10"]].concat());
        r.expect("every-0 run");
        let c = stats_table(&dumps);
        let ch = c.column_by_name(fp8scope_schemas::tables::col::AMAX_CHANNEL).expect("column");
        let filled: std::collections::BTreeSet<u32> = step_column(&c).into_iter().enumerate().filter(|&(i, _)| ch.is_valid(i)).map(|(_, s)| s).collect();
        assert_eq!(filled.into_iter().collect::<Vec<_>>(), vec![1, 10]);
    }

    /// A NaN that reaches the loss at step 5: the steps before it, recorded while their next step
    /// ran, and step 5 itself are in the table, and nothing after.
    #[test]
    fn a_diverged_step_is_recorded_with_every_step_before_it() {
        let (_dir, out, r) =
            run_tiny(&mut CpuBackend::new(), &["--steps", "9", "--flush-every", "100", "--inject", "site=layers.1.fc1,gemm=fprop,kind=nan,step=5"]);
        r.expect("a diverged run is not an error");
        assert_eq!(steps_by_part(&out).concat(), vec![1, 2, 3, 4, 5]);
        let m = Manifest::read(&out).expect("manifest");
        assert_eq!((m.status, m.steps_completed), (RunStatus::Diverged, 5));
    }

    /// A backend that fails in step 4 of 8: the run ends `crashed` with the backend's error, and
    /// steps 1-3 are in the steps table although no flush was due (the error path closes the
    /// tables instead of dropping the writer's buffered rows).
    #[test]
    fn a_backend_error_keeps_every_step_recorded_before_it() {
        let mut be = CpuBackend::new();
        be.fail_after_steps = Some(4);
        let (_dir, out, r) = run_tiny(&mut be, &["--steps", "8", "--flush-every", "100"]);
        let Err(err) = r else { panic!("the planted failure did not stop the run") };
        assert_eq!(format!("{err:#}"), "CPU backend: planted failure in step 4");
        let m = Manifest::read(&out).expect("manifest");
        assert_eq!((m.status, m.steps_completed), (RunStatus::Crashed, 3));
        assert_eq!(m.error.as_deref(), Some("CPU backend: planted failure in step 4"));
        let steps = fp8scope_schemas::parts::read_table(&RunDir::new(&out), Table::Steps).expect("steps table");
        assert_eq!(steps.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    }
}

//! Drives `fp8-capture` for the commands that record their own runs (`triage`, `regress`).
//!
//! - [`find_capture`] locates the binary: `$FP8SCOPE_CAPTURE` when set, else `fp8-capture` next to
//!   the running `fp8-analyze` executable (where `cargo build --workspace` puts both).
//! - [`Driver::run_all`] runs a batch of captures, `--jobs` at a time, each in its own run
//!   directory under `--out` (`<out>/<name>/`), its stdout and stderr kept in
//!   `<out>/logs/<name>.log`, with a progress bar on a terminal and one line per finished run
//!   otherwise. On the CPU each capture gets `--threads cores/n`, n the runs of the batch that run
//!   at once, so that parallel runs do not oversubscribe the machine and a lone run uses every core
//!   (unless the extra flags set `--threads` themselves).
//!
//! The analyzer never links the capture (the two crates only share `schemas/`): it talks to it
//! through its command line, exit status (0 completed, 3 diverged, 2 bad flags, other: crashed)
//! and the manifest it writes.

use crate::error::AnalyzeError;
use fp8scope_schemas::manifest::Manifest;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Environment variable naming the `fp8-capture` executable to use.
pub const CAPTURE_ENV: &str = "FP8SCOPE_CAPTURE";

/// Finds `fp8-capture`: `$FP8SCOPE_CAPTURE`, else next to this executable.
pub fn find_capture() -> Result<PathBuf, AnalyzeError> {
    if let Some(p) = std::env::var_os(CAPTURE_ENV) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        return Err(AnalyzeError::Usage(format!("${CAPTURE_ENV} is {}, which is not a file", p.display())));
    }
    let exe = std::env::current_exe().map_err(|e| AnalyzeError::Usage(format!("cannot find this executable's directory: {e}")))?;
    let name = format!("fp8-capture{}", std::env::consts::EXE_SUFFIX);
    let candidate = exe.parent().map(|d| d.join(&name));
    match candidate {
        Some(p) if p.is_file() => Ok(p),
        _ => Err(AnalyzeError::Usage(format!(
            "{name} not found next to {} — build the whole workspace (cargo build --release --workspace) or set ${CAPTURE_ENV}",
            exe.display()
        ))),
    }
}

/// One capture to run: its name (also its directory under `--out`) and the flags after `train`
/// (without `--out`, `--quiet` and `--threads`, which the driver adds).
#[derive(Clone, Debug, Serialize)]
pub struct RunSpec {
    pub name: String,
    pub flags: Vec<String>,
}

/// How a capture ended.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    pub name: String,
    pub dir: PathBuf,
    /// The flags given to `fp8-capture train` (as in [`RunSpec`]).
    pub flags: Vec<String>,
    /// The process exit status (None when it was killed by a signal or did not start).
    pub exit_code: Option<i32>,
    /// `completed`, `diverged`, `crashed` (from the manifest), or `failed` (no manifest).
    pub status: String,
    /// The capture's last stderr line when it did not exit 0 or 3.
    pub error: Option<String>,
    /// Mean loss of the last 20 steps, from the manifest (None when not finite).
    pub final_loss: Option<f64>,
    pub steps_completed: u32,
    pub wall_s: f64,
}

impl RunResult {
    /// Whether the run produced data to analyse (completed, or diverged with its steps recorded).
    pub fn usable(&self) -> bool {
        matches!(self.status.as_str(), "completed" | "diverged")
    }
    /// The capture refused its flags: exit status 2 (clap), or 1 before it wrote a manifest
    /// (its validation runs before anything touches the disk).
    pub fn bad_flags(&self) -> bool {
        self.exit_code == Some(2) || (self.exit_code == Some(1) && self.status == "failed")
    }
}

/// Runs captures in parallel under one output directory.
pub struct Driver {
    pub exe: PathBuf,
    pub out: PathBuf,
    pub jobs: usize,
    /// Whether `--threads` is given to each CPU capture: the cores shared out between the runs
    /// of a batch that run at once (false: leave it to the capture).
    pub share_threads: bool,
    /// Print nothing on stderr (no bar, no lines).
    pub quiet: bool,
}

/// The number of cores (at least 1).
pub fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

impl Driver {
    /// A driver writing under `out` (created if missing). `jobs` 0 means the number of cores.
    /// `cpu` says whether captures train on the CPU (then threads are shared out between jobs);
    /// `extra` are the user's pass-through flags (a `--threads` there wins).
    pub fn new(out: &Path, jobs: usize, cpu: bool, extra: &[String], quiet: bool) -> Result<Driver, AnalyzeError> {
        let exe = find_capture()?;
        let jobs = if jobs == 0 { cores() } else { jobs };
        std::fs::create_dir_all(out.join("logs")).map_err(|e| AnalyzeError::Output { path: out.join("logs"), message: e.to_string() })?;
        let user_threads = extra.iter().any(|a| a == "--threads" || a.starts_with("--threads="));
        Ok(Driver { exe, out: out.to_path_buf(), jobs, share_threads: cpu && !user_threads, quiet })
    }

    /// The directory of run `name`.
    pub fn dir(&self, name: &str) -> PathBuf {
        self.out.join(name)
    }

    /// Runs every spec, `jobs` at a time; returns the results in the order of `specs`.
    pub fn run_all(&self, label: &str, specs: &[RunSpec]) -> Vec<RunResult> {
        if specs.is_empty() {
            return Vec::new();
        }
        let pb = if self.quiet { ProgressBar::hidden() } else { ProgressBar::new(specs.len() as u64) };
        pb.set_style(
            ProgressStyle::with_template("{prefix:>10} [{bar:24}] {pos}/{len} runs, {elapsed} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        pb.set_prefix(label.to_string());
        let threads = self.share_threads.then(|| (cores() / self.jobs.min(specs.len())).max(1));
        let next = AtomicUsize::new(0);
        let running: Mutex<Vec<String>> = Mutex::new(Vec::new());
        let results: Mutex<Vec<Option<RunResult>>> = Mutex::new(vec![None; specs.len()]);
        std::thread::scope(|s| {
            for _ in 0..self.jobs.min(specs.len()) {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(spec) = specs.get(i) else { break };
                        {
                            let mut r = running.lock().unwrap_or_else(|e| e.into_inner());
                            r.push(spec.name.clone());
                            pb.set_message(r.join(" "));
                        }
                        let res = self.run_one(spec, threads);
                        {
                            let mut r = running.lock().unwrap_or_else(|e| e.into_inner());
                            r.retain(|n| n != &spec.name);
                            pb.set_message(r.join(" "));
                        }
                        let line = format!(
                            "{label}: {} {}{} ({:.1} s)",
                            res.name,
                            res.status,
                            res.final_loss.map(|l| format!(", final loss {l:.4}")).unwrap_or_default(),
                            res.wall_s
                        );
                        if !self.quiet {
                            if pb.is_hidden() {
                                eprintln!("{line}");
                            } else {
                                pb.println(line);
                            }
                        }
                        pb.inc(1);
                        results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(res);
                    }
                });
            }
        });
        pb.finish_and_clear();
        results.into_inner().unwrap_or_else(|e| e.into_inner()).into_iter().flatten().collect()
    }

    /// Runs one capture to the end.
    fn run_one(&self, spec: &RunSpec, threads: Option<usize>) -> RunResult {
        let dir = self.dir(&spec.name);
        let log = self.out.join("logs").join(format!("{}.log", spec.name));
        let mut cmd = Command::new(&self.exe);
        cmd.arg("train").args(&spec.flags).arg("--out").arg(&dir).arg("--name").arg(&spec.name).arg("--quiet");
        if let Some(t) = threads {
            cmd.arg("--threads").arg(t.to_string());
        }
        let t0 = Instant::now();
        let out = cmd.stdin(Stdio::null()).output();
        let wall_s = t0.elapsed().as_secs_f64();
        let (exit_code, text) = match out {
            Ok(o) => {
                let mut t = String::from_utf8_lossy(&o.stdout).into_owned();
                t += &String::from_utf8_lossy(&o.stderr);
                (o.status.code(), t)
            }
            Err(e) => (None, format!("could not start {}: {e}", self.exe.display())),
        };
        let _ = std::fs::write(&log, &text);
        let manifest = Manifest::read(&dir).ok();
        let status = match &manifest {
            Some(m) => m.status.as_str().to_string(),
            None => "failed".to_string(),
        };
        let error =
            (!matches!(exit_code, Some(0) | Some(3))).then(|| text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output").trim().to_string());
        RunResult {
            name: spec.name.clone(),
            dir,
            flags: spec.flags.clone(),
            exit_code,
            status,
            error,
            final_loss: manifest.as_ref().and_then(|m| m.final_loss).filter(|l| l.is_finite()),
            steps_completed: manifest.as_ref().map(|m| m.steps_completed).unwrap_or(0),
            wall_s,
        }
    }
}

/// Turns a run whose flags the capture refused into a bad-input error (exit 2), and a run that
/// crashed into an error naming its log.
pub fn require_usable(r: &RunResult, out: &Path) -> Result<(), AnalyzeError> {
    if r.bad_flags() {
        return Err(AnalyzeError::Usage(r.error.clone().unwrap_or_else(|| "fp8-capture refused the flags".into())));
    }
    if !r.usable() {
        return Err(AnalyzeError::Missing {
            run: r.name.clone(),
            message: format!(
                "fp8-capture {} ({}); see {}",
                r.status,
                r.error.clone().unwrap_or_default(),
                out.join("logs").join(format!("{}.log", r.name)).display()
            ),
        });
    }
    Ok(())
}

/// Prepares `--out`: it must not exist or be an empty directory.
pub fn prepare_out(out: &Path) -> Result<(), AnalyzeError> {
    if out.exists() {
        let empty = std::fs::read_dir(out).map(|mut d| d.next().is_none()).unwrap_or(false);
        if !out.is_dir() || !empty {
            return Err(AnalyzeError::Usage(format!("--out {}: must be a new or empty directory", out.display())));
        }
    }
    std::fs::create_dir_all(out).map_err(|e| AnalyzeError::Output { path: out.to_path_buf(), message: e.to_string() })
}

/// The capture flags `triage` and `regress` take and hand to every run they record.
#[derive(Clone, Debug, clap::Args)]
pub struct CaptureFlags {
    /// Model preset of the runs (see `fp8-capture presets`).
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// Training steps of every run [default: the capture's, 300].
    #[arg(long)]
    pub steps: Option<u32>,
    /// Seed of the weights and batches of every run.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where the captures train: auto, cpu or cuda (passed to fp8-capture).
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// A built-in failure scenario (spike, drift, nan), in every run including the BF16 baseline.
    #[arg(long, value_name = "NAME")]
    pub scenario: Option<String>,
    /// The step the scenario plants its batch at, instead of its own (as fp8-capture's).
    #[arg(long, value_name = "STEP")]
    pub scenario_step: Option<u32>,
    /// A planted fault, as fp8-capture's --inject (repeatable); FP8 runs only.
    #[arg(long, value_name = "SPEC")]
    pub inject: Vec<String>,
    /// Captures run at once [default: the number of cores].
    #[arg(long, default_value_t = 0)]
    pub jobs: usize,
    /// No progress bar and no per-run lines on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// Further fp8-capture flags for every run, after `--`.
    #[arg(last = true, value_name = "CAPTURE_FLAGS")]
    pub extra: Vec<String>,
}

impl CaptureFlags {
    /// Flags shared by every run (model, data, seed, steps, device, scenario, extras).
    pub fn common(&self) -> Vec<String> {
        self.common_with_seed(self.seed)
    }
    /// The steps every run trains: `--steps`, else one among the extra flags, else the capture's
    /// default (300).
    pub fn planned_steps(&self) -> u32 {
        let from_extra = self.extra.windows(2).find(|w| w[0] == "--steps").and_then(|w| w[1].parse().ok());
        self.steps.or(from_extra).unwrap_or(300)
    }
    /// [`CaptureFlags::common`] with another seed (a confirmation on a second seed).
    pub fn common_with_seed(&self, seed: u64) -> Vec<String> {
        let mut f = vec!["--preset".into(), self.preset.clone(), "--seed".into(), seed.to_string(), "--device".into(), self.device.clone()];
        if let Some(s) = self.steps {
            f.extend(["--steps".into(), s.to_string()]);
        }
        if let Some(s) = &self.scenario {
            f.extend(["--scenario".into(), s.clone()]);
        }
        if let Some(s) = self.scenario_step {
            f.extend(["--scenario-step".into(), s.to_string()]);
        }
        f.extend(self.extra.iter().cloned());
        f
    }
    /// Whether the extra flags train on several ranks (`--dp N` or `--tp N` with N ≥ 2): such runs
    /// support the delayed and bf16 recipes only (fp8-capture reduces amaxes between steps).
    pub fn multi_rank(&self) -> bool {
        let mut it = self.extra.iter().peekable();
        while let Some(f) = it.next() {
            let value = match f.split_once('=') {
                Some((name, v)) if name == "--dp" || name == "--tp" => Some(v.to_string()),
                None if f == "--dp" || f == "--tp" => it.peek().map(|v| v.to_string()),
                _ => None,
            };
            if value.and_then(|v| v.parse::<u32>().ok()).is_some_and(|n| n >= 2) {
                return true;
            }
        }
        false
    }
    /// The `--inject` flags.
    pub fn injections(&self) -> Vec<String> {
        self.inject.iter().flat_map(|s| ["--inject".to_string(), s.clone()]).collect()
    }
    /// Whether the captures train on the CPU (threads are then shared out between jobs).
    pub fn on_cpu(&self) -> bool {
        self.device != "cuda"
    }
    /// A driver for these flags writing under `out` (which must be new or empty).
    pub fn driver(&self, out: &Path) -> Result<Driver, AnalyzeError> {
        prepare_out(out)?;
        Driver::new(out, self.jobs, self.on_cpu(), &self.extra, self.quiet)
    }
}

#[cfg(test)]
mod tests {
    use super::CaptureFlags;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        capture: CaptureFlags,
    }

    fn multi_rank(args: &[&str]) -> bool {
        Flags::parse_from(["triage"].iter().chain(args)).capture.multi_rank()
    }

    #[test]
    fn runs_of_several_ranks_are_told_from_their_flags() {
        assert!(!multi_rank(&[]));
        assert!(!multi_rank(&["--", "--tp", "1", "--dp=1"]));
        assert!(multi_rank(&["--", "--dp", "2"]));
        assert!(multi_rank(&["--", "--lr", "1e-3", "--tp=4"]));
        assert!(!multi_rank(&["--", "--dp"]), "a flag without its value is fp8-capture's to refuse");
    }
}

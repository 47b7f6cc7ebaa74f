//! Checkpoints (`--checkpoint-every N`) and resuming from them (`--resume RUN --at-step S`).
//!
//! A checkpoint is one file, `RUN/checkpoints/step-SSSSSSSS.ckpt`:
//! - the magic `FP8SCKPT`, a format version (u32) and the length (u64) of a JSON header
//!   ([`Header`]: the step, what the run must share to resume from it, the parameters' lengths and
//!   the amax histories);
//! - then the parameters, the AdamW first moments and the second moments, each parameter's f32
//!   values little-endian, in the model's parameter order.
//!
//! It is written to a temporary name and renamed, so a checkpoint that exists is whole. What a
//! resumed run restores is everything its next step reads from the steps before: the weights, the
//! moments and the histories. The batches, the learning rate and AdamW's bias correction follow from
//! the step number; the statistics that compare with the step before (weight motion, the flight
//! recorder's loss watch) start afresh.

use crate::backend::Backend;
use crate::model::Model;
use crate::recipe::Scaling;
use anyhow::{Context, bail};
use fp8scope_schemas::config::{DataConfig, ModelDims, RunConfig};
use fp8scope_schemas::names::{Role, Site};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"FP8SCKPT";
const VERSION: u32 = 1;
/// The checkpoints' folder in a run directory.
pub const DIR: &str = "checkpoints";

/// The JSON header of a checkpoint.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    step: u32,
    model: ModelDims,
    data: DataConfig,
    seed: u64,
    init_jitter: Option<u64>,
    scenario: Option<String>,
    /// Each parameter's number of values.
    param_lens: Vec<usize>,
    /// (site, role, amax history oldest first).
    amax_histories: Vec<(Site, Role, Vec<f32>)>,
}

/// The file of `run`'s checkpoint at `step`.
pub fn path(run: &Path, step: u32) -> PathBuf {
    run.join(DIR).join(format!("step-{step:08}.ckpt"))
}

/// The steps `run` has checkpoints of, ascending.
pub fn steps(run: &Path) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(run.join(DIR))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("step-")?.strip_suffix(".ckpt")?.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// Writes the checkpoint of `step` into `run`'s checkpoints folder.
pub fn save<B: Backend>(be: &mut B, model: &Model<B>, scaling: &Scaling, cfg: &RunConfig, run: &Path, step: u32) -> anyhow::Result<()> {
    let st = &model.state;
    let param_lens: Vec<usize> = st.params.iter().map(|b| be.len(b)).collect();
    let header = Header {
        step,
        model: cfg.model.clone(),
        data: cfg.data.clone(),
        seed: cfg.train.seed,
        init_jitter: cfg.train.init_jitter,
        scenario: cfg.scenario.clone(),
        param_lens,
        amax_histories: scaling.histories(),
    };
    let json = serde_json::to_vec(&header)?;
    let dir = run.join(DIR);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dest = path(run, step);
    let tmp = dest.with_extension("ckpt.partial");
    let mut write = || -> std::io::Result<()> {
        let mut f = std::io::BufWriter::with_capacity(1 << 22, std::fs::File::create(&tmp)?);
        f.write_all(MAGIC)?;
        f.write_all(&VERSION.to_le_bytes())?;
        f.write_all(&(json.len() as u64).to_le_bytes())?;
        f.write_all(&json)?;
        for bufs in [&st.params, &st.adam_m, &st.adam_v] {
            for b in bufs.iter() {
                let n = be.len(b);
                let values = be.download(b, 0, n, 1);
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                f.write_all(&bytes)?;
            }
        }
        f.into_inner().map_err(|e| e.into_error())?.sync_all()
    };
    write().with_context(|| format!("writing the checkpoint {}", tmp.display()))?;
    std::fs::rename(&tmp, &dest).with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))?;
    Ok(())
}

/// Reads the header of `run`'s checkpoint at `step`, leaving the reader at the values.
fn open(run: &Path, step: u32) -> anyhow::Result<(Header, std::io::BufReader<std::fs::File>)> {
    let file = path(run, step);
    if !file.exists() {
        let have = steps(run);
        if have.is_empty() {
            bail!("--resume {}: the run has no checkpoints (record it with --checkpoint-every N)", run.display());
        }
        bail!("--resume {}: no checkpoint of step {step}; it has steps {}", run.display(), have.iter().map(u32::to_string).collect::<Vec<_>>().join(", "));
    }
    let size = std::fs::metadata(&file)?.len();
    let mut f = std::io::BufReader::with_capacity(1 << 22, std::fs::File::open(&file).with_context(|| format!("opening {}", file.display()))?);
    let mut head = [0u8; 20];
    f.read_exact(&mut head).map_err(|_| anyhow::anyhow!("{}: too short to be a checkpoint", file.display()))?;
    if &head[..8] != MAGIC {
        bail!("{}: not an fp8scope checkpoint", file.display());
    }
    let version = u32::from_le_bytes(head[8..12].try_into()?);
    if version != VERSION {
        bail!("{}: checkpoint format {version}; this fp8-capture reads format {VERSION}", file.display());
    }
    let json_len = u64::from_le_bytes(head[12..20].try_into()?);
    if json_len > size {
        bail!("{}: truncated (its header is longer than the file)", file.display());
    }
    let mut json = vec![0u8; json_len as usize];
    f.read_exact(&mut json)?;
    let header: Header = serde_json::from_slice(&json).with_context(|| format!("{}: unreadable header", file.display()))?;
    let values: u64 = header.param_lens.iter().map(|&n| n as u64).sum::<u64>() * 3 * 4;
    if size != 20 + json_len + values {
        bail!("{}: truncated or padded ({size} bytes; its header calls for {})", file.display(), 20 + json_len + values);
    }
    Ok((header, f))
}

/// Checks that `cfg` can resume from `run`'s checkpoint at `step`: the file is whole, and the
/// model, data, seed, initial jitter and scenario are the same. One line says what differs.
pub fn check(run: &Path, step: u32, cfg: &RunConfig) -> anyhow::Result<()> {
    let (h, _) = open(run, step)?;
    let differ = |what: &str| {
        anyhow::anyhow!(
            "--resume {}: the checkpoint's {what} differs from this run's; a resumed run changes only the recipe, routing and recording",
            run.display()
        )
    };
    if h.model != cfg.model {
        return Err(differ("model"));
    }
    if h.data != cfg.data {
        return Err(differ("data"));
    }
    if h.seed != cfg.train.seed || h.init_jitter != cfg.train.init_jitter {
        return Err(differ("seed"));
    }
    if h.scenario != cfg.scenario {
        return Err(differ("scenario"));
    }
    Ok(())
}

/// Loads `run`'s checkpoint at `step` into `model` and `scaling` (after [`check`]).
pub fn restore<B: Backend>(be: &mut B, model: &mut Model<B>, scaling: &mut Scaling, run: &Path, step: u32) -> anyhow::Result<()> {
    let (h, mut f) = open(run, step)?;
    let have: Vec<usize> = model.state.params.iter().map(|b| be.len(b)).collect();
    if have != h.param_lens {
        bail!("--resume {}: the checkpoint's parameters have other shapes than this model's", run.display());
    }
    let st = &mut model.state;
    for bufs in [&mut st.params, &mut st.adam_m, &mut st.adam_v] {
        for (b, &n) in bufs.iter_mut().zip(&h.param_lens) {
            let mut bytes = vec![0u8; n * 4];
            f.read_exact(&mut bytes).with_context(|| format!("reading the checkpoint of step {step}"))?;
            let values: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            *b = be.upload(&values);
        }
    }
    scaling.restore(h.amax_histories);
    Ok(())
}

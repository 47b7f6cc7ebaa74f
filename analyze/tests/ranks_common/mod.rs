//! Multi-rank runs as the PyTorch recorder writes them (schema version 3): per-rank partitions of
//! `casts`, `stats` and `steps`, one liveness file per rank, a manifest with the world size and the
//! device mesh's process groups — with planted faults. Used by tests/ranks.rs and, at 1,024 ranks,
//! by the generator of bench/ranks_scale.sh (tests/ranks_scale.rs).
//!
//! The job is a row-major mesh of named dimensions (`dp` replicate, `fsdp` shard, `tp`); each
//! dimension is a process group whose instances are the ranks that differ only in its coordinate.
//! Values are deterministic functions of (rank or replica, step, tensor):
//! - a weight's local amax is the same on every data-parallel replica (one hash of the rank's
//!   coordinates without the `dp` ones), an activation's or gradient's differs per rank; all lie
//!   in [1, 1.5) (gradients × 1e-3);
//! - `amax_used` is the max of the local amaxes over the configured set: the ranks that share every
//!   coordinate outside the role's amax groups (a weight over fsdp and tp, the others over tp, as
//!   `Parallel::amax_groups_of`'s default, unless `amax_groups` says otherwise);
//! - `scale` = fp8 max / amax_used in f32 (448 for E4M3 activations and weights, 57344 for E5M2
//!   gradients); `digest` a hash of the weight's replica (equal across replicas);
//! - audits every `audit_every` steps: 4096 elements checked, none differing, master and forward
//!   weight both changed;
//! - stats: 6 operand rows per site, underflow ≈ 1%, saturation ≈ 0.005%, no NaN;
//! - steps: step_ms ≈ 100 ms ± 5%.
#![allow(dead_code)]

use arrow::array::{ArrayRef, BooleanArray, Float32Array, Float64Array, Int32Array, Int64Array, StringArray, new_null_array};
use arrow::record_batch::RecordBatch;
use fp8scope_schemas::config::{DataKind, RecipeKind, RunConfig};
use fp8scope_schemas::layout::{RunDir, Table};
use fp8scope_schemas::manifest::{DataInfo, DeviceInfo, Manifest, Origin, RowCounts, RunSource, RunStatus, lacks};
use fp8scope_schemas::parts::write_part;
use fp8scope_schemas::ranks::{DeviceMesh, GroupKind, Parallel, ProcessGroup, RankInfo, RankLiveness};
use fp8scope_schemas::tables::schema;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const SITES: [&str; 4] = ["qkv", "proj", "fc1", "fc2"];
pub const ROLES: [&str; 3] = ["activation", "weight", "gradient"];
/// The stats rows of one site: (gemm, role).
pub const OPERANDS: [(&str, &str); 6] =
    [("fprop", "activation"), ("fprop", "weight"), ("dgrad", "gradient"), ("dgrad", "weight"), ("wgrad", "gradient"), ("wgrad", "activation")];

/// The GEMM a role's cast feeds first.
pub fn cast_gemm(role: &str) -> &'static str {
    if role == "gradient" { "dgrad" } else { "fprop" }
}

fn fp8_max(role: &str) -> f32 {
    if role == "gradient" { 57344.0 } else { 448.0 }
}

/// A fault planted in the run.
#[derive(Clone, Debug)]
pub enum Plant {
    /// From `step`, `rank`'s cast of the tensor skips the reduction: its amax_used is its own local
    /// amax, which is halved so that it is below its peers' (torchtitan #3109).
    LocalAmax { rank: u32, step: u32, layer: u32, site: &'static str, role: &'static str },
    /// From `step`, every rank's cast of the tensor is reduced over every rank, and `high`'s local
    /// amax is tripled, so that the max lies outside the configured sets of most ranks.
    WorldAmax { high: u32, step: u32, layer: u32, site: &'static str, role: &'static str },
    /// From `step`, `rank`'s FP8 weight bytes differ from its replicas' (digest + 1).
    Digest { rank: u32, step: u32, layer: u32, site: &'static str },
    /// At `step` (an audit step), `count` bytes of `rank`'s cast differ from the reference cast.
    AuditMismatch { rank: u32, step: u32, layer: u32, site: &'static str, role: &'static str, count: i64 },
    /// At `step` (an audit step), `count` elements of `rank`'s forward weight differ from its master.
    MasterMismatch { rank: u32, step: u32, layer: u32, site: &'static str, count: i64 },
    /// From `step`, on `ranks`, the master weight changes and the forward weight does not.
    Stale { ranks: Vec<u32>, step: u32, layer: u32, site: &'static str },
    /// From `step`, `rank`'s stats row of the operand underflows `frac`.
    Underflow { rank: u32, step: u32, layer: u32, site: &'static str, gemm: &'static str, role: &'static str, frac: f64 },
    /// At `step`, `rank`'s stats row of the operand holds `count` NaNs.
    Nan { rank: u32, step: u32, layer: u32, site: &'static str, gemm: &'static str, role: &'static str, count: i64 },
    /// `rank`'s steps take `factor` times as long.
    Slow { rank: u32, factor: f64 },
}

/// How a rank ended, when not completed.
#[derive(Clone, Debug)]
pub enum Ending {
    /// Killed: its record still says running, with a heartbeat an hour old.
    Stopped,
    Crashed(String),
}

/// A multi-rank run to write.
#[derive(Clone, Debug)]
pub struct Spec {
    pub name: String,
    /// The mesh, row-major (the last dimension varies fastest): (name, kind, size).
    pub dims: Vec<(&'static str, GroupKind, u32)>,
    /// The manifest's `amax_groups` (None: the default).
    pub amax_groups: Option<BTreeMap<String, Vec<String>>>,
    pub recipe: RecipeKind,
    pub layers: u32,
    pub steps: u32,
    /// Steps per part.
    pub flush_every: u32,
    /// Audits every this many steps (0: never).
    pub audit_every: u32,
    pub plants: Vec<Plant>,
    /// Ranks that stopped early: rank → last step written.
    pub last_step: BTreeMap<u32, u32>,
    pub endings: BTreeMap<u32, Ending>,
    /// Ranks that left nothing (no parts, no liveness file).
    pub absent: Vec<u32>,
    pub casts: bool,
    pub stats: bool,
    pub steps_table: bool,
    /// Write the `rank` column as null (the partition says it).
    pub null_ranks: bool,
}

impl Spec {
    /// A clean run over `dims`: 2 layers, 20 steps, parts of 10 steps, audits every 5 steps.
    pub fn new(name: &str, dims: &[(&'static str, GroupKind, u32)]) -> Spec {
        Spec {
            name: name.into(),
            dims: dims.to_vec(),
            amax_groups: None,
            recipe: RecipeKind::Current,
            layers: 2,
            steps: 20,
            flush_every: 10,
            audit_every: 5,
            plants: Vec::new(),
            last_step: BTreeMap::new(),
            endings: BTreeMap::new(),
            absent: Vec::new(),
            casts: true,
            stats: true,
            steps_table: true,
            null_ranks: false,
        }
    }

    pub fn world(&self) -> u32 {
        self.dims.iter().map(|d| d.2).product()
    }

    fn coords(&self, rank: u32) -> Vec<u32> {
        let mut c = vec![0; self.dims.len()];
        let mut r = rank;
        for (i, d) in self.dims.iter().enumerate().rev() {
            c[i] = r % d.2;
            r /= d.2;
        }
        c
    }

    fn rank_of(&self, coords: &[u32]) -> u32 {
        coords.iter().zip(&self.dims).fold(0, |acc, (c, d)| acc * d.2 + c)
    }

    /// The process groups: per dimension, every instance.
    pub fn groups(&self) -> Vec<ProcessGroup> {
        (0..self.dims.len())
            .map(|d| {
                let mut inst: BTreeMap<Vec<u32>, Vec<u32>> = BTreeMap::new();
                for r in 0..self.world() {
                    let mut key = self.coords(r);
                    key[d] = u32::MAX;
                    inst.entry(key).or_default().push(r);
                }
                ProcessGroup { name: self.dims[d].0.into(), kind: self.dims[d].1, members: inst.into_values().collect() }
            })
            .collect()
    }

    /// The dimensions a role's amax is reduced over.
    fn reduced_dims(&self, role: &str) -> Vec<usize> {
        match self.amax_groups.as_ref().and_then(|m| m.get(role)) {
            Some(names) => (0..self.dims.len()).filter(|&d| names.iter().any(|n| n == self.dims[d].0)).collect(),
            None => {
                let kinds: &[GroupKind] = if role == "weight" { &[GroupKind::Fsdp, GroupKind::Tp] } else { &[GroupKind::Tp] };
                (0..self.dims.len()).filter(|&d| kinds.contains(&self.dims[d].1)).collect()
            }
        }
    }

    /// The set a rank's cast of `role` is reduced over: the ranks sharing every other coordinate.
    fn class(&self, rank: u32, blank: &[usize]) -> u32 {
        let mut c = self.coords(rank);
        for &d in blank {
            c[d] = 0;
        }
        self.rank_of(&c)
    }

    fn dp_dims(&self) -> Vec<usize> {
        (0..self.dims.len()).filter(|&d| self.dims[d].1 == GroupKind::Dp).collect()
    }

    fn module(layer: u32, site: &str) -> String {
        format!("layers.{layer}.{site}")
    }

    fn key(layer: u32, site: &str, role: &str) -> usize {
        layer as usize * 12 + SITES.iter().position(|s| *s == site).unwrap_or(0) * 3 + ROLES.iter().position(|r| *r == role).unwrap_or(0)
    }

    fn keys(&self) -> usize {
        self.layers as usize * 12
    }
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A deterministic hash of a few integers.
pub fn hash(parts: &[u64]) -> u64 {
    parts.iter().fold(0x5eed_u64, |acc, &p| mix(acc ^ p.wrapping_mul(0x100_0000_01b3)))
}

/// A uniform number in [0, 1) from a few integers.
pub fn u01(parts: &[u64]) -> f64 {
    (hash(parts) >> 11) as f64 / (1u64 << 53) as f64
}

/// Every rank's casts of one chunk of steps: local amax, used amax, scale, digest, audits.
struct Chunk {
    s0: u32,
    n_steps: u32,
    keys: usize,
    /// [rank][step - s0][key]
    local: Vec<f32>,
    used: Vec<f32>,
}

impl Chunk {
    fn at(&self, rank: u32, step: u32, key: usize) -> usize {
        (rank as usize * self.n_steps as usize + (step - self.s0) as usize) * self.keys + key
    }
}

fn compute_chunk(spec: &Spec, s0: u32, s1: u32) -> Chunk {
    let world = spec.world();
    let keys = spec.keys();
    let n_steps = s1 - s0 + 1;
    let mut ch =
        Chunk { s0, n_steps, keys, local: vec![0.0; world as usize * n_steps as usize * keys], used: vec![0.0; world as usize * n_steps as usize * keys] };
    let dp = spec.dp_dims();
    for r in 0..world {
        let replica = spec.class(r, &dp) as u64;
        for s in s0..=s1 {
            for layer in 0..spec.layers {
                for site in SITES {
                    for role in ROLES {
                        let k = Spec::key(layer, site, role);
                        let who = if role == "weight" { replica } else { r as u64 + 1_000_000 };
                        let mut x = (1.0 + 0.5 * u01(&[who, s as u64, k as u64, 7])) as f32;
                        if role == "gradient" {
                            x *= 1e-3;
                        }
                        let i = ch.at(r, s, k);
                        ch.local[i] = x;
                    }
                }
            }
        }
    }
    for p in &spec.plants {
        match *p {
            Plant::LocalAmax { rank, step, layer, site, role } => {
                for s in s0.max(step)..=s1 {
                    let i = ch.at(rank, s, Spec::key(layer, site, role));
                    ch.local[i] *= 0.5;
                }
            }
            Plant::WorldAmax { high, step, layer, site, role } => {
                for s in s0.max(step)..=s1 {
                    let i = ch.at(high, s, Spec::key(layer, site, role));
                    ch.local[i] *= 3.0;
                }
            }
            _ => {}
        }
    }
    // The max over each rank's configured set, from each set's max.
    for role in ROLES {
        let blank = spec.reduced_dims(role);
        let mut set_max: HashMap<(u32, u32, usize), f32> = HashMap::new();
        for r in 0..world {
            let c = spec.class(r, &blank);
            for s in s0..=s1 {
                for layer in 0..spec.layers {
                    for site in SITES {
                        let k = Spec::key(layer, site, role);
                        let v = ch.local[ch.at(r, s, k)];
                        let e = set_max.entry((c, s, k)).or_insert(f32::MIN);
                        *e = e.max(v);
                    }
                }
            }
        }
        for r in 0..world {
            let c = spec.class(r, &blank);
            for s in s0..=s1 {
                for layer in 0..spec.layers {
                    for site in SITES {
                        let k = Spec::key(layer, site, role);
                        let i = ch.at(r, s, k);
                        ch.used[i] = set_max[&(c, s, k)];
                    }
                }
            }
        }
    }
    for p in &spec.plants {
        match *p {
            Plant::LocalAmax { rank, step, layer, site, role } => {
                for s in s0.max(step)..=s1 {
                    let i = ch.at(rank, s, Spec::key(layer, site, role));
                    ch.used[i] = ch.local[i];
                }
            }
            Plant::WorldAmax { step, layer, site, role, .. } => {
                let k = Spec::key(layer, site, role);
                for s in s0.max(step)..=s1 {
                    let m = (0..world).map(|r| ch.local[ch.at(r, s, k)]).fold(f32::MIN, f32::max);
                    for r in 0..world {
                        let i = ch.at(r, s, k);
                        ch.used[i] = m;
                    }
                }
            }
            _ => {}
        }
    }
    ch
}

fn str_col<'a>(it: impl Iterator<Item = &'a str>) -> ArrayRef {
    Arc::new(StringArray::from_iter_values(it))
}

/// A batch of `table` from the named columns; the table's other columns are null.
fn batch(table: Table, n: usize, mut cols: HashMap<&str, ArrayRef>) -> RecordBatch {
    let s = schema(table);
    let arrays: Vec<ArrayRef> = s.fields().iter().map(|f| cols.remove(f.name().as_str()).unwrap_or_else(|| new_null_array(f.data_type(), n))).collect();
    RecordBatch::try_new(s.clone(), arrays).expect("fixture batch matches its schema")
}

fn rank_col(spec: &Spec, rank: u32, n: usize) -> ArrayRef {
    if spec.null_ranks { Arc::new(Int32Array::new_null(n)) } else { Arc::new(Int32Array::from(vec![rank as i32; n])) }
}

fn casts_batch(spec: &Spec, ch: &Chunk, rank: u32, s0: u32, s1: u32) -> RecordBatch {
    let dp = spec.dp_dims();
    let replica = spec.class(rank, &dp) as u64;
    let mut step = Vec::new();
    let mut layer_c = Vec::new();
    let mut module = Vec::new();
    let mut gemm = Vec::new();
    let mut role_c = Vec::new();
    let mut format = Vec::new();
    let (mut scale, mut local, mut used, mut digest) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut a_chk, mut a_mis, mut m_chk, mut m_mis, mut m_chg, mut f_chg) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let modules: Vec<String> = (0..spec.layers).flat_map(|l| SITES.map(|s| Spec::module(l, s))).collect();
    for s in s0..=s1 {
        let audit = spec.audit_every > 0 && s % spec.audit_every == 0;
        for layer in 0..spec.layers {
            for (si, site) in SITES.iter().enumerate() {
                for role in ROLES {
                    let k = Spec::key(layer, site, role);
                    let i = ch.at(rank, s, k);
                    step.push(s as i64);
                    layer_c.push(layer as i32);
                    module.push(layer as usize * 4 + si);
                    gemm.push(cast_gemm(role));
                    role_c.push(role);
                    format.push(if role == "gradient" { "e5m2" } else { "e4m3" });
                    let u = ch.used[i];
                    scale.push(fp8_max(role) / u);
                    local.push(ch.local[i]);
                    used.push(u);
                    let who = if role == "weight" { replica } else { rank as u64 + 1_000_000 };
                    let mut d = (hash(&[who, s as u64, k as u64, 3]) >> 1) as i64;
                    let (mut am, mut mm, mut mc, mut fc) = (0i64, 0i64, true, true);
                    for p in &spec.plants {
                        match p {
                            Plant::Digest { rank: r, step: st, layer: l, site: si2 }
                                if *r == rank && s >= *st && *l == layer && si2 == site && role == "weight" =>
                            {
                                d += 1
                            }
                            Plant::AuditMismatch { rank: r, step: st, layer: l, site: si2, role: ro, count }
                                if *r == rank && s == *st && *l == layer && si2 == site && *ro == role =>
                            {
                                am = *count
                            }
                            Plant::MasterMismatch { rank: r, step: st, layer: l, site: si2, count }
                                if *r == rank && s == *st && *l == layer && si2 == site && role == "weight" =>
                            {
                                mm = *count
                            }
                            Plant::Stale { ranks, step: st, layer: l, site: si2 }
                                if ranks.contains(&rank) && s >= *st && *l == layer && si2 == site && role == "weight" =>
                            {
                                mc = true;
                                fc = false;
                            }
                            _ => {}
                        }
                    }
                    digest.push(d);
                    a_chk.push(audit.then_some(4096i64));
                    a_mis.push(audit.then_some(am));
                    let w = audit && role == "weight";
                    m_chk.push(w.then_some(4096i64));
                    m_mis.push(w.then_some(mm));
                    m_chg.push(w.then_some(mc));
                    f_chg.push(w.then_some(fc));
                }
            }
        }
    }
    let n = step.len();
    let cols: HashMap<&str, ArrayRef> = HashMap::from([
        ("step", Arc::new(Int64Array::from(step)) as ArrayRef),
        ("rank", rank_col(spec, rank, n)),
        ("layer", Arc::new(Int32Array::from(layer_c)) as ArrayRef),
        ("module", str_col(module.iter().map(|&i| modules[i].as_str()))),
        ("gemm", str_col(gemm.into_iter())),
        ("role", str_col(role_c.into_iter())),
        ("source", str_col(std::iter::repeat_n("torchao", n))),
        ("format", str_col(format.into_iter())),
        ("scale", Arc::new(Float32Array::from(scale)) as ArrayRef),
        ("amax_local", Arc::new(Float32Array::from(local)) as ArrayRef),
        ("amax_used", Arc::new(Float32Array::from(used)) as ArrayRef),
        ("numel", Arc::new(Int64Array::from(vec![4096i64; n])) as ArrayRef),
        ("digest", Arc::new(Int64Array::from(digest)) as ArrayRef),
        ("audit_checked", Arc::new(Int64Array::from(a_chk)) as ArrayRef),
        ("audit_mismatched", Arc::new(Int64Array::from(a_mis)) as ArrayRef),
        ("master_checked", Arc::new(Int64Array::from(m_chk)) as ArrayRef),
        ("master_mismatched", Arc::new(Int64Array::from(m_mis)) as ArrayRef),
        ("master_changed", Arc::new(BooleanArray::from(m_chg)) as ArrayRef),
        ("forward_changed", Arc::new(BooleanArray::from(f_chg)) as ArrayRef),
    ]);
    batch(Table::Casts, n, cols)
}

fn stats_batch(spec: &Spec, ch: &Chunk, rank: u32, s0: u32, s1: u32) -> RecordBatch {
    let modules: Vec<String> = (0..spec.layers).flat_map(|l| SITES.map(|s| Spec::module(l, s))).collect();
    let mut step = Vec::new();
    let mut layer_c = Vec::new();
    let mut module = Vec::new();
    let mut gemm = Vec::new();
    let mut role_c = Vec::new();
    let mut format = Vec::new();
    let (mut scale, mut amax, mut used, mut under, mut sat, mut nan) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for s in s0..=s1 {
        for layer in 0..spec.layers {
            for (si, site) in SITES.iter().enumerate() {
                for (g, role) in OPERANDS {
                    let k = Spec::key(layer, site, role);
                    let i = ch.at(rank, s, k);
                    step.push(s as i64);
                    layer_c.push(layer as i32);
                    module.push(layer as usize * 4 + si);
                    gemm.push(g);
                    role_c.push(role);
                    format.push(if role == "gradient" { "e5m2" } else { "e4m3" });
                    scale.push(fp8_max(role) / ch.used[i]);
                    amax.push(ch.local[i]);
                    used.push(ch.used[i]);
                    let mut uf = 0.01 + 0.002 * u01(&[rank as u64, s as u64, k as u64, 11]);
                    let mut nn = 0i64;
                    for p in &spec.plants {
                        match p {
                            Plant::Underflow { rank: r, step: st, layer: l, site: si2, gemm: g2, role: ro, frac }
                                if *r == rank && s >= *st && *l == layer && si2 == site && *g2 == g && *ro == role =>
                            {
                                uf = *frac
                            }
                            Plant::Nan { rank: r, step: st, layer: l, site: si2, gemm: g2, role: ro, count }
                                if *r == rank && s == *st && *l == layer && si2 == site && *g2 == g && *ro == role =>
                            {
                                nn = *count
                            }
                            _ => {}
                        }
                    }
                    under.push(uf);
                    sat.push(0.0001 * u01(&[rank as u64, s as u64, k as u64, 13]));
                    nan.push(nn);
                }
            }
        }
    }
    let n = step.len();
    let cols: HashMap<&str, ArrayRef> = HashMap::from([
        ("step", Arc::new(Int64Array::from(step)) as ArrayRef),
        ("rank", rank_col(spec, rank, n)),
        ("layer", Arc::new(Int32Array::from(layer_c)) as ArrayRef),
        ("module", str_col(module.iter().map(|&i| modules[i].as_str()))),
        ("gemm", str_col(gemm.into_iter())),
        ("role", str_col(role_c.into_iter())),
        ("format", str_col(format.into_iter())),
        ("scale", Arc::new(Float32Array::from(scale)) as ArrayRef),
        ("amax", Arc::new(Float32Array::from(amax)) as ArrayRef),
        ("amax_used", Arc::new(Float32Array::from(used)) as ArrayRef),
        ("numel", Arc::new(Int64Array::from(vec![4096i64; n])) as ArrayRef),
        ("underflow_frac", Arc::new(Float64Array::from(under)) as ArrayRef),
        ("saturated_frac", Arc::new(Float64Array::from(sat)) as ArrayRef),
        ("nan_count", Arc::new(Int64Array::from(nan)) as ArrayRef),
        ("inf_count", Arc::new(Int64Array::from(vec![0i64; n])) as ArrayRef),
    ]);
    batch(Table::Stats, n, cols)
}

fn steps_batch(spec: &Spec, rank: u32, s0: u32, s1: u32) -> RecordBatch {
    let slow: f64 = spec.plants.iter().map(|p| if let Plant::Slow { rank: r, factor } = p { if *r == rank { *factor } else { 1.0 } } else { 1.0 }).product();
    let steps: Vec<i64> = (s0..=s1).map(|s| s as i64).collect();
    let n = steps.len();
    let ms: Vec<f64> = (s0..=s1).map(|s| 100.0 * (1.0 + 0.1 * (u01(&[rank as u64, s as u64, 17]) - 0.5)) * slow).collect();
    let loss: Vec<f64> = (s0..=s1).map(|s| 4.0 + 3.0 * (-(s as f64) / 50.0).exp()).collect();
    let cols: HashMap<&str, ArrayRef> = HashMap::from([
        ("step", Arc::new(Int64Array::from(steps)) as ArrayRef),
        ("loss", Arc::new(Float64Array::from(loss)) as ArrayRef),
        ("grad_norm", Arc::new(Float64Array::from(vec![1.0; n])) as ArrayRef),
        ("lr", Arc::new(Float64Array::from(vec![1e-3; n])) as ArrayRef),
        ("tokens", Arc::new(Int64Array::from(vec![4096i64; n])) as ArrayRef),
        ("step_ms", Arc::new(Float64Array::from(ms)) as ArrayRef),
        ("loss_is_finite", Arc::new(BooleanArray::from(vec![true; n])) as ArrayRef),
        ("nonfinite_tensors", Arc::new(Int32Array::from(vec![0; n])) as ArrayRef),
        ("rank", rank_col(spec, rank, n)),
    ]);
    batch(Table::Steps, n, cols)
}

fn ago(seconds: i64) -> String {
    (chrono_now() - seconds).to_string()
}

fn chrono_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// RFC 3339 (UTC, seconds) of a Unix time, without a date library.
fn rfc3339(t: i64) -> String {
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs % 3600 / 60, secs % 60)
}

/// Writes the run under `parent/<name>` and returns its directory. `threads` ranks are written at
/// once (1 for the small fixtures).
pub fn write(parent: &Path, spec: &Spec, config: RunConfig) -> PathBuf {
    let dir = parent.join(&spec.name);
    std::fs::create_dir_all(&dir).unwrap();
    let run = RunDir::new(&dir);
    let world = spec.world();
    let now = chrono_now();
    let present: Vec<u32> = (0..world).filter(|r| !spec.absent.contains(r)).collect();
    let mut s0 = 1;
    let mut index = 0;
    while s0 <= spec.steps {
        let s1 = (s0 + spec.flush_every - 1).min(spec.steps);
        let ch = compute_chunk(spec, s0, s1);
        let write_rank = |&rank: &u32| {
            let last = spec.last_step.get(&rank).copied().unwrap_or(spec.steps);
            if s0 > last {
                return;
            }
            let e = s1.min(last);
            let mut out = Vec::new();
            if spec.casts {
                out.push((Table::Casts, casts_batch(spec, &ch, rank, s0, e)));
            }
            if spec.stats {
                out.push((Table::Stats, stats_batch(spec, &ch, rank, s0, e)));
            }
            if spec.steps_table {
                out.push((Table::Steps, steps_batch(spec, rank, s0, e)));
            }
            for (table, b) in out {
                let path = run.rank_part(table, rank, index);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                write_part(&path, table, &b).unwrap();
            }
        };
        {
            use rayon::prelude::*;
            present.par_iter().for_each(write_rank);
        }
        s0 = s1 + 1;
        index += 1;
    }
    for &rank in &present {
        let last = spec.last_step.get(&rank).copied().unwrap_or(spec.steps);
        let mut l = RankLiveness {
            rank,
            host: format!("node{:03}", rank / 8),
            pid: 10_000 + rank,
            status: RunStatus::Completed,
            started_at: rfc3339(now - 7200),
            heartbeat_at: rfc3339(now - 5),
            ended_at: Some(rfc3339(now - 5)),
            steps_completed: last,
            heartbeat_every_s: Some(10.0),
            error: None,
            rows: RowCounts::default(),
        };
        match spec.endings.get(&rank) {
            Some(Ending::Stopped) => {
                l.status = RunStatus::Running;
                l.heartbeat_at = rfc3339(now - 3600);
                l.ended_at = None;
            }
            Some(Ending::Crashed(e)) => {
                l.status = RunStatus::Crashed;
                l.error = Some(e.clone());
            }
            None => {}
        }
        l.write(&dir).unwrap();
    }
    let device = DeviceInfo { kind: "cuda".into(), name: "synthetic".into(), compute_capability: Some("9.0".into()), parallelism: 132, block_gemm: None };
    let mut config = config;
    config.preset = "pytorch".into();
    config.model.layers = spec.layers;
    config.train.steps = spec.steps;
    config.recipe.kind = spec.recipe;
    config.data.kind = DataKind::External;
    let mut m = Manifest::new_running(spec.name.clone(), config, device, DataInfo { entropy_floor: None, ln_vocab: 0.0 });
    m.source = RunSource::Pytorch;
    m.origin = Some(Origin {
        framework: "torch 2.5.1 (synthetic fixture)".into(),
        modules: (0..spec.layers).flat_map(|l| SITES.map(|s| Spec::module(l, s))).collect(),
        stats_decimals: None,
        lacks: [lacks::DUMPS, lacks::SHADOW, lacks::EVENTS].map(String::from).to_vec(),
        notes: Vec::new(),
    });
    m.status = RunStatus::Completed;
    m.ended_at = Some(rfc3339(now - 5));
    m.heartbeat_at = Some(rfc3339(now - 5));
    m.pid = None;
    m.host = Some("node000".into());
    m.steps_completed = spec.steps;
    m.world_size = Some(world);
    m.parallel = Some(Parallel {
        launcher: "torchrun".into(),
        backend: Some("nccl".into()),
        mesh: Some(DeviceMesh {
            dim_names: spec.dims.iter().map(|d| d.0.to_string()).collect(),
            shape: spec.dims.iter().map(|d| d.2).collect(),
            ranks: (0..world).collect(),
        }),
        groups: spec.groups(),
        wrappers: vec!["FSDP2".into(), "DTensor".into(), "Float8Linear".into()],
        amax_groups: spec.amax_groups.clone(),
    });
    m.ranks = (0..world)
        .map(|r| RankInfo { rank: r, local_rank: Some(r % 8), host: format!("node{:03}", r / 8), pid: 10_000 + r, device: Some(format!("cuda:{}", r % 8)) })
        .collect();
    m.write(&dir).unwrap();
    let _ = ago;
    dir
}

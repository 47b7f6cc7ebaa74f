//! Turning parsed statistics lines into `stats` and `extra_stats` rows: one `stats` row per
//! (step, rank, module, GEMM, role) holding every mapped statistic, everything else kept by name.
//!
//! A tensor's statistics of the tensor itself (min, max, mean, std, amax, dynamic range) go to the
//! row of every GEMM that casts it; statistics of its cast go to the GEMM that cast feeds (rowwise:
//! fprop or dgrad; `_columnwise`: wgrad or dgrad, see [`names::gemm_of`]). Under per-tensor scaling
//! (delayed, current) the transposed cast has the same scale and values as the rowwise one, so its
//! statistics describe both GEMMs and are written to both.

use crate::import::te_debug::log::{LogLine, decimals};
use crate::import::te_debug::names::{self, Column, Target};
use fp8scope_schemas::names::Role;
use fp8scope_schemas::tables::{ExternalStatRow, ExtraStatRow};
use std::collections::{BTreeMap, BTreeSet};

/// One rank's parsed log, as the row builder takes it.
pub struct RankLines<'a> {
    pub rank: Option<u32>,
    pub lines: &'a [LogLine],
}

/// How the rows are built.
#[derive(Clone, Debug)]
pub struct RowOptions {
    /// TE's name of the training recipe (`fp8_delayed_scaling`, …), None for a run without FP8.
    pub training: Option<&'static str>,
    /// Whether the recipe scales per tensor (delayed, current): the transposed cast equals the
    /// rowwise one.
    pub per_tensor: bool,
    /// fp8scope step = iteration + this.
    pub step_offset: i64,
    /// The `format` column per role (None: unknown).
    pub format_of: fn(Role) -> Option<String>,
}

/// The rows and what building them counted.
#[derive(Debug, Default)]
pub struct Rows {
    pub stats: Vec<ExternalStatRow>,
    pub extra: Vec<ExtraStatRow>,
    /// Module paths in the order first seen (rank by rank, line by line).
    pub modules: Vec<String>,
    /// Lines read, lines mapped to a `stats` column, lines kept in `extra_stats`.
    pub lines: usize,
    pub mapped: usize,
    pub kept: usize,
    /// Values logged twice for one (rank, step, layer, tensor, stat): the later one is kept.
    pub duplicates: usize,
    /// `scale_inv_max` values written as 0 (rounded): kept in extra_stats, scale left null.
    pub scale_rounded_to_zero: usize,
    /// Values of a second statistic for a column another one already filled in the same row
    /// (`fp8_delayed_scaling_overflows%` beside `overflows%`): kept in extra_stats.
    pub second_for_column: usize,
    /// Decimals of every finite value, when they all have the same number.
    pub decimals: Option<u32>,
    pub steps: BTreeSet<u32>,
    /// Distinct statistic names: mapped and kept.
    pub mapped_names: BTreeSet<String>,
    pub kept_names: BTreeSet<String>,
}

/// Per (step, rank, module, tensor): the mapped values, of the tensor and of each cast, each with
/// the statistic that gave it.
#[derive(Default)]
struct Acc {
    tensor: BTreeMap<Column, (f64, String)>,
    rowwise: BTreeMap<Column, (f64, String)>,
    columnwise: BTreeMap<Column, (f64, String)>,
}

type Key = (u32, Option<u32>, String, String); // step, rank, module, tensor

/// The step of an iteration, or a one-line reason why it has none.
fn step_of(iteration: u64, offset: i64) -> Result<u32, String> {
    let s = iteration as i128 + offset as i128;
    u32::try_from(s).ok().filter(|&s| s >= 1).ok_or_else(|| format!("iteration {iteration} + step offset {offset} is not a step ≥ 1"))
}

/// Builds the rows from every rank's lines. Errors are (rank index, line number, message).
pub fn build_rows(ranks: &[RankLines], opts: &RowOptions) -> Result<Rows, (usize, usize, String)> {
    let mut rows = Rows::default();
    let mut acc: BTreeMap<Key, Acc> = BTreeMap::new();
    let mut extra: BTreeMap<(u32, Option<u32>, String, String, String), f64> = BTreeMap::new();
    let mut seen: BTreeSet<(Option<u32>, u32, String)> = BTreeSet::new();
    let mut module_set: BTreeSet<String> = BTreeSet::new();
    let mut decimal_set: BTreeSet<u32> = BTreeSet::new();
    for (ri, r) in ranks.iter().enumerate() {
        for l in r.lines {
            rows.lines += 1;
            let Some(n) = names::split_name(&l.name) else {
                return Err((
                    ri,
                    l.line,
                    format!("'{}' names no tensor (expected <layer>_<tensor>_<stat> with tensor one of {})", l.name, names::TENSORS.join(", ")),
                ));
            };
            let step = step_of(l.iteration, opts.step_offset).map_err(|m| (ri, l.line, m))?;
            rows.steps.insert(step);
            if module_set.insert(n.layer.to_string()) {
                rows.modules.push(n.layer.to_string());
            }
            if l.value.is_finite()
                && let Some(d) = decimals(&l.text)
            {
                decimal_set.insert(d);
            }
            if !seen.insert((r.rank, step, l.name.clone())) {
                rows.duplicates += 1;
            }
            let key: Key = (step, r.rank, n.layer.to_string(), n.tensor.to_string());
            let mut keep = || {
                extra.insert((step, r.rank, n.layer.to_string(), n.tensor.to_string(), n.stat.to_string()), l.value);
            };
            match names::target(n.stat, opts.training) {
                Target::Stats { column, columnwise } => match column.convert(l.value) {
                    Some(v) => {
                        let a = acc.entry(key).or_default();
                        let into = if !column.of_cast() {
                            &mut a.tensor
                        } else if columnwise {
                            &mut a.columnwise
                        } else {
                            &mut a.rowwise
                        };
                        match into.get(&column) {
                            // Another statistic filled this column: the first keeps it.
                            Some((_, by)) if by != n.stat => {
                                rows.second_for_column += 1;
                                rows.kept += 1;
                                rows.kept_names.insert(n.stat.to_string());
                                keep();
                            }
                            _ => {
                                into.insert(column, (v, n.stat.to_string()));
                                rows.mapped += 1;
                                rows.mapped_names.insert(n.stat.to_string());
                            }
                        }
                    }
                    None => {
                        rows.scale_rounded_to_zero += 1;
                        rows.kept += 1;
                        rows.kept_names.insert(n.stat.to_string());
                        keep();
                    }
                },
                Target::Extra => {
                    rows.kept += 1;
                    rows.kept_names.insert(n.stat.to_string());
                    keep();
                }
            }
        }
    }
    rows.decimals = if decimal_set.len() == 1 { decimal_set.first().copied() } else { None };
    for ((step, rank, module, tensor), a) in acc {
        let Some(role) = Role::parse(&tensor) else { continue };
        let mut emit = |columnwise: bool, cast: &BTreeMap<Column, (f64, String)>| {
            if a.tensor.is_empty() && cast.is_empty() {
                return;
            }
            let mut row = ExternalStatRow::new(step, rank, &module, names::gemm_of(role, columnwise), role);
            row.format = (opts.format_of)(role);
            for (c, (v, _)) in a.tensor.iter().chain(cast.iter()) {
                set(&mut row, *c, *v);
            }
            rows.stats.push(row);
        };
        emit(false, &a.rowwise);
        if role.is_quantized() {
            let cast = if !a.columnwise.is_empty() {
                &a.columnwise
            } else if opts.per_tensor {
                &a.rowwise
            } else {
                &BTreeMap::new()
            };
            emit(true, cast);
        }
    }
    rows.extra = extra
        .into_iter()
        .map(|((step, rank, module, tensor, stat), value)| ExtraStatRow {
            step,
            rank,
            layer: fp8scope_schemas::names::layer_of_module(&module),
            module,
            tensor,
            stat,
            value,
        })
        .collect();
    Ok(rows)
}

fn set(row: &mut ExternalStatRow, c: Column, v: f64) {
    match c {
        Column::Min => row.min = Some(v as f32),
        Column::Max => row.max = Some(v as f32),
        Column::Mean => row.mean = Some(v),
        Column::Std => row.std = Some(v),
        Column::Amax => row.amax = Some(v as f32),
        Column::DynamicRangeLog2 => row.dynamic_range_log2 = Some(v),
        Column::UnderflowFrac => row.underflow_frac = Some(v),
        Column::SaturatedFrac => row.saturated_frac = Some(v),
        Column::Scale => row.scale = Some(v as f32),
        Column::QuantMse => row.quant_mse = Some(v),
    }
}

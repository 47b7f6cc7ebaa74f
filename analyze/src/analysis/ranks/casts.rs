//! One pass over the casts table for the agreement, amax-group and audit checks.
//!
//! Window by window (a few tens of steps of every rank, see [`scan::windows`]), batches of ranks
//! are scanned with only the columns the checks need; each row is counted by the audits and laid
//! into the window's [`Store`]; once every rank's rows of the window are in, the groups' agreement
//! and the reduction sets are judged on it, and it is dropped. Every part is read once.

use super::agree::{self, Agreement};
use super::amax::{self, Amax};
use super::audits::{self, Audits};
use super::finding::Finding;
use super::keys::Keys;
use super::mesh::Mesh;
use super::rules::BATCH_ROWS;
use super::scan::{self, RankParts, WINDOW_ROWS};
use super::store::{Row, Store};
use crate::error::AnalyzeError;
use fp8scope_schemas::config::RecipeKind;
use fp8scope_schemas::layout::Table;
use fp8scope_schemas::names::SiteNaming;
use fp8scope_schemas::tables::col as c;
use polars::prelude::*;
use std::collections::BTreeSet;
use std::path::Path;

/// What the casts checks found and counted.
#[derive(Default, Debug)]
pub struct CastsResult {
    pub findings: Vec<Finding>,
    pub rows: u64,
    /// Windows of steps the table was read in.
    pub windows: usize,
    /// (instance, step, tensor) groups compared by the agreement checks.
    pub agreement_compared: i64,
    /// Casts whose reduction set was checked.
    pub amax_checked: i64,
    /// Casts with the cast audit, with the forward-weight audit.
    pub cast_audits: i64,
    pub weight_audits: i64,
    pub steps: BTreeSet<i64>,
    pub not_checked: Vec<String>,
}

const COLUMNS: [&str; 10] = [c::STEP, c::RANK, c::LAYER, c::MODULE, c::GEMM, c::ROLE, c::SCALE, c::AMAX_LOCAL, c::AMAX_USED, c::DIGEST];

/// Runs every casts check over `parts` (the casts table by rank).
pub fn check(run: &str, parts: &[RankParts], mesh: &Mesh, naming: &SiteNaming, recipe: RecipeKind) -> Result<CastsResult, AnalyzeError> {
    let e = |e: PolarsError| AnalyzeError::scan(run, "casts", e);
    let mut res = CastsResult { rows: parts.iter().map(|p| p.rows).sum(), ..Default::default() };
    let infer_reason = match recipe {
        RecipeKind::Delayed => Some("amax groups: the recipe is delayed scaling, whose amax_used comes from an amax history, not from this step's amaxes"),
        RecipeKind::Block | RecipeKind::Mxfp8 => Some("amax groups: block scaling keeps one scale per block, with no per-tensor amax reduction"),
        RecipeKind::Nvfp4 => Some("amax groups: nvfp4's tensor scale comes from each rank's own operand, with no amax reduction across ranks"),
        RecipeKind::Bf16 => Some("amax groups: the recipe is bf16 (no FP8 casts to reduce)"),
        RecipeKind::Current => None,
    };
    let members: Vec<Vec<Vec<u32>>> = (0..mesh.partitions.len()).map(|p| mesh.members(p)).collect();
    let mut keys = Keys::default();
    let (mut agreement, mut amaxes, mut audit) = (Agreement::default(), Amax::default(), Audits::default());
    let mut both_amaxes = 0u64;
    let mut cols: Vec<&str> = COLUMNS.to_vec();
    cols.extend(audits::COLUMNS);
    let windows = scan::windows(parts, WINDOW_ROWS);
    res.windows = windows.len();
    for w in &windows {
        let mut st = Store::new(mesh.n as usize);
        for batch in w.batches(BATCH_ROWS) {
            let which: Vec<(u32, Vec<&Path>)> = batch.iter().map(|(r, ps, _)| (*r, ps.iter().map(|p| p.path.as_path()).collect())).collect();
            let df = scan::load(run, Table::Casts, &which, &cols, w.filter.then_some((w.lo, w.hi)))?;
            let kid = keys.encode(&df).map_err(e)?;
            let weight: Vec<bool> = keys.list.iter().map(|k| k.role == "weight").collect();
            let (rank, step) = (scan::i64s(&df, c::RANK).map_err(e)?, scan::i64s(&df, c::STEP).map_err(e)?);
            let (scale, local, used) =
                (scan::f32s(&df, c::SCALE).map_err(e)?, scan::f32s(&df, c::AMAX_LOCAL).map_err(e)?, scan::f32s(&df, c::AMAX_USED).map_err(e)?);
            let digest = scan::i64s(&df, c::DIGEST).map_err(e)?;
            let (ac, am) = (scan::i64s(&df, c::AUDIT_CHECKED).map_err(e)?, scan::i64s(&df, c::AUDIT_MISMATCHED).map_err(e)?);
            let (mc, mm) = (scan::i64s(&df, c::MASTER_CHECKED).map_err(e)?, scan::i64s(&df, c::MASTER_MISMATCHED).map_err(e)?);
            let (mch, fch) = (scan::bools(&df, c::MASTER_CHANGED).map_err(e)?, scan::bools(&df, c::FORWARD_CHANGED).map_err(e)?);
            drop(df);
            for i in 0..kid.len() {
                let (Some(r), Some(s)) = (rank[i], step[i]) else { continue };
                let row = Row { kid: kid[i], rank: r.max(0) as u32, step: s, scale: scale[i], local: local[i], used: used[i], digest: digest[i] };
                both_amaxes += u64::from(row.local.is_some() && row.used.is_some());
                st.put(&row, weight[kid[i] as usize]);
                let x = audits::Cols {
                    audit_checked: ac[i],
                    audit_mismatched: am[i],
                    master_checked: mc[i],
                    master_mismatched: mm[i],
                    master_changed: mch[i],
                    forward_changed: fch[i],
                };
                audit.add(kid[i], row.rank, s, &x);
            }
        }
        res.steps.extend(st.steps.iter().copied());
        agree::check_window(&st, mesh, &members, &keys, &mut agreement);
        if infer_reason.is_none() {
            amax::check_window(&st, mesh, &keys, &mut amaxes);
        }
    }
    res.agreement_compared = agree::compared(&agreement);
    res.findings.extend(agree::findings(mesh, &agreement, &keys, naming));
    match infer_reason {
        Some(r) => res.not_checked.push(r.to_string()),
        None if both_amaxes == 0 => res.not_checked.push("amax groups: no cast has both amax_local and amax_used".into()),
        None => {
            res.amax_checked = amaxes.checked();
            res.findings.extend(amax::findings(mesh, &amaxes, &keys, naming));
        }
    }
    res.cast_audits = audit.cast_audits;
    res.weight_audits = audit.weight_audits;
    res.findings.extend(audit.findings(&keys, naming));
    Ok(res)
}

//! Integer ids for the tensors of a table (layer, module, role, gemm), the same in every batch.
//!
//! The cross-rank checks group millions of rows by tensor, step and group instance; with the tensor
//! as four columns, two of them strings, every group-by and join hashes and copies those strings.
//! Each batch's rows are given one `kid` (UInt32) instead, from a dictionary that grows as batches
//! bring tensors it has not seen, and the strings are dropped.

use crate::load::{i64s, strs};
use fp8scope_schemas::tables::col as c;
use polars::prelude::*;
use std::collections::HashMap;

/// Name of the tensor-id column.
pub const KID: &str = "kid";

/// One tensor of a table.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub layer: i64,
    pub module: String,
    pub role: String,
    pub gemm: String,
}

/// The dictionary of tensor ids.
#[derive(Default, Debug)]
pub struct Keys {
    ids: HashMap<Key, u32>,
    /// The tensors by id.
    pub list: Vec<Key>,
}

impl Keys {
    /// `df` with its layer, module, role and gemm columns replaced by `kid` (last).
    pub fn encode(&mut self, df: DataFrame) -> PolarsResult<DataFrame> {
        let keys = [c::LAYER, c::MODULE, c::ROLE, c::GEMM];
        let distinct = df.clone().lazy().select(keys.map(col)).unique(None, UniqueKeepStrategy::Any).collect()?;
        let (la, mo, ro, ge) = (i64s(&distinct, c::LAYER)?, strs(&distinct, c::MODULE)?, strs(&distinct, c::ROLE)?, strs(&distinct, c::GEMM)?);
        let n = distinct.height();
        let (mut l, mut m, mut r, mut g, mut k) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n {
            let key = Key {
                layer: la[i].unwrap_or(0),
                module: mo[i].clone().unwrap_or_default(),
                role: ro[i].clone().unwrap_or_default(),
                gemm: ge[i].clone().unwrap_or_default(),
            };
            let next = self.list.len() as u32;
            let id = *self.ids.entry(key.clone()).or_insert_with(|| {
                self.list.push(key.clone());
                next
            });
            l.push(key.layer as i32);
            m.push(key.module);
            r.push(key.role);
            g.push(key.gemm);
            k.push(id);
        }
        let map = DataFrame::new(
            n,
            vec![
                Column::new(c::LAYER.into(), l),
                Column::new(c::MODULE.into(), m),
                Column::new(c::ROLE.into(), r),
                Column::new(c::GEMM.into(), g),
                Column::new(KID.into(), k),
            ],
        )?;
        let rest: Vec<Expr> = df.get_column_names().into_iter().filter(|n| !keys.contains(&n.as_str())).map(|n| col(n.clone())).chain([col(KID)]).collect();
        let on: Vec<Expr> = keys.iter().map(|k| col(*k)).collect();
        df.lazy()
            .with_column(col(c::LAYER).cast(DataType::Int32))
            .join(map.lazy(), on.clone(), on, JoinArgs::new(JoinType::Inner))
            .select(rest)
            .collect()
    }

    /// The ids of the tensors of `role`.
    pub fn of_role(&self, role: &str) -> Vec<u32> {
        self.list.iter().enumerate().filter(|(_, k)| k.role == role).map(|(i, _)| i as u32).collect()
    }

    /// The roles present, sorted.
    pub fn roles(&self) -> Vec<String> {
        let mut r: Vec<String> = self.list.iter().map(|k| k.role.clone()).collect();
        r.sort();
        r.dedup();
        r
    }

    pub fn get(&self, kid: u32) -> Option<&Key> {
        self.list.get(kid as usize)
    }
}

/// `kid ∈ ids` as an expression (false for every row when `ids` is empty).
pub fn kid_in(ids: &[u32]) -> Expr {
    if ids.is_empty() {
        return lit(false);
    }
    col(KID).is_in(lit(Series::new("ids".into(), ids.to_vec())).implode(false), false)
}

//! Integer ids for the tensors of a table (layer, module, role, gemm), the same in every batch.
//!
//! The cross-rank checks look at millions of rows by tensor, step and rank; with the tensor as four
//! columns, two of them strings, every lookup would hash those strings. Each batch's rows are given
//! one tensor id instead: each string column is mapped through a small per-batch dictionary (a
//! batch holds a few hundred distinct names), the four ids combined, and the combination looked up
//! once per distinct tensor in a dictionary that grows as batches bring tensors it has not seen.

use fp8scope_schemas::tables::col as c;
use polars::prelude::*;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FxHash (rustc's hasher): one multiply-rotate per word; the keys here are short names and small
/// integers, which SipHash's collision resistance is not needed for.
#[derive(Default, Clone, Copy)]
pub struct Fx(u64);

impl Fx {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for Fx {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for ch in &mut chunks {
            self.add(u64::from_le_bytes([ch[0], ch[1], ch[2], ch[3], ch[4], ch[5], ch[6], ch[7]]));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_i32(&mut self, i: i32) {
        self.add(i as u32 as u64);
    }
    #[inline]
    fn write_i64(&mut self, i: i64) {
        self.add(i as u64);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A hash map with [`Fx`].
pub type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

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

/// Ids of the distinct strings of one column of a batch.
struct Names<'a> {
    ids: FxMap<&'a str, u32>,
    names: Vec<&'a str>,
}

impl<'a> Names<'a> {
    fn new() -> Self {
        Names { ids: FxMap::default(), names: Vec::new() }
    }
    #[inline]
    fn id(&mut self, s: &'a str) -> u32 {
        if let Some(&i) = self.ids.get(s) {
            return i;
        }
        let i = self.names.len() as u32;
        self.ids.insert(s, i);
        self.names.push(s);
        i
    }
}

impl Keys {
    /// The tensor id of every row of `df` (from its layer, module, role and gemm columns).
    pub fn encode(&mut self, df: &DataFrame) -> PolarsResult<Vec<u32>> {
        let layer = df.column(c::LAYER)?.cast(&DataType::Int32)?;
        let layer = layer.i32()?;
        let (module, role, gemm) = (df.column(c::MODULE)?.str()?, df.column(c::ROLE)?.str()?, df.column(c::GEMM)?.str()?);
        let (mut mn, mut rn, mut gn) = (Names::new(), Names::new(), Names::new());
        let mut combos: FxMap<(i32, u32, u32, u32), u32> = FxMap::default();
        let mut out = Vec::with_capacity(df.height());
        for (((l, m), r), g) in layer.iter().zip(module.iter()).zip(role.iter()).zip(gemm.iter()) {
            let key = (l.unwrap_or(0), mn.id(m.unwrap_or("")), rn.id(r.unwrap_or("")), gn.id(g.unwrap_or("")));
            let id = match combos.get(&key) {
                Some(&id) => id,
                None => {
                    let k = Key {
                        layer: key.0 as i64,
                        module: mn.names[key.1 as usize].to_string(),
                        role: rn.names[key.2 as usize].to_string(),
                        gemm: gn.names[key.3 as usize].to_string(),
                    };
                    let next = self.list.len() as u32;
                    let id = *self.ids.entry(k.clone()).or_insert_with(|| {
                        self.list.push(k);
                        next
                    });
                    combos.insert(key, id);
                    id
                }
            };
            out.push(id);
        }
        Ok(out)
    }

    pub fn get(&self, kid: u32) -> Option<&Key> {
        self.list.get(kid as usize)
    }
}

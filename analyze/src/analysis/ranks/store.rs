//! One window of the casts table laid out by tensor, step and rank, so that the ranks of any group
//! at one step are a few array reads apart.
//!
//! Per tensor id a block holds, for each (step of the window, rank), which values the row has and
//! the values: the scale's bits, `amax_local`, `amax_used`, and for weights the digest (the only
//! role whose bytes replicas share). Entry `sidx·n + rank`, with steps numbered as they arrive;
//! [`Store::order`] gives them sorted.

use super::keys::FxMap;

/// The row exists.
pub const ROW: u8 = 1;
pub const SCALE: u8 = 2;
pub const LOCAL: u8 = 4;
pub const USED: u8 = 8;
pub const DIGEST: u8 = 16;

/// One tensor's values over the window.
#[derive(Default, Debug)]
pub struct Block {
    pub flags: Vec<u8>,
    pub scale: Vec<u32>,
    pub local: Vec<f32>,
    pub used: Vec<f32>,
    /// Empty unless the tensor is a weight.
    pub digest: Vec<i64>,
}

/// The window's blocks.
#[derive(Debug)]
pub struct Store {
    /// Ranks 0..n.
    pub n: usize,
    /// The steps by index.
    pub steps: Vec<i64>,
    sidx: FxMap<i64, usize>,
    /// By tensor id (None: no row of it in the window).
    pub blocks: Vec<Option<Block>>,
}

/// One row of the casts table.
pub struct Row {
    pub kid: u32,
    pub rank: u32,
    pub step: i64,
    pub scale: Option<f32>,
    pub local: Option<f32>,
    pub used: Option<f32>,
    pub digest: Option<i64>,
}

impl Store {
    pub fn new(n: usize) -> Store {
        Store { n, steps: Vec::new(), sidx: FxMap::default(), blocks: Vec::new() }
    }

    /// Stores a row (`weight`: keep its digest). Ranks ≥ n are ignored.
    pub fn put(&mut self, row: &Row, weight: bool) {
        let rank = row.rank as usize;
        if rank >= self.n {
            return;
        }
        let next = self.steps.len();
        let s = *self.sidx.entry(row.step).or_insert(next);
        if s == next {
            self.steps.push(row.step);
        }
        let k = row.kid as usize;
        if self.blocks.len() <= k {
            self.blocks.resize_with(k + 1, || None);
        }
        let b = self.blocks[k].get_or_insert_with(Block::default);
        let need = (s + 1) * self.n;
        if b.flags.len() < need {
            b.flags.resize(need, 0);
            b.scale.resize(need, 0);
            b.local.resize(need, 0.0);
            b.used.resize(need, 0.0);
            if weight {
                b.digest.resize(need, 0);
            }
        }
        let i = s * self.n + rank;
        let mut f = ROW;
        if let Some(x) = row.scale {
            b.scale[i] = x.to_bits();
            f |= SCALE;
        }
        if let Some(x) = row.local {
            b.local[i] = x;
            f |= LOCAL;
        }
        if let Some(x) = row.used {
            b.used[i] = x;
            f |= USED;
        }
        if let (Some(x), true) = (row.digest, weight) {
            b.digest[i] = x;
            f |= DIGEST;
        }
        b.flags[i] = f;
    }

    /// The step indices sorted by step.
    pub fn order(&self) -> Vec<usize> {
        let mut o: Vec<usize> = (0..self.steps.len()).collect();
        o.sort_by_key(|&s| self.steps[s]);
        o
    }
}

impl Block {
    /// The flags of (step index, rank), 0 when absent.
    #[inline]
    pub fn flags(&self, i: usize) -> u8 {
        self.flags.get(i).copied().unwrap_or(0)
    }
}

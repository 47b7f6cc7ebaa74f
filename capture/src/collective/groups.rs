//! A rank's process groups on a dp × tp mesh: its data-parallel group (the ranks holding the same
//! shard of the model, each on its rows of the batch) and its tensor-parallel group (the ranks
//! sharing one layer stack, on the same rows). Ranks are numbered tensor-parallel first, as
//! Megatron-LM numbers them: rank = d·TP + t, so a tp group is TP consecutive ranks.
//!
//! A job of one rank has two [`OneRank`]s; a data-parallel job a tp group of one. A rank that fails
//! aborts both its groups, so every rank waiting on it in either is released, and a rank released
//! that way aborts its other group in turn.

use super::{Collective, OneRank, ThreadGroup};

/// One rank's groups.
pub struct RankGroups {
    /// This rank in the job, 0-based, and the job's ranks.
    pub rank: u32,
    pub world: u32,
    /// The ranks holding the same model shard (rank order = batch row order).
    pub dp: Box<dyn Collective>,
    /// The ranks sharing one layer stack.
    pub tp: Box<dyn Collective>,
}

impl RankGroups {
    /// The groups of a job of one rank.
    pub fn one() -> RankGroups {
        RankGroups { rank: 0, world: 1, dp: Box::new(OneRank), tp: Box::new(OneRank) }
    }

    /// The groups of every rank of a `dp` × `tp` mesh of threads, in rank order.
    pub fn mesh(dp: u32, tp: u32) -> Vec<RankGroups> {
        let mut dps: Vec<_> = (0..tp).map(|t| ThreadGroup::of_ranks((0..dp).map(|d| d * tp + t).collect()).into_iter()).collect();
        let mut tps: Vec<_> = (0..dp).map(|d| ThreadGroup::of_ranks((0..tp).map(|t| d * tp + t).collect()).into_iter()).collect();
        let mut out = Vec::with_capacity((dp * tp) as usize);
        for d in 0..dp {
            for t in 0..tp {
                let dp_h = dps[t as usize].next().expect("one dp handle per rank");
                let tp_h = tps[d as usize].next().expect("one tp handle per rank");
                out.push(RankGroups { rank: d * tp + t, world: dp * tp, dp: Box::new(dp_h), tp: Box::new(tp_h) });
            }
        }
        out
    }

    /// This rank's index in its data-parallel group (its rows of the batch).
    pub fn dp_index(&self) -> u32 {
        self.dp.rank()
    }

    /// This rank failed: every collective of both its groups returns an error naming it.
    pub fn abort(&mut self, reason: &str) {
        self.dp.abort(reason);
        self.tp.abort(reason);
    }

    /// This rank is done and leaves both groups cleanly.
    pub fn close(&mut self) {
        self.dp.close();
        self.tp.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a 2 × 3 mesh: a tp group is 3 consecutive ranks, a dp group the ranks 3 apart; a sum over
    /// each group sees exactly its members.
    #[test]
    fn groups_of_a_mesh_hold_the_megatron_ranks() {
        let got: Vec<(u32, f32, f32)> = std::thread::scope(|s| {
            let hs: Vec<_> = RankGroups::mesh(2, 3)
                .into_iter()
                .map(|mut g| {
                    s.spawn(move || {
                        let mut a = [g.rank as f32];
                        g.tp.all_reduce_sum_f32(&mut a).expect("tp");
                        let mut b = [g.rank as f32];
                        g.dp.all_reduce_sum_f32(&mut b).expect("dp");
                        g.close();
                        (g.rank, a[0], b[0])
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank")).collect()
        });
        // tp groups {0,1,2} {3,4,5}; dp groups {0,3} {1,4} {2,5}.
        assert_eq!(got, vec![(0, 3.0, 3.0), (1, 3.0, 5.0), (2, 3.0, 7.0), (3, 12.0, 3.0), (4, 12.0, 5.0), (5, 12.0, 7.0)]);
    }

    /// Rank 3 of a 2 × 2 mesh fails: rank 0, which shares no group with it, is released too (rank 1
    /// and rank 2 fail in their groups with 3 and abort their other groups), and every error names
    /// the job's rank, not the rank within its group.
    #[test]
    fn a_failed_rank_releases_the_whole_mesh() {
        let got: Vec<Option<u32>> = std::thread::scope(|s| {
            let hs: Vec<_> = RankGroups::mesh(2, 2)
                .into_iter()
                .map(|mut g| {
                    s.spawn(move || {
                        if g.rank == 3 {
                            g.abort("planted");
                            return Some(3);
                        }
                        // Rank 0 waits in its tp group (with 1), rank 1 in its dp group (with 3).
                        let mut x = [1.0f32];
                        let r = if g.rank == 1 { g.dp.all_reduce_sum_f32(&mut x) } else { g.tp.all_reduce_sum_f32(&mut x) };
                        match r {
                            Err(crate::collective::CollectiveError::Aborted { rank, .. }) => {
                                g.abort("released");
                                Some(rank)
                            }
                            _ => None,
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank")).collect()
        });
        // Each names the job's rank that released it: 1 and 2 the planted rank 3, 0 rank 1.
        assert_eq!(got, vec![Some(1), Some(3), Some(3), Some(3)]);
    }
}

//! N ranks as threads of one process. Each collective is a rendezvous: every rank deposits its
//! buffer, the last to arrive reduces them **in rank order** (rank 0's values, then rank 1's added,
//! …) and wakes the others, who copy the result. The same inputs give the same bits on every run,
//! whatever order the threads arrive in.
//!
//! A rank that aborts, or whose handle is dropped without [`Collective::close`] (its thread
//! returned or panicked mid-run), ends the group: every pending and later collective of the other
//! ranks returns [`CollectiveError::Aborted`] naming it.

use super::{Collective, CollectiveError, max_nan};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Sum,
    Max,
    Gather,
    Barrier,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Sum => "all_reduce_sum",
            Op::Max => "all_reduce_max",
            Op::Gather => "all_gather",
            Op::Barrier => "barrier",
        }
    }
}

struct State {
    /// Collectives completed so far.
    generation: u64,
    /// Ranks that deposited for the pending collective.
    arrived: u32,
    /// The pending collective as its first rank called it: (op, length, rank).
    pending: Option<(Op, usize, u32)>,
    slots: Vec<Vec<f32>>,
    /// The last completed collective's result.
    result: Arc<Vec<f32>>,
    aborted: Option<(u32, String)>,
    closed: Vec<bool>,
}

struct Shared {
    world: u32,
    /// The job's rank of each member (errors name these: a group of a mesh is not the whole job).
    names: Vec<u32>,
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A rank that panicked while holding the lock left the state consistent (every update is
        // made before anything can panic), so the poison is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Makes the handles of a group of `world` ranks, one per rank, in rank order; each goes to its
/// rank's thread.
pub struct ThreadGroup;

impl ThreadGroup {
    #[allow(clippy::new_ret_no_self)]
    pub fn new(world: u32) -> Vec<ThreadRank> {
        Self::of_ranks((0..world).collect())
    }

    /// The handles of a group whose members are the job's ranks `names`, in group order (member i
    /// is the group's rank i); errors name the job's ranks.
    pub fn of_ranks(names: Vec<u32>) -> Vec<ThreadRank> {
        let world = names.len() as u32;
        assert!(world >= 1, "a group has at least one rank");
        let shared = Arc::new(Shared {
            world,
            names,
            state: Mutex::new(State {
                generation: 0,
                arrived: 0,
                pending: None,
                slots: vec![Vec::new(); world as usize],
                result: Arc::new(Vec::new()),
                aborted: None,
                closed: vec![false; world as usize],
            }),
            wake: Condvar::new(),
        });
        (0..world).map(|rank| ThreadRank { rank, shared: shared.clone(), closed: false }).collect()
    }
}

/// One rank's handle on its group.
pub struct ThreadRank {
    rank: u32,
    shared: Arc<Shared>,
    closed: bool,
}

/// Why the group can do no more collectives, if it cannot (the rank named as the job's).
fn broken(st: &State, names: &[u32]) -> Option<CollectiveError> {
    if let Some((rank, reason)) = &st.aborted {
        return Some(CollectiveError::Aborted { rank: *rank, reason: reason.clone() });
    }
    let closed = st.closed.iter().position(|&c| c)?;
    Some(CollectiveError::Aborted { rank: names[closed], reason: "it closed its collectives and left the group".into() })
}

impl ThreadRank {
    /// This member's rank in the job.
    fn name(&self) -> u32 {
        self.shared.names[self.rank as usize]
    }

    fn collective(&mut self, op: Op, data: &[f32]) -> Result<Arc<Vec<f32>>, CollectiveError> {
        let world = self.shared.world;
        let mut st = self.shared.lock();
        if let Some(e) = broken(&st, &self.shared.names) {
            return Err(e);
        }
        match st.pending {
            None => st.pending = Some((op, data.len(), self.name())),
            Some((first_op, first_len, first_rank)) if first_op != op || first_len != data.len() => {
                let e = CollectiveError::Mismatch { rank: self.name(), op: op.name(), len: data.len(), first_rank, first_op: first_op.name(), first_len };
                st.aborted = Some((self.name(), e.to_string()));
                self.shared.wake.notify_all();
                return Err(e);
            }
            Some(_) => {}
        }
        st.slots[self.rank as usize] = data.to_vec();
        st.arrived += 1;
        let mine = st.generation;
        if st.arrived == world {
            let slots = std::mem::replace(&mut st.slots, vec![Vec::new(); world as usize]);
            st.result = Arc::new(reduce(op, slots));
            st.arrived = 0;
            st.pending = None;
            st.generation += 1;
            self.shared.wake.notify_all();
            return Ok(st.result.clone());
        }
        loop {
            st = self.shared.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            if st.generation != mine {
                return Ok(st.result.clone());
            }
            if let Some(e) = broken(&st, &self.shared.names) {
                return Err(e);
            }
        }
    }
}

/// Every rank's buffer combined, in rank order.
fn reduce(op: Op, slots: Vec<Vec<f32>>) -> Vec<f32> {
    let mut it = slots.into_iter();
    match op {
        Op::Barrier => Vec::new(),
        Op::Gather => it.flatten().collect(),
        Op::Sum | Op::Max => {
            let mut acc = it.next().unwrap_or_default();
            for s in it {
                for (a, b) in acc.iter_mut().zip(s) {
                    *a = if op == Op::Sum { *a + b } else { max_nan(*a, b) };
                }
            }
            acc
        }
    }
}

impl Collective for ThreadRank {
    fn rank(&self) -> u32 {
        self.rank
    }
    fn world_size(&self) -> u32 {
        self.shared.world
    }
    fn all_reduce_sum_f32(&mut self, buf: &mut [f32]) -> Result<(), CollectiveError> {
        let r = self.collective(Op::Sum, buf)?;
        buf.copy_from_slice(&r);
        Ok(())
    }
    fn all_reduce_max_f32(&mut self, buf: &mut [f32]) -> Result<(), CollectiveError> {
        let r = self.collective(Op::Max, buf)?;
        buf.copy_from_slice(&r);
        Ok(())
    }
    fn all_gather_f32(&mut self, local: &[f32]) -> Result<Vec<f32>, CollectiveError> {
        // The lengths must agree (every rank holds an equal shard), which the rendezvous checks.
        Ok(self.collective(Op::Gather, local)?.as_ref().clone())
    }
    fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.collective(Op::Barrier, &[]).map(|_| ())
    }
    fn abort(&mut self, reason: &str) {
        let mut st = self.shared.lock();
        if st.aborted.is_none() {
            st.aborted = Some((self.name(), reason.to_string()));
        }
        self.shared.wake.notify_all();
    }
    fn close(&mut self) {
        self.closed = true;
        let mut st = self.shared.lock();
        st.closed[self.rank as usize] = true;
        self.shared.wake.notify_all();
    }
}

impl Drop for ThreadRank {
    fn drop(&mut self) {
        if !self.closed {
            let why = if std::thread::panicking() { "its thread panicked" } else { "it stopped without closing its collectives" };
            self.abort(why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Runs `f(rank handle)` on one thread per rank and returns the results in rank order.
    fn on_ranks<T: Send + 'static>(world: u32, f: impl Fn(ThreadRank) -> T + Send + Sync + 'static) -> Vec<T> {
        let f = Arc::new(f);
        let hs: Vec<_> = ThreadGroup::new(world)
            .into_iter()
            .map(|h| {
                let f = f.clone();
                std::thread::spawn(move || f(h))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    }

    /// Values whose float sum depends on the order of the additions: (1e8 + 1) − 1e8 = 0 in f32, but
    /// 1e8 − 1e8 + 1 = 1. Rank order gives ((r0 + r1) + r2) + r3 on every run and every rank.
    #[test]
    fn sums_are_made_in_rank_order_every_time() {
        let vals = [1e8f32, 1.0, -1e8, 0.5];
        let want = ((vals[0] + vals[1]) + vals[2]) + vals[3];
        for _ in 0..50 {
            let got = on_ranks(4, move |mut c| {
                // Let the threads arrive in another order each time.
                std::thread::sleep(Duration::from_micros((3 - c.rank()) as u64 * 50));
                let mut b = vec![vals[c.rank() as usize], c.rank() as f32];
                c.all_reduce_sum_f32(&mut b).expect("sum");
                c.close();
                b
            });
            for b in got {
                assert_eq!(b[0].to_bits(), want.to_bits());
                assert_eq!(b[1], 6.0);
            }
        }
    }

    #[test]
    fn max_keeps_nan_gather_keeps_rank_order_and_collectives_chain() {
        let got = on_ranks(3, |mut c| {
            let r = c.rank();
            let mut m = vec![r as f32, if r == 1 { f32::NAN } else { 0.0 }];
            c.all_reduce_max_f32(&mut m).expect("max");
            let g = c.all_gather_f32(&[r as f32 * 10.0, r as f32 * 10.0 + 1.0]).expect("gather");
            c.barrier().expect("barrier");
            let mut total = 0.0;
            for i in 0..200 {
                let mut b = [i as f32 + r as f32];
                c.all_reduce_sum_f32(&mut b).expect("sum");
                total += b[0];
            }
            c.close();
            (m, g, total)
        });
        for (m, g, total) in got {
            assert_eq!(m[0], 2.0);
            assert!(m[1].is_nan(), "a NaN amax must survive the max");
            assert_eq!(g, vec![0.0, 1.0, 10.0, 11.0, 20.0, 21.0]);
            assert_eq!(total, (0..200).map(|i| 3.0 * i as f32 + 3.0).sum::<f32>());
        }
    }

    /// A rank that aborts mid-run, and a rank whose thread returns without closing: the others'
    /// pending collectives return an error naming it instead of waiting forever.
    #[test]
    fn a_failed_or_vanished_rank_releases_the_others() {
        let got = on_ranks(3, |mut c| {
            let mut b = [1.0f32];
            c.all_reduce_sum_f32(&mut b).expect("first sum");
            match c.rank() {
                1 => {
                    c.abort("planted failure");
                    Ok(())
                }
                _ => c.all_reduce_sum_f32(&mut b),
            }
        });
        assert_eq!(got[0], Err(CollectiveError::Aborted { rank: 1, reason: "planted failure".into() }));
        assert_eq!(got[2], got[0]);
        let got = on_ranks(2, |mut c| {
            if c.rank() == 0 {
                std::thread::sleep(Duration::from_millis(20));
                return Ok(()); // dropped without close()
            }
            c.barrier()
        });
        assert!(matches!(&got[1], Err(CollectiveError::Aborted { rank: 0, reason }) if reason.contains("without closing")), "{:?}", got[1]);
    }

    #[test]
    fn mismatched_calls_are_an_error_not_a_mix() {
        let got = on_ranks(2, |mut c| {
            if c.rank() == 0 {
                let mut b = [0.0f32; 3];
                c.all_reduce_sum_f32(&mut b)
            } else {
                std::thread::sleep(Duration::from_millis(10));
                let mut b = [0.0f32; 2];
                c.all_reduce_sum_f32(&mut b)
            }
        });
        assert!(matches!(got[1], Err(CollectiveError::Mismatch { rank: 1, len: 2, first_len: 3, .. })), "{:?}", got[1]);
        assert!(matches!(got[0], Err(CollectiveError::Aborted { rank: 1, .. })), "{:?}", got[0]);
    }
}

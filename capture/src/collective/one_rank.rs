//! The collective of a job of one rank: every reduction is the identity and returns at once.

use super::{Collective, CollectiveError};

/// One rank, alone.
#[derive(Debug, Default, Clone, Copy)]
pub struct OneRank;

impl Collective for OneRank {
    fn rank(&self) -> u32 {
        0
    }
    fn world_size(&self) -> u32 {
        1
    }
    fn all_reduce_sum_f32(&mut self, _buf: &mut [f32]) -> Result<(), CollectiveError> {
        Ok(())
    }
    fn all_reduce_max_f32(&mut self, _buf: &mut [f32]) -> Result<(), CollectiveError> {
        Ok(())
    }
    fn all_gather_f32(&mut self, local: &[f32]) -> Result<Vec<f32>, CollectiveError> {
        Ok(local.to_vec())
    }
    fn barrier(&mut self) -> Result<(), CollectiveError> {
        Ok(())
    }
    fn abort(&mut self, _reason: &str) {}
    fn close(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rank_changes_nothing() {
        let mut c = OneRank;
        let mut b = [1.0f32, f32::NAN, -3.0];
        c.all_reduce_sum_f32(&mut b).unwrap();
        c.all_reduce_max_f32(&mut b).unwrap();
        assert_eq!((b[0], b[1].is_nan(), b[2]), (1.0, true, -3.0));
        assert_eq!(c.all_gather_f32(&[2.0]).unwrap(), vec![2.0]);
        assert_eq!((c.rank(), c.world_size()), (0, 1));
    }
}

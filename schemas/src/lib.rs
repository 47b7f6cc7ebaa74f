//! placeholder during dependency warm-up

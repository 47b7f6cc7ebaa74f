//! Recording: turning a step's measurements into table rows ([`rows`]) and writing them on a
//! separate thread ([`writer`]) so that Parquet encoding never sits on the training loop.

pub mod rows;
pub mod writer;

//! fp8scope-schemas: the contract between `fp8-capture` (which writes runs) and `fp8-analyze`
//! (which reads them).
//!
//! It defines, once:
//! - the run-directory layout ([`layout`]),
//! - the manifest `run.json` and the full run configuration ([`manifest`], [`config`]),
//! - the names used everywhere for layers, modules, GEMMs and tensor roles ([`names`]),
//! - the Arrow schemas of the `steps`, `stats`, `tensors`, `events`, `shadow` and `extra_stats`
//!   tables with their column-name constants ([`tables`]),
//! - the crash-safe Parquet part writer and the checked part reader ([`parts`]),
//! - the quantization contract: element and scale formats, block shapes, and which operand gets
//!   which under each recipe ([`quant`]),
//! - all of the above as JSON for writers in other languages ([`export`]).
//!
//! A schema version travels in the manifest and in every Parquet file's key-value metadata; readers
//! refuse versions they do not know.

pub mod config;
pub mod element_formats;
pub mod error;
pub mod export;
pub mod layout;
pub mod manifest;
pub mod names;
pub mod parts;
pub mod quant;
pub mod ranks;
pub mod tables;

pub use error::SchemaError;

/// The Arrow crate this contract is written against, for readers that want the same types.
pub use arrow as arrow_reexport;

/// The version of the run format written by this build. Bump it on any change to a table's columns,
/// the manifest's fields or the layout; readers accept exactly the versions in
/// [`SUPPORTED_SCHEMA_VERSIONS`].
///
/// History: 1, the first format; 2 added the manifest's `source` and `origin`, the stats table's
/// `amax_channel` and `top_channel_sq_frac` and its nullable `rank` (at the end; its statistics
/// became nullable, since runs from elsewhere lack some), and the `extra_stats` table. A version-1
/// run reads as a version-2 run without them ([`tables::STATS_COLUMNS_SINCE_V2`]); 3 made runs
/// multi-rank: a nullable `rank` at the end of every table, the `casts` table (the module's own FP8
/// casts and the integrity audits), parts partitioned by rank (`stats/rank=00003/part-*.parquet`),
/// per-rank liveness files (`ranks/rank=00003.json`), and the manifest's `host`, `heartbeat_at`,
/// `world_size`, `parallel` and `ranks`. Older runs read with those columns null, one rank, and no
/// heartbeat.
pub const SCHEMA_VERSION: u32 = 3;

/// Versions this build can read.
pub const SUPPORTED_SCHEMA_VERSIONS: &[u32] = &[1, 2, 3];

/// Key of the schema version in each Parquet file's key-value metadata.
pub const META_SCHEMA_VERSION: &str = "fp8scope.schema_version";
/// Key of the table name in each Parquet file's key-value metadata.
pub const META_TABLE: &str = "fp8scope.table";

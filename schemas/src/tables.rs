//! The Arrow schemas of a run's tables, their column names, and typed rows with batch builders.
//!
//! Each table's schema is defined once here ([`schema`]) and handed out by reference; the row
//! structs are how `fp8-capture` (and tests that plant known values) produce batches, and
//! [`ExternalStatRow`] / [`ExtraStatRow`] how runs from elsewhere (`fp8-analyze import`) do.
//! Field-by-field documentation lives in `schemas/README.md`.

use crate::layout::Table;
use crate::names::{Gemm, Module, Role, layer_of_module};
use arrow::array::{
    ArrayRef, BinaryBuilder, BooleanArray, Float32Array, Float32Builder, Float64Array, Int32Array, Int64Array, Int64Builder, ListBuilder, StringArray,
    UInt32Builder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use std::sync::{Arc, LazyLock};

/// Column names, shared by writer, reader, SQL and reports.
pub mod col {
    pub const STEP: &str = "step";
    pub const LOSS: &str = "loss";
    pub const GRAD_NORM: &str = "grad_norm";
    pub const LR: &str = "lr";
    pub const TOKENS: &str = "tokens";
    pub const STEP_MS: &str = "step_ms";
    pub const LOSS_IS_FINITE: &str = "loss_is_finite";
    pub const NONFINITE_TENSORS: &str = "nonfinite_tensors";

    pub const LAYER: &str = "layer";
    pub const MODULE: &str = "module";
    pub const GEMM: &str = "gemm";
    pub const ROLE: &str = "role";
    pub const FORMAT: &str = "format";
    pub const SCALE: &str = "scale";
    pub const AMAX: &str = "amax";
    pub const AMAX_USED: &str = "amax_used";
    pub const NUMEL: &str = "numel";
    pub const UNDERFLOW_FRAC: &str = "underflow_frac";
    pub const SATURATED_FRAC: &str = "saturated_frac";
    pub const NAN_COUNT: &str = "nan_count";
    pub const INF_COUNT: &str = "inf_count";
    pub const ZERO_FRAC: &str = "zero_frac";
    pub const MIN: &str = "min";
    pub const MAX: &str = "max";
    pub const MEAN: &str = "mean";
    pub const STD: &str = "std";
    pub const DYNAMIC_RANGE_LOG2: &str = "dynamic_range_log2";
    pub const QUANT_MSE: &str = "quant_mse";
    pub const QUANT_COS: &str = "quant_cos";
    pub const AMAX_CHANNEL: &str = "amax_channel";
    pub const TOP_CHANNEL_SQ_FRAC: &str = "top_channel_sq_frac";
    pub const RANK: &str = "rank";
    pub const TENSOR: &str = "tensor";
    pub const STAT: &str = "stat";

    pub const SOURCE: &str = "source";
    pub const AMAX_LOCAL: &str = "amax_local";
    pub const DIGEST: &str = "digest";
    pub const AUDIT_CHECKED: &str = "audit_checked";
    pub const AUDIT_MISMATCHED: &str = "audit_mismatched";
    pub const MASTER_CHECKED: &str = "master_checked";
    pub const MASTER_MISMATCHED: &str = "master_mismatched";
    pub const MASTER_CHANGED: &str = "master_changed";
    pub const FORWARD_CHANGED: &str = "forward_changed";

    pub const SHAPE: &str = "shape";
    pub const OFFSET: &str = "offset";
    pub const STRIDE: &str = "stride";
    pub const VALUES: &str = "values";
    pub const FP8: &str = "fp8";
    pub const BLOCK_SCALES: &str = "block_scales";
    pub const BLOCK_ROWS: &str = "block_rows";
    pub const BLOCK_COLS: &str = "block_cols";

    pub const KIND: &str = "kind";
    pub const VALUE: &str = "value";
    pub const MESSAGE: &str = "message";

    pub const COSINE: &str = "cosine";
    pub const MSE: &str = "mse";
    pub const REL_L2: &str = "rel_l2";
    pub const MAX_ABS_DIFF: &str = "max_abs_diff";
    pub const DUAL_INNER: &str = "dual_inner";
    pub const QUANT_BIAS: &str = "quant_bias";
    pub const FLIP_FRAC: &str = "flip_frac";
    pub const FLIP_RATIO: &str = "flip_ratio";
    pub const DUAL_NORM: &str = "dual_norm";
    pub const BLOCK_COUNT: &str = "block_count";
    pub const BLOCK_SCALE_LOG2_MEAN: &str = "block_scale_log2_mean";
    pub const BLOCK_SCALE_LOG2_STD: &str = "block_scale_log2_std";
    pub const BLOCK_SCALE_LOG2_MIN: &str = "block_scale_log2_min";
    pub const BLOCK_SCALE_LOG2_MAX: &str = "block_scale_log2_max";
    pub const BLOCK_SCALE_SATURATED_FRAC: &str = "block_scale_saturated_frac";
    pub const BLOCK_SCALE_FLUSHED_FRAC: &str = "block_scale_flushed_frac";
    pub const BLOCK_SCALE_LOG2_HIST: &str = "block_scale_log2_hist";
}

fn f(name: &str, dt: DataType, nullable: bool) -> Field {
    Field::new(name, dt, nullable)
}

fn list_of(dt: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", dt, true)))
}

static STEPS: LazyLock<SchemaRef> = LazyLock::new(|| {
    use col::*;
    Arc::new(Schema::new(vec![
        f(STEP, DataType::Int64, false),
        f(LOSS, DataType::Float64, false),
        f(GRAD_NORM, DataType::Float64, false),
        f(LR, DataType::Float64, false),
        f(TOKENS, DataType::Int64, false),
        f(STEP_MS, DataType::Float64, false),
        f(LOSS_IS_FINITE, DataType::Boolean, false),
        f(NONFINITE_TENSORS, DataType::Int32, false),
        // Since schema version 3, in every table: null in one-process runs.
        f(RANK, DataType::Int32, true),
    ]))
});

static STATS: LazyLock<SchemaRef> = LazyLock::new(|| {
    use col::*;
    // The statistics are nullable: a run from elsewhere has only those its source logged.
    // fp8-capture fills every one but quant_mse / quant_cos, and `rank` on runs of several ranks.
    Arc::new(Schema::new(vec![
        f(STEP, DataType::Int64, false),
        f(LAYER, DataType::Int32, false),
        f(MODULE, DataType::Utf8, false),
        f(GEMM, DataType::Utf8, false),
        f(ROLE, DataType::Utf8, false),
        f(FORMAT, DataType::Utf8, true),
        f(SCALE, DataType::Float32, true),
        f(AMAX, DataType::Float32, true),
        f(AMAX_USED, DataType::Float32, true),
        f(NUMEL, DataType::Int64, true),
        f(UNDERFLOW_FRAC, DataType::Float64, true),
        f(SATURATED_FRAC, DataType::Float64, true),
        f(NAN_COUNT, DataType::Int64, true),
        f(INF_COUNT, DataType::Int64, true),
        f(ZERO_FRAC, DataType::Float64, true),
        f(MIN, DataType::Float32, true),
        f(MAX, DataType::Float32, true),
        f(MEAN, DataType::Float64, true),
        f(STD, DataType::Float64, true),
        f(DYNAMIC_RANGE_LOG2, DataType::Float64, true),
        f(QUANT_MSE, DataType::Float64, true),
        f(QUANT_COS, DataType::Float64, true),
        // Since schema version 2; runs of version 1 read them as null (see `STATS_COLUMNS_SINCE_V2`).
        f(AMAX_CHANNEL, DataType::Int32, true),
        f(TOP_CHANNEL_SQ_FRAC, DataType::Float64, true),
        f(RANK, DataType::Int32, true),
        // Added within schema version 3, at the end; a part written before reads them as null.
        f(QUANT_BIAS, DataType::Float64, true),
        f(FLIP_FRAC, DataType::Float64, true),
        f(FLIP_RATIO, DataType::Float64, true),
        f(BLOCK_COUNT, DataType::Int64, true),
        f(BLOCK_SCALE_LOG2_MEAN, DataType::Float64, true),
        f(BLOCK_SCALE_LOG2_STD, DataType::Float64, true),
        f(BLOCK_SCALE_LOG2_MIN, DataType::Float64, true),
        f(BLOCK_SCALE_LOG2_MAX, DataType::Float64, true),
        f(BLOCK_SCALE_SATURATED_FRAC, DataType::Float64, true),
        f(BLOCK_SCALE_FLUSHED_FRAC, DataType::Float64, true),
        f(BLOCK_SCALE_LOG2_HIST, list_of(DataType::Int64), true),
    ]))
});

/// Columns of the stats table that schema version 1 did not have. A reader takes a version-1 part
/// as holding them all null; `SCHEMA_VERSION` 2 added them at the end, so every older column keeps
/// its position.
pub const STATS_COLUMNS_SINCE_V2: [&str; 2] = [col::AMAX_CHANNEL, col::TOP_CHANNEL_SQ_FRAC];

static TENSORS: LazyLock<SchemaRef> = LazyLock::new(|| {
    use col::*;
    Arc::new(Schema::new(vec![
        f(STEP, DataType::Int64, false),
        f(LAYER, DataType::Int32, false),
        f(MODULE, DataType::Utf8, false),
        f(ROLE, DataType::Utf8, false),
        f(GEMM, DataType::Utf8, true),
        f(FORMAT, DataType::Utf8, true),
        f(SHAPE, list_of(DataType::Int64), false),
        f(NUMEL, DataType::Int64, false),
        f(OFFSET, DataType::Int64, false),
        f(STRIDE, DataType::Int64, false),
        f(VALUES, list_of(DataType::Float32), false),
        f(FP8, DataType::Binary, true),
        f(SCALE, DataType::Float32, true),
        f(BLOCK_SCALES, list_of(DataType::Float32), true),
        f(BLOCK_ROWS, DataType::UInt32, true),
        f(BLOCK_COLS, DataType::UInt32, true),
        f(RANK, DataType::Int32, true),
    ]))
});

static EVENTS: LazyLock<SchemaRef> = LazyLock::new(|| {
    use col::*;
    Arc::new(Schema::new(vec![
        f(STEP, DataType::Int64, false),
        f(KIND, DataType::Utf8, false),
        f(LAYER, DataType::Int32, true),
        f(MODULE, DataType::Utf8, true),
        f(GEMM, DataType::Utf8, true),
        f(ROLE, DataType::Utf8, true),
        f(VALUE, DataType::Float64, true),
        f(MESSAGE, DataType::Utf8, false),
        f(RANK, DataType::Int32, true),
    ]))
});

static SHADOW: LazyLock<SchemaRef> = LazyLock::new(|| {
    use col::*;
    Arc::new(Schema::new(vec![
        f(STEP, DataType::Int64, false),
        f(LAYER, DataType::Int32, false),
        f(MODULE, DataType::Utf8, false),
        f(GEMM, DataType::Utf8, false),
        f(NUMEL, DataType::Int64, false),
        f(COSINE, DataType::Float64, false),
        f(MSE, DataType::Float64, false),
        f(REL_L2, DataType::Float64, false),
        f(MAX_ABS_DIFF, DataType::Float64, false),
        f(RANK, DataType::Int32, true),
        f(DUAL_INNER, DataType::Float64, true),
        f(DUAL_NORM, DataType::Float64, true),
    ]))
});

static EXTRA_STATS: LazyLock<SchemaRef> = LazyLock::new(|| {
    use col::*;
    Arc::new(Schema::new(vec![
        f(STEP, DataType::Int64, false),
        f(RANK, DataType::Int32, true),
        f(LAYER, DataType::Int32, false),
        f(MODULE, DataType::Utf8, false),
        f(TENSOR, DataType::Utf8, false),
        f(STAT, DataType::Utf8, false),
        f(VALUE, DataType::Float64, false),
    ]))
});

static CASTS: LazyLock<SchemaRef> = LazyLock::new(|| {
    use col::*;
    Arc::new(Schema::new(vec![
        f(STEP, DataType::Int64, false),
        f(RANK, DataType::Int32, true),
        f(LAYER, DataType::Int32, false),
        f(MODULE, DataType::Utf8, false),
        f(GEMM, DataType::Utf8, false),
        f(ROLE, DataType::Utf8, false),
        f(SOURCE, DataType::Utf8, false),
        f(FORMAT, DataType::Utf8, true),
        f(SCALE, DataType::Float32, true),
        f(AMAX_LOCAL, DataType::Float32, true),
        f(AMAX_USED, DataType::Float32, true),
        f(NUMEL, DataType::Int64, true),
        f(DIGEST, DataType::Int64, true),
        f(AUDIT_CHECKED, DataType::Int64, true),
        f(AUDIT_MISMATCHED, DataType::Int64, true),
        f(MASTER_CHECKED, DataType::Int64, true),
        f(MASTER_MISMATCHED, DataType::Int64, true),
        f(MASTER_CHANGED, DataType::Boolean, true),
        f(FORWARD_CHANGED, DataType::Boolean, true),
    ]))
});

/// Columns that schema version 3 added at the end of the tables that existed before it; a part of
/// an older version reads them as null.
pub const COLUMNS_SINCE_V3: [&str; 1] = [col::RANK];

/// The schema of `table`.
pub fn schema(table: Table) -> &'static SchemaRef {
    match table {
        Table::Steps => &STEPS,
        Table::Stats => &STATS,
        Table::Tensors => &TENSORS,
        Table::Events => &EVENTS,
        Table::Shadow => &SHADOW,
        Table::ExtraStats => &EXTRA_STATS,
        Table::Casts => &CASTS,
    }
}

/// Rows that turn into a batch of their table.
pub trait Row {
    const TABLE: Table;
    fn to_batch(rows: &[Self]) -> RecordBatch
    where
        Self: Sized;
}

fn batch(table: Table, columns: Vec<ArrayRef>) -> RecordBatch {
    // The columns are built here from typed rows against the schema defined above, so a mismatch is
    // a bug in this file, not something input can cause.
    RecordBatch::try_new(schema(table).clone(), columns).expect("row builder matches its schema")
}

/// The `rank` column every table ends with: each row's process rank, null for one process.
fn ranks(it: impl Iterator<Item = Option<u32>>) -> ArrayRef {
    Arc::new(Int32Array::from(it.map(|k| k.map(|k| k as i32)).collect::<Vec<_>>()))
}

fn strs<'a>(it: impl Iterator<Item = &'a str>) -> ArrayRef {
    Arc::new(StringArray::from_iter_values(it))
}

/// One training step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRow {
    pub step: u32,
    pub loss: f64,
    pub grad_norm: f64,
    pub lr: f64,
    pub tokens: u64,
    pub step_ms: f64,
    pub nonfinite_tensors: u32,
    /// The process rank; None for a run of one process.
    pub rank: Option<u32>,
}

impl Row for StepRow {
    const TABLE: Table = Table::Steps;
    fn to_batch(rows: &[Self]) -> RecordBatch {
        batch(
            Table::Steps,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.step as i64))),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.loss))),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.grad_norm))),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.lr))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.tokens as i64))),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.step_ms))),
                Arc::new(BooleanArray::from(rows.iter().map(|r| r.loss.is_finite()).collect::<Vec<_>>())),
                Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.nonfinite_tensors as i32))),
                ranks(rows.iter().map(|r| r.rank)),
            ],
        )
    }
}

/// Statistics of one quantized operand of one FP8 GEMM at one step.
#[derive(Clone, Debug, PartialEq)]
pub struct StatRow {
    pub step: u32,
    pub layer: u32,
    pub module: Module,
    pub gemm: Gemm,
    pub role: Role,
    pub format: &'static str,
    pub scale: f32,
    pub amax: f32,
    pub amax_used: f32,
    pub numel: u64,
    pub underflow_frac: f64,
    pub saturated_frac: f64,
    pub nan_count: u64,
    pub inf_count: u64,
    pub zero_frac: f64,
    pub min: f32,
    pub max: f32,
    pub mean: f64,
    pub std: f64,
    pub dynamic_range_log2: f64,
    pub quant_mse: Option<f64>,
    pub quant_cos: Option<f64>,
    /// The channel (column of the operand's row-major layout) holding the amax, lowest on ties.
    pub amax_channel: Option<u32>,
    /// Share of Σx² held by the top max(1, ⌊channels / 100⌋) channels by Σx².
    pub top_channel_sq_frac: Option<f64>,
    /// The process rank; None for a run of one process.
    pub rank: Option<u32>,
    /// The cast's multiplicative bias ⟨x, q⟩ / ⟨x, x⟩ − 1 (q = dequant(cast(x))), measured with
    /// quant_mse: 0 for unbiased rounding, negative when the cast shrinks the operand (underflow,
    /// saturation), positive when it inflates it.
    pub quant_bias: Option<f64>,
    /// fprop weights (CPU backend, per-tensor FP8): the share of elements whose quantized value
    /// changed since the previous recorded step, both quantized on this step's grid.
    pub flip_frac: Option<f64>,
    /// fprop weights: Σ|Δq| / Σ|Δw| over the same steps, bins flipped per unit of master-weight
    /// change (≈ 1 moving freely, ≫ 1 held at rounding boundaries: oscillation).
    pub flip_ratio: Option<f64>,
    /// Block-scaled casts: how the block scales spread and how many leave their format's range.
    pub block_scales: Option<BlockScaleStats>,
}

/// The block scales of one block-scaled cast (`block_scale_*` columns; capture/src/block_stats.rs
/// says what a block's scale, saturation and flush are).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockScaleStats {
    pub count: u64,
    /// log2 of the positive, finite decode scales: mean, population std, least, largest.
    pub log2_mean: f64,
    pub log2_std: f64,
    pub log2_min: f64,
    pub log2_max: f64,
    /// Shares of the blocks whose needed scale is above the scale format's range, and of those
    /// with a non-zero amax whose scale is zero or below it.
    pub saturated_frac: f64,
    pub flushed_frac: f64,
    /// Blocks by ⌊log2 scale⌋, the first bin ⌊log2_min⌋.
    pub log2_hist: Vec<u64>,
}

/// The `block_scale_*` columns of `rows` (null where a row has none), in the schema's order.
fn block_scale_columns<'a>(rows: impl Iterator<Item = Option<&'a BlockScaleStats>> + Clone) -> Vec<ArrayRef> {
    let f64s = |g: fn(&BlockScaleStats) -> f64| -> ArrayRef { Arc::new(Float64Array::from(rows.clone().map(|b| b.map(g)).collect::<Vec<_>>())) };
    let mut hist = ListBuilder::new(Int64Builder::new());
    for b in rows.clone() {
        match b {
            Some(b) => {
                hist.values().append_slice(&b.log2_hist.iter().map(|&c| c as i64).collect::<Vec<_>>());
                hist.append(true);
            }
            None => hist.append(false),
        }
    }
    vec![
        Arc::new(Int64Array::from(rows.clone().map(|b| b.map(|b| b.count as i64)).collect::<Vec<_>>())),
        f64s(|b| b.log2_mean),
        f64s(|b| b.log2_std),
        f64s(|b| b.log2_min),
        f64s(|b| b.log2_max),
        f64s(|b| b.saturated_frac),
        f64s(|b| b.flushed_frac),
        Arc::new(hist.finish()),
    ]
}

impl Row for StatRow {
    const TABLE: Table = Table::Stats;
    fn to_batch(rows: &[Self]) -> RecordBatch {
        let f32s = |g: fn(&StatRow) -> f32| -> ArrayRef { Arc::new(Float32Array::from_iter_values(rows.iter().map(g))) };
        let f64s = |g: fn(&StatRow) -> f64| -> ArrayRef { Arc::new(Float64Array::from_iter_values(rows.iter().map(g))) };
        let i64s = |g: fn(&StatRow) -> i64| -> ArrayRef { Arc::new(Int64Array::from_iter_values(rows.iter().map(g))) };
        let opt = |g: fn(&StatRow) -> Option<f64>| -> ArrayRef { Arc::new(Float64Array::from(rows.iter().map(g).collect::<Vec<_>>())) };
        batch(
            Table::Stats,
            vec![
                i64s(|r| r.step as i64),
                Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.layer as i32))),
                strs(rows.iter().map(|r| r.module.as_str())),
                strs(rows.iter().map(|r| r.gemm.as_str())),
                strs(rows.iter().map(|r| r.role.as_str())),
                strs(rows.iter().map(|r| r.format)),
                f32s(|r| r.scale),
                f32s(|r| r.amax),
                f32s(|r| r.amax_used),
                i64s(|r| r.numel as i64),
                f64s(|r| r.underflow_frac),
                f64s(|r| r.saturated_frac),
                i64s(|r| r.nan_count as i64),
                i64s(|r| r.inf_count as i64),
                f64s(|r| r.zero_frac),
                f32s(|r| r.min),
                f32s(|r| r.max),
                f64s(|r| r.mean),
                f64s(|r| r.std),
                f64s(|r| r.dynamic_range_log2),
                opt(|r| r.quant_mse),
                opt(|r| r.quant_cos),
                Arc::new(Int32Array::from(rows.iter().map(|r| r.amax_channel.map(|c| c as i32)).collect::<Vec<_>>())),
                opt(|r| r.top_channel_sq_frac),
                ranks(rows.iter().map(|r| r.rank)),
                opt(|r| r.quant_bias),
                opt(|r| r.flip_frac),
                opt(|r| r.flip_ratio),
            ]
            .into_iter()
            .chain(block_scale_columns(rows.iter().map(|r| r.block_scales.as_ref())))
            .collect(),
        )
    }
}

/// Statistics of one tensor of a run from elsewhere at one step (and rank): only what its source
/// logged is set. `module` is the full module path; `layer` its first integer component.
#[derive(Clone, Debug, PartialEq)]
pub struct ExternalStatRow {
    pub step: u32,
    /// The process rank, None for a single-process run.
    pub rank: Option<u32>,
    pub layer: u32,
    pub module: String,
    /// The GEMM that consumes (or, for output / dgrad / wgrad, produces) the tensor.
    pub gemm: Gemm,
    pub role: Role,
    pub format: Option<String>,
    pub scale: Option<f32>,
    pub amax: Option<f32>,
    pub amax_used: Option<f32>,
    pub numel: Option<u64>,
    pub underflow_frac: Option<f64>,
    pub saturated_frac: Option<f64>,
    pub nan_count: Option<u64>,
    pub inf_count: Option<u64>,
    pub zero_frac: Option<f64>,
    pub min: Option<f32>,
    pub max: Option<f32>,
    pub mean: Option<f64>,
    pub std: Option<f64>,
    pub dynamic_range_log2: Option<f64>,
    pub quant_mse: Option<f64>,
    pub quant_cos: Option<f64>,
    pub amax_channel: Option<u32>,
    pub top_channel_sq_frac: Option<f64>,
    pub quant_bias: Option<f64>,
    pub flip_frac: Option<f64>,
    pub flip_ratio: Option<f64>,
}

impl ExternalStatRow {
    /// A row with no statistic set yet; `layer` comes from the module path.
    pub fn new(step: u32, rank: Option<u32>, module: &str, gemm: Gemm, role: Role) -> ExternalStatRow {
        ExternalStatRow {
            step,
            rank,
            layer: layer_of_module(module),
            module: module.to_string(),
            gemm,
            role,
            format: None,
            scale: None,
            amax: None,
            amax_used: None,
            numel: None,
            underflow_frac: None,
            saturated_frac: None,
            nan_count: None,
            inf_count: None,
            zero_frac: None,
            min: None,
            max: None,
            mean: None,
            std: None,
            dynamic_range_log2: None,
            quant_mse: None,
            quant_cos: None,
            amax_channel: None,
            top_channel_sq_frac: None,
            quant_bias: None,
            flip_frac: None,
            flip_ratio: None,
        }
    }
}

impl Row for ExternalStatRow {
    const TABLE: Table = Table::Stats;
    fn to_batch(rows: &[Self]) -> RecordBatch {
        type R = ExternalStatRow;
        let f32s = |g: fn(&R) -> Option<f32>| -> ArrayRef { Arc::new(Float32Array::from(rows.iter().map(g).collect::<Vec<_>>())) };
        let f64s = |g: fn(&R) -> Option<f64>| -> ArrayRef { Arc::new(Float64Array::from(rows.iter().map(g).collect::<Vec<_>>())) };
        let i64s = |g: fn(&R) -> Option<u64>| -> ArrayRef { Arc::new(Int64Array::from(rows.iter().map(|r| g(r).map(|v| v as i64)).collect::<Vec<_>>())) };
        batch(
            Table::Stats,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.step as i64))) as ArrayRef,
                Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.layer as i32))),
                strs(rows.iter().map(|r| r.module.as_str())),
                strs(rows.iter().map(|r| r.gemm.as_str())),
                strs(rows.iter().map(|r| r.role.as_str())),
                Arc::new(StringArray::from(rows.iter().map(|r| r.format.as_deref()).collect::<Vec<_>>())),
                f32s(|r| r.scale),
                f32s(|r| r.amax),
                f32s(|r| r.amax_used),
                i64s(|r| r.numel),
                f64s(|r| r.underflow_frac),
                f64s(|r| r.saturated_frac),
                i64s(|r| r.nan_count),
                i64s(|r| r.inf_count),
                f64s(|r| r.zero_frac),
                f32s(|r| r.min),
                f32s(|r| r.max),
                f64s(|r| r.mean),
                f64s(|r| r.std),
                f64s(|r| r.dynamic_range_log2),
                f64s(|r| r.quant_mse),
                f64s(|r| r.quant_cos),
                Arc::new(Int32Array::from(rows.iter().map(|r| r.amax_channel.map(|c| c as i32)).collect::<Vec<_>>())),
                f64s(|r| r.top_channel_sq_frac),
                ranks(rows.iter().map(|r| r.rank)),
                f64s(|r| r.quant_bias),
                f64s(|r| r.flip_frac),
                f64s(|r| r.flip_ratio),
            ]
            .into_iter()
            .chain(block_scale_columns(rows.iter().map(|_| None)))
            .collect(),
        )
    }
}

/// A statistic of a run from elsewhere that has no column in `stats`, kept under its own name
/// (`l1_norm`, `mxfp8_underflows%_columnwise`, …).
#[derive(Clone, Debug, PartialEq)]
pub struct ExtraStatRow {
    pub step: u32,
    pub rank: Option<u32>,
    pub layer: u32,
    pub module: String,
    /// The tensor as the source names it (`activation`, `gradient`, …).
    pub tensor: String,
    /// The statistic as the source names it.
    pub stat: String,
    pub value: f64,
}

impl Row for ExtraStatRow {
    const TABLE: Table = Table::ExtraStats;
    fn to_batch(rows: &[Self]) -> RecordBatch {
        batch(
            Table::ExtraStats,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.step as i64))),
                ranks(rows.iter().map(|r| r.rank)),
                Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.layer as i32))),
                strs(rows.iter().map(|r| r.module.as_str())),
                strs(rows.iter().map(|r| r.tensor.as_str())),
                strs(rows.iter().map(|r| r.stat.as_str())),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.value))),
            ],
        )
    }
}

/// Sampled values of one tensor at a dump step.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorRow {
    pub step: u32,
    pub layer: u32,
    pub module: Module,
    pub role: Role,
    /// The FP8 GEMM whose cast produced `fp8` (quantized roles routed to FP8), else None.
    pub gemm: Option<Gemm>,
    pub format: Option<&'static str>,
    /// Logical shape, row-major.
    pub shape: Vec<u64>,
    /// Element index (row-major) of the first value.
    pub offset: u64,
    /// Distance between consecutive values (1 for leading rows).
    pub stride: u64,
    pub values: Vec<f32>,
    pub fp8: Option<Vec<u8>>,
    /// Per-tensor scale used for the cast (None with block scaling).
    pub scale: Option<f32>,
    /// Block scaling: the scales of the tiles that cover the dumped values, row-major over tiles.
    pub block_scales: Option<Vec<f32>>,
    pub block_rows: Option<u32>,
    pub block_cols: Option<u32>,
    /// The process rank; None for a run of one process.
    pub rank: Option<u32>,
}

impl Row for TensorRow {
    const TABLE: Table = Table::Tensors;
    fn to_batch(rows: &[Self]) -> RecordBatch {
        let mut shape = ListBuilder::new(Int64Builder::new());
        let mut values = ListBuilder::new(Float32Builder::new());
        let mut fp8 = BinaryBuilder::new();
        let mut block_scales = ListBuilder::new(Float32Builder::new());
        let mut block_rows = UInt32Builder::new();
        let mut block_cols = UInt32Builder::new();
        for r in rows {
            shape.append_value(r.shape.iter().map(|&d| Some(d as i64)));
            values.values().append_slice(&r.values);
            values.append(true);
            match &r.fp8 {
                Some(b) => fp8.append_value(b),
                None => fp8.append_null(),
            }
            match &r.block_scales {
                Some(s) => {
                    block_scales.values().append_slice(s);
                    block_scales.append(true);
                }
                None => block_scales.append(false),
            }
            block_rows.append_option(r.block_rows);
            block_cols.append_option(r.block_cols);
        }
        batch(
            Table::Tensors,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.step as i64))),
                Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.layer as i32))),
                strs(rows.iter().map(|r| r.module.as_str())),
                strs(rows.iter().map(|r| r.role.as_str())),
                Arc::new(StringArray::from(rows.iter().map(|r| r.gemm.map(|g| g.as_str())).collect::<Vec<_>>())),
                Arc::new(StringArray::from(rows.iter().map(|r| r.format).collect::<Vec<_>>())),
                Arc::new(shape.finish()),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.shape.iter().product::<u64>() as i64))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.offset as i64))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.stride as i64))),
                Arc::new(values.finish()),
                Arc::new(fp8.finish()),
                Arc::new(Float32Array::from(rows.iter().map(|r| r.scale).collect::<Vec<_>>())),
                Arc::new(block_scales.finish()),
                Arc::new(block_rows.finish()),
                Arc::new(block_cols.finish()),
                ranks(rows.iter().map(|r| r.rank)),
            ],
        )
    }
}

/// Something the capture itself noticed.
#[derive(Clone, Debug, PartialEq)]
pub struct EventRow {
    pub step: u32,
    /// `nonfinite_loss`, `nonfinite_tensor`, `saturation_burst`, `injection`.
    pub kind: String,
    pub layer: Option<u32>,
    pub module: Option<Module>,
    pub gemm: Option<Gemm>,
    pub role: Option<Role>,
    pub value: Option<f64>,
    pub message: String,
    /// The process rank; None for a run of one process.
    pub rank: Option<u32>,
}

impl Row for EventRow {
    const TABLE: Table = Table::Events;
    fn to_batch(rows: &[Self]) -> RecordBatch {
        batch(
            Table::Events,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.step as i64))),
                strs(rows.iter().map(|r| r.kind.as_str())),
                Arc::new(Int32Array::from(rows.iter().map(|r| r.layer.map(|l| l as i32)).collect::<Vec<_>>())),
                Arc::new(StringArray::from(rows.iter().map(|r| r.module.map(|m| m.as_str())).collect::<Vec<_>>())),
                Arc::new(StringArray::from(rows.iter().map(|r| r.gemm.map(|g| g.as_str())).collect::<Vec<_>>())),
                Arc::new(StringArray::from(rows.iter().map(|r| r.role.map(|g| g.as_str())).collect::<Vec<_>>())),
                Arc::new(Float64Array::from(rows.iter().map(|r| r.value).collect::<Vec<_>>())),
                strs(rows.iter().map(|r| r.message.as_str())),
                ranks(rows.iter().map(|r| r.rank)),
            ],
        )
    }
}

/// Error one FP8 GEMM adds in one step: its output against a BF16 GEMM on the same inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct ShadowRow {
    pub step: u32,
    pub layer: u32,
    pub module: Module,
    pub gemm: Gemm,
    pub numel: u64,
    pub cosine: f64,
    pub mse: f64,
    pub rel_l2: f64,
    pub max_abs_diff: f64,
    /// The process rank; None for a run of one process.
    pub rank: Option<u32>,
    /// ⟨δ, dual⟩, δ = FP8 result − BF16 result: the signed first-order effect of the GEMM's error
    /// (fprop: δY paired with the loss gradient dY, a loss change; dgrad and wgrad: the error paired
    /// with the BF16 result itself, the descent signal it adds along its own direction, negative
    /// when it loses some). None where the backend does not compute it (the GPU) and in older runs.
    pub dual_inner: Option<f64>,
    /// ‖dual‖, so that ‖δ‖·‖dual‖ (the bound `locate` ranks by) sits beside the signed value.
    pub dual_norm: Option<f64>,
}

impl Row for ShadowRow {
    const TABLE: Table = Table::Shadow;
    fn to_batch(rows: &[Self]) -> RecordBatch {
        let f64s = |g: fn(&ShadowRow) -> f64| -> ArrayRef { Arc::new(Float64Array::from_iter_values(rows.iter().map(g))) };
        batch(
            Table::Shadow,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.step as i64))),
                Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.layer as i32))),
                strs(rows.iter().map(|r| r.module.as_str())),
                strs(rows.iter().map(|r| r.gemm.as_str())),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.numel as i64))),
                f64s(|r| r.cosine),
                f64s(|r| r.mse),
                f64s(|r| r.rel_l2),
                f64s(|r| r.max_abs_diff),
                ranks(rows.iter().map(|r| r.rank)),
                Arc::new(Float64Array::from(rows.iter().map(|r| r.dual_inner).collect::<Vec<_>>())),
                Arc::new(Float64Array::from(rows.iter().map(|r| r.dual_norm).collect::<Vec<_>>())),
            ],
        )
    }
}

/// One FP8 cast as the module itself made it, on one rank at one step (`casts`): the scale it used,
/// the amax of this rank's own high-precision tensor and the amax the scale came from, with the
/// integrity audits of that cast when they ran. Written by the PyTorch recorder; Rust writes it in
/// tests and generated benchmarks.
#[derive(Clone, Debug, PartialEq)]
pub struct CastRow {
    pub step: u32,
    pub rank: Option<u32>,
    pub layer: u32,
    pub module: String,
    pub gemm: Gemm,
    pub role: Role,
    /// Who cast: `torchao`, `te`.
    pub source: String,
    pub format: Option<String>,
    pub scale: Option<f32>,
    pub amax_local: Option<f32>,
    pub amax_used: Option<f32>,
    pub numel: Option<u64>,
    pub digest: Option<i64>,
    pub audit_checked: Option<u64>,
    pub audit_mismatched: Option<u64>,
    pub master_checked: Option<u64>,
    pub master_mismatched: Option<u64>,
    pub master_changed: Option<bool>,
    pub forward_changed: Option<bool>,
}

impl Row for CastRow {
    const TABLE: Table = Table::Casts;
    fn to_batch(rows: &[Self]) -> RecordBatch {
        type R = CastRow;
        let f32s = |g: fn(&R) -> Option<f32>| -> ArrayRef { Arc::new(Float32Array::from(rows.iter().map(g).collect::<Vec<_>>())) };
        let u64s = |g: fn(&R) -> Option<u64>| -> ArrayRef { Arc::new(Int64Array::from(rows.iter().map(|r| g(r).map(|v| v as i64)).collect::<Vec<_>>())) };
        let bools = |g: fn(&R) -> Option<bool>| -> ArrayRef { Arc::new(BooleanArray::from(rows.iter().map(g).collect::<Vec<_>>())) };
        batch(
            Table::Casts,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.step as i64))),
                ranks(rows.iter().map(|r| r.rank)),
                Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.layer as i32))),
                strs(rows.iter().map(|r| r.module.as_str())),
                strs(rows.iter().map(|r| r.gemm.as_str())),
                strs(rows.iter().map(|r| r.role.as_str())),
                strs(rows.iter().map(|r| r.source.as_str())),
                Arc::new(StringArray::from(rows.iter().map(|r| r.format.as_deref()).collect::<Vec<_>>())),
                f32s(|r| r.scale),
                f32s(|r| r.amax_local),
                f32s(|r| r.amax_used),
                u64s(|r| r.numel),
                Arc::new(Int64Array::from(rows.iter().map(|r| r.digest).collect::<Vec<_>>())),
                u64s(|r| r.audit_checked),
                u64s(|r| r.audit_mismatched),
                u64s(|r| r.master_checked),
                u64s(|r| r.master_mismatched),
                bools(|r| r.master_changed),
                bools(|r| r.forward_changed),
            ],
        )
    }
}

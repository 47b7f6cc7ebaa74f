//! The run format as JSON, for writers in other languages (the Python recorder in `python/`): every
//! table's Arrow schema (column names, types, nullability) in [`Table::ALL`] order, the schema
//! version, the Parquet key-value metadata keys, the compression and the layout's file names.
//!
//! `python/fp8scope/_tables.json` is this JSON, committed; `tests/python_recorder.rs` fails when the
//! committed file differs from what this build produces, and says how to regenerate it. Tables and
//! columns added here reach the Python writer through that file alone.

use crate::layout::{MANIFEST_FILE, PART_TMP_SUFFIX, RANK_DIGITS, RANK_PARTITION_PREFIX, RANKS_DIR, RunDir, Table, rank_partition};
use crate::parts::properties;
use crate::tables::schema;
use crate::{META_SCHEMA_VERSION, META_TABLE, SCHEMA_VERSION, SUPPORTED_SCHEMA_VERSIONS};
use arrow::datatypes::{DataType, Field};
use parquet::schema::types::ColumnPath;
use serde_json::{Value, json};

/// The name an Arrow type has in the JSON (pyarrow's constructor of the same name builds it):
/// a string for primitive types, `{"list": <field>}` for lists. Errors name the column, so that a
/// new type in a schema says where to teach this file (and `python/fp8scope/tables.py`).
fn type_json(column: &str, dt: &DataType) -> Result<Value, String> {
    let name = match dt {
        DataType::Boolean => "bool",
        DataType::Int8 => "int8",
        DataType::Int16 => "int16",
        DataType::Int32 => "int32",
        DataType::Int64 => "int64",
        DataType::UInt8 => "uint8",
        DataType::UInt16 => "uint16",
        DataType::UInt32 => "uint32",
        DataType::UInt64 => "uint64",
        DataType::Float16 => "float16",
        DataType::Float32 => "float32",
        DataType::Float64 => "float64",
        DataType::Utf8 => "utf8",
        DataType::LargeUtf8 => "large_utf8",
        DataType::Binary => "binary",
        DataType::LargeBinary => "large_binary",
        DataType::List(item) => return Ok(json!({ "list": field_json(item)? })),
        DataType::LargeList(item) => return Ok(json!({ "large_list": field_json(item)? })),
        other => return Err(format!("column '{column}' has Arrow type {other:?}, which schemas/src/export.rs does not export yet")),
    };
    Ok(Value::from(name))
}

fn field_json(f: &Field) -> Result<Value, String> {
    Ok(json!({ "name": f.name(), "type": type_json(f.name(), f.data_type())?, "nullable": f.is_nullable() }))
}

/// Part file names: `{prefix}{index, zero-padded to digits}{suffix}`, checked against
/// [`RunDir::part`] so that a change of the layout changes the JSON.
fn part_names() -> Result<Value, String> {
    let (prefix, digits, suffix) = ("part-", 5usize, ".parquet");
    for index in [0u32, 7, 12345] {
        let path = RunDir::new("").part(Table::Steps, index);
        let got = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let want = format!("{prefix}{index:0digits$}{suffix}");
        if got != want {
            return Err(format!("layout names part {index} '{got}', export.rs assumes '{want}': update export.rs"));
        }
    }
    if rank_partition(12) != format!("{RANK_PARTITION_PREFIX}{:0RANK_DIGITS$}", 12) {
        return Err("layout's rank_partition disagrees with its constants: update export.rs".into());
    }
    Ok(json!({
        "part_prefix": prefix, "part_digits": digits, "part_suffix": suffix, "part_tmp_suffix": PART_TMP_SUFFIX,
        "rank_partition_prefix": RANK_PARTITION_PREFIX, "rank_digits": RANK_DIGITS, "ranks_dir": RANKS_DIR,
    }))
}

/// The whole run format as one JSON value.
pub fn run_format_json() -> Result<Value, String> {
    let mut tables = Vec::new();
    for table in Table::ALL {
        let columns = schema(table).fields().iter().map(|f| field_json(f)).collect::<Result<Vec<_>, _>>()?;
        tables.push(json!({ "name": table.as_str(), "columns": columns }));
    }
    let compression = properties(Table::Steps).compression(&ColumnPath::from("step"));
    Ok(json!({
        "about": "Generated from the Rust crate fp8scope-schemas (schemas/src/export.rs); do not edit. \
                  Regenerate: FP8SCOPE_WRITE_TABLES_JSON=1 cargo test --release --workspace --locked tables_json",
        "schema_version": SCHEMA_VERSION,
        "supported_schema_versions": SUPPORTED_SCHEMA_VERSIONS,
        "metadata_keys": { "schema_version": META_SCHEMA_VERSION, "table": META_TABLE },
        "compression": compression.to_string().to_lowercase(),
        "manifest_file": MANIFEST_FILE,
        "layout": part_names()?,
        "tables": tables,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_and_column_is_exported_with_its_type_and_nullability() {
        let v = run_format_json().expect("every column type is exportable");
        let tables = v["tables"].as_array().unwrap();
        assert_eq!(tables.len(), Table::ALL.len());
        for (t, table) in tables.iter().zip(Table::ALL) {
            assert_eq!(t["name"], table.as_str());
            assert_eq!(t["columns"].as_array().unwrap().len(), schema(table).fields().len());
        }
        let stats = &tables[1]["columns"];
        assert_eq!(stats[0], json!({"name": "step", "type": "int64", "nullable": false}));
        let values = tables[2]["columns"].as_array().unwrap().iter().find(|c| c["name"] == "values").unwrap();
        assert_eq!(values["type"], json!({"list": {"name": "item", "type": "float32", "nullable": true}}));
        assert_eq!(v["compression"], "snappy");
        assert!(type_json("x", &DataType::Date32).unwrap_err().contains("'x'"));
    }
}

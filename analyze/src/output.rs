//! Rendering: aligned text tables (comfy-table, Markdown-compatible so they paste into issues),
//! number formatting shared by every command, JSON values with non-finite numbers as `null`, and
//! polars frames as table, CSV, JSON or Parquet.
//!
//! CSV is written here (RFC 4180 quoting, a few lines) rather than with the `csv` crate: that crate
//! turns on serde_core's `default` feature, which changes the feature set polars is built with and
//! rebuilds all of polars.

use crate::error::AnalyzeError;
use comfy_table::{CellAlignment, ContentArrangement, Table, presets};
use polars::prelude::*;
use serde_json::Value;
use std::path::Path;

/// An aligned table; columns whose every cell parses as a number (or is inf/nan/-) are
/// right-aligned.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut t = Table::new();
    t.load_style(presets::ASCII_MARKDOWN).set_content_arrangement(ContentArrangement::Disabled);
    t.set_header(headers.to_vec());
    for r in rows {
        t.add_row(r.clone());
    }
    for (i, column) in t.column_iter_mut().enumerate() {
        let numeric = !rows.is_empty() && rows.iter().all(|r| r.get(i).is_none_or(|c| is_numeric_cell(c)));
        if numeric {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    t.to_string()
}

fn is_numeric_cell(c: &str) -> bool {
    matches!(c, "-" | "inf" | "-inf" | "nan" | "") || c.trim_end_matches('%').parse::<f64>().is_ok()
}

/// A float for humans: 6 significant digits, scientific when very small or large.
pub fn num(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return "0".into();
    }
    let a = x.abs();
    if !(1e-4..1e6).contains(&a) {
        return format!("{x:.4e}");
    }
    let digits = (5 - a.log10().floor() as i32).max(0) as usize;
    let s = format!("{x:.digits$}");
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}

/// A cosine for humans: enough digits to tell 0.99999 from 1.
pub fn cos(x: f64) -> String {
    if x.is_finite() { format!("{x:.6}") } else { num(x) }
}

/// A fraction as a percentage with two decimals.
pub fn pct(x: f64) -> String {
    if x.is_finite() { format!("{:.2}%", 100.0 * x) } else { num(x) }
}

/// An optional value, `-` when absent.
pub fn opt<T: ToString>(x: Option<T>) -> String {
    x.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// Where a spike ended: "back in band at step N", or "never back in band".
pub fn back_in_band(recovery: Option<i64>) -> String {
    recovery.map_or("never back in band".into(), |r| format!("back in band at step {r}"))
}

/// A signed relative gap as a percentage with two decimals, `-` when absent.
pub fn signed_pct(x: Option<f64>) -> String {
    x.filter(|v| v.is_finite()).map(|v| format!("{:+.2}%", 100.0 * v)).unwrap_or_else(|| "-".into())
}

/// A gap's size relative to its noise band: `0.3× band`, `∞× band` (a band of 0), `-` without one.
pub fn band_ratio(ratio: Option<f64>) -> String {
    match ratio {
        Some(r) if r.is_finite() => format!("{r:.1}× band"),
        Some(_) => "∞× band".into(),
        None => "-".into(),
    }
}

/// The gap at the end in one sentence: vertical and horizontal, each beside its band when there
/// is one.
pub fn end_gap_text(e: &crate::analysis::anomalies::EndGap) -> String {
    let mut s = format!("gap at the end: {} in loss (mean of the last 20 steps)", signed_pct(e.gap));
    if let Some(b) = e.band {
        s += &format!(", {} of {}", band_ratio(e.ratio), pct(b));
    }
    if let Some(h) = e.horizontal.as_ref().and_then(|h| Some((h.steps?, h.frac?, h.at_step))) {
        let (steps, frac, at) = h;
        s += &format!(
            "; {} to reach the same loss ({:+.1} steps, {:+.1}% of {at})",
            if steps >= 0.0 { "the run needs more steps" } else { "the run needs fewer steps" },
            steps,
            100.0 * frac
        );
        if let Some(hb) = e.horizontal_band {
            s += &format!(", {} of {hb:.1} steps", band_ratio(e.horizontal_ratio));
        }
    }
    s
}

/// A float as JSON: `null` when NaN or infinite (JSON has no such numbers).
pub fn jf(x: f64) -> Value {
    serde_json::Number::from_f64(x).map(Value::Number).unwrap_or(Value::Null)
}

/// Pretty JSON text ending in a newline, fields in their declared order (NaN and ±∞ as null).
pub fn json_text<T: serde::Serialize + ?Sized>(v: &T) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()));
    s.push('\n');
    s
}

/// A polars value as JSON: lists become arrays, binary becomes a hex string, non-finite floats null.
pub fn any_to_json(v: &AnyValue) -> Value {
    match v {
        AnyValue::Null => Value::Null,
        AnyValue::Boolean(b) => Value::Bool(*b),
        AnyValue::String(s) => Value::String((*s).to_string()),
        AnyValue::StringOwned(s) => Value::String(s.to_string()),
        AnyValue::UInt8(x) => (*x).into(),
        AnyValue::UInt16(x) => (*x).into(),
        AnyValue::UInt32(x) => (*x).into(),
        AnyValue::UInt64(x) => (*x).into(),
        AnyValue::Int8(x) => (*x).into(),
        AnyValue::Int16(x) => (*x).into(),
        AnyValue::Int32(x) => (*x).into(),
        AnyValue::Int64(x) => (*x).into(),
        AnyValue::Float32(x) => jf(*x as f64),
        AnyValue::Float64(x) => jf(*x),
        AnyValue::Binary(b) => Value::String(hex(b)),
        AnyValue::BinaryOwned(b) => Value::String(hex(b)),
        AnyValue::List(s) => Value::Array(s.iter().map(|x| any_to_json(&x)).collect()),
        other => Value::String(other.to_string()),
    }
}

/// A polars value for a table or CSV cell: lists as `[a, b, c, … (n)]` (first 8 items) in tables,
/// in full as JSON text in CSV.
fn any_to_cell(v: &AnyValue, full: bool) -> String {
    match v {
        AnyValue::Null => {
            if full {
                String::new()
            } else {
                "null".into()
            }
        }
        AnyValue::String(s) => (*s).to_string(),
        AnyValue::StringOwned(s) => s.to_string(),
        AnyValue::Float32(x) => {
            if full {
                x.to_string()
            } else {
                num(*x as f64)
            }
        }
        AnyValue::Float64(x) => {
            if full {
                x.to_string()
            } else {
                num(*x)
            }
        }
        AnyValue::Binary(b) => hex(b),
        AnyValue::BinaryOwned(b) => hex(b),
        AnyValue::List(_) if full => any_to_json(v).to_string(),
        AnyValue::List(s) => {
            let n = s.len();
            let items: Vec<String> = s.iter().take(8).map(|x| any_to_cell(&x, false)).collect();
            if n > 8 { format!("[{}, … ({n})]", items.join(", ")) } else { format!("[{}]", items.join(", ")) }
        }
        other => other.to_string(),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The rows of a frame as polars values (row-major), for the text formats.
fn rows_of(df: &DataFrame) -> Result<Vec<Vec<AnyValue<'_>>>, AnalyzeError> {
    let cols = df.columns();
    (0..df.height())
        .map(|i| cols.iter().map(|c| c.get(i)).collect::<PolarsResult<Vec<_>>>())
        .collect::<PolarsResult<Vec<_>>>()
        .map_err(|e| AnalyzeError::Query { message: e.to_string() })
}

fn names(df: &DataFrame) -> Vec<String> {
    df.get_column_names().iter().map(|n| n.to_string()).collect()
}

/// A frame as an aligned table with a `(n rows)` line.
pub fn frame_table(df: &DataFrame) -> Result<String, AnalyzeError> {
    let headers = names(df);
    let rows: Vec<Vec<String>> = rows_of(df)?.iter().map(|r| r.iter().map(|v| any_to_cell(v, false)).collect()).collect();
    let h: Vec<&str> = headers.iter().map(String::as_str).collect();
    let n = df.height();
    Ok(format!("{}\n({n} row{})\n", table(&h, &rows), if n == 1 { "" } else { "s" }))
}

/// A frame as CSV (RFC 4180: fields holding a comma, quote or line break are quoted, quotes
/// doubled) with a header line.
pub fn frame_csv(df: &DataFrame) -> Result<String, AnalyzeError> {
    let mut out = String::new();
    let line = |out: &mut String, fields: Vec<String>| {
        let quoted: Vec<String> = fields.into_iter().map(|f| csv_field(&f)).collect();
        out.push_str(&quoted.join(","));
        out.push('\n');
    };
    line(&mut out, names(df));
    for r in rows_of(df)? {
        line(&mut out, r.iter().map(|v| any_to_cell(v, true)).collect());
    }
    Ok(out)
}

fn csv_field(f: &str) -> String {
    if f.contains([',', '"', '\n', '\r']) { format!("\"{}\"", f.replace('"', "\"\"")) } else { f.to_string() }
}

/// A frame as a JSON array of objects, one per row and one row per line, keys in column order.
pub fn frame_json(df: &DataFrame) -> Result<String, AnalyzeError> {
    let keys: Vec<String> = names(df).iter().map(|n| Value::String(n.clone()).to_string()).collect();
    let rows: Vec<String> = rows_of(df)?
        .iter()
        .map(|r| {
            let fields: Vec<String> = keys.iter().zip(r).map(|(k, v)| format!("{k}: {}", any_to_json(v))).collect();
            format!("  {{{}}}", fields.join(", "))
        })
        .collect();
    Ok(if rows.is_empty() { "[]\n".to_string() } else { format!("[\n{}\n]\n", rows.join(",\n")) })
}

/// Writes a frame to a Parquet file.
pub fn frame_parquet(df: &mut DataFrame, path: &Path) -> Result<(), AnalyzeError> {
    let out = |e: &dyn std::fmt::Display| AnalyzeError::Output { path: path.to_path_buf(), message: e.to_string() };
    let file = std::fs::File::create(path).map_err(|e| out(&e))?;
    ParquetWriter::new(file).finish(df).map_err(|e| out(&e))?;
    Ok(())
}

/// Writes text to a file.
pub fn write_file(path: &Path, text: &str) -> Result<(), AnalyzeError> {
    std::fs::write(path, text).map_err(|e| AnalyzeError::Output { path: path.to_path_buf(), message: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_keep_six_significant_digits() {
        assert_eq!(num(3.24159265), "3.24159");
        assert_eq!(num(0.000123456789), "0.000123457");
        assert_eq!(num(1234.5), "1234.5");
        assert_eq!(num(2.5e-9), "2.5000e-9");
        assert_eq!(num(f64::INFINITY), "inf");
        assert_eq!(pct(0.1234), "12.34%");
        assert_eq!(jf(f64::NAN), Value::Null);
    }

    #[test]
    fn csv_fields_are_quoted_only_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("two\nlines"), "\"two\nlines\"");
    }

    #[test]
    fn tables_right_align_numeric_columns() {
        let t = table(&["name", "x"], &[vec!["a".into(), "1".into()], vec!["bbbb".into(), "100".into()]]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines.iter().any(|l| l.contains("|   1 |") || l.contains("|    1 |")), "{t}");
    }
}

"""The tables of a run as pyarrow schemas, built from `_tables.json` — the JSON the Rust crate
fp8scope-schemas exports (schemas/src/export.rs) — so that the columns are defined once, in Rust.

Rows are plain dicts keyed by column name. A nullable column a row leaves out is written null; a
non-nullable one it leaves out, or a key that is no column, is an error naming the table and column.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

import pyarrow as pa

_PRIMITIVES = {
    "bool": pa.bool_,
    "int8": pa.int8,
    "int16": pa.int16,
    "int32": pa.int32,
    "int64": pa.int64,
    "uint8": pa.uint8,
    "uint16": pa.uint16,
    "uint32": pa.uint32,
    "uint64": pa.uint64,
    "float16": pa.float16,
    "float32": pa.float32,
    "float64": pa.float64,
    "utf8": pa.string,
    "large_utf8": pa.large_string,
    "binary": pa.binary,
    "large_binary": pa.large_binary,
}


@lru_cache(maxsize=1)
def spec() -> dict:
    """The run format as exported by the Rust schemas crate."""
    text = resources.files("fp8scope").joinpath("_tables.json").read_text(encoding="utf-8")
    return json.loads(text)


def _type(t) -> pa.DataType:
    if isinstance(t, str):
        if t not in _PRIMITIVES:
            raise ValueError(f"_tables.json names Arrow type '{t}', which fp8scope/tables.py does not know")
        return _PRIMITIVES[t]()
    if "list" in t:
        return pa.list_(_field(t["list"]))
    if "large_list" in t:
        return pa.large_list(_field(t["large_list"]))
    raise ValueError(f"_tables.json names Arrow type {t!r}, which fp8scope/tables.py does not know")


def _field(c: dict) -> pa.Field:
    return pa.field(c["name"], _type(c["type"]), nullable=c["nullable"])


def table_names() -> list[str]:
    """Every table of a run, in the Rust crate's order."""
    return [t["name"] for t in spec()["tables"]]


@lru_cache(maxsize=None)
def schema(table: str) -> pa.Schema:
    """The pyarrow schema of `table`, with fp8scope's key-value metadata (table name, schema version)."""
    s = spec()
    for t in s["tables"]:
        if t["name"] == table:
            keys = s["metadata_keys"]
            meta = {keys["schema_version"]: str(s["schema_version"]), keys["table"]: table}
            return pa.schema([_field(c) for c in t["columns"]], metadata=meta)
    raise ValueError(f"no table '{table}' in this fp8scope build (tables: {', '.join(table_names())})")


def schema_version() -> int:
    return int(spec()["schema_version"])


def to_table(table: str, rows: list[dict]) -> pa.Table:
    """A pyarrow table of `rows` under the schema of `table` (columns in schema order)."""
    sch = schema(table)
    names = set(sch.names)
    for r in rows:
        extra = set(r) - names
        if extra:
            raise ValueError(f"table '{table}' has no column(s) {sorted(extra)}")
    arrays = []
    for f in sch:
        if f.nullable:
            values = [r.get(f.name) for r in rows]
        else:
            try:
                values = [r[f.name] for r in rows]
            except KeyError:
                raise ValueError(f"table '{table}': column '{f.name}' is not nullable and a row lacks it") from None
        try:
            arrays.append(pa.array(values, type=f.type, from_pandas=False))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
            raise ValueError(f"table '{table}', column '{f.name}': {e}") from None
        if not f.nullable and arrays[-1].null_count:
            raise ValueError(f"table '{table}': column '{f.name}' is not nullable and a row has None")
    return pa.Table.from_arrays(arrays, schema=sch)

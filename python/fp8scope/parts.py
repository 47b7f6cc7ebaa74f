"""Crash-safe Parquet parts, as the Rust part writer (schemas/src/parts.rs) writes them: each part is
written to `part-NNNNN.parquet.tmp` and renamed once its footer is written, so every `*.parquet`
file is complete; the table name and schema version travel in the file's key-value metadata.
"""

from __future__ import annotations

import os

import pyarrow.parquet as pq

from . import tables


def part_name(index: int) -> str:
    lay = tables.spec()["layout"]
    return f"{lay['part_prefix']}{index:0{lay['part_digits']}d}{lay['part_suffix']}"


def closed_parts(run_dir: str, table: str) -> list[str]:
    """The closed parts of a table, in index order (`.tmp` files are skipped)."""
    lay = tables.spec()["layout"]
    d = os.path.join(run_dir, table)
    if not os.path.isdir(d):
        return []
    names = [n for n in os.listdir(d) if n.startswith(lay["part_prefix"]) and n.endswith(lay["part_suffix"])]
    return [os.path.join(d, n) for n in sorted(names)]


def write_part(path: str, table: str, rows: list[dict]) -> None:
    """Writes `rows` as one closed Parquet file at `path` (through `path.tmp`)."""
    tmp = path + tables.spec()["layout"]["part_tmp_suffix"]
    # List items keep the Arrow name "item" (as the Rust writer stores them), not Parquet's "element".
    pq.write_table(tables.to_table(table, rows), tmp, compression=tables.spec()["compression"],
                   use_compliant_nested_type=False)
    os.replace(tmp, path)


class PartWriter:
    """Buffers rows of one table and writes them as numbered parts."""

    def __init__(self, run_dir: str, table: str):
        tables.schema(table)  # fails early for a table this build does not know
        self.run_dir, self.table = run_dir, table
        os.makedirs(os.path.join(run_dir, table), exist_ok=True)
        self.next_index = len(closed_parts(run_dir, table))
        self.pending: list[dict] = []
        self.rows_written = 0

    def extend(self, rows: list[dict]) -> None:
        self.pending.extend(rows)

    def flush(self) -> None:
        """Writes the pending rows as one closed part (nothing when none are pending)."""
        if not self.pending:
            return
        path = os.path.join(self.run_dir, self.table, part_name(self.next_index))
        write_part(path, self.table, self.pending)
        self.next_index += 1
        self.rows_written += len(self.pending)
        self.pending = []

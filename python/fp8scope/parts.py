"""Crash-safe Parquet parts, as the Rust part writer (schemas/src/parts.rs) writes them: each part is
written to `part-NNNNN.parquet.tmp` and renamed once its footer is written, so every `*.parquet`
file is complete; the table name and schema version travel in the file's key-value metadata.

A writer of rank `r` writes into the table's rank partition, `<table>/rank=0000r/` (every recording
of the Python recorder does, rank 0 of 1 included); `closed_parts` lists the flat parts and then each
partition's, by rank, as `layout::RunDir::parts` does.
"""

from __future__ import annotations

import os

import pyarrow.parquet as pq

from . import ranks, tables


def part_name(index: int) -> str:
    lay = tables.spec()["layout"]
    return f"{lay['part_prefix']}{index:0{lay['part_digits']}d}{lay['part_suffix']}"


def _parts_in(d: str) -> list[str]:
    lay = tables.spec()["layout"]
    if not os.path.isdir(d):
        return []
    names = [n for n in os.listdir(d) if n.startswith(lay["part_prefix"]) and n.endswith(lay["part_suffix"])]
    return [os.path.join(d, n) for n in sorted(names)]


def partitions(run_dir: str, table: str) -> list[tuple[int, str]]:
    """The rank partitions of a table: (rank, folder), by rank."""
    d = os.path.join(run_dir, table)
    if not os.path.isdir(d):
        return []
    found = [(ranks.rank_of_partition(n), os.path.join(d, n)) for n in os.listdir(d)]
    return sorted((r, p) for r, p in found if r is not None and os.path.isdir(p))


def closed_parts(run_dir: str, table: str, rank: int | None = None) -> list[str]:
    """The closed parts of a table (`.tmp` files are skipped): with `rank`, those of its partition in
    index order; else the flat layout's, then every partition's by rank and index."""
    if rank is not None:
        return _parts_in(ranks.table_dir(run_dir, table, rank))
    out = _parts_in(os.path.join(run_dir, table))
    for _, d in partitions(run_dir, table):
        out += _parts_in(d)
    return out


def write_part(path: str, table: str, rows: list[dict]) -> None:
    """Writes `rows` as one closed Parquet file at `path` (through `path.tmp`)."""
    tmp = path + tables.spec()["layout"]["part_tmp_suffix"]
    # List items keep the Arrow name "item" (as the Rust writer stores them), not Parquet's "element".
    pq.write_table(tables.to_table(table, rows), tmp, compression=tables.spec()["compression"],
                   use_compliant_nested_type=False)
    os.replace(tmp, path)


class PartWriter:
    """Buffers rows of one table and writes them as numbered parts: into `rank`'s partition of the
    table (`<table>/rank=00003/`), or the flat folder when `rank` is None."""

    def __init__(self, run_dir: str, table: str, rank: int | None = None):
        tables.schema(table)  # fails early for a table this build does not know
        self.run_dir, self.table, self.rank = run_dir, table, rank
        self.dir = os.path.join(run_dir, table) if rank is None else ranks.table_dir(run_dir, table, rank)
        os.makedirs(self.dir, exist_ok=True)
        self.next_index = len(_parts_in(self.dir))
        self.pending: list[dict] = []
        self.rows_written = 0
        self.bytes_written = 0

    def extend(self, rows: list[dict]) -> None:
        self.pending.extend(rows)

    def flush(self) -> None:
        """Writes the pending rows as one closed part (nothing when none are pending)."""
        if not self.pending:
            return
        path = os.path.join(self.dir, part_name(self.next_index))
        write_part(path, self.table, self.pending)
        self.bytes_written += os.path.getsize(path)
        self.next_index += 1
        self.rows_written += len(self.pending)
        self.pending = []

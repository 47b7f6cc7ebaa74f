"""The tables the Python writer builds from `_tables.json`, and its crash-safe parts."""

import os
import tempfile
import unittest

import pyarrow as pa
import pyarrow.parquet as pq

from fp8scope import parts, tables


class Tables(unittest.TestCase):
    def test_every_table_has_its_columns_and_metadata(self):
        names = tables.table_names()
        for t in ("steps", "stats", "tensors", "events", "shadow"):
            self.assertIn(t, names)
        s = tables.schema("tensors")
        self.assertEqual(s.field("values").type, pa.list_(pa.float32()))
        self.assertFalse(s.field("step").nullable)
        self.assertTrue(s.field("fp8").nullable)
        self.assertEqual(s.metadata[b"fp8scope.table"], b"tensors")
        self.assertEqual(s.metadata[b"fp8scope.schema_version"], str(tables.schema_version()).encode())

    def test_absent_nullable_columns_are_null_and_absent_required_ones_are_errors(self):
        row = {"step": 3, "kind": "nonfinite_loss", "message": "m", "value": float("nan")}
        t = tables.to_table("events", [row])
        self.assertIsNone(t.column("layer")[0].as_py())
        self.assertEqual(t.column("value").null_count, 0, "NaN is a value, not null")
        with self.assertRaisesRegex(ValueError, "column 'message' is not nullable"):
            tables.to_table("events", [{"step": 1, "kind": "x"}])
        with self.assertRaisesRegex(ValueError, r"no column\(s\) \['typo'\]"):
            tables.to_table("events", [dict(row, typo=1)])
        with self.assertRaisesRegex(ValueError, "no table 'nope'"):
            tables.schema("nope")

    def test_parts_are_renamed_when_closed_and_numbered_on(self):
        with tempfile.TemporaryDirectory() as d:
            w = parts.PartWriter(d, "events")
            w.extend([{"step": 1, "kind": "k", "message": "m"}])
            w.flush()
            w.flush()  # nothing pending: no empty part
            w.extend([{"step": 2, "kind": "k", "message": "m"}] * 3)
            w.flush()
            files = sorted(os.listdir(os.path.join(d, "events")))
            self.assertEqual(files, ["part-00000.parquet", "part-00001.parquet"])
            f = pq.ParquetFile(os.path.join(d, "events", files[1]))
            self.assertEqual(f.metadata.num_rows, 3)
            self.assertEqual(f.metadata.metadata[b"fp8scope.table"], b"events")
            self.assertEqual(w.rows_written, 4)
            self.assertEqual(parts.PartWriter(d, "events").next_index, 2, "a new writer continues the numbering")


if __name__ == "__main__":
    unittest.main()

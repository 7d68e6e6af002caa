"""Sharded, deterministic Parquet writing.

Every shard file is named `<kind>-SSSSS-of-NNNNN.parquet`, holds the rows whose
id hashes to that shard, sorted by id, so two builds of the same input write
byte-identical files whatever the runner's bundle order, and a reader can find
a row by binary search over row-group statistics. Every shard index gets a file,
empty or not, so readers can tell a complete table from a partial one.
"""
from __future__ import annotations

import io
import os
from typing import Any, Callable, Iterable

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from ritrag.ids import shard_of
from ritrag.layout import shard_file_name

ROW_GROUP_ROWS = 4096  # small groups keep point lookups of one node cheap


def write_bytes(path: str, data: bytes) -> None:
    """Write a whole file through Beam's FileSystems (local, GCS, S3, ...)."""
    with FileSystems.create(path) as fh:
        fh.write(data)


def parquet_bytes(rows: list[dict], schema: pa.Schema) -> bytes:
    table = pa.Table.from_pylist(rows, schema=schema)
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=ROW_GROUP_ROWS, compression="zstd",
                   write_statistics=True)
    return sink.getvalue()


def write_table_file(path: str, rows: list[dict], schema: pa.Schema, id_column: str) -> int:
    rows.sort(key=lambda r: r[id_column])
    write_bytes(path, parquet_bytes(rows, schema))
    return len(rows)


class _WriteShardFn(beam.DoFn):
    def __init__(self, out_dir: str, kind: str, num_shards: int, extension: str,
                 write: Callable[[str, list], Any]):
        self._out_dir = out_dir
        self._kind = kind
        self._num_shards = num_shards
        self._extension = extension
        self._write = write

    def process(self, shard_and_values: tuple[int, Iterable], **side_inputs):
        shard, values = shard_and_values
        rows = [v for v in values if v is not None]
        name = shard_file_name(self._kind, shard, self._num_shards, self._extension)
        self._write(os.path.join(self._out_dir, name), rows, **side_inputs)
        yield self._kind, len(rows)


class WriteShards(beam.PTransform):
    """Group records by shard and write one file per shard with `write(path, records)`.

    `shard_key` maps a record to the id that picks its shard; `side_inputs`
    reach `write` as keyword arguments. Outputs one (kind, number of records)
    pair per shard.
    """

    def __init__(self, out_dir: str, kind: str, num_shards: int,
                 shard_key: Callable[[Any], Any], write: Callable[[str, list], Any],
                 extension: str = "parquet", side_inputs: dict | None = None):
        super().__init__()
        self._extension = extension
        self._side_inputs = side_inputs or {}
        self._out_dir = out_dir
        self._kind = kind
        self._num_shards = num_shards
        self._shard_key = shard_key
        self._write = write

    def expand(self, records):
        n = self._num_shards
        shard_key = self._shard_key
        keyed = records | "KeyByShard" >> beam.Map(lambda r: (shard_of(shard_key(r), n), r))
        every_shard = (records.pipeline | "AllShards" >> beam.Create([(s, None) for s in range(n)]))
        return (
            (keyed, every_shard)
            | "WithEmptyShards" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShard" >> beam.ParDo(_WriteShardFn(self._out_dir, self._kind, n, self._extension, self._write),
                                          **self._side_inputs)
        )


class WriteParquetTable(beam.PTransform):
    """Rows (dicts of `schema`) -> Parquet files sharded by and sorted on the
    unique `id_column`."""

    def __init__(self, out_dir: str, kind: str, schema: pa.Schema, id_column: str, num_shards: int):
        super().__init__()
        self._out_dir = out_dir
        self._kind = kind
        self._schema = schema
        self._id_column = id_column
        self._num_shards = num_shards

    def expand(self, rows):
        schema, id_column = self._schema, self._id_column
        return rows | WriteShards(
            self._out_dir, self._kind, self._num_shards,
            shard_key=lambda r: r[id_column],
            write=lambda path, shard_rows: write_table_file(path, shard_rows, schema, id_column),
        )

"""WriteShards: records reach shard files through spill files, never a shuffle."""
from __future__ import annotations

import os

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from ritrag.ids import shard_of
from ritrag.layout import shard_file_name
from ritrag.transforms.tables import SPILL_DIR, WriteShards, remove_spill_files, write_sorted_table

SCHEMA = pa.schema([pa.field("id", pa.string(), nullable=False), pa.field("text", pa.string(), nullable=False),
                    pa.field("tags", pa.list_(pa.string()), nullable=False)])


def rows(n: int) -> list[dict]:
    return [{"id": f"node-{i:05d}", "text": f"body {i} " * (i % 50), "tags": [str(i % 3)] * (i % 4)}
            for i in range(n)]


def write(out_dir: str, records: list[dict], num_shards: int, spill_bytes: int) -> None:
    with TestPipeline(runner="FnApiRunner") as p:
        written = (p | beam.Create(records) | WriteShards(
            out_dir, "nodes", num_shards, shard_key=lambda r: r["id"],
            to_table=lambda rs: pa.Table.from_pylist(rs, schema=SCHEMA),
            write=lambda path, table: write_sorted_table(path, table, SCHEMA, ["id"]),
            spill_bytes=spill_bytes))
        assert_that(written | beam.CombinePerKey(sum), equal_to([("nodes", len(records))]))


def shard_bytes(out_dir: str, num_shards: int) -> list[bytes]:
    return [open(os.path.join(out_dir, shard_file_name("nodes", s, num_shards, "parquet")), "rb").read()
            for s in range(num_shards)]


def test_many_small_spills_write_the_same_sorted_shards_as_one_spill(tmp_path):
    records = rows(5000)
    one, many = str(tmp_path / "one"), str(tmp_path / "many")
    write(one, records, 3, spill_bytes=1 << 30)
    write(many, records[::-1], 3, spill_bytes=20_000)  # a spill file per converted batch
    assert len(os.listdir(os.path.join(many, SPILL_DIR, "nodes"))) >= 4
    assert shard_bytes(one, 3) == shard_bytes(many, 3)
    for shard in range(3):
        table = pq.read_table(os.path.join(many, shard_file_name("nodes", shard, 3, "parquet")))
        assert table.schema == SCHEMA
        ids = table.column("id").to_pylist()
        assert ids == sorted(ids) and all(shard_of(i, 3) == shard for i in ids)
        assert pq.ParquetFile(os.path.join(many, shard_file_name("nodes", shard, 3, "parquet"))
                              ).metadata.row_group(0).num_rows == min(4096, len(ids))
    assert sorted(r["id"] for s in range(3) for r in pq.read_table(
        os.path.join(many, shard_file_name("nodes", s, 3, "parquet"))).to_pylist()) == [r["id"] for r in records]
    remove_spill_files(many)
    assert not os.path.exists(os.path.join(many, SPILL_DIR))


def test_every_shard_gets_a_file_even_without_records(tmp_path):
    out = str(tmp_path / "out")
    write(out, rows(2), 4, spill_bytes=1 << 30)
    tables = [pq.read_table(os.path.join(out, shard_file_name("nodes", s, 4, "parquet"))) for s in range(4)]
    assert sum(t.num_rows for t in tables) == 2
    assert all(t.schema == SCHEMA for t in tables)

"""Sharded, deterministic table files, written without shuffling the records.

Every shard file is named `<kind>-SSSSS-of-NNNNN.<ext>` and holds the records
whose key hashes to that shard, sorted, so two builds of the same input write
byte-identical files whatever the runner's bundle order, and a reader can find
a row by binary search over row-group statistics. Every shard index gets a file,
empty or not, so readers can tell a complete table from a partial one.

Records are never shuffled themselves (Beam's local runner holds every shuffled
collection in memory, decoded into Python objects). Each worker converts the
records it sees to Arrow and appends them to spill files under the segment's
`.spill/<kind>/` folder (Arrow IPC, LZ4, one record batch per shard and flush,
named by a hash of the keys it holds);
only the (shard, spill file, batches) spans are shuffled. One worker per shard
then reads its spans, sorts them and writes the shard file. A worker's memory is
thus bounded by one shard (plus `SPILL_BYTES`), not by the corpus: more shards,
less memory per worker. The launching process deletes `.spill/` before publishing.
"""
from __future__ import annotations

import functools
import hashlib
import io
import logging
import operator
import os
import shutil
from collections import defaultdict
from typing import Any, Callable, Iterable, Sequence

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystem import BeamIOError, CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

from ritrag.ids import shard_of
from ritrag.layout import shard_file_name
from ritrag.reader import IndexReader, live_row_type
from ritrag.schema import TABLES, TableSpec
from ritrag.storage import is_remote
from ritrag.transforms import records  # noqa: F401  (the records' RowCoder)

LOG = logging.getLogger("ritrag.tables")
ROW_GROUP_ROWS = 4096  # small groups keep point lookups of one node cheap
SPILL_DIR = ".spill"  # under the segment directory; dot-named: never part of a segment
SPILL_BYTES = 64 * 2 ** 20  # Arrow bytes a worker buffers before it writes a spill file
CONVERT_RECORDS = 1024  # Python records buffered before they become Arrow tables


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


def _wide(data_type: pa.DataType) -> pa.DataType:
    """`data_type` with 64-bit offsets: a shard's text may exceed 2 GiB."""
    if pa.types.is_string(data_type):
        return pa.large_string()
    if pa.types.is_binary(data_type):
        return pa.large_binary()
    if pa.types.is_list(data_type):
        return pa.large_list(_wide(data_type.value_type))
    if pa.types.is_struct(data_type):
        return pa.struct([field.with_type(_wide(field.type)) for field in data_type])
    return data_type


def sorted_in_one_piece(table: pa.Table, sort_keys: Sequence[str]) -> tuple[pa.Table, pa.Array]:
    """(`table` as one contiguous chunk per column, the row order that sorts it by
    `sort_keys`). Slicing a contiguous table by that order is cheap; a chunked one
    would be concatenated again at every slice."""
    wide = pa.schema([field.with_type(_wide(field.type)) for field in table.schema])
    table = table.cast(wide).combine_chunks()
    return table, pc.sort_indices(table, sort_keys=[(key, "ascending") for key in sort_keys])


def write_sorted_table(path: str, table: pa.Table, schema: pa.Schema, sort_keys: Sequence[str]) -> int:
    """Write `table` sorted by `sort_keys` as Parquet of `schema`, one row group at a time."""
    table, order = sorted_in_one_piece(table, sort_keys)
    with FileSystems.create(path) as fh:
        with pq.ParquetWriter(fh, schema, compression="zstd", write_statistics=True) as writer:
            for start in range(0, len(order), ROW_GROUP_ROWS):
                writer.write_table(table.take(order[start: start + ROW_GROUP_ROWS]).cast(schema))
    return table.num_rows


SpillSpan = tuple[str, int, int]  # (spill file, first record batch, number of batches)


def read_spill_span(span: SpillSpan) -> pa.Table:
    path, first, count = span
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
        reader = pa.ipc.open_file(fh)
        return pa.Table.from_batches([reader.get_batch(i) for i in range(first, first + count)],
                                     schema=reader.schema)


class _SpillByShardFn(beam.DoFn):
    """Records -> spill files; outputs a (shard, SpillSpan) per shard and spill file."""

    def __init__(self, spill_dir: str, num_shards: int, shard_key: Callable[[Any], Any],
                 to_table: Callable[[list], pa.Table], spill_bytes: int):
        self._spill_dir = spill_dir
        self._num_shards = num_shards
        self._shard_key = shard_key
        self._to_table = to_table
        self._spill_bytes = spill_bytes

    def start_bundle(self):
        self._records: dict[int, list] = defaultdict(list)
        self._n_records = 0
        self._tables: dict[int, list[pa.Table]] = defaultdict(list)
        self._n_bytes = 0
        self._keys = hashlib.blake2b(digest_size=16)

    def process(self, record):
        key = self._shard_key(record)
        self._keys.update(repr(key).encode())
        self._records[shard_of(key, self._num_shards)].append(record)
        self._n_records += 1
        if self._n_records >= CONVERT_RECORDS:
            self._convert()
            if self._n_bytes >= self._spill_bytes:
                yield from self._spill()

    def finish_bundle(self):
        self._convert()
        for span in self._spill():
            yield GlobalWindows.windowed_value(span)

    def _convert(self) -> None:
        for shard, records in self._records.items():
            table = self._to_table(records)
            self._tables[shard].append(table)
            self._n_bytes += table.nbytes
        self._records.clear()
        self._n_records = 0

    def _spill(self) -> list[tuple[int, SpillSpan]]:
        if not self._tables:
            return []
        # Named by the keys it holds: a retried bundle rewrites the same file.
        path = f"{self._spill_dir.rstrip('/')}/{self._keys.hexdigest()}.arrow"
        self._keys = hashlib.blake2b(digest_size=16)
        spans, written = [], 0
        schema = next(iter(self._tables.values()))[0].schema
        options = pa.ipc.IpcWriteOptions(compression="lz4")
        with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            with pa.ipc.new_file(fh, schema, options=options) as writer:
                for shard in sorted(self._tables):
                    # One batch per shard and spill, however many small conversions made it.
                    table = pa.concat_tables(self._tables[shard]).combine_chunks()
                    batches = [b for b in table.to_batches() if b.num_rows]
                    for batch in batches:
                        writer.write_batch(batch)
                    spans.append((shard, (path, written, len(batches))))
                    written += len(batches)
        self._tables.clear()
        self._n_bytes = 0
        return spans


class _WriteShardFn(beam.DoFn):
    def __init__(self, out_dir: str, kind: str, num_shards: int, extension: str,
                 to_table: Callable[[list], pa.Table], write: Callable[..., Any]):
        self._out_dir = out_dir
        self._kind = kind
        self._num_shards = num_shards
        self._extension = extension
        self._to_table = to_table
        self._write = write

    def process(self, shard_and_spans: tuple[int, Iterable[SpillSpan | None]], **side_inputs):
        shard, spans = shard_and_spans
        tables = [read_spill_span(span) for span in sorted(s for s in spans if s is not None)]
        table = pa.concat_tables(tables) if tables else self._to_table([])
        name = shard_file_name(self._kind, shard, self._num_shards, self._extension)
        self._write(os.path.join(self._out_dir, name), table, **side_inputs)
        yield self._kind, table.num_rows


class WriteShards(beam.PTransform):
    """Records -> one file per shard, through spill files (see the module doc).

    `shard_key` maps a record to the id that picks its shard; `to_table` turns a
    list of records into an Arrow table (always of the same schema, also for no
    records); `write(path, table, **side_inputs)` writes one shard's file from the
    table of all its records, in any order. Outputs one (kind, number of rows)
    pair per shard.
    """

    def __init__(self, out_dir: str, kind: str, num_shards: int, shard_key: Callable[[Any], Any],
                 to_table: Callable[[list], pa.Table], write: Callable[..., Any],
                 extension: str = "parquet", side_inputs: dict | None = None,
                 spill_bytes: int = SPILL_BYTES):
        super().__init__()
        self._out_dir = out_dir
        self._kind = kind
        self._num_shards = num_shards
        self._shard_key = shard_key
        self._to_table = to_table
        self._write = write
        self._extension = extension
        self._side_inputs = side_inputs or {}
        self._spill_bytes = spill_bytes

    def expand(self, records):
        n = self._num_shards
        spill_dir = spill_location(self._out_dir, self._kind)
        spans = records | "Spill" >> beam.ParDo(
            _SpillByShardFn(spill_dir, n, self._shard_key, self._to_table, self._spill_bytes))
        every_shard = records.pipeline | "AllShards" >> beam.Create([(s, None) for s in range(n)])
        return (
            (spans, every_shard)
            | "WithEmptyShards" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShard" >> beam.ParDo(
                _WriteShardFn(self._out_dir, self._kind, n, self._extension, self._to_table, self._write),
                **self._side_inputs)
        )


def spill_location(segment_dir: str, kind: str) -> str:
    """Where a job writing `segment_dir` keeps the scratch files of `kind`
    (deleted by `remove_spill_files` before it publishes)."""
    return f"{segment_dir.rstrip('/')}/{SPILL_DIR}/{kind}"


def remove_spill_files(segment_dir: str) -> None:
    """Delete what WriteShards spilled (also files of retried or failed bundles)."""
    spill_dir = f"{segment_dir.rstrip('/')}/{SPILL_DIR}"
    if not is_remote(spill_dir):
        shutil.rmtree(spill_dir, ignore_errors=True)
        return
    try:
        FileSystems.delete([spill_dir + "/"])  # an object store: everything under the prefix
    except BeamIOError as exc:  # garbage left behind, never part of a segment: warn, go on
        LOG.warning("could not delete spill files under %s: %s", spill_dir, exc)


def records_table(records: Sequence[tuple], schema: pa.Schema) -> pa.Table:
    """The Arrow table of typed records (`ritrag.schema.table_record`) of
    `schema`: their first fields, one column each; the fields after them
    (`ChunkRow.embedded_text`) are no columns."""
    if not records:
        return schema.empty_table()
    columns = list(zip(*records))[:len(schema)]
    return pa.Table.from_arrays([pa.array(values, f.type) for values, f in zip(columns, schema)], schema=schema)


def dicts_table(rows: Sequence[dict], schema: pa.Schema) -> pa.Table:
    """The Arrow table of rows that are dicts of `schema`'s columns."""
    return pa.Table.from_pylist(rows, schema=schema)


class WriteParquetTable(beam.PTransform):
    """Rows -> the table's Parquet files, as its `ritrag.schema.TableSpec`
    says: sharded by its id column, sorted on its sort keys (the id column
    alone: then unique). Rows are the spec's typed records, or dicts of its
    schema where it has none."""

    def __init__(self, out_dir: str, spec: TableSpec, num_shards: int):
        super().__init__()
        self._out_dir, self._spec, self._num_shards = out_dir, spec, num_shards
        if spec.record is not None:  # rows of another table are refused when the pipeline is built
            self.with_input_types(spec.record)

    def expand(self, rows):
        schema, id_column, sort_keys = self._spec.schema, self._spec.id_column, list(self._spec.sort_keys)
        if self._spec.record is not None:
            shard_key = operator.attrgetter(id_column)
            to_table = functools.partial(records_table, schema=schema)
        else:
            shard_key = operator.itemgetter(id_column)
            to_table = functools.partial(dicts_table, schema=schema)
        return rows | WriteShards(
            self._out_dir, self._spec.kind, self._num_shards, shard_key=shard_key, to_table=to_table,
            write=lambda path, table: write_sorted_table(path, table, schema, sort_keys),
        )


class WriteSegmentTables(beam.PTransform):
    """{table kind: rows} -> {table kind: its writes, (kind, rows) per shard
    file}: the segment's tables (ritrag.schema.TABLES), each written by
    WriteParquetTable; what build, update and compact write alike."""

    def __init__(self, out_dir: str, num_shards: int):
        super().__init__()
        self._out_dir, self._num_shards = out_dir, num_shards

    def expand(self, tables):  # {kind: PCollection}: no annotation, which Beam would warn of
        return {kind: rows | f"Write{kind.title()}" >> WriteParquetTable(self._out_dir, TABLES[kind], self._num_shards)
                for kind, rows in tables.items()}


def as_set(ids: beam.PCollection, label: str) -> beam.pvalue.AsDict:
    """A side input holding `ids` (an update's changes, small) for membership tests."""
    return beam.pvalue.AsDict(ids | f"{label}Distinct" >> beam.Distinct()
                              | f"{label}AsKeys" >> beam.Map(lambda i: (i, None)))


class ReadLiveRows(beam.PTransform):
    """The live rows of one kind of table (`ritrag.reader.LiveFile.rows`): as
    `record`s of (some of) its columns, by default as its table is written.

    `where` ({column: PCollection of values}) keeps only the rows whose
    columns hold one of those values: the values (an update's changes, small)
    are a side input, and each file is filtered as it is read, so the rows
    that do not match never become elements."""

    def __init__(self, live: IndexReader, kind: str, record: type | None = None,
                 where: dict[str, beam.PCollection] | None = None):
        super().__init__()
        self._files, self._record, self._where = live.files(kind), record, dict(where or {})
        self._element_type = live_row_type(kind, record)

    def expand(self, pbegin):
        record, names = self._record, list(self._where)
        files = pbegin | "Files" >> beam.Create(self._files)
        if not names:
            return files | "Rows" >> beam.FlatMap(lambda f: f.rows(record)).with_output_types(self._element_type)
        values = [beam.pvalue.AsList(self._where[name] | f"Distinct{i}" >> beam.Distinct())
                  for i, name in enumerate(names)]
        return files | "RowsWhere" >> beam.FlatMap(
            lambda f, *wanted: f.rows(record, dict(zip(names, wanted))), *values
        ).with_output_types(self._element_type)

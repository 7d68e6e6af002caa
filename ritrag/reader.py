"""Reading one published version of an index: its files, verified, and its live rows.

A version is the segments its manifest lists, oldest first. A row of a
segment's table is live unless a later segment's tombstones name its id: an
update tombstones the nodes, chunks and pages it replaced or deleted, so the
rows of a version are the live rows of all its segments, each id once.
`IndexReader` is the one reader of that rule: the jobs (update, compact),
`ritrag inspect`, evaluation and the server's loaded version
(ritrag.serving.index) all read through it.

Every file is checked against its manifest entry (size and sha256,
`IndexLayout.verified_path`) the first time a reader opens it, and only then:
a missing file raises MissingIndexError and a damaged one DamagedIndexError,
the IndexLoadError kinds the server reports. The one exception is
`sized_paths`, for a reader that checks the parts it reads (a job's vector
store: ritrag/vectors.py, `checked`). Files are reached through
ritrag/storage.py, so a job reads an index in an object store as it reads one
on disk (the server reads its local mirror of one, ritrag.serving.remote).

A row is found two ways: by its id (`IndexReader.rows_by_id`; an id is looked
for only in the shard that owns it, ritrag.ids.shard_of), and by its position
among all rows of its kind's files in manifest order, dead rows included
(`RowPositions`): the server numbers node rows so and reads bodies by them.
"""
from __future__ import annotations

import functools

import os
from collections.abc import Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ritrag.ids import shard_of
from ritrag.layout import (DENSE_TRAINED_FILE, TOMBSTONES_FILE, DamagedIndexError, IndexLayout, Manifest,
                           file_identity, parse_shard_file_name)
from ritrag.schema import FILE_FIELD, TABLES
from ritrag.storage import is_remote, open_parquet, open_read

# The id column that keys each kind of shard file, and that tombstones name
# (the tombstones table has one column per id: node_id, chunk_id, url,
# source_node_id): the tables' (ritrag.schema.TABLES) and the chunk files'.
ID_COLUMNS = {**{kind: spec.id_column for kind, spec in TABLES.items()},
              "postings": "chunk_id", "vectors": "chunk_id", "dense": "chunk_id"}


def live_mask(ids: pa.Array | pa.ChunkedArray, dead: frozenset) -> np.ndarray:
    """numpy bool mask: True for the `ids` that `dead` does not name."""
    if not dead:
        return np.ones(len(ids), bool)
    return ~pc.is_in(ids, value_set=_value_set(dead, ids.type)).to_numpy(zero_copy_only=False)


@functools.lru_cache(maxsize=8)
def _value_set(dead: frozenset, value_type: pa.DataType) -> pa.Array:
    # Made once per set: every file of a segment shares its dead ids (hundreds of
    # thousands after an update that re-placed a large site), and a frozenset's
    # hash is computed once.
    return pa.array(sorted(dead), value_type)


def read_tombstones(path: str) -> dict[str, frozenset]:
    """The ids a tombstones file names, by id column, read once per process
    while a local file's size, mtime and inode stay as they were: every
    version a server loads names the tombstones files of all its segments,
    and one update adds one (reading the others again took 1.0 s of a
    5.7 s reload at 600k pages, 10 segments, beside another job)."""
    identity = file_identity(path)
    return _read_tombstones(path) if identity is None else _held_tombstones(path, identity)


def _read_tombstones(path: str) -> dict[str, frozenset]:
    table = open_parquet(path).read()
    return {name: frozenset(table[name].drop_null().to_pylist()) for name in table.column_names}


@functools.lru_cache(maxsize=256)  # one per segment of the versions a process loads
def _held_tombstones(path: str, identity: tuple[int, int, int]) -> dict[str, frozenset]:
    return _read_tombstones(path)


def _unpickled_live_file(kind: str, path: str, segment: str, shard: int, num_shards: int,
                         tombstones: tuple[str, ...]) -> "LiveFile":
    column = ID_COLUMNS.get(kind)
    return LiveFile(kind, path, segment, shard, num_shards,
                    later_tombstones(tombstones, column) if column else frozenset(), tombstones)


def read_rows_by_id(path: str, id_column: str, ids: list, columns: list[str]) -> dict[Any, dict[str, Any]]:
    """Point reads: the rows of `ids` in one Parquet file sorted by
    `id_column` (row-group statistics prune what is not needed), by id."""
    source = open_read(path) if is_remote(path) else path
    table = pq.read_table(source, columns=[id_column, *columns], filters=pc.field(id_column).isin(pa.array(ids)))
    return {row[id_column]: row for row in table.to_pylist()}


@contextmanager
def refused_if_unreadable(path: str) -> Iterator[None]:
    """A file of a version that passed its checksum and still does not parse
    was written damaged: DamagedIndexError naming it, not an Arrow error."""
    try:
        yield
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:  # pyarrow's ArrowIOError and ArrowInvalid among them
        raise DamagedIndexError(f"{path}: does not load ({type(exc).__name__}: {exc})") from exc


def live_row_type(kind: str, record: type | None = None) -> type:
    """The type of the live rows of a `kind` table that `LiveFile.rows(record)` gives."""
    return record or TABLES[kind].record or dict


# (tombstones files, id column) -> the ids they name: what a process read, or
# what its job's reader shared (`IndexReader.share_dead_ids`: 4 id columns per
# segment); the 128 newest are kept.
_LATER_TOMBSTONES: dict[tuple[tuple[str, ...], str], frozenset] = {}
_LATER_TOMBSTONES_KEPT = 128


def _remember_later_tombstones(paths: tuple[str, ...], id_column: str, ids: frozenset) -> None:
    _LATER_TOMBSTONES.pop((paths, id_column), None)
    _LATER_TOMBSTONES[(paths, id_column)] = ids
    while len(_LATER_TOMBSTONES) > _LATER_TOMBSTONES_KEPT:
        _LATER_TOMBSTONES.pop(next(iter(_LATER_TOMBSTONES)), None)


def later_tombstones(paths: tuple[str, ...], id_column: str) -> frozenset:
    """The ids of `id_column` that the tombstones files at `paths` name, read
    once per process for each set of files."""
    ids = _LATER_TOMBSTONES.get((paths, id_column))
    if ids is None:
        ids = frozenset().union(*(read_tombstones(path).get(id_column, frozenset()) for path in paths))
        _remember_later_tombstones(paths, id_column, ids)
    return ids


@dataclass(frozen=True)
class LiveFile:
    """One shard file of a version, verified, with the ids of its kind that
    later segments tombstoned (`dead`) and those segments' tombstones files
    (`tombstones`). A LiveFile pickles without its dead ids, which an update
    of a large index counts in hundreds of thousands (its jobs' stages are
    pickled again and again): where it is unpickled, they are read again
    from `tombstones`, once per process."""

    kind: str
    path: str
    segment: str
    shard: int
    num_shards: int
    dead: frozenset
    tombstones: tuple[str, ...] = ()

    def __reduce__(self):
        if self.dead and not self.tombstones:  # made with ids but no files that name them: the ids travel
            return LiveFile, (self.kind, self.path, self.segment, self.shard, self.num_shards, self.dead)
        return _unpickled_live_file, (self.kind, self.path, self.segment, self.shard, self.num_shards,
                                      self.tombstones)

    @property
    def id_column(self) -> str:
        return ID_COLUMNS[self.kind]

    def owns(self, row_id: int | str) -> bool:
        """Whether a row of this id is written to this file's shard (none other holds it)."""
        return shard_of(row_id, self.num_shards) == self.shard

    def live_mask(self, ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        return live_mask(ids, self.dead)

    def read(self, columns: list[str] | None = None) -> pa.Table:
        """Every row of a table file, dead ones too; a column added since the
        file was written (TableSpec.added) is filled with its default."""
        with refused_if_unreadable(self.path):
            parquet = open_parquet(self.path)  # one open for the schema and the rows
            present = set(parquet.schema_arrow.names)
            added = {name: value for name, value in TABLES[self.kind].added.items()
                     if name not in present and (columns is None or name in columns)}
            table = parquet.read(columns=[c for c in columns if c not in added] if columns is not None else None)
        for name, value in added.items():
            field = TABLES[self.kind].schema.field(name)
            table = table.append_column(field, pa.array([value] * len(table), field.type))
        return table.select(columns) if columns is not None else table

    def table(self, columns: list[str] | None = None, rows: np.ndarray | None = None) -> pa.Table:
        """The live rows of a table file (its id column always among
        `columns`); with `rows`, only those of the file's rows (positions,
        ascending), so that the dead ids are looked up for them alone."""
        if columns is not None and self.id_column not in columns:
            columns = [self.id_column, *columns]
        table = self.read(columns)
        if rows is not None:
            table = table.take(rows)
        return table.filter(self.live_mask(table[self.id_column]))

    def rows(self, record: type | None = None, where: Mapping[str, Collection] | None = None) -> Iterator[Any]:
        """The live rows as `record`s: a record made from this file's table
        (ritrag.schema.table_record) holds the columns its fields name, and in
        its FILE_FIELD, where it has one, this file (for later point reads and
        tombstones). By default, the rows as their table is written: its
        TableSpec.record, or dicts of its columns for a table without one.
        With `where` ({column: values}), only the rows whose every named column
        holds one of its values; "list.field" names a field of a list of structs,
        and a row matches when any of its elements' does. The filter is
        vectorized and comes first: the columns `where` names are read, and the
        others only from a file where some row matches, so a job that needs a
        few rows of a large table pays a scan of those columns, not a record
        per row, and an empty set of values reads nothing."""
        names = TABLES[self.kind].schema.names
        record = live_row_type(self.kind, record)
        columns = names if record is dict else [name for name in record._fields if name in names]
        if not where:
            table = self.table(columns)
        elif any(len(values) == 0 for values in where.values()):
            return  # no row holds one of no values (an update that changed nothing asks so of every file)
        else:
            matching = self.read(list(dict.fromkeys(name.partition(".")[0] for name in where)))
            keep = np.ones(len(matching), bool)
            for name, values in where.items():
                keep &= _holds_one_of(matching, name, values)
            if not keep.any():
                return
            table = self.table(columns, np.flatnonzero(keep))
        rows = table.select(columns).to_pylist()  # `table` holds the id column, asked for or not
        if record is dict:
            yield from rows
            return
        located = {FILE_FIELD: self.path} if FILE_FIELD in record._fields else {}
        for values in rows:
            yield record(**values, **located)


def _holds_one_of(table: pa.Table, name: str, values: Collection) -> np.ndarray:
    """Which rows of `table` hold one of `values` in column `name` (a flat
    column, or "list.field": any element of a list-of-structs column)."""
    column, _, member = name.partition(".")
    array = table[column].combine_chunks()
    if not member:
        return pc.is_in(array, value_set=pa.array(list(values), array.type)).to_numpy(zero_copy_only=False)
    elements = pc.list_flatten(array)
    field = pc.struct_field(elements, member)
    hit = pc.is_in(field, value_set=pa.array(list(values), field.type)).to_numpy(zero_copy_only=False)
    rows = pc.list_parent_indices(array).to_numpy()
    out = np.zeros(len(table), bool)
    out[rows[hit]] = True
    return out


def _mapped_whole(path: str) -> pa.Buffer:
    """The whole local file at `path` as a read-only mapped buffer (the buffer
    keeps the mapping alive once the file is closed)."""
    with pa.memory_map(path) as mapped:
        return mapped.read_buffer()


class RowPositions:
    """Every row of one kind's files, dead ones too, numbered in manifest
    order (a file's rows follow the previous file's). The footers are read
    once, so a position names its file and row group, and a point read
    decodes that row group only.

    A local file is memory-mapped here, once: the mapping outlives the file's
    name, so a server keeps reading the version it loaded after a prune
    deleted that version's segments (docs/OPERATING.md), and it costs no file
    descriptor and no memory but the pages read."""

    def __init__(self, kind: str, files: Sequence[LiveFile]):
        self.kind, self.files = kind, list(files)
        self._mapped = [None if is_remote(f.path) else _mapped_whole(f.path) for f in self.files]
        self._metadata = []
        for f, mapped in zip(self.files, self._mapped):
            with refused_if_unreadable(f.path):
                self._metadata.append(pq.ParquetFile(pa.BufferReader(mapped)).metadata if mapped is not None
                                      else open_parquet(f.path).metadata)
        self.file_start = np.concatenate([[0], np.cumsum([md.num_rows for md in self._metadata])]).astype(np.int64)
        self._group_start = [np.cumsum([0] + [md.row_group(g).num_rows for g in range(md.num_row_groups)])
                             for md in self._metadata]

    @property
    def num_rows(self) -> int:
        return int(self.file_start[-1])

    def column(self, name: str) -> pa.ChunkedArray:
        """One column of every row, in position order."""
        if not self.files:
            return pa.chunked_array([], TABLES[self.kind].schema.field(name).type)
        return pa.concat_tables([f.read([name]) for f in self.files])[name]

    def read(self, positions: Sequence[int], columns: list[str]) -> dict[int, dict[str, Any]]:
        """`columns` of the rows at `positions`, by position; each row group is read once."""
        wanted: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for position in positions:
            f = int(np.searchsorted(self.file_start, position, side="right")) - 1
            in_file = position - int(self.file_start[f])
            g = int(np.searchsorted(self._group_start[f], in_file, side="right")) - 1
            wanted.setdefault((f, g), []).append((position, in_file - int(self._group_start[f][g])))
        out: dict[int, dict[str, Any]] = {}
        for (f, g), members in wanted.items():
            # A fresh reader per lookup (over the footer read once) is safe
            # to use from many request threads at once.
            mapped = self._mapped[f]
            source = pa.BufferReader(mapped) if mapped is not None else open_read(self.files[f].path)
            parquet = pq.ParquetFile(source, metadata=self._metadata[f])
            group = parquet.read_row_group(g, columns=columns)
            for position, offset in members:
                out[position] = {name: group[name][offset].as_py() for name in columns}
        return out


class IndexReader:
    """One published version of an index (default: the one CURRENT names),
    read through `layout`: its segment files by kind, verified once each, the
    ids later segments tombstoned, live rows by kind, and point reads."""

    def __init__(self, layout: IndexLayout | str, version: str | None = None):
        self.layout = IndexLayout(layout) if isinstance(layout, str) else layout
        self.manifest: Manifest = self.layout.load_manifest(version)
        self.version = self.manifest.version
        self._verified: dict[tuple[str, str], str] = {}
        self._files: dict[str, list[LiveFile]] = {}
        self._positions: dict[str, RowPositions] = {}
        self._later_tombstones: dict[str, tuple[str, ...]] = {}  # per segment: its later segments' tombstones files
        self.dead = self._dead_per_segment()

    def verified_path(self, segment: dict[str, Any], name: str) -> str:
        """The path of a segment's file, checked against the manifest the first time it is asked for."""
        key = (segment["id"], name)
        if key not in self._verified:
            self._verified[key] = self.layout.verified_path(segment, name)
        return self._verified[key]

    def verify_files(self, kinds: Sequence[str], workers: int) -> None:
        """Check every shard file of `kinds` against the manifest now, `workers`
        files at a time: sha256 releases the GIL, so a first load hashes at
        the disk's speed, not at one core's."""
        wanted = [(segment, name) for segment in self.manifest.segments for name in segment["files"]
                  if (parsed := parse_shard_file_name(name)) and parsed[0] in kinds
                  and (segment["id"], name) not in self._verified]
        with ThreadPoolExecutor(max(1, workers)) as pool:
            for (segment, name), path in zip(wanted, pool.map(lambda job: self.layout.verified_path(*job), wanted)):
                self._verified[(segment["id"], name)] = path

    def _dead_per_segment(self) -> dict[str, dict[str, frozenset]]:
        """Per segment, the ids (by id column) that any later segment tombstoned
        (and, in `_later_tombstones`, the files that name them)."""
        out: dict[str, dict[str, frozenset]] = {}
        later: dict[str, frozenset] = {}
        paths: tuple[str, ...] = ()
        for segment in reversed(self.manifest.segments):
            out[segment["id"]] = later
            self._later_tombstones[segment["id"]] = paths
            if TOMBSTONES_FILE in segment["files"]:
                path = self.verified_path(segment, TOMBSTONES_FILE)
                own = read_tombstones(path)
                later = {name: later.get(name, frozenset()) | own.get(name, frozenset())
                         for name in {*later, *own}}
                paths = (path, *paths)
        return out

    def share_dead_ids(self) -> None:
        """Give the LiveFiles this process unpickles the dead ids this reader
        read, so that they do not read the tombstones files again: a job's
        stages, which the direct runner unpickles in the job's own process
        (886,939 dead ids of 7 segments at 400k pages took 4.6 s to read again). Not for a server,
        which would keep the dead ids of versions it no longer serves."""
        for segment in self.manifest.segments:
            paths = self._later_tombstones[segment["id"]]
            if paths:
                for column in set(ID_COLUMNS.values()):
                    _remember_later_tombstones(paths, column, self.dead[segment["id"]].get(column, frozenset()))

    def segment_files(self, name: str) -> list[str]:
        """The one file `name` (bm25.json, dead_letters.parquet, ...) of every segment that has it."""
        return [self.verified_path(seg, name) for seg in self.manifest.segments if name in seg["files"]]

    def sized_paths(self, kind: str) -> list[str]:
        """The paths of the shard files of `kind` of every segment, in manifest
        order, each there at its manifest size but not hashed
        (`IndexLayout.sized_path`): for a reader that checks the parts it reads."""
        return [self.layout.sized_path(seg, name) for seg in self.manifest.segments
                for name in self.layout.segment_files(seg, kind)]

    def files(self, kind: str) -> list[LiveFile]:
        """The shard files of `kind` (nodes, chunks, postings, dense, ...) of every segment, in manifest order."""
        if kind not in self._files:
            found = []
            for seg in self.manifest.segments:
                dead = self.dead[seg["id"]].get(ID_COLUMNS.get(kind, ""), frozenset())
                for name in self.layout.segment_files(seg, kind):
                    _, shard, num_shards = parse_shard_file_name(name)
                    found.append(LiveFile(kind, self.verified_path(seg, name), seg["id"], shard, num_shards, dead,
                                          self._later_tombstones[seg["id"]]))
            self._files[kind] = found
        return self._files[kind]

    def table(self, kind: str, columns: list[str] | None = None) -> pa.Table:
        """The live rows of a table (pages, nodes, chunks, edges) as one Arrow table."""
        tables = [f.table(columns) for f in self.files(kind)]
        if not tables:
            schema = TABLES[kind].schema
            return schema.empty_table().select(columns) if columns is not None else schema.empty_table()
        return pa.concat_tables(tables)

    def rows(self, kind: str, record: type | None = None) -> Iterator[Any]:
        """The live rows of a table, file by file, as `LiveFile.rows` gives them."""
        for live_file in self.files(kind):
            yield from live_file.rows(record)

    def rows_by_id(self, kind: str, ids: Sequence[Any], columns: list[str]) -> dict[Any, dict[str, Any]]:
        """Point reads: the live rows of `ids` (those no live row has are left
        out), by id; each file is read only for the ids its shard owns."""
        out: dict[Any, dict[str, Any]] = {}
        for live_file in self.files(kind):
            wanted = [i for i in ids if live_file.owns(i) and i not in live_file.dead]
            if wanted:
                out.update(read_rows_by_id(live_file.path, live_file.id_column, wanted, columns))
        return out

    def positions(self, kind: str) -> RowPositions:
        """Every row of a table, dead ones too, addressed by position (`RowPositions`)."""
        if kind not in self._positions:
            self._positions[kind] = RowPositions(kind, self.files(kind))
        return self._positions[kind]

    def trained_dense_source(self) -> str:
        """The file the trained empty index of the version's dense shards
        comes from (`read_trained_dense_index`), checked against the manifest
        now: a job asks in its launcher, so a damaged file is refused before
        the pipeline runs. It is the base segment's DENSE_TRAINED_FILE, so that
        new shards share its lists and codebooks; for an index written before
        that file existed, its first dense shard."""
        base = self.manifest.segments[0]
        if DENSE_TRAINED_FILE in base["files"]:
            return self.verified_path(base, DENSE_TRAINED_FILE)
        return self.files("dense")[0].path

    def trained_dense_index(self) -> bytes:
        """The trained empty index of the version's dense shards (`trained_dense_source`)."""
        return read_trained_dense_index(self.trained_dense_source())


def read_trained_dense_index(source: str) -> bytes:
    """The trained empty index in `source` (IndexReader.trained_dense_source):
    the file as it is, or a dense shard emptied."""
    if os.path.basename(source) != DENSE_TRAINED_FILE:
        return trained_empty_index_of(source)
    with open_read(source) as fh:
        return fh.read()


def trained_empty_index_of(dense_path: str) -> bytes:
    """The trained index of an existing dense shard, emptied."""
    with open_read(dense_path) as fh:
        index = faiss.deserialize_index(np.frombuffer(fh.read(), dtype=np.uint8))
    index.reset()
    return faiss.serialize_index(index).tobytes()

"""The node skeleton as serving holds it: what every GetToC touches, in
arrays. `Skeleton` is the skeleton columns of every node row (ids, parents,
positions, titles, optional summary and keywords, ancestors; Arrow), a row's
parent and ancestors resolved to live rows as a query asks; `NodeRows` maps
node ids to rows. Parent and ancestor ids are held as their node keys
(ritrag.ids.node_keys, made once per node file decoded: `skeleton_columns`),
so a query resolves them by integer search without converting a string.
Rows are node positions in the version's files (ritrag.reader.RowPositions):
rows that later segments replaced stay, but no id maps to them.
"""
from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ritrag.ids import NO_NODE_KEY, node_ids_of_keys, node_keys
from ritrag.serving_form import utf8_fixed_width

SKELETON_COLUMNS = ["node_id", "parent_id", "position", "title", "summary", "keywords", "ancestor_ids"]  # read
# What is held of them: the node's own id, and its own, parent and ancestor ids as keys
# (uint64; NO_NODE_KEY for a root's missing parent), which take less memory than the strings.
HELD_COLUMNS = ["node_id", "node_key", "parent_key", "position", "title", "summary", "keywords", "ancestor_keys"]


class Column(Sequence):
    """Row access to an Arrow array, as Python values."""

    def __init__(self, array: pa.Array):
        self._array = array

    def __getitem__(self, row: int) -> Any:
        return self._array[row].as_py()

    def __len__(self) -> int:
        return len(self._array)


class IdColumn(Column):
    """Row access to a column of node keys, as the node ids they stand for (None for NO_NODE_KEY)."""

    def __getitem__(self, row: int) -> str | None:
        key = self._array[row].as_py()
        return None if key == int(NO_NODE_KEY) else node_ids_of_keys(np.array([key], np.uint64))[0]


class IdListColumn(Column):
    """Row access to a column of lists of node keys, as lists of the node ids they stand for."""

    def __getitem__(self, row: int) -> list[str]:
        keys = self._array[row].values.to_numpy(zero_copy_only=False)
        return node_ids_of_keys(keys) if len(keys) else []


class NodeRows(Mapping):
    """Node id -> row, by binary search over the ids' keys (uint64,
    ritrag.ids.node_keys) sorted once: an integer array takes a fraction of a
    dict's memory and start time for millions of ids, and an integer compares
    in one step where the id's 12 bytes compare one by one (the searches of a
    GetToC: its hits' ancestors, their links)."""

    def __init__(self, sorted_keys: np.ndarray, order: np.ndarray):
        """`sorted_keys` (uint64, ascending) and the row of each."""
        self._sorted, self._order = sorted_keys, order

    @classmethod
    def of(cls, ids: np.ndarray, rows: np.ndarray | None = None) -> "NodeRows":
        """The map of `ids` (bytes, or their keys: uint64) held by the node rows
        `rows` (default: row i holds ids[i])."""
        keys = ids if ids.dtype == np.uint64 else _held_keys(ids)
        by_key = np.argsort(keys, kind="stable")
        return cls(keys[by_key], by_key if rows is None else rows[by_key])

    def merged(self, live: np.ndarray, ids: np.ndarray, start: int) -> "NodeRows":
        """The map of the rows `live` marks, when this map's rows are all below
        `start` and every live row below it is among them: this map less the
        rows no longer live, and the live rows from `start` on (`ids`: every
        row's id, or its key) merged in, as `of` would order them. It sorts the new ids
        only: a version one segment on costs that segment, not the index."""
        keep = live[self._order]
        new_rows = start + np.flatnonzero(live[start:])
        new_keys = ids[new_rows] if ids.dtype == np.uint64 else _held_keys(ids[new_rows])
        by_key = np.argsort(new_keys, kind="stable")
        new_keys, new_rows = new_keys[by_key], new_rows[by_key]
        old_keys = self._sorted[keep]
        at = np.searchsorted(old_keys, new_keys, side="right")  # equal ids: the earlier row first, as in `of`
        return NodeRows(np.insert(old_keys, at, new_keys), np.insert(self._order[keep], at, new_rows))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted keys, their rows): what `NodeRows(...)` is made of."""
        return self._sorted, self._order

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows of an array of node ids (bytes) or of their keys (uint64); -1 where unknown."""
        keys = ids if ids.dtype == np.uint64 else node_keys(ids)
        if not len(self._sorted):
            return np.full(len(keys), -1, np.int64)
        pos = np.minimum(np.searchsorted(self._sorted, keys), len(self._sorted) - 1)
        return np.where(self._sorted[pos] == keys, self._order[pos], -1)

    def __getitem__(self, node_id: str) -> int:
        try:
            key = node_id.encode("ascii")
        except (AttributeError, UnicodeEncodeError):
            raise KeyError(node_id) from None
        # numpy's bytes drop trailing NULs: "a" and "a\0" would be one id.
        if not key or b"\0" in key:
            raise KeyError(node_id)
        row = int(self.rows(np.array([key]))[0])
        if row < 0:
            raise KeyError(node_id)
        return row

    def __iter__(self) -> Iterator[str]:
        return iter(node_ids_of_keys(self._sorted))

    def __len__(self) -> int:
        return len(self._sorted)


def _held_keys(ids: np.ndarray) -> np.ndarray:
    """The keys of ids a node row holds: an id no key stands for is refused."""
    keys = node_keys(ids)
    if (keys == NO_NODE_KEY).any():
        raise ValueError(f"node id {ids[keys == NO_NODE_KEY][0]!r} is not a node id "
                         f"(12 base32 characters, ritrag.ids)")
    return keys


def skeleton_columns(table: pa.Table | Mapping[str, pa.Array | pa.ChunkedArray]) -> dict[str, pa.Array]:
    """The HELD_COLUMNS of node rows read with the SKELETON_COLUMNS, one array
    each: ids keyed once here, so that queries never convert them. A node id
    no key stands for is refused (ValueError)."""
    present = set(table.column_names if isinstance(table, pa.Table) else table)
    # (a hand-made skeleton, in tests, may leave out the text columns)
    columns = {name: _one_array(table[name]) for name in SKELETON_COLUMNS
               if name in HELD_COLUMNS and name in present}
    columns["node_key"] = pa.array(_held_keys(utf8_fixed_width(columns["node_id"])), pa.uint64())
    parents = pc.fill_null(_one_array(table["parent_id"]), "")
    parent_keys = node_keys(utf8_fixed_width(parents))
    parent_keys[np.asarray(pc.equal(parents, "").to_numpy(zero_copy_only=False), bool)] = NO_NODE_KEY
    columns["parent_key"] = pa.array(parent_keys, pa.uint64())
    lists = _one_array(table["ancestor_ids"])
    offsets = lists.offsets.to_numpy()
    # An ancestor is listed by every node below it: each distinct id keyed once.
    ancestors = lists.flatten().dictionary_encode()
    values = (node_keys(utf8_fixed_width(ancestors.dictionary))[ancestors.indices.to_numpy()]
              if len(ancestors) else np.zeros(0, np.uint64))
    columns["ancestor_keys"] = pa.ListArray.from_arrays(pa.array(offsets - offsets[0], pa.int32()),
                                                         pa.array(values, pa.uint64()))
    return {name: columns[name] for name in HELD_COLUMNS if name in columns}


def _one_array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.Array):
        return column
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


class Skeleton:
    """Every node row as the sub-forest reads it: the skeleton columns (Arrow)
    and the live rows' id map. A row's parent and ancestors are resolved to
    live rows when a query asks for them (`parents`, `ancestor_lists`): a few
    hundred id searches per GetToC, where resolving every row at load cost a
    search per node and per ancestor (seconds at a million nodes, at every
    version a server loads). The whole-version arrays (`parent_row`,
    `ancestor_indptr`, `ancestor_rows`) are resolved once, at first use, for
    what needs every row (the root prior)."""

    def __init__(self, columns: Mapping[str, pa.Array], node_row: NodeRows):
        """`columns`: the HELD_COLUMNS (`skeleton_columns`), or the SKELETON_COLUMNS, keyed here."""
        self.columns = columns if "node_key" in columns else skeleton_columns(columns)
        self.node_row = node_row
        self.position = self.columns["position"].to_numpy()  # int32 place among its siblings
        self.node_key = self.columns["node_key"].to_numpy()  # uint64, every row's own id's key
        self._parent_key = self.columns["parent_key"].to_numpy()
        ancestors = self.columns["ancestor_keys"]
        self._ancestor_starts = ancestors.offsets.to_numpy().astype(np.int64)
        self._ancestor_keys = ancestors.values.to_numpy()

    def parents(self, rows: np.ndarray) -> np.ndarray:
        """The live row of each row's parent (int64); -1 for a root or a parent no live row holds."""
        return self.node_row.rows(self._parent_key[np.asarray(rows, np.int64)])

    def ancestor_lists(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(how many live ancestors each row has, their rows concatenated, each
        row's root first); ids no live row holds are left out."""
        rows = np.asarray(rows, np.int64)
        starts = self._ancestor_starts[rows]
        counts = self._ancestor_starts[rows + 1] - starts
        # the entries of each row's list, one gather: each entry's start, plus its place in the list
        at = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        found = self.node_row.rows(self._ancestor_keys[at])
        kept = np.concatenate([[0], np.cumsum(found >= 0)])[np.concatenate([[0], np.cumsum(counts)])]
        return np.diff(kept), found[found >= 0]

    def ancestors(self, rows: np.ndarray) -> np.ndarray:
        """The ancestor rows of all `rows`, concatenated."""
        return self.ancestor_lists(rows)[1]

    @functools.cached_property
    def _every_row(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        every = np.arange(len(self.position))
        counts, ancestors = self.ancestor_lists(every)
        indptr = np.zeros(len(every) + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        return self.parents(every).astype(np.int32), indptr, ancestors.astype(np.int32)

    @property
    def parent_row(self) -> np.ndarray:
        """int32, every row's `parents`."""
        return self._every_row[0]

    @property
    def ancestor_indptr(self) -> np.ndarray:
        """int64 (rows + 1): row r's ancestors are ancestor_rows[indptr[r]:indptr[r + 1]]."""
        return self._every_row[1]

    @property
    def ancestor_rows(self) -> np.ndarray:
        """int32, every row's `ancestor_lists`, concatenated."""
        return self._every_row[2]

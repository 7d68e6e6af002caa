"""A segment's serving form: what a server maps instead of deriving it.

Every job that writes a segment (build, update, compact) ends its pipeline
with the stage that writes it (ritrag.transforms.serving_files, one shard
per worker), before the segment is checksummed into its manifest:
one file per shard number, `serving-SSSSS-of-NNNNN.arrays`, holding that
shard's BM25 postings as CSR, its chunks' rows and its vocabulary's document
frequencies per field. A server maps the files as written (`map_arrays`), so a
version is served without reading a posting, and a new version maps only the
segments it adds (ritrag.serving.segments). The Parquet files stay the
interchange and Read format; these arrays are derived from them, once.

The arrays of shard s (numbers of ritrag.bm25.KIND_FIELDS for fields):

    chunk_ids     int64 (c,)   the chunks of chunks-s, ascending (the shard's rows)
    chunk_kind    int8  (c,)   each row's field
    chunk_length  float32 (c,) each row's BM25 length: the sum of its tf
    chunk_node    int32 (c,)   the row's node: its position among the rows of
                               the segment's node files, in shard order; -1 for a
                               node of another segment (an update's anchor documents)
    chunk_node_id S<w> (c,)    the row's node id, to resolve it when its node is
                               elsewhere or was replaced by a later segment
    terms         S<w> (t,)    the distinct terms of postings-s, ascending (UTF-8 bytes)
    indptr        int64 (t+1,) the postings of terms[i] are entries indptr[i]:indptr[i+1]
    rows          int32 (p,)   each posting's row in chunk_ids, ascending within a term
    tf            uint16 (p,)  each posting's term frequency (capped at 65,535)
    vocab_terms   S<w> (v,)    the terms of vocabulary-s, ascending
    vocab_df      int64 (v, 3) their document frequency per field over the whole
                               segment (signed in an update's delta)
    link_out_source uint64 (e,) the node links of edges-s (the sources shard s
    link_out_target uint64 (e,) owns), each (source, target) pair once as node
                               keys (ritrag.ids.node_keys), a node's links to
                               itself left out, sorted by source then target
                               (a node's out-links)
    in_link_target  uint64 (i,) the segment's node links whose target shard s
    in_link_source  uint64 (i,) owns (ritrag.ids.shard_of, as a source's shard),
                               the same pairs of every edges shard, sorted by
                               target then source (a node's in-links: one
                               shard of each segment to search, as for its
                               out-links)

Files written before the in-links were sharded by target hold, instead of
`in_link_*`, `link_in_target` and `link_in_source`: edges-s's own pairs sorted
by target, so a node's in-links may be in any shard (a server searches each);
files written before node keys hold those four arrays as the ids' bytes,
S<w>, sorted likewise (a server turns them into keys once, `link_arrays`).

The container: 8 bytes of magic `RITRAG\\x01\\x00`, a little-endian uint64
header length, the header as UTF-8 JSON ({"arrays": {name: {"dtype",
"shape", "offset"}}}), then each array's bytes, C order, little endian, at
an offset that is a multiple of 64 from the start of the file.
"""
from __future__ import annotations

import json
import mmap
import os
import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ritrag.bm25 import row_kinds
from ritrag.ids import NO_NODE_KEY, node_keys, shard_of
from ritrag.layout import DamagedIndexError, shard_file_name
from ritrag.schema import EDGES_KIND
from ritrag.storage import is_remote, open_parquet, open_read

SERVING_KIND = "serving"
SERVING_EXT = "arrays"
MAGIC = b"RITRAG\x01\x00"
ALIGN = 64
# The dtypes a serving file may hold: anything else in a header is damage.
DTYPES = {"<i8", "<i4", "|i1", "<f4", "<u2", "<u8"}
MAX_TF = np.iinfo(np.uint16).max


def utf8_fixed_width(strings: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Arrow strings as a numpy bytes array (`S<w>`, w the longest UTF-8
    encoding), built from Arrow's buffers without a Python object per string.
    numpy compares such arrays bytewise, as Arrow sorted them."""
    chunked = pa.chunked_array([strings]) if isinstance(strings, pa.Array) else strings
    array = chunked.combine_chunks().cast(pa.large_binary())
    n = len(array)
    if n == 0:
        return np.zeros(0, "S1")
    offsets = np.frombuffer(array.buffers()[1], np.int64)[array.offset:array.offset + n + 1]
    data = np.frombuffer(array.buffers()[2], np.uint8) if array.buffers()[2] is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    width = max(int(lengths.max()), 1)
    full = lengths == width
    if not lengths[~full].any():  # ids: all of one length, or empty (a root's parent): one view, no scatter
        out = np.zeros(n, f"S{width}")
        out[full] = data[offsets[0]:offsets[-1]].view(f"S{width}")
        return out
    out = np.zeros((n, width), np.uint8)
    row = np.repeat(np.arange(n), lengths)
    column = np.arange(int(lengths.sum())) - np.repeat(offsets[:-1] - offsets[0], lengths)
    out[row, column] = data[offsets[0]:offsets[-1]]
    return out.view(f"S{width}").reshape(n)


def write_arrays(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Write `arrays` to `path` in the container format (module docstring)."""
    from apache_beam.io.filesystems import FileSystems

    arrays = {name: np.ascontiguousarray(a, a.dtype.newbyteorder("<")) for name, a in arrays.items()}
    relative, at = {}, 0
    for name, a in arrays.items():
        relative[name] = at
        at += -(-a.nbytes // ALIGN) * ALIGN
    start = 0
    while True:  # the header's length depends on the offsets it holds: a few rounds settle it
        header = json.dumps({"arrays": {name: {"dtype": a.dtype.str, "shape": list(a.shape),
                                               "offset": start + relative[name]}
                                        for name, a in arrays.items()}}, sort_keys=True).encode()
        needed = -(-(len(MAGIC) + 8 + len(header)) // ALIGN) * ALIGN
        if needed <= start:
            break
        start = needed
    with FileSystems.create(path) as fh:
        fh.write(MAGIC + struct.pack("<Q", len(header)) + header)
        position = len(MAGIC) + 8 + len(header)
        for name, a in arrays.items():
            fh.write(b"\0" * (start + relative[name] - position))
            if a.nbytes:
                fh.write(memoryview(a.reshape(-1).view(np.uint8)))
            position = start + relative[name] + a.nbytes


def map_arrays(path: str) -> dict[str, np.ndarray]:
    """The arrays of a serving file, memory-mapped read-only (a remote file is
    read whole); DamagedIndexError naming the file when it is not one. The
    mapping outlives the file's name (a prune under a running server)."""
    if is_remote(path):
        with open_read(path) as fh:
            buffer: bytes | mmap.mmap = fh.read()
    else:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < len(MAGIC) + 8:
                raise DamagedIndexError(f"{path}: not a serving arrays file ({size} bytes)")
            buffer = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        if buffer[:len(MAGIC)] != MAGIC:
            raise ValueError("no magic")
        (length,) = struct.unpack("<Q", buffer[len(MAGIC):len(MAGIC) + 8])
        if len(MAGIC) + 8 + length > len(buffer):
            raise ValueError(f"cut short: its header is {length} bytes, the file {len(buffer)}")
        header = json.loads(bytes(buffer[len(MAGIC) + 8:len(MAGIC) + 8 + length]))
        out = {}
        for name, entry in header["arrays"].items():
            dtype = np.dtype(entry["dtype"])
            if entry["dtype"] not in DTYPES and not (dtype.kind == "S" and 0 < dtype.itemsize <= 1024):
                raise ValueError(f"array {name!r} of dtype {entry['dtype']!r}")
            shape = tuple(int(d) for d in entry["shape"])
            count = int(np.prod(shape, dtype=np.int64))
            offset = int(entry["offset"])
            if offset < 0 or offset % ALIGN or offset + count * dtype.itemsize > len(buffer):
                raise ValueError(f"array {name!r} past the end of the file")
            out[name] = np.frombuffer(buffer, dtype, count, offset).reshape(shape)
        return out
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise DamagedIndexError(f"{path}: not a serving arrays file ({exc})") from None


def shard_serving_arrays(chunks: pa.Table, postings: pa.Table, vocabulary: pa.Table,
                         node_position: pa.Array) -> dict[str, np.ndarray]:
    """The serving arrays of one shard (module docstring) from its chunks
    (chunk_id, ordinal, node_id), postings (term, chunk_id, tf; sorted by term,
    chunk) and vocabulary (term and df per field, sorted by term) tables;
    `node_position`: the segment's node ids in position order."""
    ids = chunks["chunk_id"].to_numpy()
    order = np.argsort(ids, kind="stable")
    chunk_ids = ids[order]
    # A chunk's node is most often in its own segment; an update's anchor
    # documents and the unchanged chunks of a re-written page name nodes of
    # other segments (-1 here): a server resolves those by `chunk_node_id`.
    node_of = pc.fill_null(pc.index_in(chunks["node_id"], value_set=node_position), -1)
    term_runs = pc.run_end_encode(postings["term"].combine_chunks()) if postings.num_rows else None
    posting_ids = postings["chunk_id"].to_numpy()
    rows = np.searchsorted(chunk_ids, posting_ids)
    if len(rows) and (rows.max() >= len(chunk_ids) or not np.array_equal(chunk_ids[rows], posting_ids)):
        raise RuntimeError("postings of chunks that their chunk shard lacks")
    tf = np.minimum(postings["tf"].to_numpy(), MAX_TF).astype(np.uint16)
    kinds = ["df_body", "df_doc", "df_anchors"]
    return {
        "chunk_ids": chunk_ids.astype(np.int64),
        "chunk_kind": row_kinds(chunks["ordinal"].to_numpy()[order]),
        "chunk_length": np.bincount(rows, weights=tf, minlength=len(chunk_ids)).astype(np.float32),
        "chunk_node": node_of.to_numpy(zero_copy_only=False)[order].astype(np.int32),
        "chunk_node_id": utf8_fixed_width(chunks["node_id"].take(pa.array(order))),
        "terms": utf8_fixed_width(term_runs.values) if term_runs is not None else np.zeros(0, "S1"),
        "indptr": np.concatenate([[0], term_runs.run_ends.to_numpy()]).astype(np.int64) if term_runs is not None
        else np.zeros(1, np.int64),
        "rows": rows.astype(np.int32),
        "tf": tf,
        "vocab_terms": utf8_fixed_width(vocabulary["term"]),
        "vocab_df": np.stack([vocabulary[k].to_numpy() for k in kinds], axis=1).astype(np.int64)
        if vocabulary.num_rows else np.zeros((0, len(kinds)), np.int64),
    }


# The link arrays of a file written before the in-links were sharded by target.
LINK_ARRAYS = ("link_out_source", "link_out_target", "link_in_target", "link_in_source")
OUT_LINK_ARRAYS = ("link_out_source", "link_out_target")
IN_LINK_ARRAYS = ("in_link_target", "in_link_source")
LINK_COLUMNS = ["source_node_id", "target_node_id"]  # of an edges table, what the link arrays hold


def _link_pairs(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The (source, target) pairs of node ids (bytes) as node keys, each once,
    sorted by source then target; a node's links to itself and a pair naming
    an id no key stands for (ritrag.ids.NO_NODE_KEY: no node holds it) left out."""
    source, target = node_keys(source), node_keys(target)
    pairs = np.zeros(len(source), [("source", np.uint64), ("target", np.uint64)])
    pairs["source"], pairs["target"] = source, target
    kept = (source != target) & (source != NO_NODE_KEY) & (target != NO_NODE_KEY)
    return np.unique(pairs[kept])


def _by_target(pairs: np.ndarray) -> np.ndarray:
    return pairs[np.argsort(pairs, order=("target", "source"), kind="stable")]


def table_link_ids(edges: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) node ids of an edges table's LINK_COLUMNS, as bytes."""
    return utf8_fixed_width(edges["source_node_id"]), utf8_fixed_width(edges["target_node_id"])


def shard_link_arrays(out_links: pa.Table, in_links: pa.Table) -> dict[str, np.ndarray]:
    """The link arrays of one shard (module docstring) from the
    source_node_id and target_node_id columns of the edges whose source it
    owns (`out_links`: its edges file) and of those whose target it owns
    (`in_links`, from every edges shard of the segment): a server answers a
    node's links by binary search in them, so no version derives a link
    graph at load."""
    out, into = _link_pairs(*table_link_ids(out_links)), _by_target(_link_pairs(*table_link_ids(in_links)))
    return {"link_out_source": out["source"], "link_out_target": out["target"],
            "in_link_target": into["target"], "in_link_source": into["source"]}


def link_arrays(source: np.ndarray, target: np.ndarray) -> dict[str, np.ndarray]:
    """LINK_ARRAYS of one shard's own (source, target) pairs of node ids
    (bytes: an edges file's, or a file's written before keys), as files
    written before the in-links were sharded by target hold them."""
    pairs = _link_pairs(source, target)
    by_target = _by_target(pairs)
    return {"link_out_source": pairs["source"], "link_out_target": pairs["target"],
            "link_in_target": by_target["target"], "link_in_source": by_target["source"]}


def segment_node_ids(segment_dir: str, num_shards: int) -> pa.Array:
    """The node ids of a segment's node files, in position order (shard order, then row)."""
    return pa.concat_arrays([
        open_parquet(os.path.join(segment_dir, shard_file_name("nodes", shard, num_shards, "parquet")))
        .read(["node_id"])["node_id"].combine_chunks() for shard in range(num_shards)])


def write_shard_serving_form(segment_dir: str, shard: int, num_shards: int, node_ids: pa.Array,
                             in_links: pa.Table) -> str:
    """Write shard `shard`'s serving file from its chunks, postings,
    vocabulary and edges files (written before) and `in_links` (the
    source_node_id and target_node_id of the segment's edges whose target the
    shard owns); returns its path. `node_ids`: `segment_node_ids`. Memory
    follows the shard."""

    def read(kind: str, columns: list[str]) -> pa.Table:
        return open_parquet(os.path.join(segment_dir, shard_file_name(kind, shard, num_shards, "parquet"))).read(
            columns)

    arrays = shard_serving_arrays(read("chunks", ["chunk_id", "ordinal", "node_id"]),
                                  read("postings", ["term", "chunk_id", "tf"]),
                                  read("vocabulary", ["term", "df_body", "df_doc", "df_anchors"]), node_ids)
    arrays.update(shard_link_arrays(read(EDGES_KIND, LINK_COLUMNS), in_links))
    path = os.path.join(segment_dir, shard_file_name(SERVING_KIND, shard, num_shards, SERVING_EXT))
    write_arrays(path, arrays)
    return path


def target_shards(edges: pa.Table, num_shards: int) -> np.ndarray:
    """The shard that owns each edge's target (ritrag.ids.shard_of), hashed
    once per distinct target."""
    targets = edges["target_node_id"].combine_chunks()
    distinct = pc.unique(targets)
    owner = np.fromiter((shard_of(t, num_shards) for t in distinct.to_pylist()), np.int64, len(distinct))
    return owner[pc.index_in(targets, value_set=distinct).to_numpy(zero_copy_only=False)]


def write_serving_form(segment_dir: str, num_shards: int) -> None:
    """Every shard's serving file, one after the other, in this process (the
    jobs write them in parallel: ritrag.transforms.serving_files)."""
    node_ids = segment_node_ids(segment_dir, num_shards)
    edges = pa.concat_tables(
        open_parquet(os.path.join(segment_dir, shard_file_name(EDGES_KIND, shard, num_shards, "parquet")))
        .read(LINK_COLUMNS) for shard in range(num_shards))
    owner = target_shards(edges, num_shards)
    for shard in range(num_shards):
        write_shard_serving_form(segment_dir, shard, num_shards, node_ids,
                                 edges.filter(pa.array(owner == shard)))

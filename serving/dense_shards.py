"""The dense shards a server searches: each segment's FAISS shard files,
memory-mapped (`read_dense_shard`), joined behind their one coarse quantizer
when they are IVF (`segment_dense_indexes`), read once per process per
segment (`segment_indexes`), each with the chunk ids that later segments
tombstoned (ritrag.serving.retrieval.dense_top_k leaves them out of its
answers).
"""
from __future__ import annotations

import os
import threading
import weakref

import faiss
import numpy as np

from ritrag.layout import DamagedIndexError
from ritrag.reader import IndexReader


class SegmentIndexes:
    """One segment's dense indexes to search, read once per process however
    many loaded versions name the segment (`segment_indexes`): searching
    does not change them, and a new version then reads only the dense files
    of the segments it adds."""

    def __init__(self, paths: list[str], nprobe: int):
        self.indexes = segment_dense_indexes([read_dense_shard(path, nprobe) for path in paths])


_READ: "weakref.WeakValueDictionary[tuple, SegmentIndexes]" = weakref.WeakValueDictionary()
_READ_LOCK = threading.Lock()


def segment_indexes(paths: list[str], checksums: list[str], nprobe: int) -> SegmentIndexes:
    key = (tuple(os.path.abspath(p) for p in paths), tuple(checksums), nprobe)
    with _READ_LOCK:
        found = _READ.get(key)
        if found is None:
            found = _READ[key] = SegmentIndexes(paths, nprobe)
        return found


def load_dense_shards(reader: IndexReader) -> tuple[list, list[np.ndarray], list[SegmentIndexes]]:
    """The indexes to search; for index i the sorted chunk ids that later
    segments tombstoned (`dead[i]`); and the per-segment holders, which the
    caller keeps for as long as it searches the indexes."""
    nprobe = int(reader.manifest.config.get("dense", {}).get("nprobe", 64))
    files: dict[str, list] = {}
    for f in reader.files("dense"):
        files.setdefault(f.segment, []).append(f)
    checksums = {seg["id"]: seg["files"] for seg in reader.manifest.segments}
    indexes, dead_per_index, holders = [], [], []
    for segment, shard_files in files.items():
        holder = segment_indexes([f.path for f in shard_files],
                                 [checksums[segment][os.path.basename(f.path)]["sha256"] for f in shard_files], nprobe)
        holders.append(holder)
        dead = np.array(sorted(shard_files[0].dead), np.int64)
        indexes += holder.indexes
        dead_per_index += [dead] * len(holder.indexes)
    return indexes, dead_per_index, holders


def read_dense_shard(path: str, nprobe: int):
    """A dense shard file as a FAISS index searching `nprobe` lists.

    IO_FLAG_MMAP maps the inverted lists of IVF indexes stored as arrays (IVF-Flat,
    -SQ, -PQ) from the file instead of copying them, so processes serving one index
    share its pages; faiss 1.15 still reads the blocked lists of fast-scan indexes
    (`...x4fs`) and exact indexes into private memory (48 B of codes per vector at
    PQ96x4fs; benchmarks/RESULTS.md, "Dense search at scale").
    """
    try:
        index = faiss.read_index(path, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    except RuntimeError as exc:
        raise DamagedIndexError(f"{path}: not a readable FAISS index ({exc})") from exc
    try:
        faiss.extract_index_ivf(index).nprobe = nprobe
    except RuntimeError:
        pass  # not an IVF index: exact search has no nprobe
    return index


def segment_dense_indexes(shards: list) -> list:
    """The shards of one segment as the indexes to search. IVF shards trained
    together (one coarse quantizer) become one `IndexShardsIVF`: a query is
    assigned to its lists once, not once per shard, and every shard scans those
    lists (the same candidates, up to the order of equal scores). Shards with
    different quantizers, or not IVF, stay as they are."""
    try:
        ivfs = [faiss.extract_index_ivf(shard) for shard in shards]
    except RuntimeError:
        return shards
    quantizers = [faiss.downcast_index(ivf.quantizer) for ivf in ivfs]
    first = ivfs[0]
    if len(shards) < 2 or not all(isinstance(q, faiss.IndexFlat) for q in quantizers) or any(
            ivf.nlist != first.nlist or ivf.nprobe != first.nprobe
            or not np.array_equal(faiss.vector_to_array(q.codes), faiss.vector_to_array(quantizers[0].codes))
            for ivf, q in zip(ivfs[1:], quantizers[1:])):
        return shards
    # The quantizer is the first shard's; faiss's add_shard keeps each shard (so
    # also that quantizer) alive as long as the joined index.
    joined = faiss.IndexShardsIVF(first.quantizer, first.nlist, False, False)
    for shard in shards:
        joined.add_shard(shard)
    return [joined]

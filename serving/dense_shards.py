"""The dense shards a server searches: each segment's FAISS shard files,
memory-mapped (`read_dense_shard`), read once per process per segment
(`segment_indexes`), each with the search parameters that leave out the chunk
ids later segments tombstoned (`tombstone_parameters`: a FAISS ID selector the
search applies as it scans, so it fetches no deeper), and joined behind their
one coarse quantizer where they are IVF (`joined_by_quantizer`).

The segments of a version share the coarse quantizer its build trained (an
update adds its vectors to the live trained index), so the IVF shards of all
of them are joined: the query is assigned to its lists once per version, not
once per shard or segment. That assignment is most of an
IVF search's cost at any size (0.08 of 0.21 ms at 4,096 lists of 384
dimensions, against 0.004 ms to scan a one-page delta's lists): 16 segments
had taken GetToC at 100k pages from 5.5 to 9.8 ms p50 (benchmarks/RESULTS.md,
session 24).
"""
from __future__ import annotations

import hashlib
import os
import threading
import weakref

import faiss
import numpy as np

from ritrag.layout import DamagedIndexError
from ritrag.reader import IndexReader


class SegmentIndexes:
    """One segment's dense shards, each with its `quantizer_key`, read once
    per process however many loaded versions name the segment
    (`segment_indexes`): searching does not change them, and a new version
    then reads only the dense files of the segments it adds."""

    def __init__(self, paths: list[str], nprobe: int):
        self.shards = [read_dense_shard(path, nprobe) for path in paths]
        self.quantizers = [quantizer_key(shard) for shard in self.shards]


_READ: "weakref.WeakValueDictionary[tuple, SegmentIndexes]" = weakref.WeakValueDictionary()
_READ_LOCK = threading.Lock()


def segment_indexes(paths: list[str], checksums: list[str], nprobe: int) -> SegmentIndexes:
    key = (tuple(os.path.abspath(p) for p in paths), tuple(checksums), nprobe)
    with _READ_LOCK:
        found = _READ.get(key)
        if found is None:
            found = _READ[key] = SegmentIndexes(paths, nprobe)
        return found


def load_dense_shards(reader: IndexReader) -> tuple[list, list, list[SegmentIndexes]]:
    """The indexes to search; for index i its search parameters (`params[i]`,
    None when no later segment tombstoned any of its chunks, or when it joins
    shards that carry their own); and the per-segment holders, which the
    caller keeps for as long as it searches the indexes."""
    nprobe = reader.manifest.settings.dense.nprobe
    files: dict[str, list] = {}
    for f in reader.files("dense"):
        files.setdefault(f.segment, []).append(f)
    checksums = {seg["id"]: seg["files"] for seg in reader.manifest.segments}
    shards, quantizers, shard_params, holders = [], [], [], []
    for segment, shard_files in files.items():
        holder = segment_indexes([f.path for f in shard_files],
                                 [checksums[segment][os.path.basename(f.path)]["sha256"] for f in shard_files], nprobe)
        holders.append(holder)
        dead = np.array(sorted(shard_files[0].dead), np.int64)
        shards += holder.shards
        quantizers += holder.quantizers
        shard_params += [tombstone_parameters(shard, dead) for shard in holder.shards]
    indexes, params = joined_by_quantizer(shards, shard_params, quantizers)
    return indexes, params, holders


def tombstone_parameters(index, dead: np.ndarray):
    """Search parameters for `index` that leave out the chunk ids in `dead`
    (None when there are none): an `IDSelectorNot` over an `IDSelectorBatch`
    (a hash set behind a Bloom filter), tested as the search scans, so the
    search asks for k and gets k live ones however many were tombstoned. The
    IVF parameters carry the index's own nprobe (FAISS otherwise takes the
    parameters' default of 1)."""
    if len(dead) == 0:
        return None
    batch = faiss.IDSelectorBatch(np.ascontiguousarray(dead, dtype=np.int64))
    selector = faiss.IDSelectorNot(batch)
    nprobe = index_nprobe(index)
    params = (faiss.SearchParametersIVF(sel=selector, nprobe=nprobe) if nprobe is not None
              else faiss.SearchParameters(sel=selector))
    params.referenced_objects = [batch, selector]  # SWIG does not keep them alive for the parameters
    return params


def index_nprobe(index) -> int | None:
    """The lists an IVF index (or joined shards) scans; None for an exact index."""
    if isinstance(index, JoinedIVFShards):
        return index.nprobe
    try:
        return int(faiss.extract_index_ivf(index).nprobe)
    except RuntimeError:
        return None


def read_dense_shard(path: str, nprobe: int):
    """A dense shard file as a FAISS index searching `nprobe` lists.

    IO_FLAG_MMAP maps the inverted lists of IVF indexes stored as arrays (IVF-Flat,
    -SQ, -PQ) from the file instead of copying them, so processes serving one index
    share its pages; IO_FLAG_MMAP_IFC maps the codes of flat indexes, where
    faiss allows it beside IO_FLAG_MMAP: a fast-scan IVF shard's coarse
    quantizer (6 MiB at 4,096 lists of 384 dimensions, in every shard) and an
    exact index. faiss 1.15 still reads the blocked lists of
    fast-scan indexes (`...x4fs`) into private memory (48 B of codes per vector
    at PQ96x4fs; benchmarks/RESULTS.md, "Dense search at scale").
    """
    mapped = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY
    try:
        index = faiss.read_index(path, mapped | faiss.IO_FLAG_MMAP_IFC)
    except RuntimeError:
        # faiss maps array lists (IVF-Flat, -SQ, -PQ) only from a file reader, which
        # IO_FLAG_MMAP_IFC replaces: those shards map their lists, the bulk, instead.
        try:
            index = faiss.read_index(path, mapped)
        except RuntimeError as exc:
            raise DamagedIndexError(f"{path}: not a readable FAISS index ({exc})") from exc
    try:
        faiss.extract_index_ivf(index).nprobe = nprobe
    except RuntimeError:
        pass  # not an IVF index: exact search has no nprobe
    return index


def quantizer_key(shard) -> tuple | None:
    """What identifies the flat coarse quantizer of an IVF shard (lists,
    nprobe, metric, a digest of its centroids), so that shards trained
    together are joined; None for a shard that is not IVF behind a flat
    quantizer (an exact index)."""
    try:
        ivf = faiss.extract_index_ivf(shard)
    except RuntimeError:
        return None
    quantizer = faiss.downcast_index(ivf.quantizer)
    if not isinstance(quantizer, faiss.IndexFlat):
        return None
    digest = hashlib.blake2b(faiss.vector_to_array(quantizer.codes).tobytes(), digest_size=16).digest()
    return int(ivf.nlist), int(ivf.nprobe), int(ivf.metric_type), digest


def joined_by_quantizer(shards: list, shard_params: list | None = None, quantizers: list | None = None
                        ) -> tuple[list, list]:
    """The indexes to search for `shards`, with their search parameters
    (`shard_params`, None: none), in the shards' order: IVF shards of one
    quantizer (`quantizers`, each shard's `quantizer_key`, computed here when
    not given) become one `JoinedIVFShards` in the place of the first, each
    shard keeping its parameters; any other shard stays as it is."""
    shard_params = list(shard_params) if shard_params is not None else [None] * len(shards)
    quantizers = quantizers if quantizers is not None else [quantizer_key(shard) for shard in shards]
    groups: dict[tuple, list[int]] = {}
    for i, key in enumerate(quantizers):
        if key is not None:
            groups.setdefault(key, []).append(i)
    indexes, params = [], []
    for i, key in enumerate(quantizers):
        group = groups.get(key, [i]) if key is not None else [i]
        if len(group) == 1:
            indexes.append(shards[i])
            params.append(shard_params[i])
        elif group[0] == i:
            indexes.append(JoinedIVFShards([shards[j] for j in group], [shard_params[j] for j in group]))
            params.append(None)
    return indexes, params


class JoinedIVFShards:
    """IVF shards of one coarse quantizer searched as one index: the query is
    assigned to its nprobe lists once (the first shard's quantizer), each shard
    scans those lists, and the best k of all shards are kept. faiss's own
    `IndexShardsIVF` does the same but drops the search parameters, so a
    tombstone selector never reached the shards (faiss 1.15.1); this passes
    them to each shard's `search_preassigned`: the caller's, or where it gives
    none each shard's own (`shard_params`: shards of several segments, each
    with its segment's tombstones)."""

    def __init__(self, shards: list, shard_params: list | None = None):
        self.shards = shards
        self.shard_params = shard_params or [None] * len(shards)
        self.ivfs = [faiss.extract_index_ivf(shard) for shard in shards]
        self.quantizer = self.ivfs[0].quantizer
        self.nprobe = int(self.ivfs[0].nprobe)
        self.ntotal = sum(int(shard.ntotal) for shard in shards)

    def search(self, queries: np.ndarray, k: int, params=None) -> tuple[np.ndarray, np.ndarray]:
        """(similarities, ids), each (n, k), best first; -1 ids past the hits.
        `params`: for every shard, in place of their own."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        n = len(queries)
        list_scores, lists = self.quantizer.search(queries, min(self.nprobe, self.ivfs[0].nlist))
        # A shard gives at most the vectors it holds: a one-page update's segment a few
        # columns, not k, so the merge follows what the shards hold, not k x shards.
        scores, ids = [np.full((n, k), -np.inf, np.float32)], [np.full((n, k), -1, np.int64)]
        for s, ivf in enumerate(self.ivfs):
            shard_k = min(k, int(self.shards[s].ntotal))
            if shard_k == 0:
                continue
            scores.append(np.empty((n, shard_k), np.float32))
            ids.append(np.empty((n, shard_k), np.int64))
            # The wrapper's search_preassigned refuses parameters; its C++
            # method (kept by faiss as search_preassigned_c) takes them.
            ivf.search_preassigned_c(n, faiss.swig_ptr(queries), shard_k, faiss.swig_ptr(lists),
                                     faiss.swig_ptr(list_scores), faiss.swig_ptr(scores[-1]),
                                     faiss.swig_ptr(ids[-1]), False,
                                     params if params is not None else self.shard_params[s])
        # the padding first, at -inf: a stable sort leaves it behind every hit
        scores, ids = np.concatenate(scores, axis=1), np.concatenate(ids, axis=1)
        scores = np.where(ids >= 0, scores, -np.inf)
        best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(scores, best, 1), np.take_along_axis(ids, best, 1)

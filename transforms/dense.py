"""Sharded FAISS indexes over chunk vectors, and the vectors themselves.

The index is an index factory string, with the lists probed per query and the
depth of exact re-ranking, chosen from the number of vectors (`choose_params`,
a table measured in benchmarks/RESULTS.md, "Dense recall"): exact inner product
up to `EXACT_MAX_VECTORS`, above it IVF with 4-bit fast-scan PQ. PQ alone loses
too much recall at this scale, so the server takes `rerank` x k' candidates from
the index and re-ranks them exactly against the stored vectors (ritrag.vectors).

The index is trained once, on the `TRAIN_SAMPLE_SIZE` smallest chunk ids: chunk
ids are hashes, so that is a uniform sample, and unlike Beam's `Sample` a rerun
picks the same one. The trained empty index reaches every shard as a side input.
Each shard writes its vectors (float16, `vectors-SSSSS-of-NNNNN.zip`) and a FAISS
index built from exactly those float16 vectors, so `rebuild_index` from the
vectors file alone gives the same index, without re-embedding.
Vectors are L2-normalized by the embedder, so inner product is cosine.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Iterable

import apache_beam as beam
import faiss
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from ritrag.layout import DENSE_INFO_FILE, DENSE_TRAINED_FILE, parse_shard_file_name, shard_file_name
from ritrag.vectors import CHUNK_ROWS, VECTORS_EXTENSION, VECTORS_KIND, VectorShard, write_vectors
from ritrag.transforms.tables import WriteShards, sorted_in_one_piece, write_bytes

EXACT_MAX_VECTORS = 50_000
TRAIN_SAMPLE_SIZE = 200_000  # 48 points per list at 4096 lists (FAISS asks for 39)
# Dimensions per 4-bit PQ code: 96 codes (48 bytes) at 384 dims. With 8 (48 codes)
# the exact re-ranking needed twice the candidates for the same recall.
PQ_SUB_DIMS = 4


@dataclasses.dataclass(frozen=True)
class DenseParams:
    """How the dense index is built and searched (recorded in dense.json)."""

    factory: str  # FAISS index factory string
    nprobe: int  # inverted lists probed per query; ignored by exact indexes
    rerank: int  # the server re-ranks rerank x k' index candidates exactly; 1: no re-ranking


# (most vectors, IVF lists, nprobe, rerank) above EXACT_MAX_VECTORS, and the
# recall@200 against exact search measured at the sizes named, with re-ranking on
# (benchmarks/dense_recall.py; RESULTS.md, "Dense recall" and "Dense search at
# scale"). Few vectors need many probes: the 200 nearest are then a larger share
# of the corpus, spread over more lists. Many vectors need deeper re-ranking: more
# near ties for PQ to misorder. Lists stay at 4096: the training sample (48 points
# per list) bounds them, and from 1M on probing more lists barely changes recall
# (1M, rerank 4: nprobe 16 0.970, 32 0.978, 64 0.980) while each probe costs.
IVF_TABLE: tuple[tuple[float, int, int, int], ...] = (
    (300_000, 1024, 256, 8),  # 60k: 0.971, 100k: 0.981-0.984, 250k: 0.994
    (2_000_000, 4096, 32, 4),  # 300k: 0.964, 1M: 0.978; (nprobe 64) 2M: 0.972
    (float("inf"), 4096, 32, 8),  # 2M: 0.994, 10M: 0.975 (30M: not measured)
)


def pq_codes(dim: int) -> int:
    """Number of 4-bit PQ codes for `dim` dims: sub-vectors of about PQ_SUB_DIMS dims
    (PQ needs the number of codes to divide the dimension)."""
    width = next(w for w in range(min(PQ_SUB_DIMS, dim), dim + 1) if dim % w == 0)
    return dim // width


def choose_params(n_vectors: int, dim: int) -> DenseParams:
    """The table's index parameters for a corpus of `n_vectors` vectors of `dim` dims."""
    if n_vectors <= EXACT_MAX_VECTORS:
        return DenseParams("IDMap2,Flat", nprobe=1, rerank=1)
    nlist, nprobe, rerank = next((lists, probe, depth) for most, lists, probe, depth in IVF_TABLE
                                 if n_vectors <= most)
    return DenseParams(f"IVF{nlist},PQ{pq_codes(dim)}x4fs", nprobe=nprobe, rerank=rerank)


def dense_info(params: DenseParams, dim: int, n_vectors: int, train_sample: int) -> dict:
    """What dense.json records (and the manifest's config "dense"): the parameters
    the server searches with, and what the index was built from."""
    return {**dataclasses.asdict(params), "dim": int(dim), "n_vectors": int(n_vectors),
            "metric": "inner_product", "train_sample": int(train_sample),
            "vectors": {"kind": VECTORS_KIND, "dtype": "float16", "format": "zarr v3 in an uncompressed zip"}}


def train_empty_index(factory: str, sample: np.ndarray) -> bytes:
    """A trained, empty index of `factory`, serialized (FAISS's own format)."""
    dim = sample.shape[1]
    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        index.train(np.ascontiguousarray(sample, dtype=np.float32))
    return faiss.serialize_index(index).tobytes()


def shard_index(trained: bytes, batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> bytes:
    """The trained index with every (ids, float16 vectors) batch added, serialized."""
    index = faiss.deserialize_index(np.frombuffer(trained, dtype=np.uint8))
    for ids, vectors in batches:
        index.add_with_ids(vectors.astype(np.float32), ids.astype(np.int64))
    return faiss.serialize_index(index).tobytes()


def rebuild_index(trained: bytes, vectors_path: str) -> bytes:
    """A shard's index rebuilt from its vectors file alone (no re-embedding)."""
    return shard_index(trained, VectorShard(vectors_path).batches())


def vectors_path_for(dense_path: str) -> str:
    """The vectors file that goes with a dense shard file."""
    directory, name = os.path.split(dense_path)
    _, shard, num_shards = parse_shard_file_name(name)
    return os.path.join(directory, shard_file_name(VECTORS_KIND, shard, num_shards, VECTORS_EXTENSION))


VECTORS_SCHEMA = pa.schema([pa.field("chunk_id", pa.int64(), nullable=False),
                            pa.field("vector", pa.list_(pa.float16()), nullable=False)])


def vectors_table(items: list[tuple[int, np.ndarray]]) -> pa.Table:
    """(chunk_id, vector) pairs as a VECTORS_SCHEMA table (vectors as float16)."""
    if not items:
        return VECTORS_SCHEMA.empty_table()
    ids = np.fromiter((k for k, _ in items), dtype=np.int64, count=len(items))
    vectors = np.stack([v for _, v in items]).astype(np.float16)
    offsets = np.arange(0, vectors.size + 1, vectors.shape[1], dtype=np.int32)
    column = pa.ListArray.from_arrays(offsets, pa.array(vectors.reshape(-1)))
    return pa.table([pa.array(ids), column], schema=VECTORS_SCHEMA)


@dataclasses.dataclass(frozen=True)
class TrainedIndex:
    """A trained, empty FAISS index (serialized, FAISS's own format), and what
    dense.json records of it when this job trained it."""

    index: bytes
    # dense_info of the training; None for an index an earlier job trained, which
    # this job's shards join (dense.json and the trained index are not written again)
    info: dict | None = None


class ReadTrainedIndex(beam.PTransform):
    """pbegin -> the one TrainedIndex that `read` returns (an index an earlier
    job trained: ritrag.reader.read_trained_dense_index), read when the pipeline
    runs. As a Create value, its megabytes were part of the pipeline's
    description, which the runner pickles and compresses several times (at
    100k pages, 6 MB: 4-5 s of a one-page update)."""

    def __init__(self, read: Callable[[], bytes]):
        super().__init__()
        self._read = read

    def expand(self, pbegin):
        read = self._read
        return pbegin | "Once" >> beam.Create([None]) | "Read" >> beam.Map(lambda _: TrainedIndex(read()))


def train_dense_index(sample: list[tuple[int, np.ndarray]], n_vectors: int, overrides: dict
                      ) -> TrainedIndex | None:
    """The index trained on `sample` ((chunk_id, vector) pairs, in any order) of a
    corpus of `n_vectors`, with the table's parameters but for `overrides`."""
    if not sample:  # nothing to index: the job refuses to publish, with its accounting (launcher.refuse_empty)
        return None
    matrix = np.stack([v for _, v in sorted(sample, key=lambda kv: kv[0])]).astype(np.float32)
    params = dataclasses.replace(choose_params(n_vectors, matrix.shape[1]), **overrides)
    return TrainedIndex(train_empty_index(params.factory, matrix),
                        dense_info(params, matrix.shape[1], n_vectors, len(sample)))


class TrainDenseIndex(beam.PTransform):
    """(chunk_id, vector) pairs -> one TrainedIndex (None when there is no vector).

    `factory`, `nprobe` and `rerank` override the table's choice (`choose_params`).
    """

    def __init__(self, factory: str | None = None, nprobe: int | None = None, rerank: int | None = None):
        super().__init__()
        self._overrides = {k: v for k, v in {"factory": factory, "nprobe": nprobe, "rerank": rerank}.items()
                           if v is not None}

    def expand(self, vectors: beam.PCollection) -> beam.PCollection:
        n_vectors = vectors | "CountVectors" >> beam.combiners.Count.Globally()
        return (vectors
                | "TrainingSample" >> beam.combiners.Top.Smallest(TRAIN_SAMPLE_SIZE, key=lambda kv: kv[0])
                | "Train" >> beam.Map(train_dense_index, n_vectors=beam.pvalue.AsSingleton(n_vectors),
                                      overrides=self._overrides))


def write_trained_index(trained: TrainedIndex | None, out_dir: str) -> None:
    """dense.json and the trained empty index, of an index this job trained."""
    if trained is None or trained.info is None:
        return
    write_bytes(os.path.join(out_dir, DENSE_INFO_FILE), json.dumps(trained.info, sort_keys=True).encode())
    write_bytes(os.path.join(out_dir, DENSE_TRAINED_FILE), trained.index)


def write_dense_shard(path: str, table: pa.Table, trained: TrainedIndex | None) -> int:
    """Write one shard's vectors file and, from the same float16 vectors, its index.
    Nothing when no vector was trained on: the job refuses to publish."""
    if trained is None:
        return 0
    dim = faiss.deserialize_index(np.frombuffer(trained.index, dtype=np.uint8)).d
    table, order = sorted_in_one_piece(table, ["chunk_id"])
    table = table.take(order)
    ids = table.column("chunk_id").to_numpy()
    vectors = table.column("vector").combine_chunks().flatten().to_numpy().reshape(len(ids), dim)
    with FileSystems.create(vectors_path_for(path)) as fh:
        write_vectors(fh, ids, vectors)
    batches = ((ids[s: s + CHUNK_ROWS], vectors[s: s + CHUNK_ROWS]) for s in range(0, len(ids), CHUNK_ROWS))
    write_bytes(path, shard_index(trained.index, batches))
    return len(ids)


# The inputs of WriteDenseIndex.
VECTORS = "vectors"  # (chunk_id, vector) pairs
TRAINED = "trained"  # one TrainedIndex (TrainDenseIndex's, or the live index's) or None


class WriteDenseIndex(beam.PTransform):
    """{VECTORS, TRAINED} -> dense and vectors shard files in `out_dir`, each shard
    added to the trained index; and, when this job trained it, dense.json and the
    trained empty index. Outputs one (kind, number of vectors) pair per shard."""

    def __init__(self, out_dir: str, num_shards: int):
        super().__init__()
        self._out_dir = out_dir
        self._num_shards = num_shards

    def expand(self, dense) -> beam.PCollection:  # {name: PCollection}: no annotation, which Beam would warn of
        dense[TRAINED] | "WriteTrainedIndex" >> beam.Map(write_trained_index, self._out_dir)
        return dense[VECTORS] | "WriteShards" >> WriteShards(
            self._out_dir, "dense", self._num_shards, shard_key=lambda kv: kv[0], to_table=vectors_table,
            write=write_dense_shard, extension="faiss",
            side_inputs={"trained": beam.pvalue.AsSingleton(dense[TRAINED])})

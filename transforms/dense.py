"""Sharded FAISS indexes over chunk vectors.

The index type is an index factory string. By default it is chosen from the
number of vectors (`choose_factory`): exact inner product below
`EXACT_MAX_VECTORS`, IVF-PQ above. The index is trained once, on a sample
(Beam's `Sample`), and the trained empty index travels to every shard as a side
input; each shard adds its vectors under their 63-bit chunk ids.
Vectors are L2-normalized by the embedder, so inner product is cosine.
"""
from __future__ import annotations

import json
import math
import os

import apache_beam as beam
import faiss
import numpy as np

from transforms.tables import WriteShards, write_bytes

DENSE_INFO_FILE = "dense.json"
EXACT_MAX_VECTORS = 50_000
TRAIN_SAMPLE_SIZE = 100_000


def choose_factory(n_vectors: int, dim: int) -> str:
    """Index factory string for a corpus of `n_vectors` vectors of `dim` dims."""
    if n_vectors <= EXACT_MAX_VECTORS:
        return "IDMap2,Flat"
    nlist = 2 ** round(math.log2(4 * math.sqrt(n_vectors)))
    m = dim // 4 if dim % 4 == 0 else dim // 2
    return f"IVF{nlist},PQ{m}"


def train_empty_index(factory: str, sample: np.ndarray) -> bytes:
    """A trained, empty index of `factory`, serialized (FAISS's own format)."""
    dim = sample.shape[1]
    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        index.train(np.ascontiguousarray(sample, dtype=np.float32))
    return faiss.serialize_index(index).tobytes()


def index_bytes(trained: bytes, ids: np.ndarray, vectors: np.ndarray) -> bytes:
    index = faiss.deserialize_index(np.frombuffer(trained, dtype=np.uint8))
    if len(ids):
        index.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), ids.astype(np.int64))
    return faiss.serialize_index(index).tobytes()


def write_dense_file(path: str, items: list[tuple[int, np.ndarray]], trained: bytes) -> int:
    items = sorted(items, key=lambda kv: kv[0])
    dim = faiss.deserialize_index(np.frombuffer(trained, dtype=np.uint8)).d
    ids = np.fromiter((k for k, _ in items), dtype=np.int64, count=len(items))
    vectors = np.stack([v for _, v in items]) if items else np.zeros((0, dim), np.float32)
    write_bytes(path, index_bytes(trained, ids, vectors))
    return len(items)


def _train(sample: list[np.ndarray], n_vectors: int, factory: str | None, out_dir: str) -> bytes:
    if not sample:
        raise ValueError("no vectors to index: every page was empty or dead-lettered")
    matrix = np.stack(sample).astype(np.float32)
    chosen = factory or choose_factory(n_vectors, matrix.shape[1])
    info = {"factory": chosen, "dim": int(matrix.shape[1]), "n_vectors": int(n_vectors),
            "metric": "inner_product", "train_sample": len(sample)}
    write_bytes(os.path.join(out_dir, DENSE_INFO_FILE), json.dumps(info, sort_keys=True).encode())
    return train_empty_index(chosen, matrix)


class BuildDenseIndex(beam.PTransform):
    """(chunk_id, vector) pairs -> dense shard files and dense.json (factory, dim)."""

    def __init__(self, out_dir: str, num_shards: int, factory: str | None = None):
        super().__init__()
        self._out_dir = out_dir
        self._num_shards = num_shards
        self._factory = factory

    def expand(self, vectors):
        n_vectors = vectors | "CountVectors" >> beam.combiners.Count.Globally()
        trained = (
            vectors
            | "Vectors" >> beam.Values()
            | "TrainingSample" >> beam.combiners.Sample.FixedSizeGlobally(TRAIN_SAMPLE_SIZE)
            | "Train" >> beam.Map(_train, n_vectors=beam.pvalue.AsSingleton(n_vectors),
                                  factory=self._factory, out_dir=self._out_dir)
        )

        return vectors | "WriteDense" >> WriteShards(
            self._out_dir, "dense", self._num_shards, shard_key=lambda kv: kv[0],
            write=write_dense_file, extension="faiss",
            side_inputs={"trained": beam.pvalue.AsSingleton(trained)})

"""Dense index: parameter table, float16 vector store, exact re-ranking, Beam build."""
from __future__ import annotations

import json
import os
import zipfile

import apache_beam as beam
import faiss
import numpy as np
import pytest
import zarr
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from zarr.storage import ZipStore

from ritrag import vectors as vectors_module
from ritrag.layout import DamagedIndexError, shard_file_name
from ritrag.reader import trained_empty_index_of
from ritrag.vectors import MissingVectorsError, VectorShard, VectorStore, rerank_exact, write_vectors
from ritrag.serving.retrieval import dense_top_k
from ritrag.transforms.dense import (DENSE_INFO_FILE, DENSE_TRAINED_FILE, EXACT_MAX_VECTORS, TRAINED, VECTORS,
                                    DenseParams, TrainDenseIndex, TrainedIndex, WriteDenseIndex, choose_params,
                                    pq_codes, rebuild_index)
from ritrag.transforms.tables import remove_spill_files

DIM = 32


@pytest.fixture(autouse=True)
def one_faiss_thread():
    """FAISS single-threaded: on a busy test machine, OpenMP threads spinning for a core
    made a 1,200-vector training take 9 s instead of 0.2 s."""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(threads)


def unit_vectors(n: int, dim: int = DIM, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def chunk_ids(n: int, seed: int = 0) -> np.ndarray:
    return np.unique(np.random.default_rng(seed).integers(0, 1 << 63, n + 16))[:n]


def write_store(path, ids: np.ndarray, vectors: np.ndarray) -> str:
    with open(path, "wb") as fh:
        write_vectors(fh, ids, vectors)
    return str(path)


def exact_top_k(query: np.ndarray, ids: np.ndarray, vectors: np.ndarray, k: int) -> np.ndarray:
    scores = vectors.astype(np.float16).astype(np.float32) @ query
    return ids[np.lexsort((ids, -scores))][:k]


def test_parameter_table_by_corpus_size():
    assert choose_params(EXACT_MAX_VECTORS, 384).factory == "IDMap2,Flat"
    assert choose_params(EXACT_MAX_VECTORS, 384).rerank == 1
    larger = [choose_params(n, 384) for n in (EXACT_MAX_VECTORS + 1, 1_000_000, 10_000_000, 30_000_000)]
    assert all(p.factory.startswith("IVF") and p.factory.endswith("x4fs") and p.rerank > 1 for p in larger)
    lists = [int(p.factory[3:].split(",")[0].split("_")[0]) for p in larger]
    assert lists == sorted(lists)  # more vectors, never fewer lists
    assert pq_codes(384) == 96 and pq_codes(30) == 6  # PQ needs codes that divide the dimension


@pytest.mark.parametrize("n, factory, nprobe, rerank", [
    (100_000, "IVF1024,PQ96x4fs", 256, 8),
    (1_000_000, "IVF4096,PQ96x4fs", 32, 4),
    (10_000_000, "IVF4096,PQ96x4fs", 32, 8),
])
def test_parameters_chosen_at_the_measured_sizes(n, factory, nprobe, rerank):
    """The table's choice at the sizes benchmarks/RESULTS.md measured (recall@200 >= 0.95)."""
    assert choose_params(n, 384) == DenseParams(factory, nprobe=nprobe, rerank=rerank)


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_store_round_trips_ids_to_vectors(tmp_path, monkeypatch, n):
    monkeypatch.setattr(vectors_module, "CHUNK_ROWS", 64)  # many chunks, a padded last one
    ids, vectors = chunk_ids(n), unit_vectors(n)
    path = write_store(tmp_path / "vectors-00000-of-00001.zip", ids, vectors)
    store = VectorStore.open([path])
    assert len(store) == n and store.dim == DIM
    assert store.shards[0].ids.flags.aligned  # searched in place, not copied
    wanted = np.random.default_rng(1).permutation(n)
    got = store.vectors(ids[wanted])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, vectors[wanted], atol=1e-3)
    group = zarr.open_group(ZipStore(path, mode="r"), mode="r")  # any zarr reader opens it
    np.testing.assert_array_equal(group["ids"][:], ids)
    np.testing.assert_array_equal(group["vectors"][:], vectors.astype(np.float16))
    streamed = list(VectorShard(path).batches())
    assert sum(len(i) for i, _ in streamed) == n and all(len(i) == len(v) for i, v in streamed)


@pytest.mark.parametrize("member", ["vectors/c/1/0", "ids/c/0"])
def test_a_checked_store_refuses_a_damaged_chunk_when_it_reads_it(tmp_path, monkeypatch, member):
    """A job that did not hash a vector file whole (`IndexLayout.sized_path`)
    reads it `checked`: the ids at open and each chunk of vectors at its first
    read, against the zip's CRC-32 of their member. A flipped byte in a
    chunk it never reads costs it nothing; one an unchecked reader would
    read as a wrong vector is a DamagedIndexError naming the file."""
    monkeypatch.setattr(vectors_module, "CHUNK_ROWS", 64)
    ids, vectors = chunk_ids(200), unit_vectors(200)
    path = write_store(tmp_path / "vectors-00000-of-00001.zip", ids, vectors)
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    data, header = bytearray(open(path, "rb").read()), info.header_offset
    at = header + 30 + sum(int.from_bytes(data[header + i: header + i + 2], "little") for i in (26, 28))  # name, extra
    data[at + 5] ^= 0x40  # inside the member's data: a row of chunk 1 (rows 64-127), or an id
    open(path, "wb").write(bytes(data))
    if member.startswith("ids"):
        with pytest.raises(DamagedIndexError, match="vectors-00000-of-00001.zip.*CRC-32 of ids/c/0"):
            VectorShard(path, checked=True)
        return
    store = VectorStore.open([path], checked=True)
    np.testing.assert_allclose(store.vectors(ids[:64]), vectors[:64], atol=1e-3)  # chunk 0: intact
    with pytest.raises(DamagedIndexError, match="vectors-00000-of-00001.zip.*CRC-32 of vectors/c/1/0"):
        store.vectors(ids[[3, 70]])
    with pytest.raises(DamagedIndexError, match="CRC-32 of vectors/c/1/0"):
        list(VectorShard(path, checked=True).batches())
    unchecked = VectorStore.open([path]).vectors(ids[64:128])  # what an unchecked reader would take as a vector
    assert not np.allclose(unchecked, vectors[64:128], atol=1e-3)


def test_store_refuses_unknown_ids(tmp_path):
    ids, vectors = chunk_ids(50), unit_vectors(50)
    own = [ids % 2 == s for s in range(2)]
    shards = [write_store(tmp_path / shard_file_name("vectors", s, 2, "zip"), ids[own[s]], vectors[own[s]])
              for s in range(2)]
    store = VectorStore.open(shards)
    np.testing.assert_allclose(store.vectors(ids[[30, 3]]), vectors[[30, 3]], atol=1e-3)
    with pytest.raises(ValueError, match="not named like a vector shard"):
        VectorShard(write_store(tmp_path / "other.zip", ids, vectors))
    with pytest.raises(MissingVectorsError, match="1 chunk id") as raised:
        store.vectors([int(ids[3]), 12345])
    assert raised.value.chunk_ids.tolist() == [12345]


def test_writer_requires_unique_ascending_ids(tmp_path):
    vectors = unit_vectors(3)
    with pytest.raises(ValueError, match="unique and ascending"):
        write_store(tmp_path / "vectors-00000-of-00001.zip", np.array([5, 3, 9]), vectors)
    with pytest.raises(ValueError, match="unique and ascending"):
        write_store(tmp_path / "vectors-00000-of-00001.zip", np.array([3, 3, 9]), vectors)


def test_store_files_are_deterministic(tmp_path):
    ids, vectors = chunk_ids(300), unit_vectors(300)
    first = write_store(tmp_path / "first.zip", ids, vectors)
    second = write_store(tmp_path / "second.zip", ids, vectors)
    assert open(first, "rb").read() == open(second, "rb").read()


def test_rerank_restores_exact_order(tmp_path):
    ids, vectors = chunk_ids(500), unit_vectors(500)
    store = VectorStore.open([write_store(tmp_path / "vectors-00000-of-00001.zip", ids, vectors)])
    query = unit_vectors(1, seed=9)[0]
    candidates = np.random.default_rng(2).permutation(ids)[:200]
    order = np.isin(ids, candidates)
    reranked, scores = rerank_exact(query, candidates, store)
    np.testing.assert_array_equal(reranked, exact_top_k(query, ids[order], vectors[order], 200))
    assert np.all(np.diff(scores) <= 0)
    np.testing.assert_allclose(scores, store.vectors(reranked) @ query, rtol=1e-5, atol=1e-6)


def run_dense_build(out_dir: str, ids: np.ndarray, vectors: np.ndarray, num_shards: int,
                    trained: bytes | None = None, **params) -> None:
    """The dense stage and sink; given `trained`, the shards join that index (as an update's do)."""
    pairs = [(int(i), v) for i, v in zip(ids, vectors)]
    with TestPipeline(runner="FnApiRunner") as p:
        vectors_pc = p | "Vectors" >> beam.Create(pairs)
        if trained is None:
            trained_pc = vectors_pc | TrainDenseIndex(**params)
        else:
            trained_pc = p | "Trained" >> beam.Create([TrainedIndex(trained)])
        written = ({VECTORS: vectors_pc, TRAINED: trained_pc} | WriteDenseIndex(out_dir, num_shards)
                   | beam.CombinePerKey(sum))
        assert_that(written, equal_to([("dense", len(pairs))]))
    remove_spill_files(out_dir)


def shard_paths(out_dir: str, kind: str, ext: str, num_shards: int) -> list[str]:
    return [os.path.join(out_dir, shard_file_name(kind, s, num_shards, ext)) for s in range(num_shards)]


@pytest.mark.parametrize("params", [{}, {"factory": "IVF16,PQ32x4fs", "nprobe": 16, "rerank": 8}],
                         ids=["exact", "ivf-pq-reranked"])
def test_beam_build_searches_like_exact_search(tmp_path, params):
    n, k, num_shards = 2000, 10, 3
    ids, vectors = chunk_ids(n), unit_vectors(n)
    out = str(tmp_path / "segment")
    os.makedirs(out)
    run_dense_build(out, ids, vectors, num_shards, **params)

    info = json.load(open(os.path.join(out, DENSE_INFO_FILE)))
    assert info["n_vectors"] == n and info["dim"] == DIM
    assert info["factory"] == params.get("factory", "IDMap2,Flat")
    shards = [faiss.read_index(p) for p in shard_paths(out, "dense", "faiss", num_shards)]
    store = VectorStore.open(shard_paths(out, "vectors", "zip", num_shards))
    assert sum(s.ntotal for s in shards) == len(store) == n
    for shard in shards:
        if "nprobe" in params:
            faiss.extract_index_ivf(shard).nprobe = info["nprobe"]
    for query in unit_vectors(5, seed=3):
        found, _ = dense_top_k(query, shards, info["rerank"] * k)
        if info["rerank"] > 1:
            found, _ = rerank_exact(query, found, store)
        np.testing.assert_array_equal(found[:k], exact_top_k(query, ids, vectors, k))


def test_beam_build_is_deterministic_rebuildable_and_extendable(tmp_path):
    ids, vectors = chunk_ids(1600), unit_vectors(1600)
    params = {"factory": "IVF16,PQ32x4fs", "nprobe": 8, "rerank": 4}
    first, second, delta = (str(tmp_path / name) for name in ("first", "second", "delta"))
    for out in (first, second, delta):
        os.makedirs(out)
    run_dense_build(first, ids[:1200], vectors[:1200], 2, **params)
    run_dense_build(second, ids[:1200][::-1], vectors[:1200][::-1], 2, **params)  # input order is irrelevant
    for kind, ext in (("vectors", "zip"), ("dense", "faiss")):
        for a, b in zip(shard_paths(first, kind, ext, 2), shard_paths(second, kind, ext, 2)):
            assert open(a, "rb").read() == open(b, "rb").read()

    trained = open(os.path.join(first, DENSE_TRAINED_FILE), "rb").read()
    dense_files = shard_paths(first, "dense", "faiss", 2)
    for vectors_path, dense_path in zip(shard_paths(first, "vectors", "zip", 2), dense_files):
        assert rebuild_index(trained, vectors_path) == open(dense_path, "rb").read()

    run_dense_build(delta, ids[1200:], vectors[1200:], 1, trained=trained_empty_index_of(dense_files[0]))
    assert sorted(os.listdir(delta)) == ["dense-00000-of-00001.faiss", "vectors-00000-of-00001.zip"]
    added = faiss.read_index(shard_paths(delta, "dense", "faiss", 1)[0])
    assert added.ntotal == 400 and faiss.extract_index_ivf(added).nlist == 16

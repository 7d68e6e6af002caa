"""Memory-aware loading: the skeleton in memory, bodies by point lookups,
postings mapped from each segment's serving files, checked against plain
reads of the tables; dense shards memory-mapped and joined behind their one
coarse quantizer."""
from __future__ import annotations

import os

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ritrag.analyzer import analyze
from ritrag.bm25 import Bm25, top_k
from ritrag.ids import NO_NODE_KEY, node_id_for, node_ids_of_keys, node_keys
from ritrag.layout import DamagedIndexError, IndexLayout
from ritrag.reader import IndexReader
from ritrag.serving.dense_shards import JoinedIVFShards, joined_by_quantizer, read_dense_shard, tombstone_parameters
from ritrag.serving.index import LoadedVersion
from ritrag.serving.retrieval import dense_top_k
from ritrag.vectors import VectorStore
from support import benchmark_module

write_synthetic_index = benchmark_module("synthetic_index").write_synthetic_index
write_synthetic_change = benchmark_module("synthetic_index").write_synthetic_change


def files(index_dir: str, kind: str) -> list[str]:
    layout = IndexLayout(index_dir)
    seg = layout.load_manifest().segments[0]
    return [os.path.join(layout.segment_dir(seg["id"]), name) for name in layout.segment_files(seg, kind)]


def table(index_dir: str, kind: str) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in files(index_dir, kind)])


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("synthetic_index"))
    # 9,000 nodes in 2 shards: more than one 4,096-row group per node file; two chunks a node.
    write_synthetic_index(out, nodes=9_000, sites=3, num_shards=2, vocabulary_size=3_000, factory="IDMap2,Flat",
                          chunks_per_node=2)
    return out


@pytest.fixture(scope="module")
def loaded(synthetic) -> LoadedVersion:
    return LoadedVersion(synthetic)


def test_bodies_stay_on_disk_and_come_by_point_lookup(synthetic, loaded):
    assert "body" not in loaded.nodes and "url" not in loaded.nodes
    nodes = table(synthetic, "nodes").to_pydict()
    rows = [loaded.node_row[nid] for nid in nodes["node_id"][::97]]
    records = loaded.node_records(rows)
    by_id = dict(zip(nodes["node_id"], zip(nodes["body"], nodes["url"])))
    for row in rows:
        assert (records[row]["body"], records[row]["url"]) == by_id[loaded.nodes["node_id"][row]]
    assert all(pq.ParquetFile(f).num_row_groups > 1 for f in files(synthetic, "nodes"))


def test_node_ids_map_to_rows_and_odd_ids_to_nothing(synthetic, loaded):
    ids = table(synthetic, "nodes")["node_id"].to_pylist()
    assert sorted(loaded.node_row) == sorted(ids) and len(loaded.node_row) == len(ids)
    assert all(loaded.nodes["node_id"][loaded.node_row[nid]] == nid for nid in ids[::50])
    for odd in ("", "x", ids[0] + "x", ids[0][:-1], ids[0][:-1] + "\0", "é" * 12, ids[0].upper()):
        assert loaded.node_row.get(odd) is None
    parents = loaded.nodes["parent_id"]
    row = loaded.node_row[ids[123]]
    assert loaded.nodes["ancestor_ids"][row][-1:] == ([parents[row]] if parents[row] else [])


def test_node_keys_sort_as_the_ids_do_and_stand_for_them_alone():
    ids = np.array(sorted(node_id_for(f"page {i}").encode("ascii") for i in range(5_000)), dtype="S12")
    keys = node_keys(ids)
    assert np.all(np.diff(keys.astype(np.float64)) > 0)  # ascending and distinct, as the sorted ids
    assert node_ids_of_keys(keys) == [i.decode("ascii") for i in ids]
    short = node_keys(np.array([b"n1", b"a0", b""]))
    assert node_ids_of_keys(short) == ["n1", "a0", ""] and not set(short.tolist()) & set(keys.tolist())
    odd = np.array([ids[0] + b"x", ids[0].upper(), b"\xc3\xa9" * 6, b"eightbyt"])  # no key stands for these
    assert (node_keys(odd) == NO_NODE_KEY).all()
    assert (node_keys(ids.astype("S20")) == keys).all()  # the width an array has is not the id


class PlainPostings:
    """The postings read the plain way, every posting's term string from the
    Parquet files, rows looked up by chunk id: the oracle of the mapped ones."""

    def __init__(self, synthetic: str, loaded: LoadedVersion):
        postings = table(synthetic, "postings")
        self.terms = np.array(postings["term"].to_pylist(), object)
        self.rows = loaded.chunk_rows(postings["chunk_id"].to_numpy())
        self.tf = postings["tf"].to_numpy()
        self.chunk_length = np.bincount(self.rows, self.tf, len(loaded.chunk_ids)).astype(np.float32)

    def of(self, term: str):
        at = np.flatnonzero(self.terms == term)
        order = np.argsort(self.rows[at], kind="stable")
        return self.rows[at][order], self.tf[at][order].astype(np.uint16)


def test_postings_score_like_a_plainly_read_index(synthetic, loaded):
    reference = PlainPostings(synthetic, loaded)
    np.testing.assert_array_equal(loaded.postings.chunk_length, reference.chunk_length)
    plain = Bm25(reference, loaded.bm25.fields, loaded.bm25.k1, loaded.bm25.b)
    words = sorted(set(reference.terms.tolist()))
    titles = [loaded.nodes["title"][row] for row in (0, 17, 4_321)]
    assert set(loaded.bm25.fields) == {"body", "doc", "anchors"}  # the build's default representation
    for query in (words[:2], words[100:103], words[-1:], [words[7], words[7], "zzzunknown"], *titles):
        terms = analyze(" ".join(query) if isinstance(query, list) else query)
        for field in loaded.bm25.fields:
            got_rows, got = top_k(loaded.bm25.scores(terms, field), 50)
            want_rows, want = top_k(plain.scores(terms, field), 50)
            np.testing.assert_array_equal(got_rows, want_rows)
            np.testing.assert_array_equal(got, want)


def test_the_fields_df_is_the_vocabularys_summed_over_its_shards(synthetic, loaded):
    vocabulary = table(synthetic, "vocabulary").to_pydict()
    for name, field in loaded.bm25.fields.items():
        for term, df in list(zip(vocabulary["term"], vocabulary[f"df_{name}"]))[::37]:
            assert field.df.get(term) == df
        assert field.df.get("zzzunknown") == 0 and field.df.get("\ud800x") == 0
    assert sum(vocabulary["df_doc"]) > 0 and sum(vocabulary["df_anchors"]) > 0


def test_the_synthetic_index_has_the_builds_rows_and_vectors(synthetic):
    """Two chunks a node, their words the node's body; a node document a node; vectors
    of the chunks alone (the default representation embeds no node document)."""
    chunks = table(synthetic, "chunks").to_pydict()
    ordinals = dict(zip(chunks["chunk_id"], chunks["ordinal"]))
    assert list(ordinals.values()).count(1) == list(ordinals.values()).count(-1) == 9_000
    node = table(synthetic, "nodes").slice(0, 1).to_pylist()[0]
    pieces = sorted((o, t) for n, o, t in zip(chunks["node_id"], chunks["ordinal"], chunks["text"])
                    if n == node["node_id"] and o >= 0)
    assert " ".join(t.partition("\n")[2] for _, t in pieces) == node["body"]
    store = VectorStore.open([f.path for f in IndexReader(synthetic).files("vectors")])
    assert {int(i) for shard in store.shards for i in shard.ids} == {c for c, o in ordinals.items() if o >= 0}


def test_a_load_that_fails_while_deriving_is_a_damaged_index(synthetic, monkeypatch):
    from ritrag.serving import index

    def broken(*args):
        raise RuntimeError("edges of another index")

    monkeypatch.setattr(index, "derive_nodes", broken)
    with pytest.raises(DamagedIndexError, match="edges of another index"):
        LoadedVersion(synthetic)


def test_with_a_cache_dir_a_local_index_is_hashed_once_then_trusted_by_its_stamps(synthetic, loaded, tmp_path,
                                                                                  monkeypatch):
    from ritrag import layout
    hashed = []
    sha256_file = layout.sha256_file
    monkeypatch.setattr(layout, "sha256_file", lambda path: hashed.append(path) or sha256_file(path))
    monkeypatch.setattr(layout, "_VERIFIED", {})  # as a fresh process: nothing hashed yet
    LoadedVersion(synthetic, cache_dir=str(tmp_path))
    assert any("nodes-" in path for path in hashed)
    first = len(hashed)
    monkeypatch.setattr(layout, "_VERIFIED", {})  # a restart: only the stamps remain
    again = LoadedVersion(synthetic, cache_dir=str(tmp_path))
    assert len(hashed) == first
    assert again.node_records([0]) == loaded.node_records([0])


def test_a_file_changed_after_its_stamp_is_hashed_again_and_refused(synthetic, tmp_path):
    import shutil

    index = str(tmp_path / "index")
    shutil.copytree(synthetic, index)
    LoadedVersion(index, cache_dir=str(tmp_path / "cache"))
    node_file = files(index, "nodes")[0]
    data = bytearray(open(node_file, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(node_file, "wb").write(bytes(data))
    with pytest.raises(DamagedIndexError, match="nodes-"):
        LoadedVersion(index, cache_dir=str(tmp_path / "cache"))


def test_skeleton_arrays_resolve_parents_and_ancestors_to_rows(loaded):
    sk = loaded.skeleton
    for row in range(0, len(loaded.nodes["node_id"]), 211):
        parent = loaded.nodes["parent_id"][row]
        assert sk.parent_row[row] == (loaded.node_row[parent] if parent else -1)
        expected = [loaded.node_row[a] for a in loaded.nodes["ancestor_ids"][row]]
        assert sk.ancestors(np.array([row])).tolist() == expected


def test_an_index_of_another_format_is_refused_with_what_to_do(tmp_path):
    import json

    from ritrag.layout import FORMAT_VERSION, IndexLoadError, Manifest

    with pytest.raises(IndexLoadError, match=f"format 1 .*reads formats 2, {FORMAT_VERSION}.*rebuild"):
        Manifest.from_json(json.dumps({"format_version": 1}).encode())


def unit_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("factory", ["IVF8,SQ8", "IVF8,PQ8x4fs", "IDMap2,Flat"])
def test_a_memory_mapped_dense_shard_answers_as_a_read_one(tmp_path, factory):
    index = faiss.index_factory(16, factory, faiss.METRIC_INNER_PRODUCT)
    vectors = unit_vectors(2000, 16, 0)
    index.train(vectors)
    index.add_with_ids(vectors, np.arange(2000, dtype=np.int64) * 7 + 3)
    path = str(tmp_path / "dense-00000-of-00001.faiss")
    faiss.write_index(index, path)
    mapped, read = read_dense_shard(path, nprobe=3), faiss.read_index(path)
    if factory.startswith("IVF"):
        faiss.extract_index_ivf(read).nprobe = 3
        assert faiss.extract_index_ivf(mapped).nprobe == 3
    if factory == "IVF8,SQ8":  # lists stored as arrays are mapped from the file, not copied
        lists = faiss.downcast_InvertedLists(faiss.extract_index_ivf(mapped).invlists)
        assert isinstance(lists, faiss.OnDiskInvertedLists)
    queries = unit_vectors(20, 16, 1)
    for got, expected in zip(mapped.search(queries, 50), read.search(queries, 50)):
        np.testing.assert_array_equal(got, expected)


def test_a_damaged_dense_shard_is_refused_naming_it(tmp_path):
    path = tmp_path / "dense-00000-of-00001.faiss"
    path.write_bytes(b"not a faiss index" * 8)
    with pytest.raises(DamagedIndexError, match="dense-00000-of-00001.faiss: not a readable FAISS index"):
        read_dense_shard(str(path), nprobe=1)


def trained_shards(vectors: np.ndarray, num_shards: int, seed: int = 0) -> list:
    trained = faiss.index_factory(vectors.shape[1], "IVF16,PQ8x4fs", faiss.METRIC_INNER_PRODUCT)
    trained.train(vectors[np.random.default_rng(seed).permutation(len(vectors))])
    shards = []
    for s in range(num_shards):
        shard = faiss.clone_index(trained)
        shard.add_with_ids(vectors[s::num_shards], np.arange(s, len(vectors), num_shards, dtype=np.int64))
        faiss.extract_index_ivf(shard).nprobe = 4
        shards.append(shard)
    return shards


def test_shards_of_one_quantizer_are_searched_as_one_index_like_each_apart():
    vectors = unit_vectors(3000, 16, 0)
    shards = trained_shards(vectors, 3)
    joined, _ = joined_by_quantizer(shards)
    assert len(joined) == 1 and isinstance(joined[0], JoinedIVFShards) and joined[0].ntotal == 3000
    queries = unit_vectors(20, 16, 1)
    # the ids some query finds first, tombstoned: the search skips them and still answers 100
    dead = np.unique(np.concatenate([dense_top_k(q, joined, 3)[0] for q in queries[:5]]))
    joined_params = [tombstone_parameters(joined[0], dead)]
    apart_params = [tombstone_parameters(shard, dead) for shard in shards]
    for query in queries:
        ids, scores = dense_top_k(query, joined, 100, joined_params)
        apart_ids, apart_scores = dense_top_k(query, shards, 100, apart_params)
        assert len(ids) == 100 and not np.isin(ids, dead).any()
        np.testing.assert_array_equal(scores, apart_scores)
        above = scores > scores[-1]  # equal scores at the cut may be any of the tied ids
        np.testing.assert_array_equal(np.sort(ids[above]), np.sort(apart_ids[above]))
        live_ids, live_scores = dense_top_k(query, joined, 100 + len(dead))
        kept = ~np.isin(live_ids, dead)
        np.testing.assert_array_equal(scores, live_scores[kept][:100])  # what an over-fetch would have kept


def test_shards_of_different_quantizers_or_exact_ones_stay_apart():
    vectors = unit_vectors(3000, 16, 0)
    mixed = trained_shards(vectors, 2, seed=0)[:1] + trained_shards(vectors, 2, seed=1)[1:]
    assert joined_by_quantizer(mixed)[0] == mixed
    exact = [faiss.index_factory(16, "IDMap2,Flat", faiss.METRIC_INNER_PRODUCT) for _ in range(2)]
    assert joined_by_quantizer(exact)[0] == exact


def test_a_synthetic_ivf_index_loads_joined_with_the_recorded_parameters(tmp_path):
    out = str(tmp_path / "ivf")
    write_synthetic_index(out, nodes=3_000, sites=3, num_shards=3, vocabulary_size=1_000, factory="IVF16,PQ96x4fs",
                          nprobe=4, rerank=4)
    loaded = LoadedVersion(out)
    dense = loaded.manifest.config["dense"]
    assert dense["factory"] == "IVF16,PQ96x4fs" and (dense["nprobe"], dense["rerank"]) == (4, 4)
    assert faiss.extract_index_ivf(loaded.dense_shards[0].shards[0]).nprobe == 4
    assert len(loaded.dense_shards) == len(loaded.dense_params) == 1
    assert loaded.dense_shards[0].ntotal == 3_000 and loaded.vector_store is not None  # the chunks: no node documents


def test_the_ivf_shards_of_all_segments_are_searched_behind_their_one_quantizer_as_each_segment_apart(tmp_path):
    out = str(tmp_path / "ivf")
    write_synthetic_index(out, nodes=3_000, sites=3, num_shards=3, vocabulary_size=1_000, factory="IVF16,PQ96x4fs",
                          nprobe=4, rerank=4)
    write_synthetic_change(out)  # a delta segment of one vector, in the version's trained index; one chunk tombstoned
    loaded = LoadedVersion(out)
    (joined,), (joined_params,) = loaded.dense_shards, loaded.dense_params
    assert isinstance(joined, JoinedIVFShards) and len(joined.shards) == 4 and joined.ntotal == 3_001
    assert joined_params is None and sum(p is not None for p in joined.shard_params) == 3  # the base's tombstone
    # the same shards searched a segment at a time, as before the join
    reader = IndexReader(IndexLayout(out))
    apart, apart_params = [], []
    for segment in loaded.manifest.segments:
        files = [f for f in reader.files("dense") if f.segment == segment["id"]]
        dead = np.array(sorted(files[0].dead), np.int64)
        shards = [read_dense_shard(f.path, 4) for f in files]
        indexes, params = joined_by_quantizer(shards, [tombstone_parameters(shard, dead) for shard in shards])
        apart += indexes
        apart_params += params
    dead_of_base = np.array(sorted(reader.files("dense")[0].dead), np.int64)
    assert len(apart) == 2 and len(dead_of_base) == 1  # the base's shards joined, and the delta's one
    for query in unit_vectors(20, loaded.vector_store.dim, 2):
        ids, scores = dense_top_k(query, [joined], 100)
        apart_ids, apart_scores = dense_top_k(query, apart, 100, apart_params)
        assert not np.isin(ids, dead_of_base).any()
        np.testing.assert_array_equal(scores, apart_scores)
        above = scores > scores[-1]  # equal scores at the cut may be any of the tied ids
        np.testing.assert_array_equal(np.sort(ids[above]), np.sort(apart_ids[above]))

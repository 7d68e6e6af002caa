"""A synthetic index written straight in the on-disk format, for serving at scale.

Building a million-chunk index through the Beam job means embedding a million
chunks, hours on a CPU. What the server's load time, memory and latency depend
on is the shape of the files (rows, row groups, postings, IVF-PQ shards), not on
where the text came from, so this writes those files directly with numpy:
a forest of `nodes` nodes (roots = sites, fan-out `fanout`), one chunk per node,
bodies of Zipf-distributed words that BM25 can rank, and embedding-like unit
vectors (benchmarks/dense_recall.py's generator) of the dimension of the bundled
model, so that the real query embedder can search them. The dense part is the
build's own: the index the build would choose for that many vectors
(`choose_params`, unless `factory` is given), trained on the build's sample
(the smallest chunk ids), float16 vector files and shard indexes built from them
(`rebuild_index`), and the same dense.json, so that the server searches and
re-ranks exactly as it would on a built index of that size.

    python -m benchmarks.synthetic_index OUT --nodes 1000000
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ritrag.analyzer import analyze
from ritrag.embedder import DEFAULT_MODEL, EmbedderSpec
from ritrag.ids import chunk_id_for, node_id_for, shard_of
from ritrag.bm25 import BM25_PARAMETERS, corpus_stats
from ritrag.layout import (BM25_STATS_FILE, DEAD_LETTERS_FILE, DENSE_INFO_FILE, DENSE_TRAINED_FILE, IndexLayout,
                           new_manifest, shard_file_name)
from ritrag.schema import CHUNKS_SCHEMA, DEAD_LETTERS_SCHEMA, NODES_SCHEMA, POSTINGS_SCHEMA, VOCABULARY_SCHEMA
from ritrag.transforms.dense import TRAIN_SAMPLE_SIZE, choose_params, dense_info, rebuild_index, train_empty_index
from ritrag.vectors import VECTORS_EXTENSION, VECTORS_KIND, write_vectors

ROW_GROUP_ROWS = 4096  # as transforms/tables.py writes them (importing it would load Beam)
DIM = 384  # all-MiniLM-L6-v2
BATCH = 65_536  # vectors per generated batch
QUERY_STREAM = 1 << 40  # batch indices of query vectors, apart from the corpus's
SYLLABLES = [c + v for c in "bcdfgklmnprstvz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]


class SyntheticEmbeddings:
    """Deterministic batches of embedding-like unit vectors: in 384 dims, a
    component common to all (sentence embeddings share a mean direction), one of
    `sites` x `topics` topic centres (Zipf-distributed popularity; topics of a site
    are correlated) and anisotropic noise (power-law spectrum in a random basis,
    about 26 effective dimensions). Typical cosines: unrelated 0.13, nearest
    neighbour 0.77, 200th neighbour 0.47 at 262k vectors. Batch `index` is the
    same whatever else is generated."""

    def __init__(self, dim: int = 384, sites: int = 256, topics_per_site: int = 64, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.seed = seed
        self.rotation = np.linalg.qr(rng.standard_normal((dim, dim)))[0].astype(np.float32)
        spectrum = (1.0 + np.arange(dim)) ** -0.5
        self.spectrum = (spectrum / np.linalg.norm(spectrum)).astype(np.float32)
        self.common = _unit(rng.standard_normal(dim)).astype(np.float32)
        site = np.repeat(_unit(rng.standard_normal((sites, dim))), topics_per_site, axis=0)
        self.topics = _unit(0.7 * site + 0.7 * _unit(rng.standard_normal(site.shape))).astype(np.float32)
        popularity = 1.0 / (np.arange(len(self.topics)) + 10.0) ** 0.8
        self.cdf = np.cumsum(popularity / popularity.sum())

    def batch(self, index: int, size: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, index])
        topic = np.minimum(np.searchsorted(self.cdf, rng.random(size)), len(self.topics) - 1)
        x = rng.standard_normal((size, len(self.common)), dtype=np.float32)
        x *= self.spectrum
        x = x @ self.rotation
        x *= 0.6
        x += 0.75 * self.topics[topic]
        x += 0.35 * self.common
        return _unit(x)

    def rows(self, first_batch: int, n: int) -> np.ndarray:
        return np.concatenate([self.batch(first_batch + b, min(BATCH, n - b * BATCH))
                               for b in range(-(-n // BATCH))])


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def vocabulary(size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` distinct words that the BM25 analyzer keeps as they are."""
    words: dict[str, None] = {}
    while len(words) < size:
        parts = rng.integers(0, len(SYLLABLES), size=(size, 3))
        lengths = rng.integers(2, 4, size=size)
        for row, n in zip(parts, lengths):
            word = "".join(SYLLABLES[p] for p in row[:n])
            if analyze(word) == [word]:
                words[word] = None
    return np.array(list(words)[:size], dtype=object)


def forest(nodes: int, sites: int, fanout: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(parent row or -1, position among siblings, depth) of breadth-first
    numbered trees, one per site, sizes as even as `nodes` allows."""
    parent = np.full(nodes, -1, np.int64)
    position = np.zeros(nodes, np.int32)
    depth = np.zeros(nodes, np.int32)
    bounds = np.linspace(0, nodes, sites + 1).astype(np.int64)
    for start, end in zip(bounds[:-1], bounds[1:]):
        local = np.arange(1, end - start)
        parent[start + local] = start + (local - 1) // fanout
        position[start + local] = (local - 1) % fanout
    for row in range(nodes):  # parents come first in breadth-first order
        if parent[row] >= 0:
            depth[row] = depth[parent[row]] + 1
    return parent, position, depth


def write_table(path: str, columns: dict[str, pa.Array], schema: pa.Schema) -> None:
    """Write the columns `schema` names; the schema's other fields (it grows
    with the build job) get nulls or empty values."""
    rows = len(next(iter(columns.values())))
    arrays = []
    for field in schema:
        if field.name in columns:
            arrays.append(pa.array(columns[field.name], field.type))
        elif field.nullable:
            arrays.append(pa.nulls(rows, field.type))
        else:
            arrays.append(pa.array([[] if pa.types.is_list(field.type) else field.type.to_pandas_dtype()()
                                    if not pa.types.is_string(field.type) else ""] * rows, field.type))
    table = pa.Table.from_arrays(arrays, schema=schema)
    pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS, compression="zstd", write_statistics=True)


def write_synthetic_index(out: str, nodes: int = 1_000_000, sites: int = 16, fanout: int = 10,
                          words_per_node: int = 120, vocabulary_size: int = 50_000, num_shards: int = 8,
                          factory: str | None = None, nprobe: int | None = None, rerank: int | None = None,
                          seed: int = 0) -> dict:
    start = time.time()
    faiss.omp_set_num_threads(1)  # OpenMP spin-waits badly on a shared 2-core machine
    rng = np.random.default_rng(seed)
    words = vocabulary(vocabulary_size, rng)
    parent, position, depth = forest(nodes, sites, fanout)
    ids = np.array([node_id_for(f"synthetic:{seed}:{i}") for i in range(nodes)], dtype=object)

    # Zipf-like word frequencies, plus a few topic words per node so that nodes differ.
    weights = 1.0 / np.arange(2.7, vocabulary_size + 2.7)
    weights /= weights.sum()
    lengths = rng.poisson(words_per_node, nodes).clip(20, None)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.choice(vocabulary_size, size=int(offsets[-1]), p=weights)
    topics = rng.integers(0, vocabulary_size, size=(nodes, 4))
    topic_slots = offsets[:-1, None] + (rng.random((nodes, 4)) * lengths[:, None]).astype(np.int64)
    tokens[topic_slots.ravel()] = topics.ravel()
    titles = np.array([" ".join(w.capitalize() for w in words[topics[i, :2 + i % 2]]) for i in range(nodes)],
                      dtype=object)
    bodies = np.array([" ".join(words[tokens[offsets[i]:offsets[i + 1]]]) + "."
                       for i in range(nodes)], dtype=object)
    chunk_texts = titles + "\n" + bodies
    chunk_ids = np.array([chunk_id_for(ids[i], 0, chunk_texts[i]) for i in range(nodes)], dtype=np.int64)

    ancestors: list[list[int]] = [[] for _ in range(nodes)]  # rows, root first
    for row in range(nodes):
        if parent[row] >= 0:
            ancestors[row] = ancestors[parent[row]] + [parent[row]]
    term_rank = np.argsort(np.argsort(words.astype(str)))  # postings sort by term text
    df = np.zeros(vocabulary_size, np.int64)
    site_of = np.searchsorted(np.linspace(0, nodes, sites + 1)[1:], np.arange(nodes), side="right")

    layout = IndexLayout(out)
    segment_id = f"seg-{layout.next_version()}"
    seg_dir = layout.segment_dir(segment_id)
    os.makedirs(seg_dir, exist_ok=True)

    node_shard = np.array([shard_of(i, num_shards) for i in ids])
    chunk_shard = chunk_ids % num_shards
    for s in range(num_shards):
        rows = np.flatnonzero(node_shard == s)
        rows = rows[np.argsort(ids[rows].astype(str))]
        write_table(os.path.join(seg_dir, shard_file_name("nodes", s, num_shards, "parquet")), {
            "node_id": pa.array(ids[rows], pa.string()),
            "page_id": pa.array(ids[rows], pa.string()),
            "parent_id": pa.array([ids[parent[r]] if parent[r] >= 0 else None for r in rows], pa.string()),
            "site": pa.array([f"site{site_of[r]}" for r in rows], pa.string()),
            "kind": pa.array(["page"] * len(rows), pa.string()),
            "position": pa.array(position[rows], pa.int32()),
            "depth": pa.array(depth[rows], pa.int32()),
            "title": pa.array(titles[rows], pa.string()),
            "url": pa.array([f"https://synthetic.example/site{site_of[r]}/{r}.html" for r in rows], pa.string()),
            "ancestor_ids": pa.array([list(ids[ancestors[r]]) for r in rows], pa.list_(pa.string())),
            "ancestor_titles": pa.array([list(titles[ancestors[r]]) for r in rows], pa.list_(pa.string())),
            "body": pa.array(bodies[rows], pa.string()),
            "summary": pa.array([""] * len(rows), pa.string()),
            "keywords": pa.array([[]] * len(rows), pa.list_(pa.string())),
            "content_hash": pa.array([""] * len(rows), pa.string()),
            "trail_method": pa.array(["synthetic"] * len(rows), pa.string()),
            "source_kind": pa.array(["html"] * len(rows), pa.string()),
        }, NODES_SCHEMA)

        rows = np.flatnonzero(chunk_shard == s)
        rows = rows[np.argsort(chunk_ids[rows])]
        write_table(os.path.join(seg_dir, shard_file_name("chunks", s, num_shards, "parquet")), {
            "chunk_id": pa.array(chunk_ids[rows], pa.int64()),
            "node_id": pa.array(ids[rows], pa.string()),
            "page_id": pa.array(ids[rows], pa.string()),
            "ordinal": pa.array(np.zeros(len(rows), np.int32)),
            "text": pa.array(chunk_texts[rows], pa.string()),
            "n_tokens": pa.array(lengths[rows].astype(np.int32)),
        }, CHUNKS_SCHEMA)

        # Postings of this shard's chunks: (term, chunk) pairs with their counts.
        owner = np.repeat(rows, lengths[rows])
        terms = np.concatenate([tokens[offsets[r]:offsets[r + 1]] for r in rows])
        pairs, tf = np.unique(owner * vocabulary_size + terms, return_counts=True)
        chunk_of, term_of = pairs // vocabulary_size, pairs % vocabulary_size
        df += np.bincount(term_of, minlength=vocabulary_size)
        order = np.lexsort((chunk_ids[chunk_of], term_rank[term_of]))
        write_table(os.path.join(seg_dir, shard_file_name("postings", s, num_shards, "parquet")), {
            "term": pa.array(words[term_of[order]], pa.string()),
            "chunk_id": pa.array(chunk_ids[chunk_of[order]], pa.int64()),
            "tf": pa.array(tf[order].astype(np.int32)),
        }, POSTINGS_SCHEMA)

    present = np.flatnonzero(df)
    order = present[np.argsort(words[present].astype(str))]
    write_table(os.path.join(seg_dir, shard_file_name("vocabulary", 0, 1, "parquet")),
                {"term": words[order], "df": df[order]}, VOCABULARY_SCHEMA)
    bm25 = corpus_stats(nodes, int(offsets[-1]))
    with open(os.path.join(seg_dir, BM25_STATS_FILE), "w", encoding="utf-8") as fh:
        json.dump(bm25, fh, sort_keys=True)
    pq.write_table(DEAD_LETTERS_SCHEMA.empty_table(), os.path.join(seg_dir, DEAD_LETTERS_FILE))

    overrides = {k: v for k, v in {"factory": factory, "nprobe": nprobe, "rerank": rerank}.items() if v is not None}
    dense = write_dense(seg_dir, chunk_ids, chunk_shard, num_shards, overrides, seed)
    counts = {"pages_read": nodes, "pages_indexed": nodes, "chunks": nodes}
    segment = layout.describe_segment(segment_id, num_shards, counts)
    spec = EmbedderSpec(model=DEFAULT_MODEL)
    manifest = new_manifest(layout, [segment], stats={"bm25": bm25, "pages": counts},
                            config={"embedder": {**spec.to_dict(), "dimension": DIM}, "dense": dense,
                                    "bm25": dict(BM25_PARAMETERS), "granularity": "page",
                                    "num_shards": num_shards, "base_url": "https://synthetic.example/",
                                    "site_depth": 1})
    layout.publish(manifest)
    return {"version": manifest.version, "nodes": nodes, "chunks": nodes, "postings_terms": int(offsets[-1]),
            "seconds": round(time.time() - start, 1)}


def write_dense(seg_dir: str, chunk_ids: np.ndarray, chunk_shard: np.ndarray, num_shards: int,
                overrides: dict, seed: int) -> dict:
    """Vector files, the trained index and shard indexes as the build writes them
    (`overrides` as the build's --dense_* flags); returns dense.json. Chunk row i
    gets vector i of the embedding-like stream."""
    n = len(chunk_ids)
    params = dataclasses.replace(choose_params(n, DIM), **overrides)
    gen = SyntheticEmbeddings(dim=DIM, seed=seed)
    vectors = np.empty((n, DIM), np.float16)
    for b, start in enumerate(range(0, n, BATCH)):
        vectors[start: start + BATCH] = gen.batch(b, min(BATCH, n - start))
    sample = np.sort(np.argsort(chunk_ids)[:TRAIN_SAMPLE_SIZE])  # the build's: the smallest chunk ids
    trained = train_empty_index(params.factory, vectors[sample].astype(np.float32))
    with open(os.path.join(seg_dir, DENSE_TRAINED_FILE), "wb") as fh:
        fh.write(trained)
    for s in range(num_shards):
        rows = np.flatnonzero(chunk_shard == s)
        rows = rows[np.argsort(chunk_ids[rows])]
        vectors_path = os.path.join(seg_dir, shard_file_name(VECTORS_KIND, s, num_shards, VECTORS_EXTENSION))
        with open(vectors_path, "wb") as fh:
            write_vectors(fh, chunk_ids[rows], vectors[rows])
        with open(os.path.join(seg_dir, shard_file_name("dense", s, num_shards, "faiss")), "wb") as fh:
            fh.write(rebuild_index(trained, vectors_path))
    dense = dense_info(params, DIM, n, len(sample))
    with open(os.path.join(seg_dir, DENSE_INFO_FILE), "w", encoding="utf-8") as fh:
        json.dump(dense, fh, sort_keys=True)
    return dense


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--num_shards", type=int, default=8)
    parser.add_argument("--factory", help="a FAISS factory string; default: the build's choice for the size")
    parser.add_argument("--nprobe", type=int, help="default: the build's choice for the size")
    parser.add_argument("--rerank", type=int, help="default: the build's choice for the size")
    args = parser.parse_args(argv)
    print(json.dumps(write_synthetic_index(args.out, args.nodes, num_shards=args.num_shards, factory=args.factory,
                                           nprobe=args.nprobe, rerank=args.rerank)))


if __name__ == "__main__":
    main()

"""A synthetic index written straight in the on-disk format, for serving at scale.

Building a million-chunk index through the Beam job means embedding a million
chunks, hours on a CPU (and the local runner does not hold a million pages in
24 GiB). What the server's load time, memory and latency depend on is the shape
of the files (rows, row groups, postings, IVF-PQ shards, links), not on where
the text came from, so this writes those files directly with numpy, in the
representation `ritrag build` writes by default (ritrag/representation.py):
a forest of `nodes` nodes (roots = sites, fan-out `fanout`), `chunks_per_node`
chunks per node (BM25 indexes their words; the model would embed the path and
them), one node
document per node (its path, in BM25's "doc" field; embedded only where the
representation has node_doc_vectors, as the build does), links
(`LINKS_PER_NODE` per node into its own site, skewed toward the top of the
site as navigation is; anchor text the target's title or its first word) with
their edges table and an anchor document per linked-to node (BM25's "anchors"
field, no vector). Bodies are Zipf-distributed words that BM25 can rank; every
embedded row gets an embedding-like unit vector (benchmarks/dense_recall.py's
generator) of the dimension of the bundled model, so that the real query
embedder can search them. The dense part is the
build's own: the index the build would choose for that many vectors
(`choose_params`, unless `factory` is given), trained on the build's sample
(the smallest chunk ids), float16 vector files and shard indexes built from them
(`rebuild_index`), and the same dense.json, so that the server searches and
re-ranks exactly as it would on a built index of that size.

It streams, so that 10M chunks fit this machine: per-node state is a few
arrays (forest, lengths, topics, ids, titles); bodies are drawn block by block
(each block from its own random stream), node rows written as drawn, chunks
spilled to their chunk shard and written (with their postings) one shard at a
time, vectors drawn once and scattered into per-shard files. Peak memory
follows one chunk shard, so raise --num_shards with --nodes (10M: 16).

    python -m benchmarks.synthetic_index OUT --nodes 1000000
    python -m benchmarks.synthetic_index OUT --nodes 10000000 --num_shards 16
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import tempfile
import time

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ritrag.analyzer import analyze
from ritrag.embedder import DEFAULT_MODEL, EmbedderSpec
from ritrag.ids import chunk_id_for, node_id_for, shard_of
from ritrag.bm25 import BM25_PARAMETERS, KIND_FIELDS, corpus_stats, row_kind, row_kinds
from ritrag.layout import (BM25_STATS_FILE, DEAD_LETTERS_FILE, DENSE_INFO_FILE, DENSE_TRAINED_FILE, IndexLayout,
                           new_manifest, shard_file_name)
from ritrag.representation import (ANCHOR_DOC_ORDINAL, LEGACY, NODE_DOC_ORDINAL, Representation,
                                   retrieval_defaults)
from ritrag.serving_form import write_serving_form
from ritrag.schema import (CHUNKS_SCHEMA, DEAD_LETTERS_SCHEMA, EDGES_KIND, EDGES_SCHEMA, NODES_SCHEMA,
                           POSTINGS_SCHEMA, VOCABULARY_SCHEMA, NodeRow)
from ritrag.transforms.dense import TRAIN_SAMPLE_SIZE, choose_params, dense_info, rebuild_index, train_empty_index
from ritrag.transforms.edges import bounded_anchors
from ritrag.vectors import VECTORS_EXTENSION, VECTORS_KIND, write_vectors

ROW_GROUP_ROWS = 4096  # as transforms/tables.py writes them (importing it would load Beam)
DIM = 384  # all-MiniLM-L6-v2
BATCH = 65_536  # vectors per generated batch
BLOCK_ROWS = 65_536  # nodes per generated block (a multiple of ROW_GROUP_ROWS)
QUERY_STREAM = 1 << 40  # batch indices of query vectors, apart from the corpus's
REPRESENTATION = Representation()  # what `ritrag build` writes by default
LINKS_PER_NODE = 4
SHORT_ANCHOR_SHARE = 0.25  # links whose anchor text is the target title's first word, not the whole title
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
    bounds = np.linspace(0, nodes, sites + 1).astype(np.int64)
    for start, end in zip(bounds[:-1], bounds[1:]):
        local = np.arange(1, end - start)
        parent[start + local] = start + (local - 1) // fanout
        position[start + local] = (local - 1) % fanout
    depth = np.zeros(nodes, np.int32)
    above = parent.copy()
    while (alive := above >= 0).any():  # one step up per pass: depth is at most log_fanout(nodes)
        depth[alive] += 1
        above[alive] = parent[above[alive]]
    return parent, position, depth


def ancestor_rows(rows: np.ndarray, parent: np.ndarray, depth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(list offsets, ancestor rows root first) of `rows`, as one flat array."""
    chain = [parent[rows]]
    for _ in range(int(depth[rows].max(initial=0)) - 1):
        chain.append(np.where(chain[-1] >= 0, parent[chain[-1].clip(0)], -1))
    chain = np.stack(chain, axis=1)
    d = depth[rows]
    back = d[:, None] - 1 - np.arange(chain.shape[1])[None, :]  # column of the j-th ancestor from the root
    valid = back >= 0
    flat = np.take_along_axis(chain, back.clip(0), axis=1)[valid]
    return np.concatenate([[0], np.cumsum(d)]).astype(np.int32), flat


def joined(*parts) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def write_table(writer: pq.ParquetWriter, columns: dict[str, pa.Array], schema: pa.Schema) -> None:
    """Append the columns `schema` names; the schema's other fields (it grows
    with the build job) get nulls or empty values."""
    rows = len(next(iter(columns.values())))
    arrays = []
    for field in schema:
        if field.name in columns:
            arrays.append(columns[field.name].cast(field.type))
        elif field.nullable:
            arrays.append(pa.nulls(rows, field.type))
        elif pa.types.is_list(field.type):
            arrays.append(pa.ListArray.from_arrays(np.zeros(rows + 1, np.int32), pa.array([], field.type.value_type)))
        elif pa.types.is_string(field.type):
            arrays.append(pa.array(np.full(rows, ""), field.type))
        else:
            arrays.append(pa.array(np.zeros(rows, field.type.to_pandas_dtype())))
    writer.write_table(pa.Table.from_arrays(arrays, schema=schema), row_group_size=ROW_GROUP_ROWS)


def table_writer(path: str, schema: pa.Schema) -> pq.ParquetWriter:
    return pq.ParquetWriter(path, schema, compression="zstd", write_statistics=True)


@dataclasses.dataclass
class SyntheticCorpus:
    """What every block of the corpus draws on: the forest, titles and ids of
    all nodes (small per node), the word distribution. Bodies are drawn per
    block, never held whole."""
    words: pa.Array
    weights: np.ndarray
    parent: np.ndarray
    position: np.ndarray
    depth: np.ndarray
    lengths: np.ndarray
    topics: np.ndarray
    ids: pa.Array
    titles: pa.Array
    site: np.ndarray
    link_target: np.ndarray  # (nodes, LINKS_PER_NODE) target rows, -1 where a draw hit the node itself
    link_short: np.ndarray  # (nodes, LINKS_PER_NODE) whether the anchor text is the title's first word
    seed: int
    chunks_per_node: int  # a body's words cut into this many chunks (ordinals 0..), as even as they allow

    @classmethod
    def draw(cls, nodes: int, sites: int, fanout: int, words_per_node: int, vocabulary_size: int,
             seed: int, chunks_per_node: int = 1) -> "SyntheticCorpus":
        rng = np.random.default_rng(seed)
        words = vocabulary(vocabulary_size, rng)
        parent, position, depth = forest(nodes, sites, fanout)
        # Zipf-like word frequencies, plus a few topic words per node so that nodes differ.
        weights = 1.0 / np.arange(2.7, vocabulary_size + 2.7)
        lengths = rng.poisson(words_per_node, nodes).clip(20, None)
        topics = rng.integers(0, vocabulary_size, size=(nodes, 4))
        capital = pc.utf8_capitalize(pa.array(words))
        third = pa.array(np.where(np.arange(nodes) % 2 == 1, topics[:, 2], -1), mask=np.arange(nodes) % 2 == 0)
        titles = pc.binary_join_element_wise(capital.take(pa.array(topics[:, 0])), capital.take(pa.array(topics[:, 1])),
                                             capital.take(third), " ", null_handling="skip")
        ids = pa.array([node_id_for(f"synthetic:{seed}:{i}") for i in range(nodes)], pa.string())
        bounds = np.linspace(0, nodes, sites + 1).astype(np.int64)
        site = np.searchsorted(bounds[1:], np.arange(nodes), side="right")
        start, size = bounds[site], bounds[site + 1] - bounds[site]
        # u^3: most links go to the top of their site (home, section indexes), as navigation does
        link_target = start[:, None] + (size[:, None] * rng.random((nodes, LINKS_PER_NODE)) ** 3).astype(np.int64)
        link_target[link_target == np.arange(nodes)[:, None]] = -1
        link_short = rng.random((nodes, LINKS_PER_NODE)) < SHORT_ANCHOR_SHARE
        return cls(pa.array(words), weights / weights.sum(), parent, position, depth, lengths, topics, ids,
                   titles, site, link_target, link_short, seed, chunks_per_node)

    def title_tokens(self, row: int) -> list[int]:
        """The word ids of node `row`'s title (two words, three on odd rows)."""
        return self.topics[row, :3 if row % 2 else 2].tolist()

    def in_links(self) -> tuple[np.ndarray, np.ndarray]:
        """(links with the whole title, links with its first word) into each node."""
        valid = self.link_target >= 0
        n = len(self.lengths)
        return (np.bincount(self.link_target[valid & ~self.link_short], minlength=n),
                np.bincount(self.link_target[valid & self.link_short], minlength=n))

    def bodies(self, rows: np.ndarray, stream: list[int]) -> tuple[pa.Array, np.ndarray, np.ndarray]:
        """(body texts, list offsets, word ids) of `rows`, drawn from the random
        stream `stream` (the same rows and stream give the same bodies)."""
        rng = np.random.default_rng([self.seed, *stream])
        lengths = self.lengths[rows]
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        tokens = rng.choice(len(self.weights), size=int(offsets[-1]), p=self.weights)
        slots = offsets[:-1, None] + (rng.random((len(rows), 4)) * lengths[:, None]).astype(np.int64)
        tokens[slots.ravel()] = self.topics[rows].ravel()
        words = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), self.words.take(pa.array(tokens)))
        return joined(pc.binary_join(words, " "), "."), offsets, tokens


def write_synthetic_index(out: str, nodes: int = 1_000_000, sites: int = 16, fanout: int = 10,
                          words_per_node: int = 120, vocabulary_size: int = 50_000, num_shards: int = 8,
                          factory: str | None = None, nprobe: int | None = None, rerank: int | None = None,
                          seed: int = 0, representation: Representation = REPRESENTATION,
                          chunks_per_node: int = 1) -> dict:
    """Write the index in two streaming passes, memory bounded by one shard's
    rows, not the corpus: node shards block by block (node and edge rows
    written; chunks, node and anchor documents spilled to their chunk shard),
    then each chunk shard (sorted, its rows and postings written), then the
    dense side. `representation`: the build's default, or another (LEGACY:
    an index as builds wrote them before representations, which servers still load).
    `chunks_per_node`: 1, nodes that are one chunk each (the node-side arrays
    at their heaviest for the rows), or the several of real pages (the dev
    corpus: 10 chunks per page), with `words_per_node` that many times a chunk's."""
    start = time.time()
    faiss.omp_set_num_threads(1)  # OpenMP spin-waits badly on a shared 2-core machine
    corpus = SyntheticCorpus.draw(nodes, sites, fanout, words_per_node, vocabulary_size, seed, chunks_per_node)
    layout = IndexLayout(out)
    segment_id = f"seg-{layout.next_version()}"
    seg_dir = layout.segment_dir(segment_id)
    os.makedirs(seg_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="synthetic-", dir=out) as spill_dir:
        spills = [os.path.join(spill_dir, f"chunks-{s}.arrow") for s in range(num_shards)]
        edges = write_node_shards(corpus, seg_dir, spills, num_shards, representation)
        df = np.zeros((len(KIND_FIELDS), vocabulary_size), np.int64)
        shards = [write_chunk_shard(corpus, seg_dir, spills[s], s, num_shards, df, representation)
                  for s in range(num_shards)]
        n_rows, n_terms = sum(rows for _, rows, _ in shards), sum(terms for _, _, terms in shards)
        total = df.sum(axis=0)
        present = np.flatnonzero(total)
        words = corpus.words.to_numpy(zero_copy_only=False)
        term_shard = np.array([shard_of(str(w), num_shards) for w in words[present]], np.int64)
        for shard in range(num_shards):  # sharded by term hash, as the build's vocabulary
            mine = present[term_shard == shard]
            order = mine[np.argsort(words[mine].astype(str))]
            with table_writer(os.path.join(seg_dir, shard_file_name("vocabulary", shard, num_shards, "parquet")),
                              VOCABULARY_SCHEMA) as writer:
                write_table(writer, {"term": corpus.words.take(pa.array(order)), "df": pa.array(total[order]),
                                     **{f"df_{name}": pa.array(df[kind, order])
                                        for kind, name in enumerate(KIND_FIELDS)}}, VOCABULARY_SCHEMA)
        bm25 = corpus_stats(n_rows, n_terms)
        with open(os.path.join(seg_dir, BM25_STATS_FILE), "w", encoding="utf-8") as fh:
            json.dump(bm25, fh, sort_keys=True)
        pq.write_table(DEAD_LETTERS_SCHEMA.empty_table(), os.path.join(seg_dir, DEAD_LETTERS_FILE))
        overrides = {k: v for k, v in {"factory": factory, "nprobe": nprobe, "rerank": rerank}.items()
                     if v is not None}
        embedded = [ids for ids, _, _ in shards]
        dense = write_dense(seg_dir, embedded, overrides, seed, spill_dir)
    n_embedded = sum(len(ids) for ids in embedded)
    counts = {"pages_read": nodes, "pages_indexed": nodes, "chunks": n_rows, "chunks_embedded": n_embedded,
              "edges": edges}
    write_serving_form(seg_dir, num_shards)
    segment = layout.describe_segment(segment_id, num_shards, counts)
    spec = EmbedderSpec(model=DEFAULT_MODEL)
    manifest = new_manifest(layout, [segment], stats={"bm25": bm25, "pages": counts},
                            config={"embedder": {**spec.to_dict(), "dimension": DIM}, "dense": dense,
                                    "bm25": dict(BM25_PARAMETERS), "granularity": "page",
                                    "num_shards": num_shards, "base_url": "https://synthetic.example/",
                                    "site_depth": 1,
                                    **({"representation": representation.to_dict(),
                                        "retrieval": retrieval_defaults(representation)}
                                       if representation != LEGACY else {})})
    layout.publish(manifest)
    return {"version": manifest.version, "nodes": nodes, "rows": n_rows, "embedded": n_embedded, "edges": edges,
            "postings_terms": n_terms, "seconds": round(time.time() - start, 1),
            "peak_rss_gib": round(peak_rss_gib(), 2)}


SPILL_SCHEMA = pa.schema([pa.field("chunk_id", pa.int64()), pa.field("row", pa.int64()),
                          pa.field("ordinal", pa.int32()), pa.field("n_tokens", pa.int32()),
                          pa.field("text", pa.large_string()), pa.field("tokens", pa.list_(pa.int32()))])


def write_node_shards(corpus: SyntheticCorpus, seg_dir: str, spills: list[str], num_shards: int,
                      representation: Representation) -> int:
    """Each node shard's node and edge rows, sorted by node id (edges by
    source, then position) as the build writes them, block by block; each
    block's rows of the chunks table (per node its chunk, its node document
    and, if linked to, its anchor document) spilled to their chunk shard.
    Returns the number of edges."""
    ids = corpus.ids
    node_shard = np.fromiter((shard_of(i, num_shards) for i in ids.to_pylist()), np.int64, len(ids))
    capital = pc.utf8_capitalize(corpus.words)
    word_id = {w: i for i, w in enumerate(corpus.words.to_pylist())}
    in_full, in_short = corpus.in_links()
    spill_writers = [pa.ipc.new_file(path, SPILL_SCHEMA) for path in spills]
    edges = 0
    for s in range(num_shards):
        rows = np.flatnonzero(node_shard == s)
        rows = rows[np.argsort(ids.take(pa.array(rows)).to_numpy(zero_copy_only=False).astype(str), kind="stable")]
        with (table_writer(os.path.join(seg_dir, shard_file_name("nodes", s, num_shards, "parquet")),
                           NODES_SCHEMA) as node_writer,
              table_writer(os.path.join(seg_dir, shard_file_name(EDGES_KIND, s, num_shards, "parquet")),
                           EDGES_SCHEMA) as edge_writer):
            for b, first in enumerate(range(0, len(rows), BLOCK_ROWS)):
                block = rows[first: first + BLOCK_ROWS]
                bodies, offsets, tokens = corpus.bodies(block, [s, b])
                titles = corpus.titles.take(pa.array(block))
                block_ids = ids.take(pa.array(block))
                anc_offsets, anc = ancestor_rows(block, corpus.parent, corpus.depth)
                ancestor_titles = pa.ListArray.from_arrays(pa.array(anc_offsets), corpus.titles.take(pa.array(anc)))
                parent = corpus.parent[block]
                site = pa.array(corpus.site[block]).cast(pa.string())
                write_table(node_writer, {
                    "node_id": block_ids, "page_id": block_ids,
                    "parent_id": ids.take(pa.array(parent, mask=parent < 0)),
                    "site": joined("site", site), "kind": pa.array(np.full(len(block), "page")),
                    "position": pa.array(corpus.position[block]), "depth": pa.array(corpus.depth[block]),
                    "title": titles,
                    "url": joined("https://synthetic.example/site", site, "/",
                                  pa.array(block).cast(pa.string()), ".html"),
                    "ancestor_ids": pa.ListArray.from_arrays(pa.array(anc_offsets), ids.take(pa.array(anc))),
                    "ancestor_titles": ancestor_titles,
                    "body": bodies, "trail_method": pa.array(np.full(len(block), "synthetic")),
                    "source_kind": pa.array(np.full(len(block), "html")),
                }, NODES_SCHEMA)
                edges += write_edges(corpus, edge_writer, block, capital)
                spilled = block_rows(corpus, block, block_ids, titles, ancestor_titles, bodies, offsets, tokens,
                                     capital, word_id, in_full, in_short, representation)
                chunk_ids = spilled.column("chunk_id").to_numpy()
                for c in range(num_shards):
                    mine = np.flatnonzero(chunk_ids % num_shards == c)
                    if len(mine):
                        spill_writers[c].write_table(spilled.take(pa.array(mine)))
    for writer in spill_writers:
        writer.close()
    return edges


def write_edges(corpus: SyntheticCorpus, writer: pq.ParquetWriter, block: np.ndarray, capital: pa.Array) -> int:
    """The edges rows of the links of `block` (nodes in id order); returns their number."""
    targets = corpus.link_target[block]
    valid = targets >= 0
    source = np.repeat(block, valid.sum(axis=1))
    position = np.broadcast_to(np.arange(LINKS_PER_NODE, dtype=np.int32), targets.shape)[valid]
    target, short = targets[valid], corpus.link_short[block][valid]
    anchor = pc.if_else(pa.array(short), capital.take(pa.array(corpus.topics[target, 0])),
                        corpus.titles.take(pa.array(target)))
    write_table(writer, {"source_node_id": corpus.ids.take(pa.array(source)), "position": pa.array(position),
                         "target_node_id": corpus.ids.take(pa.array(target)), "anchor_text": anchor}, EDGES_SCHEMA)
    return len(target)


def text_node(title: str, ancestor_titles: list[str]) -> NodeRow:
    """A node row holding what the representation reads of a node (its title
    and ancestors' titles; a synthetic node has no summary or keywords); the
    other columns, which it does not read, are None."""
    return NodeRow(**{**dict.fromkeys(NodeRow._fields), "title": title, "ancestor_titles": ancestor_titles,
                      "summary": "", "keywords": [], "source_summary": "", "source_keywords": [], "metadata_key": ""})


def block_rows(corpus: SyntheticCorpus, block: np.ndarray, block_ids: pa.Array, titles: pa.Array,
               ancestor_titles: pa.Array, bodies: pa.Array, offsets: np.ndarray, tokens: np.ndarray,
               capital: pa.Array, word_id: dict[str, int], in_full: np.ndarray, in_short: np.ndarray,
               representation: Representation) -> pa.Table:
    """The chunks-table rows of `block`, as the build makes them (transforms/chunk.py):
    its chunks (the body's words cut into `corpus.chunks_per_node` runs; stored
    text title line + run, id of the embedded text, BM25 of the run, or of the
    whole text without node documents); if `representation`
    has them, its node document (the path) and, for a node others link to, its
    anchor document (its anchor texts one a line, most used first). Terms
    besides the body's are the analyzer's."""
    id_list, title_list, body_list = block_ids.to_pylist(), titles.to_pylist(), bodies.to_pylist()
    short_list = capital.take(pa.array(corpus.topics[block, 0])).to_pylist()
    chunk_id, row, ordinal, n_tokens, text, token_lists = [], [], [], [], [], []

    def add(node: int, cid: int, kind: int, words: list[int], stored: str) -> None:
        chunk_id.append(cid), row.append(node), ordinal.append(kind), n_tokens.append(len(words))
        text.append(stored), token_lists.append(words)

    for i, node in enumerate(block.tolist()):
        nid, title, body = id_list[i], title_list[i], body_list[i]
        placed = text_node(title, ancestor_titles[i].as_py())
        words = tokens[offsets[i]: offsets[i + 1]].tolist()
        spelled = body.split(" ")  # the body is its words joined by spaces: one spelling per word id
        cuts = np.linspace(0, len(words), min(corpus.chunks_per_node, len(words)) + 1).astype(int).tolist()
        for place, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:])):
            piece = " ".join(spelled[lo:hi])
            add(node, chunk_id_for(nid, place, representation.render(placed, piece)), place,
                words[lo:hi] if representation.node_docs else [word_id[t] for t in analyze(title)] + words[lo:hi],
                f"{title}\n{piece}")
        if representation.node_docs:
            doc = representation.node_doc(placed)
            add(node, chunk_id_for(nid, NODE_DOC_ORDINAL, doc), NODE_DOC_ORDINAL, [word_id[t] for t in analyze(doc)],
                doc)
        # ranked and bounded as transforms/edges.py's AnchorTexts does: most used first, then by folded text
        ranked = sorted(((count, " ".join(line.casefold().split()), line)
                         for count, line in ((in_full[node], title), (in_short[node], short_list[i])) if count),
                        key=lambda v: (-v[0], v[1]))
        if ranked and representation.anchor_docs:
            anchors = "\n".join(bounded_anchors((nid, ranked))[1])
            add(node, chunk_id_for(nid, ANCHOR_DOC_ORDINAL, anchors), ANCHOR_DOC_ORDINAL,
                [word_id[t] for t in analyze(anchors)], anchors)
    return pa.Table.from_arrays(
        [pa.array(chunk_id, pa.int64()), pa.array(row, pa.int64()), pa.array(ordinal, pa.int32()),
         pa.array(n_tokens, pa.int32()), pa.array(text, pa.large_string()), pa.array(token_lists, pa.list_(pa.int32()))],
        schema=SPILL_SCHEMA)


def write_chunk_shard(corpus: SyntheticCorpus, seg_dir: str, spill: str, s: int, num_shards: int,
                      df: np.ndarray, representation: Representation) -> tuple[np.ndarray, int, int]:
    """One chunk shard from its spill: the chunks table and the postings, both
    sorted as the build writes them; adds the shard's document frequencies per
    field to `df` (fields x terms); returns (the ids of its embedded rows,
    ascending; its number of rows; its number of term occurrences)."""
    with pa.memory_map(spill) as source:
        table = pa.ipc.open_file(source).read_all()
    table = table.sort_by("chunk_id")
    os.unlink(spill)  # the sorted copy is in memory: the disk holds one spill less (10M: 16 GB of them)
    chunk_ids = table.column("chunk_id").to_numpy()
    rows = table.column("row").to_numpy()
    ordinals = table.column("ordinal").to_numpy()
    with table_writer(os.path.join(seg_dir, shard_file_name("chunks", s, num_shards, "parquet")),
                      CHUNKS_SCHEMA) as writer:
        node_ids = corpus.ids.take(pa.array(rows))
        write_table(writer, {"chunk_id": pa.array(chunk_ids), "node_id": node_ids, "page_id": node_ids,
                             "ordinal": pa.array(ordinals),
                             "text": table.column("text").combine_chunks().cast(pa.string()),
                             "n_tokens": table.column("n_tokens").combine_chunks()}, CHUNKS_SCHEMA)
    tokens = table.column("tokens").combine_chunks()
    owner = np.repeat(np.arange(len(rows)), np.diff(tokens.offsets.to_numpy()))
    n_terms = len(owner)
    vocabulary_size = len(corpus.weights)
    pairs, tf = np.unique(owner * vocabulary_size + tokens.values.to_numpy(), return_counts=True)
    del owner, tokens, table
    chunk_of, term_of = pairs // vocabulary_size, pairs % vocabulary_size
    kind_of = row_kinds(ordinals)[chunk_of]
    for kind in range(len(KIND_FIELDS)):
        df[kind] += np.bincount(term_of[kind_of == kind], minlength=vocabulary_size)
    term_rank = np.argsort(np.argsort(corpus.words.to_numpy(zero_copy_only=False).astype(str)))
    order = np.lexsort((chunk_of, term_rank[term_of]))  # postings sort by term text, then chunk id
    with table_writer(os.path.join(seg_dir, shard_file_name("postings", s, num_shards, "parquet")),
                      POSTINGS_SCHEMA) as writer:
        for first in range(0, len(order), BLOCK_ROWS * 64):
            part = order[first: first + BLOCK_ROWS * 64]
            write_table(writer, {"term": corpus.words.take(pa.array(term_of[part])),
                                 "chunk_id": pa.array(chunk_ids[chunk_of[part]]),
                                 "tf": pa.array(tf[part].astype(np.int32))}, POSTINGS_SCHEMA)
    embedded = np.fromiter(map(representation.embeds, ordinals.tolist()), bool, len(ordinals))
    return chunk_ids[embedded], len(rows), n_terms


def write_dense(seg_dir: str, chunk_ids: list[np.ndarray], overrides: dict, seed: int, spill_dir: str) -> dict:
    """Vector files, the trained index and shard indexes as the build writes them
    (`overrides` as the build's --dense_* flags); returns dense.json. The
    embedded row (chunk or node document) of rank i among all their ids gets
    vector i of the embedding-like stream, so the build's training sample (the
    smallest ids) is the stream's start; the stream is drawn once, scattered
    into per-shard float16 files."""
    everything = np.sort(np.concatenate(chunk_ids))
    n, num_shards = len(everything), len(chunk_ids)
    params = dataclasses.replace(choose_params(n, DIM), **overrides)
    gen = SyntheticEmbeddings(dim=DIM, seed=seed)
    ranks = [np.searchsorted(everything, ids) for ids in chunk_ids]
    staged = [np.lib.format.open_memmap(os.path.join(spill_dir, f"vectors-{s}.npy"), "w+", np.float16,
                                        (len(ids), DIM)) for s, ids in enumerate(chunk_ids)]
    sample_size = min(TRAIN_SAMPLE_SIZE, n)
    sample = np.empty((sample_size, DIM), np.float32)
    for b, first in enumerate(range(0, n, BATCH)):
        batch = gen.batch(b, min(BATCH, n - first))
        if first < sample_size:  # as the build trains: on the stored float16 vectors
            sample[first: first + len(batch)] = batch[: sample_size - first].astype(np.float16)
        for s, rank in enumerate(ranks):
            lo, hi = np.searchsorted(rank, [first, first + len(batch)])
            staged[s][lo:hi] = batch[rank[lo:hi] - first]
    trained = train_empty_index(params.factory, sample)
    with open(os.path.join(seg_dir, DENSE_TRAINED_FILE), "wb") as fh:
        fh.write(trained)
    for s, ids in enumerate(chunk_ids):
        vectors_path = os.path.join(seg_dir, shard_file_name(VECTORS_KIND, s, num_shards, VECTORS_EXTENSION))
        with open(vectors_path, "wb") as fh:
            write_vectors(fh, ids, staged[s])
        with open(os.path.join(seg_dir, shard_file_name("dense", s, num_shards, "faiss")), "wb") as fh:
            fh.write(rebuild_index(trained, vectors_path))
        staged[s] = None  # written: its staging file goes (10M: 15 GB of them)
        os.unlink(os.path.join(spill_dir, f"vectors-{s}.npy"))
    dense = dense_info(params, DIM, n, sample_size)
    with open(os.path.join(seg_dir, DENSE_INFO_FILE), "w", encoding="utf-8") as fh:
        json.dump(dense, fh, sort_keys=True)
    return dense


def write_synthetic_change(out: str, added: str = "Revised for the go-live benchmark.") -> dict:
    """Publish the version `ritrag update` publishes when one page of the
    index changed (`added` appended to its body): a one-shard delta segment
    holding the node's new row and its new last chunk (tombstoning the old node
    row and that chunk; its other chunks, node and anchor documents and links are unchanged, so stay
    where they are), the signed differences of the vocabulary and BM25
    statistics, the new chunk's vector in a dense shard of the version's
    trained index, and its serving form. The node changed is the first in node
    id order of the first node shard. Returns what was changed, and when."""
    from ritrag.analyzer import term_frequencies
    from ritrag.layout import TOMBSTONES_FILE
    from ritrag.reader import IndexReader
    from ritrag.schema import TOMBSTONES_SCHEMA

    layout = IndexLayout(out)
    manifest = layout.load_manifest()
    base = manifest.segments[0]
    representation = manifest.settings.index.representation
    nodes = pq.read_table(os.path.join(layout.segment_dir(base["id"]), layout.segment_files(base, "nodes")[0]))
    node = nodes.slice(0, 1).to_pylist()[0]
    old = max((chunk for name in layout.segment_files(base, "chunks")
               for chunk in pq.read_table(os.path.join(layout.segment_dir(base["id"]), name),
                                          filters=[("node_id", "=", node["node_id"]), ("ordinal", ">=", 0)]).to_pylist()),
              key=lambda chunk: chunk["ordinal"])
    node["body"] = f"{node['body']} {added}"
    chunk = {**old, "text": f"{old['text']} {added}"}
    chunk["chunk_id"] = chunk_id_for(node["node_id"], old["ordinal"],
                                     representation.render(NodeRow(**node), chunk["text"].partition("\n")[2]))
    (old_tf, old_n), (new_tf, new_n) = (term_frequencies(representation.bm25_text(row["text"], row["ordinal"]))
                                        for row in (old, chunk))
    kind = KIND_FIELDS[row_kind(old["ordinal"])]
    df = {t: int(t in new_tf) - int(t in old_tf) for t in sorted(set(old_tf) | set(new_tf))}
    df = {t: d for t, d in df.items() if d}
    segment_id = f"seg-{layout.next_version()}"
    seg_dir = layout.segment_dir(segment_id)
    os.makedirs(seg_dir)
    name = lambda kind_: os.path.join(seg_dir, shard_file_name(kind_, 0, 1, "parquet"))  # noqa: E731
    pq.write_table(pa.Table.from_pylist([node], schema=NODES_SCHEMA), name("nodes"))
    pq.write_table(pa.Table.from_pylist([chunk], schema=CHUNKS_SCHEMA), name("chunks"))
    pq.write_table(pa.Table.from_pylist([{"term": t, "chunk_id": chunk["chunk_id"], "tf": n}
                                         for t, n in sorted(new_tf.items())], schema=POSTINGS_SCHEMA), name("postings"))
    pq.write_table(pa.Table.from_pylist([{"term": t, "df": d, **{f"df_{f}": d if f == kind else 0
                                                                 for f in KIND_FIELDS}} for t, d in df.items()],
                                        schema=VOCABULARY_SCHEMA), name("vocabulary"))
    pq.write_table(EDGES_SCHEMA.empty_table(), name(EDGES_KIND))
    pq.write_table(pa.Table.from_pylist([{"chunk_id": old["chunk_id"]}, {"node_id": node["node_id"]}],
                                        schema=TOMBSTONES_SCHEMA), os.path.join(seg_dir, TOMBSTONES_FILE))
    pq.write_table(DEAD_LETTERS_SCHEMA.empty_table(), os.path.join(seg_dir, DEAD_LETTERS_FILE))
    delta = corpus_stats(0, new_n - old_n)
    with open(os.path.join(seg_dir, BM25_STATS_FILE), "w", encoding="utf-8") as fh:
        json.dump(delta, fh, sort_keys=True)
    vectors_path = os.path.join(seg_dir, shard_file_name(VECTORS_KIND, 0, 1, VECTORS_EXTENSION))
    with open(vectors_path, "wb") as fh:
        write_vectors(fh, np.array([chunk["chunk_id"]]), SyntheticEmbeddings(dim=DIM).batch(QUERY_STREAM - 1, 1))
    with open(os.path.join(seg_dir, shard_file_name("dense", 0, 1, "faiss")), "wb") as fh:
        fh.write(rebuild_index(IndexReader(layout).trained_dense_index(), vectors_path))
    write_serving_form(seg_dir, 1)
    counts = {"pages_indexed": 1, "pages_replaced": 1, "chunks_added": 1, "chunks_embedded": 1}
    bm25 = manifest.stats["bm25"]
    n_terms = bm25["n_terms"] + delta["n_terms"]
    tombstones = {**manifest.tombstones, "chunk_id": manifest.tombstones["chunk_id"] + 1,
                  "node_id": manifest.tombstones["node_id"] + 1}
    changed = new_manifest(layout, [*manifest.segments, layout.describe_segment(segment_id, 1, counts)],
                           stats={"bm25": corpus_stats(bm25["n_chunks"], n_terms), "pages": counts},
                           config=manifest.config, tombstones=tombstones)
    layout.publish(changed)
    return {"version": changed.version, "node_id": node["node_id"], "title": node["title"],
            "published": os.stat(layout.current_path).st_mtime}


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--chunks_per_node", type=int, default=1,
                        help="chunks per node (real pages: about 10); each of about 120 words")
    parser.add_argument("--num_shards", type=int, default=8)
    parser.add_argument("--factory", help="a FAISS factory string; default: the build's choice for the size")
    parser.add_argument("--nprobe", type=int, help="default: the build's choice for the size")
    parser.add_argument("--rerank", type=int, help="default: the build's choice for the size")
    args = parser.parse_args(argv)
    print(json.dumps(write_synthetic_index(args.out, args.nodes, words_per_node=120 * args.chunks_per_node,
                                           num_shards=args.num_shards, factory=args.factory, nprobe=args.nprobe,
                                           rerank=args.rerank, chunks_per_node=args.chunks_per_node)))


if __name__ == "__main__":
    main()

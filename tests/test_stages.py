"""Each stage of the jobs alone, on a TestPipeline: stages compute PCollections
and write no file (the sinks the jobs apply do), so `assert_that` checks them."""
from __future__ import annotations

import random

import apache_beam as beam
import faiss
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to, is_not_empty
from apache_beam.typehints.decorators import TypeCheckError

from support import BASE, chunk_row, node_row, write_tiny_site
from ritrag.bm25 import BODY, DOC
from ritrag.embedder import EmbedderSpec
from ritrag.encoders import load_encoder
from ritrag.representation import LEGACY, NODE_DOC_ORDINAL, Representation
from ritrag.schema import TABLES, ChunkRow, NodeRow
from ritrag.transforms.chunk import ChunkNodesFn, Chunker
from ritrag.transforms.dense import (DenseParams, TrainDenseIndex, TrainedIndex, dense_info, train_dense_index,
                                    train_empty_index)
from ritrag.transforms.embed import EmbedChunks
from ritrag.transforms.nodes import PAGES_OUTPUT, BuildForestNodes
from ritrag.transforms.pages import DEAD, PageParser, ParsePages, ReadInput, input_root_and_pattern
from ritrag.transforms.sparse import CORPUS_STATS, POSTINGS, VOCABULARY, BuildSparseIndex
from ritrag.transforms.tables import WriteParquetTable

HASHING = EmbedderSpec(model="hashing:384")


def pipeline() -> TestPipeline:
    return TestPipeline(runner="FnApiRunner")


def the_one(check):
    """An assert_that matcher: the PCollection holds one element, and `check` accepts it."""
    def match(actual):
        assert len(actual) == 1, actual
        check(actual[0])
    return match


# --- sparse ----------------------------------------------------------------------

# Three chunks whose terms the analyzer keeps as written (no stop words, stems of themselves).
CHUNKS = [chunk_row(chunk_id=1, ordinal=0, text="port port log"),
          chunk_row(chunk_id=2, ordinal=0, text="log disk"),
          chunk_row(chunk_id=3, ordinal=0, text="port host disk disk")]


def test_sparse_stage_gives_postings_document_frequencies_and_corpus_statistics():
    with pipeline() as p:
        sparse = p | beam.Create(CHUNKS) | BuildSparseIndex(LEGACY)
        assert_that(sparse[POSTINGS], equal_to([(1, {"port": 2, "log": 1}, BODY), (2, {"log": 1, "disk": 1}, BODY),
                                                (3, {"port": 1, "host": 1, "disk": 2}, BODY)]), label="Postings")
        # document frequency per field (body, node documents, anchor documents)
        assert_that(sparse[VOCABULARY], equal_to([("port", (2, 0, 0)), ("log", (2, 0, 0)), ("disk", (2, 0, 0)),
                                                  ("host", (1, 0, 0))]), label="Vocabulary")
        # N = 3 chunks, 3 + 2 + 4 = 9 terms, 3 per chunk
        assert_that(sparse[CORPUS_STATS], equal_to([{"n_chunks": 3, "n_terms": 9, "avg_chunk_terms": 3.0}]),
                    label="CorpusStats")


def test_sparse_stage_of_a_delta_gives_signed_differences():
    # A delta adds chunks 1 and 3 and tombstones chunk 2: "log" and "disk" each
    # gain one chunk and lose one (df 0: not in the vocabulary), "port" gains two.
    with pipeline() as p:
        removed = p | "Removed" >> beam.Create([(2, {"log": 1, "disk": 1}, BODY), (9, {"port": 1}, DOC)])
        sparse = (p | "Added" >> beam.Create([CHUNKS[0], CHUNKS[2]])
                  | BuildSparseIndex(LEGACY, removed=removed))
        # "port" also lost a node document: its df is signed per field
        assert_that(sparse[VOCABULARY], equal_to([("port", (2, -1, 0)), ("host", (1, 0, 0))]), label="Vocabulary")
        # 2 - 2 chunks; 3 + 4 - 2 - 1 terms
        assert_that(sparse[CORPUS_STATS], equal_to([{"n_chunks": 0, "n_terms": 4, "avg_chunk_terms": 0.0}]),
                    label="CorpusStats")


def test_sparse_stage_indexes_a_chunk_body_without_its_title_line_where_node_documents_hold_the_path():
    chunk = chunk_row(chunk_id=7, ordinal=0, text="Ports\nport host")
    node_doc = chunk_row(chunk_id=8, ordinal=NODE_DOC_ORDINAL, text="Ports\nport host")
    with pipeline() as p:
        sparse = p | beam.Create([chunk, node_doc]) | BuildSparseIndex(Representation())
        assert_that(sparse[POSTINGS], equal_to([(7, {"port": 1, "host": 1}, BODY), (8, {"port": 2, "host": 1}, DOC)]))


# --- dense -------------------------------------------------------------------------

TEXTS = [f"version {i} listens on port {8000 + i} behind the proxy" for i in range(40)]


@pytest.fixture(autouse=True)
def one_faiss_thread():
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(threads)


def hashing_vectors() -> list[tuple[int, np.ndarray]]:
    vectors = load_encoder(HASHING).embed(TEXTS).vectors
    return [(1000 + i, v) for i, v in enumerate(vectors)]


def test_dense_training_stage_trains_the_tables_index_on_the_models_vectors():
    expected = TrainedIndex(train_empty_index("IDMap2,Flat", np.stack([v for _, v in hashing_vectors()])),
                            dense_info(DenseParams("IDMap2,Flat", nprobe=1, rerank=1), 384, len(TEXTS), len(TEXTS)))

    def check(trained: TrainedIndex):
        assert trained == expected
        index = faiss.deserialize_index(np.frombuffer(trained.index, dtype=np.uint8))
        assert (index.d, index.ntotal, index.is_trained) == (384, 0, True)

    with pipeline() as p:
        trained = (p | beam.Create(list(enumerate(TEXTS, start=1000)))
                   | EmbedChunks(HASHING) | TrainDenseIndex())
        assert_that(trained, the_one(check))


def test_dense_training_stage_is_deterministic_whatever_the_input_order():
    pairs = hashing_vectors()
    overrides = {"factory": "IVF4,PQ96x4fs", "nprobe": 2, "rerank": 4}
    expected = train_dense_index(pairs, len(pairs), overrides)
    assert expected == train_dense_index(pairs[::-1], len(pairs), overrides)
    assert expected.info == dense_info(DenseParams(**overrides), 384, len(pairs), len(pairs))
    for seed in (1, 2):
        with pipeline() as p:
            trained = p | beam.Create(random.Random(seed).sample(pairs, len(pairs))) | TrainDenseIndex(**overrides)
            assert_that(trained, equal_to([expected]))


def test_dense_training_stage_gives_none_for_no_vectors():
    with pipeline() as p:
        assert_that(p | beam.Create([]) | TrainDenseIndex(), equal_to([None]))


# --- chunks ------------------------------------------------------------------------

NODES = [
    node_row(node_id="n-page", page_id="n-page", kind="page", title="Ports", ancestor_titles=["Shop"],
             body="Version 2 listens on port 8080.\n\nVersion 3 listens on port 9443.", url=f"{BASE}/ports.html"),
    node_row(node_id="n-site", kind="site", title="Shop", url=f"{BASE}/"),
]


def test_chunk_stage_cuts_each_node_like_the_one_chunker():
    expected = [row for node in NODES for row in Chunker(HASHING, LEGACY)(node)]
    assert [row.node_id for row in expected] == ["n-page"]  # a site node holds no text
    with pipeline() as p:
        chunks = p | beam.Create(NODES) | beam.ParDo(ChunkNodesFn(Chunker(HASHING, LEGACY)))
        assert chunks.element_type is ChunkRow  # declared: what consumes chunks is checked against it
        assert_that(chunks, equal_to(expected))


def test_a_stage_given_the_wrong_rows_is_refused_when_the_pipeline_is_built():
    """Node and chunk rows are declared types: wiring chunk rows where node
    rows belong (or the other way) fails at construction, before any data."""
    p = pipeline()
    chunks = p | "Chunks" >> beam.Create(CHUNKS).with_output_types(ChunkRow)
    nodes = p | "Nodes" >> beam.Create(NODES).with_output_types(NodeRow)
    with pytest.raises(TypeCheckError):
        chunks | "ChunkChunks" >> beam.ParDo(ChunkNodesFn(Chunker(HASHING, LEGACY)))
    with pytest.raises(TypeCheckError):
        nodes | "NodesAsChunks" >> WriteParquetTable("/nonexistent", TABLES["chunks"], 1)
    with pytest.raises(TypeCheckError):
        nodes | "SparseOfNodes" >> BuildSparseIndex(LEGACY)


def test_typed_rows_cross_a_shuffle_as_themselves():
    """Beam encodes the records with RowCoder (transforms/records.py), and a
    grouped record comes back equal, list columns as lists."""
    assert isinstance(beam.coders.registry.get_coder(NodeRow), beam.coders.RowCoder)
    with pipeline() as p:
        grouped = (p | beam.Create(NODES).with_output_types(NodeRow)
                   | beam.Map(lambda n: (n.kind, n)).with_output_types(tuple[str, NodeRow])
                   | beam.GroupByKey()
                   | beam.FlatMap(lambda kv: kv[1]).with_output_types(NodeRow))
        assert_that(grouped, equal_to(NODES))


# --- forest and node rows -----------------------------------------------------------

def forest_of(tiny_site, with_public_base: bool):
    """ParsePages + BuildForestNodes over the tiny site; the parser a side input
    (as the build's, once site bases are inferred) when `with_public_base`."""
    root, pattern = input_root_and_pattern(str(tiny_site))
    reader = PageParser(root, BASE + "/", 0, 1 << 20)
    p = pipeline()
    parser = reader
    if with_public_base:
        decided = p | "SiteBases" >> beam.Create([{BASE + "/": {"base": "https://public.example.org/shop-docs/"}}])
        parser = beam.pvalue.AsSingleton(decided | beam.Map(reader.with_site_bases))
    parsed = p | ReadInput(pattern, reader) | ParsePages(parser)
    return p, parsed, parsed["pages"] | BuildForestNodes(parser, "section")


@pytest.mark.parametrize("with_public_base", [False, True], ids=["input-urls", "public-base"])
def test_forest_stage_gives_node_and_pages_rows_keyed_as_the_parser_keys_them(tmp_path, with_public_base):
    tiny_site = write_tiny_site(tmp_path / "site")
    base = "https://public.example.org/shop-docs/" if with_public_base else BASE + "/"

    def pages_rows(rows):
        assert sorted(r["url"] for r in rows) == sorted(base + path.removesuffix("/index.html") for path in [
            "shop/index.html", "shop/v2/index.html", "shop/v2/config.html", "shop/v3/index.html",
            "shop/v3/config.html", "shop/v3/logging.html", "shop/v3/guide/deploy.html"])

    def node_rows(rows):
        page_rows = [r for r in rows if r.page_id == r.node_id]  # the pages indexed
        assert len(page_rows) == 7 and all(r.url.startswith(base) for r in page_rows)
        assert any(r.kind == "section" and r.title == "Ports" for r in rows)

    p, parsed, forest = forest_of(tiny_site, with_public_base)
    with p:
        assert_that(parsed[DEAD], equal_to([]), label="NoDeadParse")
        assert_that(forest[DEAD], equal_to([]), label="NoDeadNodes")
        assert_that(forest[PAGES_OUTPUT], pages_rows, label="PagesRows")
        assert_that(forest["nodes"], is_not_empty(), label="SomeNodes")
        assert_that(forest["nodes"], node_rows, label="NodeRows")

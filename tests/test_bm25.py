"""ritrag.bm25: hand-computed scores, the two fields, odd queries, and rankings
identical to the dense scorer it replaced (kept here as the oracle)."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from ritrag.analyzer import analyze
from ritrag.bm25 import BM25_PARAMETERS, Bm25, Field, Postings, corpus_stats, parameters, top_k, two_fields
from support import benchmark_module

K1, B = BM25_PARAMETERS["k1"], BM25_PARAMETERS["b"]


def make_postings(docs: list[list[str]]) -> Postings:
    vocabulary = sorted({t for d in docs for t in d})
    term_row = {t: i for i, t in enumerate(vocabulary)}
    entries = sorted((term_row[t], i, d.count(t)) for i, d in enumerate(docs) for t in set(d))
    indptr = np.zeros(len(vocabulary) + 1, np.int64)
    np.cumsum(np.bincount([e[0] for e in entries], minlength=len(vocabulary)), out=indptr[1:])
    return Postings(term_row, indptr, np.array([e[1] for e in entries], np.int32),
                    np.array([e[2] for e in entries], np.uint16), np.array([len(d) for d in docs], np.float32))


def one_field(docs: list[list[str]]) -> Bm25:
    postings = make_postings(docs)
    df = np.diff(postings.indptr)
    return Bm25(postings, {"all": Field(None, df, len(docs), sum(map(len, docs)) / len(docs))}, K1, B)


def dense(scores, n: int) -> np.ndarray:
    out = np.zeros(n, np.float32)
    out[scores[0]] = scores[1]
    return out


# --- the oracle: the dense scorer of every row that ritrag.bm25 replaced ------------------------------------------

def old_scores(terms, postings: Postings, k1: float, b: float, field: Field) -> np.ndarray:
    scores = np.zeros(len(postings.chunk_length), dtype=np.float32)
    norm = k1 * (1.0 - b + b * postings.chunk_length / max(field.avg_length, 1e-9))
    for term, qtf in Counter(terms).items():
        row = postings.term_row.get(term)
        if row is None:
            continue
        df = int(field.df[row])
        if df <= 0:
            continue
        idf = np.log(1.0 + (field.n - df + 0.5) / (df + 0.5))
        lo, hi = postings.indptr[row], postings.indptr[row + 1]
        docs, tf = postings.chunk_index[lo:hi], postings.tf[lo:hi]
        if field.member is not None:
            keep = field.member[docs]
            docs, tf = docs[keep], tf[keep]
        scores[docs] += qtf * idf * tf * (k1 + 1.0) / (tf + norm[docs])
    return scores


def old_two_fields(terms, bm25: Bm25, chunk_node: np.ndarray, n_nodes: int, path_weight: float):
    body = old_scores(terms, bm25.postings, bm25.k1, bm25.b, bm25.fields["body"])
    doc = old_scores(terms, bm25.postings, bm25.k1, bm25.b, bm25.fields["doc"])
    if path_weight > 0:
        matched = np.flatnonzero(doc > 0)
        path_of_node = np.zeros(n_nodes, np.float32)
        path_of_node[chunk_node[matched]] = doc[matched]
        body += path_weight * path_of_node[chunk_node] * bm25.fields["body"].member
    return body, doc


def old_top_k(scores: np.ndarray, k: int):
    positive = np.flatnonzero(scores > 0)
    if len(positive) > k:
        positive = positive[np.argpartition(-scores[positive], k - 1)[:k]]
    chosen = positive[np.lexsort((positive, -scores[positive]))]
    return chosen, scores[chosen]


def assert_identical(new, old) -> None:
    """Same rows in the same order, scores bit for bit."""
    np.testing.assert_array_equal(np.asarray(new[0], np.int64), np.asarray(old[0], np.int64))
    np.testing.assert_array_equal(new[1], old[1])


# --- hand-computed scores ---------------------------------------------------------------------------------------

def test_one_field_scores_are_the_hand_computed_bm25():
    # avgdl = 9/4; "ssl": df 2 of N 4; doc 2 holds it twice in 3 terms
    docs = [["ssl", "config", "server"], ["log", "server"], ["ssl", "ssl", "cert"], ["other"]]
    rows, scores = one_field(docs).scores(["ssl"])
    idf = np.log(1 + (4 - 2 + 0.5) / (2 + 0.5))
    norm = [1.2 * (1 - 0.75 + 0.75 * 3 / 2.25)] * 2
    expected = [idf * 1 * 2.2 / (1 + norm[0]), idf * 2 * 2.2 / (2 + norm[1])]
    assert list(rows) == [0, 2]
    np.testing.assert_allclose(scores, expected, rtol=1e-6)
    # query tf 2 for "ssl" doubles its weight; "server" (df 2) adds to rows 0 and 1
    rows, scores = top_k(one_field(docs).scores(["ssl", "server", "ssl"]), 10)
    server = [np.log(1 + 2.5 / 2.5) * 2.2 / (1 + 1.2 * (1 - 0.75 + 0.75 * n / 2.25)) for n in (3, 2)]
    by_row = {0: 2 * expected[0] + server[0], 1: server[1], 2: 2 * expected[1]}
    assert list(rows) == sorted(by_row, key=lambda r: -by_row[r]) and 3 not in rows
    np.testing.assert_allclose(scores, [by_row[r] for r in rows], rtol=1e-6)


def test_two_fields_each_with_its_own_statistics_and_the_path_on_its_nodes_chunks():
    # rows 0-2: chunk bodies of nodes 0, 0, 1; rows 3-4: the documents (paths) of nodes 0 and 1
    docs = [["ssl", "key"], ["log"], ["ssl", "key", "cert", "file"], ["alpha", "ssl"], ["beta"]]
    postings = make_postings(docs)
    is_doc = np.array([False, False, False, True, True])
    body, doc = two_fields(postings, is_doc)
    assert (body.n, doc.n) == (3, 2) and (body.avg_length, doc.avg_length) == pytest.approx((7 / 3, 1.5))
    assert (body.df[postings.term_row["ssl"]], doc.df[postings.term_row["ssl"]]) == (2, 1)
    bm25 = Bm25(postings, {"body": body, "doc": doc}, K1, B)
    chunk_node = np.array([0, 0, 1, 0, 1])
    node_chunks = (np.array([0, 2, 3]), np.array([0, 1, 2], np.int32))
    (rows, scores), (doc_rows, doc_scores) = bm25.chunk_and_doc_scores(["alpha", "ssl"], 0.5, chunk_node, node_chunks)

    def hand(tf, length, avg, n, df):
        return np.log(1 + (n - df + 0.5) / (df + 0.5)) * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * length / avg))

    path = hand(1, 2, 1.5, 2, 1) + hand(1, 2, 1.5, 2, 1)  # alpha and ssl, each in 1 of 2 documents
    assert list(doc_rows) == [3] and doc_scores[0] == pytest.approx(path, rel=1e-6)
    # row 1 ("log") matches no term but is a chunk of node 0, whose path matched: it gets the path alone
    assert list(rows) == [0, 1, 2]
    np.testing.assert_allclose(scores, [hand(1, 2, 7 / 3, 3, 2) + 0.5 * path, 0.5 * path, hand(1, 4, 7 / 3, 3, 2)],
                               rtol=1e-6)
    (rows, scores), _ = bm25.chunk_and_doc_scores(["alpha", "ssl"], 0.0, chunk_node, node_chunks)
    assert list(rows) == [0, 2]  # no path weight: bodies alone


@pytest.mark.parametrize("query", [[], ["absent"], ["absent", "nowhere"]])
def test_empty_queries_and_terms_absent_from_the_index_score_nothing(query):
    bm25 = one_field([["ssl", "key"], ["log"]])
    rows, scores = bm25.scores(query)
    assert len(rows) == len(scores) == 0
    assert len(top_k((rows, scores), 5)[0]) == 0
    assert list(bm25.scores(query + ["ssl"])[0]) == [0]  # an absent term beside a present one is ignored


def test_a_term_whose_recorded_df_is_zero_scores_nothing():
    # after an update's signed deltas a term can have postings in no live row of a field
    docs = [["ssl"], ["log"]]
    postings = make_postings(docs)
    bm25 = Bm25(postings, {"all": Field(None, np.array([0, 1]), 2, 1.0)}, K1, B)
    assert len(bm25.scores(["log"])[0]) == 0 and list(bm25.scores(["ssl"])[0]) == [0]  # rows: "log", "ssl"


def test_top_k_breaks_ties_by_row():
    rows, _ = top_k((np.array([3, 5, 7, 8, 9]), np.array([1.0, 2.0, 1.0, 0.0, 1.0], np.float32)), 3)
    assert list(rows) == [5, 3, 7]


def test_parameters_are_the_manifests_over_the_defaults_and_stats_what_the_jobs_record():
    assert parameters({}) == (1.2, 0.75) and parameters({"bm25": {"k1": 0.9}}) == (0.9, 0.75)
    assert corpus_stats(4, 10) == {"n_chunks": 4, "n_terms": 10, "avg_chunk_terms": 2.5}
    assert corpus_stats(0, 0)["avg_chunk_terms"] == 0.0


# --- new scoring == old scoring on indexes ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    from ritrag.serving.index import LoadedVersion

    out = str(tmp_path_factory.mktemp("bm25_synthetic"))
    benchmark_module("synthetic_index").write_synthetic_index(out, nodes=6_000, sites=3, num_shards=3,
                                                              vocabulary_size=2_000, factory="IDMap2,Flat")
    return LoadedVersion(out)


def test_one_field_rankings_equal_the_dense_scorer_on_a_synthetic_index(synthetic):
    bm25 = synthetic.bm25
    words = list(bm25.postings.term_row)
    queries = [synthetic.nodes["title"][row] for row in range(0, 6_000, 157)]
    queries += [" ".join(words[:3]), words[-1], f"{words[5]} {words[5]} zzzabsent"]
    for query in queries:
        terms = analyze(query)
        for k in (10, 200):
            assert_identical(top_k(bm25.scores(terms), k),
                             old_top_k(old_scores(terms, bm25.postings, bm25.k1, bm25.b, bm25.fields["all"]), k))


def test_two_field_rankings_equal_the_dense_scorer_on_the_sample_index(sample_index):
    from ritrag.serving.index import LoadedVersion

    idx = LoadedVersion(str(sample_index))
    bm25 = idx.bm25
    assert set(bm25.fields) == {"body", "doc"}
    titles = [idx.nodes["title"][row] for row in range(0, len(idx.nodes["title"]), 7)]
    for query in titles + ["configure the server port", "nothing matches zzzqqq"]:
        terms = analyze(query)
        for path_weight in (0.0, 0.5, 2.0):
            chunks, docs = bm25.chunk_and_doc_scores(terms, path_weight, idx.chunk_node, idx.node_chunks)
            old_chunks, old_docs = old_two_fields(terms, bm25, idx.chunk_node, len(idx.nodes["node_id"]), path_weight)
            for k in (5, 200):
                assert_identical(top_k(chunks, k), old_top_k(old_chunks, k))
                assert_identical(top_k(docs, k), old_top_k(old_docs, k))


def test_tombstoned_rows_are_never_returned(tiny_site, tmp_path):
    """An update that rewrites a page tombstones its old chunks: no query
    reaches them, even one made of words only they held."""
    from ritrag.layout import IndexLayout
    from ritrag.pipelines import update
    from ritrag.serving.index import LoadedVersion
    from support import TINY_SITE, build_index, tiny_page, write_tiny_site

    index = tmp_path / "index"
    build_index(tiny_site, index, "--embedding_model", "hashing:384")
    before = LoadedVersion(str(index))
    old_rows = set(top_k(before.bm25.scores(analyze("rotate daily fourteen"), "body"), 200)[0].tolist())
    old_ids = set(before.chunk_ids[list(old_rows)].tolist())
    assert old_ids
    edited = write_tiny_site(tmp_path / "edited")
    title, trail, _ = TINY_SITE["shop/v3/logging.html"]
    (edited / "shop/v3/logging.html").write_text(tiny_page(title, trail, [("Rotation", "Logs rotate hourly."),
                                                                          ("Levels", "Set SHOP_LOG=debug.")]))
    update.run(["--input", str(edited), "--index", str(index)])
    layout = IndexLayout(str(index))
    assert layout.load_manifest().tombstones["chunk_id"] > 0
    after = LoadedVersion(str(index))
    assert not old_ids & set(after.chunk_ids.tolist())
    for field in ("body", "doc"):
        rows, _ = top_k(after.bm25.scores(analyze("rotate daily fourteen hourly"), field), 200)
        assert not old_ids & set(after.chunk_ids[rows].tolist())
    assert len(after.bm25.scores(analyze("daily fourteen"), "body")[0]) == 0  # words only the old chunk held

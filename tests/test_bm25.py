"""ritrag.bm25: hand-computed scores, the fields by row kind (body, doc,
anchors), odd queries, and rankings identical to the dense scorer it replaced
(kept here as the oracle)."""
from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from ritrag.analyzer import analyze
from ritrag.bm25 import (ANCHORS, BM25_PARAMETERS, BODY, DOC, PRUNE_MIN_POSTINGS, Bm25, Field, NodeAdditions,
                         ScoreAccumulators, corpus_stats, top_k)
from ritrag.representation import LEGACY
from support import benchmark_module

K1, B = BM25_PARAMETERS["k1"], BM25_PARAMETERS["b"]


class ListPostings:
    """`ritrag.bm25.TermPostings` of a list of documents (row i: docs[i])."""

    def __init__(self, docs: list[list[str]]):
        self.docs = docs
        self.chunk_length = np.array([len(d) for d in docs], np.float32)

    def of(self, term: str):
        rows = [i for i, d in enumerate(self.docs) if term in d]
        return np.array(rows, np.int64), np.array([self.docs[i].count(term) for i in rows], np.uint16)

    def tf_at(self, term: str, rows: np.ndarray):
        return np.array([self.docs[r].count(term) for r in rows], np.uint16)


def field_of(docs: list[list[str]], member: np.ndarray | None) -> Field:
    """A field's statistics counted over its rows (all rows: member None)."""
    rows = [d for i, d in enumerate(docs) if member is None or member[i]]
    df = Counter(t for d in rows for t in set(d))
    return Field(member, df, len(rows), sum(map(len, rows)) / len(rows) if rows else 0.0)


def kind_fields(docs: list[list[str]], kinds: np.ndarray) -> dict[str, Field]:
    names = {BODY: "body", DOC: "doc", ANCHORS: "anchors"}
    return {names[k]: field_of(docs, kinds == k) for k in (BODY, DOC, ANCHORS) if k == BODY or (kinds == k).any()}


def one_field(docs: list[list[str]]) -> Bm25:
    return Bm25(ListPostings(docs), {"all": field_of(docs, None)}, K1, B)


def dense(scores, n: int) -> np.ndarray:
    out = np.zeros(n, np.float32)
    out[scores[0]] = scores[1]
    return out


# --- the oracle: the dense scorer of every row that ritrag.bm25 replaced ------------------------------------------

def old_scores(terms, postings, k1: float, b: float, field: Field) -> np.ndarray:
    scores = np.zeros(len(postings.chunk_length), dtype=np.float32)
    norm = k1 * (1.0 - b + b * postings.chunk_length / max(field.avg_length, 1e-9))
    for term, qtf in Counter(terms).items():
        df = field.df.get(term, 0)
        if df <= 0:
            continue
        idf = np.log(1.0 + (field.n - df + 0.5) / (df + 0.5))
        docs, tf = postings.of(term)
        if field.member is not None:
            keep = field.member[docs]
            docs, tf = docs[keep], tf[keep]
        scores[docs] += qtf * idf * tf * (k1 + 1.0) / (tf + norm[docs])
    return scores


def old_fields(terms, bm25: Bm25, chunk_node: np.ndarray, n_nodes: int, weights: dict[str, float]):
    """Every row's chunk score (body + weight x each node field's row of its
    node, in the order of `weights`) and each node field's own scores."""
    body = old_scores(terms, bm25.postings, bm25.k1, bm25.b, bm25.fields["body"])
    own = {}
    for name, weight in weights.items():
        if name not in bm25.fields:
            continue
        own[name] = old_scores(terms, bm25.postings, bm25.k1, bm25.b, bm25.fields[name])
        if weight > 0:
            matched = np.flatnonzero(own[name] > 0)
            of_node = np.zeros(n_nodes, np.float32)
            of_node[chunk_node[matched]] = own[name][matched]
            body += weight * of_node[chunk_node] * bm25.fields["body"].member
    return body, own


def old_top_k(scores: np.ndarray, k: int, row_ids: np.ndarray | None = None):
    """Every positive row sorted by score, ties by row (or by `row_ids`), the first k."""
    positive = np.flatnonzero(scores > 0)
    key = positive if row_ids is None else row_ids[positive]
    chosen = positive[np.lexsort((key, -scores[positive]))][:k]
    return chosen, scores[chosen]


def ascending(scores):
    """(rows ascending, their scores): the scorer returns rows in no particular order."""
    rows, values = scores
    order = np.argsort(rows, kind="stable")
    return rows[order], values[order]


def assert_identical(new, old) -> None:
    """Same rows in the same order, scores bit for bit."""
    np.testing.assert_array_equal(np.asarray(new[0], np.int64), np.asarray(old[0], np.int64))
    np.testing.assert_array_equal(new[1], old[1])


# --- hand-computed scores ---------------------------------------------------------------------------------------

def test_one_field_scores_are_the_hand_computed_bm25():
    # avgdl = 9/4; "ssl": df 2 of N 4; doc 2 holds it twice in 3 terms
    docs = [["ssl", "config", "server"], ["log", "server"], ["ssl", "ssl", "cert"], ["other"]]
    rows, scores = ascending(one_field(docs).scores(["ssl"]))
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


def hand(tf, length, avg, n, df):
    """One term's BM25 in a field of `n` rows of mean length `avg`, `df` of them holding it."""
    return np.log(1 + (n - df + 0.5) / (df + 0.5)) * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * length / avg))


def test_two_fields_each_with_its_own_statistics_and_the_path_on_its_nodes_chunks():
    # rows 0-2: chunk bodies of nodes 0, 0, 1; rows 3-4: the documents (paths) of nodes 0 and 1
    docs = [["ssl", "key"], ["log"], ["ssl", "key", "cert", "file"], ["alpha", "ssl"], ["beta"]]
    postings = ListPostings(docs)
    fields = kind_fields(docs, np.array([BODY, BODY, BODY, DOC, DOC]))
    body, doc = fields["body"], fields["doc"]
    assert (body.n, doc.n) == (3, 2) and (body.avg_length, doc.avg_length) == pytest.approx((7 / 3, 1.5))
    bm25 = Bm25(postings, fields, K1, B)
    chunk_node = np.array([0, 0, 1, 0, 1])
    node_chunks = (np.array([0, 2, 3]), np.array([0, 1, 2], np.int32))
    weights = {"doc": 0.5, "anchors": 1.0}  # an index without anchors ignores their weight
    chunks, own = bm25.chunk_top_k(["alpha", "ssl"], weights, chunk_node, node_chunks, len(docs))
    rows, scores = ascending(chunks)
    doc_rows, doc_scores = own["doc"]

    path = hand(1, 2, 1.5, 2, 1) + hand(1, 2, 1.5, 2, 1)  # alpha and ssl, each in 1 of 2 documents
    assert list(doc_rows) == [3] and doc_scores[0] == pytest.approx(path, rel=1e-6)
    # row 1 ("log") matches no term but is a chunk of node 0, whose path matched: it gets the path alone
    assert list(rows) == [0, 1, 2]
    np.testing.assert_allclose(scores, [hand(1, 2, 7 / 3, 3, 2) + 0.5 * path, 0.5 * path, hand(1, 4, 7 / 3, 3, 2)],
                               rtol=1e-6)
    rows, scores = ascending(bm25.chunk_top_k(["alpha", "ssl"], {"doc": 0.0}, chunk_node, node_chunks, len(docs))[0])
    assert list(rows) == [0, 2]  # no path weight: bodies alone


def test_three_fields_add_the_anchors_of_a_nodes_in_links_to_its_chunks():
    # rows 0-2: bodies of nodes 0, 0, 1; rows 3-4: documents of nodes 0, 1; rows 5-6: anchors of nodes 1, 2
    docs = [["ssl", "key"], ["log"], ["key", "cert", "file"], ["alpha"], ["beta"], ["tls", "setup"],
            ["tls", "tls", "ssl"]]
    postings = ListPostings(docs)
    kinds = np.array([BODY, BODY, BODY, DOC, DOC, ANCHORS, ANCHORS])
    fields = kind_fields(docs, kinds)
    anchors = fields["anchors"]
    assert (anchors.n, anchors.avg_length) == (2, 2.5) and fields["body"].n == 3
    bm25 = Bm25(postings, fields, K1, B)
    chunk_node = np.array([0, 0, 1, 0, 1, 1, 2])
    node_chunks = (np.array([0, 2, 3, 3]), np.array([0, 1, 2], np.int32))  # node 2 has no body chunk
    chunks, own = bm25.chunk_top_k(["tls", "ssl"], {"doc": 0.5, "anchors": 0.25}, chunk_node, node_chunks, len(docs))
    rows, scores = ascending(chunks)
    # node 1's anchors ("tls setup") reach its one body chunk, row 2, which holds neither term itself;
    # node 2's anchors match but it has no chunk to carry them
    tls_1 = hand(1, 2, 2.5, 2, 2)
    anchor_rows, anchor_scores = ascending(own["anchors"])
    assert list(anchor_rows) == [5, 6]
    assert anchor_scores[0] == pytest.approx(tls_1, rel=1e-6)
    assert list(rows) == [0, 2]
    np.testing.assert_allclose(scores, [hand(1, 2, 2.0, 3, 1), 0.25 * tls_1], rtol=1e-6)
    (rows, _), _ = bm25.chunk_top_k(["tls", "ssl"], {"doc": 0.5, "anchors": 0.0}, chunk_node, node_chunks, len(docs))
    assert list(rows) == [0]  # no anchor weight: the anchors reach no chunk


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
    bm25 = Bm25(ListPostings(docs), {"all": Field(None, {"log": 0, "ssl": 1}, 2, 1.0)}, K1, B)
    assert len(bm25.scores(["log"])[0]) == 0 and list(bm25.scores(["ssl"])[0]) == [0]


def test_top_k_breaks_ties_by_row_or_by_the_rows_ids_also_at_the_kth_place():
    scores = (np.array([3, 5, 7, 8, 9]), np.array([1.0, 2.0, 1.0, 0.0, 1.0], np.float32))
    assert list(top_k(scores, 3)[0]) == [5, 3, 7]
    ids = np.zeros(10, np.int64)
    ids[[3, 5, 7, 9]] = [30, 50, 70, 10]  # row 9 holds the smallest chunk id
    assert list(top_k(scores, 3, ids)[0]) == [5, 9, 3]
    rng = np.random.default_rng(0)
    for _ in range(50):  # many ties around the k-th: the same rows as a full sort
        values = rng.integers(0, 4, 40).astype(np.float32)
        ids = rng.permutation(40)
        for k in (1, 5, 17):
            assert_identical(top_k((np.arange(40), values), k, ids), old_top_k(values, k, ids))


def test_parameters_are_the_manifests_over_the_defaults_and_stats_what_the_jobs_record():
    assert corpus_stats(4, 10) == {"n_chunks": 4, "n_terms": 10, "avg_chunk_terms": 2.5}
    assert corpus_stats(0, 0)["avg_chunk_terms"] == 0.0


# --- new scoring == old scoring on indexes ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    from ritrag.serving.index import LoadedVersion

    out = str(tmp_path_factory.mktemp("bm25_synthetic"))
    # an index as builds wrote them before representations: one field, "all"
    benchmark_module("synthetic_index").write_synthetic_index(out, nodes=6_000, sites=3, num_shards=3,
                                                              vocabulary_size=2_000, factory="IDMap2,Flat",
                                                              representation=LEGACY)
    return LoadedVersion(out)


def test_one_field_rankings_equal_the_dense_scorer_on_a_synthetic_index(synthetic):
    bm25 = synthetic.bm25
    words = [t.decode() for t in synthetic.chunks.shards[0].arrays["terms"]]
    queries = [synthetic.nodes["title"][row] for row in range(0, 6_000, 157)]
    queries += [" ".join(words[:3]), words[-1], f"{words[5]} {words[5]} zzzabsent"]
    for query in queries:
        terms = analyze(query)
        for k, bm25.prune_min_postings in itertools.product((10, 200), (0, PRUNE_MIN_POSTINGS)):
            want = old_top_k(old_scores(terms, bm25.postings, bm25.k1, bm25.b, bm25.fields["all"]), k)
            assert_identical(top_k(bm25.scores(terms), k), want)
            assert_identical(bm25.top_k(terms, "all", k), want)


def test_field_rankings_equal_the_dense_scorer_on_the_sample_index(sample_index):
    from ritrag.serving.index import LoadedVersion

    idx = LoadedVersion(str(sample_index))
    bm25 = idx.bm25
    assert {"body", "doc"} <= set(bm25.fields)
    titles = [idx.nodes["title"][row] for row in range(0, len(idx.nodes["title"]), 7)]
    for query in titles + ["configure the server port", "nothing matches zzzqqq"]:
        terms = analyze(query)
        for weights in ({"doc": 0.0, "anchors": 0.0}, {"doc": 0.5, "anchors": 0.0}, {"doc": 2.0, "anchors": 0.5},
                        {"doc": 0.0, "anchors": 1.0}):
            old_chunks, old_own = old_fields(terms, bm25, idx.chunk_node, len(idx.nodes["node_id"]), weights)
            for k, bm25.prune_min_postings in itertools.product((1, 5, 200), (0, PRUNE_MIN_POSTINGS)):
                best, own = bm25.chunk_top_k(terms, weights, idx.chunk_node, idx.node_chunks, k, idx.chunk_ids)
                # a field of weight 0 is not scored (the retrieval plan asks only for what it fuses)
                assert set(own) == {name for name in old_own if weights[name] > 0}
                assert_identical(best, old_top_k(old_chunks, k, idx.chunk_ids))
                for name in own:
                    assert_identical(top_k(own[name], k), old_top_k(old_own[name], k))


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
    assert not old_ids & set(after.chunk_ids[after.chunks.live].tolist())  # their rows stay, dead
    assert (after.chunk_rows(np.array(sorted(old_ids))) == -1).all()
    for field in ("body", "doc"):
        rows, _ = top_k(after.bm25.scores(analyze("rotate daily fourteen hourly"), field), 200)
        assert not old_ids & set(after.chunk_ids[rows].tolist())
    assert len(after.bm25.scores(analyze("daily fourteen"), "body")[0]) == 0  # words only the old chunk held


def test_queries_from_many_threads_and_a_failed_query_share_the_score_arrays_correctly():
    """Each query adds into an array lent to it alone and hands it back zeroed;
    one that fails midway keeps its partial sums out of the next query's."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(7)
    words = [f"w{i}" for i in range(40)]
    docs = [list(rng.choice(words, int(rng.integers(1, 12)))) for _ in range(500)] + [["w1", "w2", "w39"]]
    bm25 = one_field(docs)
    queries = [list(rng.choice(words, 3)) for _ in range(30)]
    want = [ascending(bm25.scores(q)) for q in queries]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda q: ascending(bm25.scores(q)), queries * 10))
    for i, scores in enumerate(got):
        assert_identical(scores, want[i % len(queries)])

    class FailingPostings:
        chunk_length = bm25.postings.chunk_length

        def of(self, term):
            if term == "w39":
                raise OSError("a mapped file went away")
            return bm25.postings.of(term)

    failing = Bm25(FailingPostings(), bm25.fields, K1, B)
    failing.accumulators = bm25.accumulators  # the same arrays as the queries above
    for _ in range(ScoreAccumulators.POOLED + 1):
        with pytest.raises(OSError):
            failing.scores(["w1", "w2", "w39"])  # w1 and w2 are added before w39 fails
    for q, scores in zip(queries, want):
        assert_identical(ascending(bm25.scores(q)), scores)


class CountingPostings(ListPostings):
    """ListPostings that records which terms were read whole and which looked up."""

    def __init__(self, docs):
        super().__init__(docs)
        self.read, self.looked_up = [], []

    def of(self, term):
        self.read.append(term)
        return super().of(term)

    def tf_at(self, term, rows):
        self.looked_up.append(term)
        return super().tf_at(term, rows)


@pytest.mark.parametrize("seed", range(6))
def test_the_pruned_top_k_equals_the_exhaustive_one_with_ties_and_additions(seed):
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(12)]  # few words, short rows: many equal scores
    docs = [list(rng.choice(words, int(rng.integers(1, 5)), p=np.linspace(2, 0.2, 12) / 13.2)) for _ in range(400)]
    docs += [list(d) for d in docs[:80]]  # exact twins tie at every query
    bm25 = one_field(docs)
    bm25.prune_min_postings = 0  # prune however few the postings
    ids = rng.permutation(len(docs))
    # Rows grouped into nodes (the last 30 nodes hold none), two node fields added per node.
    chunk_node = rng.integers(0, 120, len(docs))
    order = np.argsort(chunk_node, kind="stable")
    node_chunks = (np.searchsorted(chunk_node[order], np.arange(151)), order)
    for _ in range(25):
        terms = list(rng.choice(words, int(rng.integers(1, 6))))
        fields = []
        for _field in range(2):
            nodes = rng.choice(150, int(rng.integers(1, 60)), replace=False)
            fields.append((nodes, rng.choice([0.5, 1.0, 2.0, 0.3], len(nodes)).astype(np.float32)))
        additions = NodeAdditions(fields, chunk_node, node_chunks)
        want = dense(bm25.scores(terms), len(docs))
        with_additions = want.copy()
        for nodes, values in fields:
            of_node = np.zeros(150, np.float32)
            of_node[nodes] = values
            with_additions = with_additions + of_node[chunk_node]
        for k in (1, 3, 10, 50, 1000):
            assert_identical(bm25.top_k(terms, "all", k, ids), old_top_k(want, k, ids))
            assert_identical(bm25.top_k(terms, "all", k, ids, additions), old_top_k(with_additions, k, ids))
            bm25.prune_min_postings = PRUNE_MIN_POSTINGS  # and adding every posting
            assert_identical(bm25.top_k(terms, "all", k, ids, additions), old_top_k(with_additions, k, ids))
            bm25.prune_min_postings = 0


def test_a_common_term_is_looked_up_at_the_candidates_not_read_whole():
    """Once the rare term's rows fill the top k, the common terms' bound
    (k1 + 1) x their small idf cannot lift a row it does not hold into them."""
    docs = [["rare", "common", "often"]] * 3 + [["common", "often"]] * 3000 + [["often"]] * 2000
    postings = CountingPostings(docs)
    bm25 = Bm25(postings, {"all": field_of(docs, None)}, K1, B)
    bm25.prune_min_postings = 0
    rows, scores = bm25.top_k(["common", "often", "rare"], "all", 3)
    assert sorted(rows.tolist()) == [0, 1, 2]
    assert postings.read == ["rare"] and sorted(postings.looked_up) == ["common", "often"]
    assert_identical((rows, scores), old_top_k(dense(bm25.scores(["common", "often", "rare"]), len(docs)), 3))

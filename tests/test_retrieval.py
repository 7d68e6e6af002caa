import numpy as np
import pytest

from ritrag.serving.index import Postings, bm25_fields
from ritrag.serving.retrieval import (RetrievalParams, bm25_scores, bm25_top_k, bm25f_chunk_scores, build_subforest,
                                     fuse, minmax_fusion, node_scores, reciprocal_rank_fusion, top_k, top_nodes,
                                     with_node_docs)


def make_postings(docs: list[list[str]]) -> Postings:
    vocabulary = sorted({t for d in docs for t in d})
    term_row = {t: i for i, t in enumerate(vocabulary)}
    entries = sorted((term_row[t], i, d.count(t)) for i, d in enumerate(docs) for t in set(d))
    indptr = np.zeros(len(vocabulary) + 1, np.int64)
    for row, _, _ in entries:
        indptr[row + 1] += 1
    return Postings(
        term_row=term_row, indptr=np.cumsum(indptr),
        chunk_index=np.array([e[1] for e in entries], np.int32),
        tf=np.array([e[2] for e in entries], np.float32),
        chunk_length=np.array([len(d) for d in docs], np.float32),
        df={t: sum(t in d for d in docs) for t in vocabulary},
        n_chunks=len(docs), avg_length=sum(map(len, docs)) / len(docs),
    )


def reference_bm25(query, docs, k1=1.2, b=0.75):
    avg = sum(map(len, docs)) / len(docs)
    out = []
    for d in docs:
        s = 0.0
        for t in query:
            df = sum(t in x for x in docs)
            if not df:
                continue
            idf = np.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
            tf = d.count(t)
            s += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(d) / avg))
        out.append(s)
    return np.array(out)


def test_bm25_matches_the_textbook_formula():
    docs = [["ssl", "config", "server"], ["log", "server"], ["ssl", "ssl", "cert"], ["other"]]
    rows, scores = bm25_top_k(["ssl", "server"], make_postings(docs), k=10)
    expected = reference_bm25(["ssl", "server"], docs)
    assert list(rows) == list(np.argsort(-expected, kind="stable")[: len(rows)])
    np.testing.assert_allclose(scores, expected[rows], rtol=1e-5)
    assert 3 not in rows  # no term in common: not recalled


def test_top_k_breaks_ties_by_row():
    rows, _ = top_k(np.array([1.0, 2.0, 1.0, 0.0, 1.0]), 3)
    assert list(rows) == [1, 0, 2]


def test_rrf_sums_reciprocal_ranks():
    fused = reciprocal_rank_fusion([np.array([5, 7]), np.array([7, 9])], k=60)
    assert fused[7] == 1 / 62 + 1 / 61
    assert fused[5] == 1 / 61 and fused[9] == 1 / 62


def test_minmax_fusion_averages_normalized_scores():
    bm25 = (np.array([5, 7, 8]), np.array([12.0, 4.0, 2.0]))  # 5 far ahead of 7 and 8
    dense = (np.array([7, 9, 5, 10]), np.array([0.61, 0.60, 0.59, 0.40]))  # 7, 9, 5 close together
    fused = minmax_fusion([bm25, dense])
    assert fused[5] == pytest.approx(0.5 * 1.0 + 0.5 * 0.19 / 0.21)
    assert fused[7] == pytest.approx(0.5 * 0.2 + 0.5 * 1.0)
    assert fused[9] == pytest.approx(0.5 * 0.20 / 0.21) and fused[8] == fused[10] == pytest.approx(0.0)
    # weights are shares of the sum; one-score rankings give their item 1; empty ones nothing
    assert minmax_fusion([bm25, dense], (3.0, 1.0))[5] == pytest.approx(0.75 + 0.25 * 0.19 / 0.21)
    assert minmax_fusion([(np.array([4]), np.array([2.5])), (np.array([], int), np.array([]))]) == {4: 0.5}
    # RRF sees only ranks: 7 (2nd and 1st) beats 5 (1st and 3rd); min-max sees 5 far ahead in BM25 and
    # close behind in dense
    assert max(reciprocal_rank_fusion([bm25[0], dense[0]]).items(), key=lambda kv: kv[1])[0] == 7
    assert max(fused.items(), key=lambda kv: kv[1])[0] == 5
    assert fuse([bm25, dense], RetrievalParams(fusion="rrf")) == reciprocal_rank_fusion([bm25[0], dense[0]], 60)
    assert fuse([bm25, dense], RetrievalParams(sparse_weight=3.0)) == minmax_fusion([bm25, dense], (3.0, 1.0))


def test_node_score_is_the_max_of_its_chunks():
    chunk_node = np.array([0, 0, 1])
    assert node_scores({0: 0.1, 1: 0.3, 2: 0.2}, chunk_node) == {0: 0.3, 1: 0.2}
    assert top_nodes({0: 0.3, 1: 0.2, 2: 0.3}, 2) == [(0, 0.3), (2, 0.3)]


def test_subforest_holds_hits_and_every_ancestor_in_document_order():
    #   r1 ─ a (pos 0) ─ a1 (pos 1), a0 (pos 0)
    #      └ b (pos 1)
    #   r2 ─ c
    ids = ["r1", "a", "a0", "a1", "b", "r2", "c"]
    nodes = {
        "node_id": ids,
        "parent_id": [None, "r1", "a", "a", "r1", None, "r2"],
        "position": [0, 0, 0, 1, 1, 0, 0],
        "ancestor_ids": [[], ["r1"], ["r1", "a"], ["r1", "a"], ["r1"], [], ["r2"]],
        "title": [i.upper() for i in ids],
    }
    row = {n: i for i, n in enumerate(ids)}
    trees = build_subforest([(row["c"], 0.9), (row["a1"], 0.5), (row["a0"], 0.4)], nodes, row)
    assert [t["id"] for t in trees] == ["r2", "r1"]  # ordered by best hit inside
    r1 = trees[1]
    assert r1["hit"] is False and "score" not in r1
    assert [c["id"] for c in r1["children"]] == ["a"]  # b is not a hit nor an ancestor
    assert [c["id"] for c in r1["children"][0]["children"]] == ["a0", "a1"]
    assert r1["children"][0]["children"][1] == {"id": "a1", "title": "A1", "hit": True, "score": 0.5}


# --- retrieval that uses the forest ------------------------------------------------------------------------------

def test_each_bm25_field_scores_with_its_own_statistics():
    # rows 0-2: chunk bodies; rows 3-4: node documents (paths)
    docs = [["ssl", "key", "cert"], ["log", "rotat"], ["ssl"], ["alpha", "ssl"], ["beta", "ssl"]]
    postings = make_postings(docs)
    is_doc = np.array([False, False, False, True, True])
    fields = bm25_fields(postings, is_doc)
    assert (fields.body.n, fields.doc.n) == (3, 2)
    assert fields.body.avg_length == 2.0 and fields.doc.avg_length == 2.0
    row = postings.term_row["ssl"]
    assert (fields.body.df[row], fields.doc.df[row]) == (2, 2)
    body = bm25_scores(["ssl"], postings, field=fields.body)
    np.testing.assert_allclose(body[:3], reference_bm25(["ssl"], docs[:3]), rtol=1e-5)
    assert (body[3:] == 0).all()
    doc = bm25_scores(["alpha"], postings, field=fields.doc)
    np.testing.assert_allclose(doc[3:], reference_bm25(["alpha"], docs[3:]), rtol=1e-5)


def test_a_chunk_adds_its_node_documents_score_times_the_path_weight():
    docs = [["ssl", "key"], ["ssl", "key"], ["alpha", "ssl"], ["beta", "ssl"]]
    postings = make_postings(docs)
    is_doc = np.array([False, False, True, True])
    chunk_node = np.array([0, 1, 0, 1])  # chunk 0 and document 2 belong to node 0
    fields = bm25_fields(postings, is_doc)
    chunks, own = bm25f_chunk_scores(["alpha", "ssl"], postings, fields, chunk_node, 2, path_weight=0.5)
    body = bm25_scores(["alpha", "ssl"], postings, field=fields.body)
    assert chunks[0] == pytest.approx(body[0] + 0.5 * own[2]) and chunks[1] == pytest.approx(body[1] + 0.5 * own[3])
    assert chunks[0] > chunks[1] and (chunks[2:] == 0).all() and (own[:2] == 0).all()
    unweighted, _ = bm25f_chunk_scores(["alpha", "ssl"], postings, fields, chunk_node, 2, path_weight=0.0)
    assert unweighted[0] == unweighted[1]  # same bodies: only the path tells them apart


def test_weighted_rrf_and_node_scores_with_the_nodes_own_match():
    fused = reciprocal_rank_fusion([np.array([5, 7]), np.array([7, 9])], k=10, weights=(2.0, 0.0))
    assert fused == {5: 2 / 11, 7: 2 / 12}
    assert with_node_docs({0: 0.5, 1: 0.2}, {1: 0.4, 2: 0.1}, 0.5) == {0: 0.5, 1: 0.4, 2: 0.05}


def test_retrieval_params_come_from_the_manifest_and_are_checked():
    assert RetrievalParams.from_config({}).node_score == "max"  # an index without node documents
    recorded = {"representation": {"template": "{path}\\n{body}", "path_levels": 4, "node_docs": True},
                "retrieval": {"rrf_k": 30, "node_score": "max+doc"}}
    params = RetrievalParams.from_config(recorded, rrf_k=None, path_weight=2.0)
    assert (params.rrf_k, params.path_weight, params.node_score) == (30, 2.0, "max+doc")
    with pytest.raises(ValueError):
        RetrievalParams(node_score="sum")
    with pytest.raises(ValueError):
        RetrievalParams(fusion="borda")
    with pytest.raises(ValueError):
        RetrievalParams(sparse_weight=0.0, dense_weight=0.0)
    # an index whose manifest predates the fusion parameter gets today's default fusion
    assert RetrievalParams.from_config(recorded).fusion == "minmax"


LOOKALIKE_BODY = [("Certificates", "Put the certificate and its private key in the configuration directory."),
                  ("Restart", "Restart the service so that it reads them.")]


def write_lookalike_sites(directory):
    """Two sites, each with a page titled "Configuring SSL" whose text is the
    same word for word: only the site (the path) tells them apart."""
    from support import tiny_page

    for site, name in (("alpha", "Alpha Server"), ("beta", "Beta Gateway")):
        pages = {f"{site}/index.html": (name, [], [("Overview", f"{name} serves requests.")]),
                 f"{site}/admin/index.html": ("Administration", [(name, f"{site}/")],
                                              [("Tasks", "Day to day administration tasks.")]),
                 f"{site}/admin/ssl.html": ("Configuring SSL",
                                            [(name, f"{site}/"), ("Administration", f"{site}/admin/")],
                                            LOOKALIKE_BODY)}
        for path, (title, trail, sections) in pages.items():
            target = directory / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(tiny_page(title, trail, sections), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def lookalike_indexes(tmp_path_factory):
    from support import build_index

    site = write_lookalike_sites(tmp_path_factory.mktemp("lookalike_site"))
    out = {}
    for name, flags in (("forest", ()), ("legacy", ("--chunk_template", "{title}\\n{body}", "--node_docs", "off"))):
        out[name] = tmp_path_factory.mktemp(f"lookalike_{name}")
        build_index(site, out[name], "--embedding_model", "hashing:384", *flags)
    return out


def _ssl_ranks(index, query: str, params: RetrievalParams) -> dict[str, tuple[int, float]]:
    """Site -> (rank, score) of its "Configuring SSL" page among the hits."""
    hits = index.retrieve(query, params=params).hits
    out = {}
    for rank, (row, score) in enumerate(hits, start=1):
        if index.index.nodes["title"][row] == "Configuring SSL":
            site = index.index.nodes["title"][index.index.node_row[index.index.nodes["ancestor_ids"][row][0]]]
            out[site] = (rank, score)
    return out


def test_a_title_in_two_sites_ranks_the_site_the_query_names_first(lookalike_indexes):
    """What this proves: with the hashing stand-in (bag of hashed words, no
    semantics), both BM25 and dense only see words; the two pages' own texts are
    identical, so the site name reaches the ranking only through the path in the
    representation (node documents and path-prefixed embeddings). The legacy
    representation indexes both pages identically, so it ranks them in the same
    order (a tie broken by row) whichever site the query names."""
    from ritrag.serving.api import RitragIndex

    forest, legacy = RitragIndex(str(lookalike_indexes["forest"])), RitragIndex(str(lookalike_indexes["legacy"]))
    sparse_only = RetrievalParams(dense_weight=0.0)
    for query, named, other in (("Configuring SSL in Alpha Server", "Alpha Server", "Beta Gateway"),
                                ("Beta Gateway: configuring SSL", "Beta Gateway", "Alpha Server")):
        for params in (forest.params, sparse_only, RetrievalParams(node_score="max+doc")):
            ranks = _ssl_ranks(forest, query, params)
            assert ranks[named][0] < ranks[other][0], (query, params)
    legacy_first = {min(ranks, key=lambda site: ranks[site][0])
                    for ranks in (_ssl_ranks(legacy, q, legacy.params) for q in ("Configuring SSL in Alpha Server",
                                                                                  "Beta Gateway: configuring SSL"))}
    assert len(legacy_first) == 1

import numpy as np

from serving.index import Postings
from serving.retrieval import (bm25_top_k, build_subforest, node_scores, reciprocal_rank_fusion,
                               top_k, top_nodes)


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

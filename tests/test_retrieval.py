import numpy as np
import pyarrow as pa
import pytest

from ritrag.index_config import ManifestConfig
from ritrag.serving.skeleton import NodeRows, Skeleton
from ritrag.serving.retrieval import (RetrievalParams, build_subforest, fuse, minmax_fusion, node_scores,
                                     reciprocal_rank_fusion, top_nodes, with_node_docs)


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


def skeleton_of(columns: dict[str, list]) -> Skeleton:
    types = {"keywords": pa.list_(pa.string()), "ancestor_ids": pa.list_(pa.string()), "position": pa.int32()}
    arrays = {name: pa.array(values, types.get(name, pa.string())) for name, values in columns.items()}
    return Skeleton(arrays, NodeRows.of(np.array(columns["node_id"], dtype=bytes)))


def test_subforest_holds_hits_and_every_ancestor_in_document_order():
    #   r1 ─ a (pos 0) ─ a1 (pos 1), a0 (pos 0)
    #      └ b (pos 1)
    #   r2 ─ c
    ids = ["r1", "a", "a0", "a1", "b", "r2", "c"]
    skeleton = skeleton_of({
        "node_id": ids,
        "parent_id": [None, "r1", "a", "a", "r1", None, "r2"],
        "position": [0, 0, 0, 1, 1, 0, 0],
        "ancestor_ids": [[], ["r1"], ["r1", "a"], ["r1", "a"], ["r1"], [], ["r2"]],
        "title": [i.upper() for i in ids],
    })
    row = {n: i for i, n in enumerate(ids)}
    trees = build_subforest([(row["c"], 0.9), (row["a1"], 0.5), (row["a0"], 0.4)], skeleton)
    assert [t["id"] for t in trees] == ["r2", "r1"]  # ordered by best hit inside
    r1 = trees[1]
    assert r1["hit"] is False and "score" not in r1
    assert [c["id"] for c in r1["children"]] == ["a"]  # b is not a hit nor an ancestor
    assert [c["id"] for c in r1["children"][0]["children"]] == ["a0", "a1"]
    assert r1["children"][0]["children"][1] == {"id": "a1", "title": "A1", "hit": True, "score": 0.5}
    assert build_subforest([], skeleton) == []


def test_a_node_whose_parent_no_row_holds_roots_its_own_tree():
    # "gone" was tombstoned or never indexed: x's chain stops below it
    skeleton = skeleton_of({"node_id": ["r", "x", "y"], "parent_id": [None, "gone", "x"], "position": [0, 0, 0],
                            "ancestor_ids": [[], ["r", "gone"], ["r", "gone", "x"]], "title": ["R", "X", "Y"]})
    trees = build_subforest([(2, 0.7)], skeleton)
    assert [t["id"] for t in trees] == ["x", "r"]  # x holds the hit; r: an ancestor with no included child
    assert trees[0]["children"][0]["id"] == "y" and "children" not in trees[1]


def old_build_subforest(hits, nodes, node_row, fields=("title",)) -> list[dict]:
    """The element-at-a-time sub-forest the vectorized one replaced: the oracle."""
    score_of = dict(hits)
    included: set[int] = set()
    for row, _ in hits:
        included.add(row)
        for ancestor in nodes["ancestor_ids"][row]:
            a = node_row.get(ancestor)
            if a is not None:
                included.add(a)
    children: dict[int, list[int]] = {}
    roots = []
    for row in included:
        parent = node_row.get(nodes["parent_id"][row]) if nodes["parent_id"][row] else None
        if parent is None or parent not in included:
            roots.append(row)
        else:
            children.setdefault(parent, []).append(row)

    def render(row: int) -> tuple[dict, float]:
        entry = {"id": nodes["node_id"][row]}
        for field in fields:
            value = nodes[field][row]
            if value:
                entry[field] = value
        best = score_of.get(row, 0.0)
        entry["hit"] = row in score_of
        if entry["hit"]:
            entry["score"] = round(score_of[row], 6)
        kids = sorted(children.get(row, []), key=lambda r: (nodes["position"][r], nodes["node_id"][r]))
        if kids:
            rendered = [render(k) for k in kids]
            entry["children"] = [e for e, _ in rendered]
            best = max([best] + [s for _, s in rendered])
        return entry, best

    trees = [render(r) for r in roots]
    trees.sort(key=lambda t: (-t[1], t[0]["id"]))
    return [t for t, _ in trees]


def test_the_vectorized_subforest_equals_the_element_at_a_time_one(sample_index):
    """Same JSON text (entries, key order, children order, tree order) for real
    GetToC hits on the sample index and for hits with tied scores."""
    import json

    from ritrag.serving.api import TOC_FIELDS
    from serving_fixtures import loaded_index

    index = loaded_index(str(sample_index))
    idx = index.loaded
    queries = [idx.nodes["title"][row] for row in range(0, len(idx.nodes["title"]), 5)]
    for query in queries + ["configure the server port", "zzz nothing"]:
        hits = index.retrieve(query, n=50).hits
        for case in (hits, [(row, 0.5) for row, _ in hits]):
            want = old_build_subforest(case, idx.nodes, idx.node_row, TOC_FIELDS)
            assert json.dumps(build_subforest(case, idx.skeleton, TOC_FIELDS)) == json.dumps(want)


# --- retrieval that uses the forest ------------------------------------------------------------------------------

def test_weighted_rrf_and_node_scores_with_the_nodes_own_match():
    fused = reciprocal_rank_fusion([np.array([5, 7]), np.array([7, 9])], k=10, weights=(2.0, 0.0))
    assert fused == {5: 2 / 11, 7: 2 / 12}
    assert with_node_docs({0: 0.5, 1: 0.2}, {1: 0.4, 2: 0.1}, 0.5) == {0: 0.5, 1: 0.4, 2: 0.05}


def test_retrieval_params_come_from_the_manifest_and_are_checked():
    def recorded_in(config: dict) -> RetrievalParams:
        return RetrievalParams.recorded(ManifestConfig.from_manifest(config).retrieval)

    assert recorded_in({}).node_score == "max"  # an index without node documents
    recorded = {"representation": {"template": "{path}\\n{body}", "path_levels": 4, "node_docs": True},
                "retrieval": {"rrf_k": 30, "node_score": "max+doc"}}
    params = RetrievalParams.recorded(ManifestConfig.from_manifest(recorded).retrieval, rrf_k=None, path_weight=2.0)
    assert (params.rrf_k, params.path_weight, params.node_score) == (30, 2.0, "max+doc")
    with pytest.raises(ValueError):
        RetrievalParams(node_score="sum")
    with pytest.raises(ValueError):
        RetrievalParams(fusion="borda")
    with pytest.raises(ValueError):
        RetrievalParams(sparse_weight=0.0, dense_weight=0.0)
    # an index whose manifest predates the fusion parameter gets today's default fusion
    assert recorded_in(recorded).fusion == "minmax"


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
        if index.loaded.nodes["title"][row] == "Configuring SSL":
            site = index.loaded.nodes["title"][index.loaded.node_row[index.loaded.nodes["ancestor_ids"][row][0]]]
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

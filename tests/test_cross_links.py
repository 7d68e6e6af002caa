"""Cross-links in GetToC (issue #30): each hit's related nodes from the link
graph, outside its chain and the ToC, in the JSON and the outline, off on
request, readable by handle within the episode; and the link statistics
of `ritrag inspect`."""
from __future__ import annotations

import threading

import httpx
import numpy as np
import pyarrow as pa
import pytest

from ritrag.evaluation.forest_report import forest_report, render_html, render_text
from ritrag.reader import IndexReader
from ritrag.serving.http import create_app
from ritrag.serving.links import MAX_SEE_ALSO, LinkGraph, ShardLinks, see_also
from ritrag.serving_form import link_arrays, shard_link_arrays, table_link_ids
from ritrag.ids import node_ids_of_keys, node_keys
from ritrag.serving.outline import SEE_MARK, outline_ids, parse_outline, preorder
from ritrag.serving.skeleton import NodeRows, Skeleton
from ritrag.serving.tool_models import TocResult
from ritrag.serving.tools import ToolService
from serving_fixtures import loaded_index, serving

QUERIES = ("configure the server port", "authentication and access control", "log files rotation")


@pytest.fixture(scope="module")
def service(sample_index) -> ToolService:
    return ToolService(loaded_index(str(sample_index)), n=10)


def test_hits_list_related_nodes_outside_their_chain_and_the_toc(service):
    idx = service.index.loaded
    assert len(idx.links) > 0
    listed = 0
    for query in QUERIES:
        toc = service.get_toc(query)
        shown = {node["id"] for node, _ in preorder(toc["trees"])}
        related = [link["id"] for node, _ in preorder(toc["trees"]) for link in node.get("see_also", ())]
        listed += len(related)
        assert len(related) == len(set(related)) and not set(related) & shown  # once each, none in the ToC
        for node, _ in preorder(toc["trees"]):
            if "see_also" not in node:
                continue
            assert node["hit"] and 0 < len(node["see_also"]) <= MAX_SEE_ALSO
            row = idx.node_row[node["id"]]
            for link in node["see_also"]:
                other = idx.node_row[link["id"]]
                assert other in idx.links.neighbours(row) and link["title"] == idx.nodes["title"][other]
                assert row not in idx.skeleton.ancestors(np.array([other]))  # not below the hit either
        TocResult.model_validate(toc)  # the result schema the faces publish
        assert "see_also" not in str(service.get_toc(query, cross_links=False))
        assert service.get_toc(query, cross_links=False)["trees"] == ToolService(
            service.index, n=10, cross_links=False).get_toc(query)["trees"]
    assert listed > 0


def test_related_nodes_are_those_the_query_scored_best_first_then_by_in_links():
    # rows: 0 root; 1, 2, 3, 4 its children; hit 1 links to 2, 3 and 4, and 3 links to 4
    ids = ["n0", "n1", "n2", "n3", "n4"]
    skeleton = Skeleton({"node_id": pa.array(ids), "parent_id": pa.array([None, "n0", "n0", "n0", "n0"]),
                         "position": pa.array([0] * 5, pa.int32()),
                         "ancestor_ids": pa.array([[], ["n0"], ["n0"], ["n0"], ["n0"]], pa.list_(pa.string()))},
                        NodeRows.of(np.array(ids, dtype=bytes)))
    edges = pa.table({"source_node_id": ["n1", "n1", "n1", "n3", "n1", "n2"],
                      "target_node_id": ["n2", "n3", "n4", "n4", "n2", "n2"]})  # a repeated link, a link to itself
    # one shard holding every link: as written now, and as a file written before the
    # in-links were sharded by target holds them
    for arrays, owns_targets in ((shard_link_arrays(edges, edges), True), (link_arrays(*table_link_ids(edges)), False)):
        graph = LinkGraph([ShardLinks(arrays, frozenset(), owns_targets=owns_targets)], skeleton)
        assert graph.neighbours(1).tolist() == [2, 3, 4] and graph.neighbours(4).tolist() == [1, 3]
        assert graph.in_degree(np.array([2, 3, 4, 0])).tolist() == [1, 1, 2, 0]
        # n3's edges tombstoned by a later segment: its link to n4 is gone both ways
        pruned = LinkGraph([ShardLinks(arrays, frozenset({"n3"}), owns_targets=owns_targets)], skeleton)
        assert pruned.neighbours(4).tolist() == [1] and pruned.in_degree(np.array([4, 3])).tolist() == [1, 1]
        assert pruned.neighbours(3).tolist() == [1]
    shown = np.array([0, 1])
    assert see_also([1], shown, graph, skeleton, {}) == {}  # the query scored none of them
    assert see_also([1], shown, graph, skeleton, {2: 0.1, 3: 0.1, 0: 0.9}) == {1: [2, 3]}  # not the root, in the ToC
    assert see_also([1], shown, graph, skeleton, {3: 0.2, 4: 0.1}, per_hit=1) == {1: [3]}  # the best score first
    assert see_also([1], shown, graph, skeleton, {2: 0.1, 4: 0.1}) == {1: [4, 2]}  # a tie: 4 has more in-links
    assert see_also([1], shown, graph, skeleton, {2: 0.3, 4: 0.1}) == {1: [2, 4]}  # no tie: the score decides
    assert see_also([1], shown, graph, skeleton, {}, unscored=True) == {1: [4, 2, 3]}  # in-links: 4 has two
    assert see_also([1], shown, graph, skeleton, {3: 0.2}, per_hit=2, unscored=True) == {1: [3, 4]}
    assert see_also([1], np.array([0, 1, 4]), graph, skeleton, {}, unscored=True) == {1: [2, 3]}  # 4 is in the ToC


def test_the_outline_shows_cross_links_and_read_resolves_their_handles(service):
    toc = service.get_toc(QUERIES[0], format="both", episode_id="links")
    assert SEE_MARK in toc["outline"]
    parsed = {node["label"]: node for node, _ in preorder(parse_outline(toc["outline"]))}
    ids = outline_ids(toc["trees"])
    lines = sum(1 for _ in preorder(toc["trees"]))
    handles = [link["label"] for node in parsed.values() for link in node.get("see_also", ())]
    assert handles == [f"a{i}" for i in range(lines + 1, len(ids) + 1)]  # numbered after the node lines
    by_id = {node["id"]: node for node, _ in preorder(toc["trees"])}
    for label, node in parsed.items():
        want = by_id[ids[int(label[1:]) - 1]].get("see_also", [])
        assert [link["title"] for link in node.get("see_also", ())] == [" ".join(w["title"].split()) for w in want]
    read = service.read(handles[:2], episode_id="links")
    assert [node["id"] for node in read["nodes"]] == ids[lines:lines + 2]
    assert [node["handle"] for node in read["nodes"]] == handles[:2]
    assert toc["tokens"]["outline"] > service.get_toc(QUERIES[0], format="both", cross_links=False)["tokens"]["outline"]
    off = service.get_toc(QUERIES[0], format="outline", episode_id="links", cross_links=False)["outline"]
    assert SEE_MARK not in off


def test_http_requests_turn_cross_links_off(service):
    with serving(create_app(lambda: service)) as url, httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(600):
            if client.get("/readyz").status_code == 200:
                break
            threading.Event().wait(0.05)
        on = client.post("/v1/toc", json={"query": QUERIES[0]}).json()
        off = client.post("/v1/toc", json={"query": QUERIES[0], "cross_links": False}).json()
    assert any("see_also" in node for node, _ in preorder(on["trees"]))
    assert not any("see_also" in node for node, _ in preorder(off["trees"]))


def test_inspect_reports_the_link_graph_per_site(sample_index, tmp_path):
    report = forest_report(str(sample_index))
    reader = IndexReader(str(sample_index))
    edges = reader.table("edges", ["source_node_id", "target_node_id"])
    pairs = {(s, t) for s, t in zip(edges["source_node_id"].to_pylist(), edges["target_node_id"].to_pylist())}
    links = {name: site["links"] for name, site in report["sites"].items() if "links" in site}
    assert sum(site["edges"] for site in links.values()) <= len(pairs) and sum(s["edges"] for s in links.values())
    for name, site in links.items():
        degree = site["in_degree"]
        assert degree["min"] <= degree["median"] <= degree["p90"] <= degree["max"]
        assert 0 <= site["no_in_links"] <= report["sites"][name]["pages"]
    assert "links_unresolved" in report["link_counters"]
    # per site, what the build counted in all: links to nothing, and navigation left out
    counters = report["link_counters"]
    assert sum(site["unresolved"] for site in links.values()) == counters["links_unresolved"] > 0
    assert sum(site["navigation"] for site in links.values()) == counters["links_navigation"] > 0
    text, page = render_text(report), render_html(report)
    assert "pages with no in-links" in text and "links (build counters)" in text
    assert "pages with no in-links" in page and "links by what became of them" in page


def test_a_serving_file_written_before_the_link_arrays_derives_them_from_its_edges(sample_index, tmp_path):
    from ritrag.serving.segments import MappedShard
    from ritrag.serving_form import IN_LINK_ARRAYS, LINK_ARRAYS, OUT_LINK_ARRAYS, map_arrays, write_arrays

    class Edges:  # the shard's edges file, as a LiveFile reads it
        reads = 0

        def read(self, columns):
            Edges.reads += 1
            return pa.table({"source_node_id": ["n1", "n1"], "target_node_id": ["n2", "n0"]}).select(columns)

    arrays = {name: np.array(a) for name, a in map_arrays(str(next(sample_index.rglob("serving-*.arrays")))).items()
              if name not in LINK_ARRAYS + OUT_LINK_ARRAYS + IN_LINK_ARRAYS}
    write_arrays(str(tmp_path / "old.arrays"), arrays)
    shard = MappedShard(str(tmp_path / "old.arrays"))
    links, owns_targets = shard.links(Edges())
    n0, n1, n2 = node_keys(np.array([b"n0", b"n1", b"n2"])).tolist()
    assert links["link_out_source"].tolist() == [n1, n1] and links["link_out_target"].tolist() == [n0, n2]
    assert links["link_in_target"].tolist() == [n0, n2] and not owns_targets  # its own edges' in-links
    assert shard.links(Edges())[0] is links and Edges.reads == 1  # once per process


def test_a_serving_file_written_before_node_keys_has_its_link_arrays_made_keys(sample_index, tmp_path):
    """Link arrays of node ids as bytes (the serving form before keys) are
    turned into the keys of the same links, once per process."""
    from ritrag.serving.segments import MappedShard
    from ritrag.serving_form import IN_LINK_ARRAYS, LINK_ARRAYS, map_arrays, write_arrays

    written = map_arrays(str(next(sample_index.rglob("serving-*.arrays"))))
    source, target = written["link_out_source"], written["link_out_target"]
    by_target = np.lexsort((source, target))
    # The link arrays of a file written before keys: its own edges' pairs, by source and by target.
    keys = {"link_out_source": source, "link_out_target": target,
            "link_in_target": target[by_target], "link_in_source": source[by_target]}
    ids = {int(k): i.encode("ascii") for k, i in zip(source, node_ids_of_keys(source))}
    ids.update({int(k): i.encode("ascii") for k, i in zip(target, node_ids_of_keys(target))})
    old = {name: np.array(a) for name, a in written.items() if name not in IN_LINK_ARRAYS}
    for name in LINK_ARRAYS:  # as the writer made them before keys: the ids, sorted by their bytes
        old[name] = np.array([ids[int(k)] for k in keys[name]], dtype="S12")
    assert len(old["link_out_source"]) > 10
    write_arrays(str(tmp_path / "old.arrays"), old)
    shard = MappedShard(str(tmp_path / "old.arrays"))
    links, owns_targets = shard.links(edges=None)
    assert all(np.array_equal(links[name], keys[name]) for name in LINK_ARRAYS) and not owns_targets
    assert shard.links(edges=None)[0] is links

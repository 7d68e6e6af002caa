"""The link graph as the jobs write it (issue #30): the edges table and the anchor
documents of a build; an update that moves, deletes and adds pages leaves the
live edges and chunks a fresh build of its input writes; compaction keeps them;
each shard's serving file holds the links of the nodes it owns."""
from __future__ import annotations

import shutil
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow.parquet as pq
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from ritrag.ids import node_id_for, node_keys, shard_of
from ritrag.layout import IndexLayout
from ritrag.schema import EDGES_KIND
from ritrag.pipelines import compact, update
from ritrag.reader import IndexReader
from ritrag.representation import ANCHOR_DOC_ORDINAL, Representation
from ritrag.schema import NodePlacement
from ritrag.serving.index import LoadedVersion
from ritrag.serving.links import LinkGraph, ShardLinks
from ritrag.serving_form import (IN_LINK_ARRAYS, LINK_COLUMNS, OUT_LINK_ARRAYS, SERVING_KIND, link_arrays, map_arrays,
                                 table_link_ids, write_serving_form)
from ritrag.transforms.delta import plan_page_update
from ritrag.transforms.link_delta import TOMBSTONE, anchor_doc_delta, source_delta
from ritrag.vectors import VectorStore
from support import BASE, build_index, chunk_ref, chunk_row, live_table, node_skeleton, tiny_page

GUIDE = [("Guide", "guide/")]


def link(path: str, text: str) -> str:
    return f'<a href="{BASE}/guide/{path}">{text}</a>'


# path -> (title, sections [(heading, text with links)]); the "Moving" page moves
# to moved.html in v2, "Old" is deleted, "Future" appears (the index links it already).
SITE_V1 = {
    "guide/index.html": ("Guide", [("Start", f"Begin with {link('install.html', 'installing')}, then "
                                             f"{link('config.html#s0', 'proxy settings')}, "
                                             f"{link('old.html', 'the old notes')} and "
                                             f"{link('future.html', 'what comes next')}.")]),
    "guide/install.html": ("Installing", [("Steps", f"Read {link('config.html', 'configuration')}, "
                                                    f"{link('api.html', 'the API')} and "
                                                    f"{link('moving.html', 'the moving page')}.")]),
    "guide/config.html": ("Configuration", [("Proxy", f"Set the proxy; see {link('install.html', 'install')}."),
                                            ("Ports", "Port 8080 by default.")]),
    "guide/api.html": ("API", [("Calls", f"Ports are in {link('config.html#s1', 'port settings')}; "
                                         f"{link('moving.html', 'moving')} too.")]),
    "guide/old.html": ("Old notes", [("Notes", f"Superseded by {link('api.html', 'API reference')}.")]),
    "guide/moving.html": ("Moving", [("Body", f"Back to {link('api.html', 'the API')}.")]),
}


def site_v2() -> dict:
    site = {path: page for path, page in SITE_V1.items() if path not in ("guide/old.html", "guide/moving.html")}
    site["guide/moved.html"] = SITE_V1["guide/moving.html"]
    title, _ = SITE_V1["guide/install.html"]
    site["guide/install.html"] = (title, [("Steps", f"Read {link('config.html', 'configuration')}, "
                                                    f"{link('api.html', 'the API')} and "
                                                    f"{link('moved.html', 'the moved page')}.")])
    site["guide/future.html"] = ("Future", [("Plans", f"Built on {link('config.html#s1', 'ports')}.")])
    return site


def write_site(directory: Path, site: dict) -> Path:
    for path, (title, sections) in site.items():
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        trail = [] if path == "guide/index.html" else GUIDE
        target.write_text(tiny_page(title, trail, sections), encoding="utf-8")
    return directory


def live_edges(index: Path) -> set[tuple]:
    rows = list(IndexReader(str(index)).rows(EDGES_KIND))
    edges = {(r["source_node_id"], r["position"], r["target_node_id"], r["anchor_text"]) for r in rows}
    assert len(edges) == len(rows), "an edge is live twice"
    return edges


def url_id(path: str) -> str:
    return node_id_for(f"{BASE}/guide/{path}".removesuffix("/index.html"))


def section_id(path: str, anchor: str) -> str:
    return node_id_for(f"{BASE}/guide/{path}#{anchor}")


@pytest.fixture(scope="module", params=["page", "section"])
def indexes(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"links_{request.param}")
    flags = ("--granularity", request.param, "--embedding_model", "hashing:384")
    updated, fresh = root / "updated", root / "fresh"
    build_index(write_site(root / "v1", SITE_V1), updated, *flags)
    update.run(["--input", str(write_site(root / "v2", site_v2())), "--index", str(updated)])
    build_index(root / "v2", fresh, *flags)
    return request.param, updated, fresh


def test_a_build_keeps_resolved_text_links_and_counts_the_rest(indexes):
    granularity, _, fresh = indexes
    port = section_id("config.html", "s1") if granularity == "section" else url_id("config.html")
    edges = live_edges(fresh)
    assert (url_id("api.html"), 0, port, "port settings") in edges
    assert (url_id("install.html"), 2, url_id("moved.html"), "the moved page") in edges
    # The header's home link is navigation, no edge; moving.html is gone.
    assert not any(target == node_id_for(f"{BASE}/") for _, _, target, _ in edges)
    assert {source for source, _, _, _ in edges} == {url_id(p.removeprefix("guide/")) for p in site_v2()}
    counts = IndexLayout(str(fresh)).load_manifest().stats["pages"]
    assert counts["edges"] == len(edges) and counts["links_unresolved"] == 2  # index -> old, api -> moving
    assert counts["edges_to_sections"] == (3 if granularity == "section" else 0)
    assert counts["pages_links_capped"] == 0


def test_anchor_documents_are_bm25_rows_without_vectors(indexes):
    _, _, fresh = indexes
    chunks = live_table(fresh, "chunks")
    docs = {c["node_id"]: c for c in chunks.values() if c["ordinal"] == ANCHOR_DOC_ORDINAL}
    assert docs[url_id("api.html")]["text"] == "the API"  # two pages, one text
    assert docs[url_id("api.html")]["page_id"] == url_id("api.html")
    store = VectorStore.open([f.path for f in IndexReader(str(fresh)).files("vectors")])
    embedded = {int(i) for shard in store.shards for i in shard.ids}
    assert embedded == {c["chunk_id"] for c in chunks.values() if c["ordinal"] >= 0}  # chunks alone: the default


def test_an_update_retargets_and_drops_edges_like_a_fresh_build(indexes):
    _, updated, fresh = indexes
    assert live_edges(updated) == live_edges(fresh)
    for kind in ("chunks", "nodes", "pages"):
        assert live_table(updated, kind) == live_table(fresh, kind), kind
    # The unchanged index page's link to future.html resolves now; old.html's edges died with it.
    assert any(s == url_id("index.html") and t == url_id("future.html") for s, _, t, _ in live_edges(updated))
    assert not any(s == url_id("old.html") for s, _, _, _ in live_edges(updated))
    tombstones = IndexLayout(str(updated)).load_manifest().tombstones
    assert tombstones["source_node_id"] > 0


def test_compaction_keeps_the_live_edges_and_anchor_documents(indexes, tmp_path):
    _, updated, fresh = indexes
    before_edges, before_chunks = live_edges(updated), live_table(updated, "chunks")
    compact.run(["--index", str(updated)])
    manifest = IndexLayout(str(updated)).load_manifest()
    assert len(manifest.segments) == 1
    assert live_edges(updated) == before_edges == live_edges(fresh)
    assert live_table(updated, "chunks") == before_chunks


def edge_row(source: str, position: int, target: str, text: str) -> dict:
    return {"source_node_id": source, "position": position, "target_node_id": target, "anchor_text": text}


def test_a_source_is_rewritten_only_when_its_edges_change():
    p = test_pipeline.TestPipeline(runner="FnApiRunner")
    groups = p | beam.Create([
        ("same", {"old": [edge_row("same", 0, "t", "a")], "new": [edge_row("same", 0, "t", "a")], "gone": []}),
        ("moved", {"old": [edge_row("moved", 0, "t", "a"), edge_row("moved", 1, "u", "b")],
                   "new": [edge_row("moved", 0, "t", "a"), edge_row("moved", 1, "v", "b")], "gone": []}),
        ("gone", {"old": [edge_row("gone", 0, "t", "a")], "new": [edge_row("gone", 0, "t", "a")], "gone": [True]}),
        ("new", {"old": [], "new": [edge_row("new", 0, "w", "c")], "gone": []}),
    ])
    out = groups | "Delta" >> beam.FlatMap(source_delta).with_outputs(
        TOMBSTONE, "changed_nodes", main="edges")
    assert_that(out["edges"], equal_to([edge_row("moved", 0, "t", "a"), edge_row("moved", 1, "v", "b"),
                                        edge_row("new", 0, "w", "c")]), label="Edges")
    assert_that(out[TOMBSTONE], equal_to([("source_node_id", "moved"), ("source_node_id", "gone")]),
                label="Tombstones")
    assert_that(out["changed_nodes"], equal_to(["u", "v", "t", "w"]), label="Changed")
    p.run().wait_until_finish()


def test_an_anchor_document_is_replaced_only_when_its_text_changes():
    doc = chunk_ref(file="f", chunk_id=1, node_id="t", ordinal=ANCHOR_DOC_ORDINAL)
    assert list(anchor_doc_delta(("t", {"new": [chunk_row(chunk_id=1, node_id="t")], "old": [doc]}))) == []
    replaced = list(anchor_doc_delta(("t", {"new": [chunk_row(chunk_id=2, node_id="t")], "old": [doc]})))
    assert replaced[0] == chunk_row(chunk_id=2, node_id="t")
    assert (replaced[1].tag, replaced[1].value) == (TOMBSTONE, ("chunk_id", doc))
    gone = list(anchor_doc_delta(("t", {"new": [], "old": [doc]})))
    assert [(g.tag, g.value) for g in gone] == [(TOMBSTONE, ("chunk_id", doc))]


def test_a_plan_names_the_urls_whose_nodes_a_link_may_name_changed():
    page = node_skeleton(node_id="p", parent_id="r", page_id="p", site="s", kind="page", position=0, depth=1,
                         title="P", url="u", ancestor_ids=["r"], ancestor_titles=["R"], trail_method="url",
                         source_kind="html")  # a live row as PlaceChangedForests reads it (no body)
    section = page._replace(node_id="s1", kind="section", url="u#a", depth=2)
    anchor_doc = chunk_ref(file="f", chunk_id=9, node_id="p", page_id="p", ordinal=ANCHOR_DOC_ORDINAL)
    gone = plan_page_update(None, None, 0, [page, section], [anchor_doc], "section",
                            representation=Representation())
    assert (gone.changed_target_urls, gone.targets, gone.dead_source) == (["u"], [], "p")
    assert gone.dead_chunks == [anchor_doc]  # an anchor document dies with its page
    # Moved under another parent, unchanged: the same nodes, no URL to resolve again, its anchor document kept.
    moved = NodePlacement("p", "x", "s", "page", 3, 1, "P", "u", ("x",), ("X",), "url", "html")
    kept = plan_page_update(moved, None, 0, [page, section], [anchor_doc], "section",
                            representation=Representation(template="{body}"))
    assert kept.changed_target_urls == [] and {t["node_id"] for t in kept.targets} == {"p", "s1"}
    assert kept.dead_chunks == [] and kept.dead_source is None


def ref_link(path: str, text: str) -> str:
    return f'<a href="{BASE}/ref/{path}">{text}</a>'


# A second site that links into the guide; in v2 only the API page's text
# changes (a link to the moving page dropped, one to the other site added), so
# its skeleton, and every forest, stays as it was.
REF_SITE = {
    "ref/index.html": ("Reference", [], [("Index", f"See {ref_link('cli.html', 'the CLI')} and "
                                                   f"{link('api.html', 'the API guide')}.")]),
    "ref/cli.html": ("CLI", [("Reference", "ref/")], [("Flags", f"Flags mirror {link('config.html', 'configuration')}."),
                                                      ("Exit", "Status 0 means success.")]),
}
API_EDITED = ("API", [("Calls", f"Ports are in {link('config.html#s1', 'port settings')}; the flags are in "
                                f"{ref_link('cli.html#s0', 'the CLI flags')}.")])


def write_two_sites(directory: Path, guide: dict) -> Path:
    write_site(directory, guide)
    for path, (title, trail, sections) in REF_SITE.items():
        (directory / path).parent.mkdir(parents=True, exist_ok=True)
        (directory / path).write_text(tiny_page(title, trail, sections), encoding="utf-8")
    return directory


def test_an_edit_that_keeps_every_forest_reads_no_site_and_equals_a_fresh_build(tmp_path):
    flags = ("--granularity", "section", "--embedding_model", "hashing:384")
    updated, fresh = tmp_path / "updated", tmp_path / "fresh"
    build_index(write_two_sites(tmp_path / "v1", SITE_V1), updated, *flags)
    edited = write_two_sites(tmp_path / "v2", {**SITE_V1, "guide/api.html": API_EDITED})
    update.run(["--input", str(edited), "--index", str(updated)])
    build_index(edited, fresh, *flags)

    counts = IndexLayout(str(updated)).load_manifest().stats["pages"]
    assert counts["pages_indexed"] == 1 and counts["sites_placed"] == 0  # the page kept its place
    assert IndexLayout(str(fresh)).load_manifest().stats["pages"]["sites_placed"] == 2
    assert live_edges(updated) == live_edges(fresh)
    for kind in ("chunks", "nodes", "pages"):
        assert live_table(updated, kind) == live_table(fresh, kind), kind
    # The new cross-site link resolved against a node the update did not place,
    # and the in-links of both pages it touched were recounted.
    cli_flags = node_id_for(f"{BASE}/ref/cli.html#s0")
    assert any(s == url_id("api.html") and t == cli_flags for s, _, t, _ in live_edges(updated))
    docs = {c["node_id"]: c["text"] for c in live_table(updated, "chunks").values() if c["ordinal"] == ANCHOR_DOC_ORDINAL}
    assert docs[cli_flags] == "the CLI flags" and docs[url_id("moving.html")] == "the moving page"


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """SITE_V1 built in 3 shards, then updated to site_v2 (2 segments, tombstoned sources)."""
    root = tmp_path_factory.mktemp("links_sharded")
    index = root / "index"
    build_index(write_site(root / "v1", SITE_V1), index, "--embedding_model", "hashing:384", "--num_shards", "3")
    update.run(["--input", str(write_site(root / "v2", site_v2())), "--index", str(index)])
    return index


def test_a_nodes_links_are_in_the_one_shard_of_each_segment_that_owns_it(sharded, tmp_path):
    """A serving file holds the out-links of the sources its shard owns and
    the in-links of the targets it owns (from every edges shard of its
    segment); served, they answer as the links of files written before the
    in-links were sharded by target (each shard's own edges, searched in all)."""

    def pairs(source: np.ndarray, target: np.ndarray) -> set[tuple[int, int]]:
        return set(zip(source.tolist(), target.tolist()))

    layout = IndexLayout(str(sharded))
    linked = 0
    for segment in layout.load_manifest().segments:
        directory = Path(layout.segment_dir(segment["id"]))
        edges = [pq.read_table(directory / f"{EDGES_KIND}-0000{s}-of-00003.parquet", columns=LINK_COLUMNS)
                 for s in range(3)]
        files = [map_arrays(str(directory / f"{SERVING_KIND}-0000{s}-of-00003.arrays")) for s in range(3)]
        for shard, (own, arrays) in enumerate(zip(edges, files)):
            source, target = own["source_node_id"].to_pylist(), own["target_node_id"].to_pylist()
            assert pairs(*(arrays[name] for name in OUT_LINK_ARRAYS)) == {
                (int(s), int(t)) for s, t in zip(node_keys(np.array(source, "S")), node_keys(np.array(target, "S")))
                if s != t}
            assert all(shard_of(s, 3) == shard for s in source)
        every = [(s, t) for table in edges for s, t in zip(table["source_node_id"].to_pylist(),
                                                          table["target_node_id"].to_pylist()) if s != t]
        linked += len(every)
        for shard, arrays in enumerate(files):
            in_target, in_source = (arrays[name] for name in IN_LINK_ARRAYS)
            assert np.all(np.diff(in_target.astype(np.float64)) >= 0)  # sorted by target
            wanted = [(s, t) for s, t in every if shard_of(t, 3) == shard]
            assert pairs(in_source, in_target) == pairs(node_keys(np.array([s for s, _ in wanted], "S")),
                                                        node_keys(np.array([t for _, t in wanted], "S")))
    assert linked > 10
    # the serving form written in one process (write_serving_form) is the one the jobs write
    for segment in layout.load_manifest().segments:
        copy = tmp_path / segment["id"]
        shutil.copytree(layout.segment_dir(segment["id"]), copy)
        for written in copy.glob(f"{SERVING_KIND}-*"):
            written.unlink()
        write_serving_form(str(copy), 3)
        for s in range(3):
            name = f"{SERVING_KIND}-0000{s}-of-00003.arrays"
            assert (copy / name).read_bytes() == (Path(layout.segment_dir(segment["id"])) / name).read_bytes()
    served = LoadedVersion(str(sharded))
    legacy = LinkGraph([ShardLinks(link_arrays(*table_link_ids(f.read(LINK_COLUMNS))),
                                   f.dead, f, owns_targets=False) for f in served.reader.files(EDGES_KIND)],
                       served.skeleton)
    rows = np.arange(len(served.node_row))
    got, want = served.links.neighbour_pairs(rows), legacy.neighbour_pairs(rows)
    assert len(got[0]) > 10 and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert np.array_equal(served.links.in_degree(rows), legacy.in_degree(rows))

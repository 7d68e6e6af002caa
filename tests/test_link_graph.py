"""The link graph as the jobs write it (issue #30): the edges table and the anchor
documents of a build; an update that moves, deletes and adds pages leaves the
live edges and chunks a fresh build of its input writes; compaction keeps them."""
from __future__ import annotations

from pathlib import Path

import pytest

from ritrag.ids import node_id_for
from ritrag.layout import EDGES_KIND, IndexLayout
from ritrag.pipelines import compact, update
from ritrag.reader import IndexReader
from ritrag.representation import ANCHOR_DOC_ORDINAL
from ritrag.vectors import VectorStore
from support import BASE, build_index, live_table, tiny_page

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
    assert embedded == {c["chunk_id"] for c in chunks.values() if c["ordinal"] != ANCHOR_DOC_ORDINAL}


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

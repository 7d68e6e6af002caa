"""ritrag.transforms.edges: a small site parsed and placed as the build does it,
its links resolved into edge rows; anchor texts aggregated per node."""
from __future__ import annotations

import pytest
from apache_beam import Create
from apache_beam.metrics import MetricsFilter
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from ritrag.ids import node_id_for
from ritrag.schema import EDGES_SCHEMA, PageSkeleton
from ritrag.transforms.edges import (EDGES_COUNTER, EDGES_TO_SECTIONS_COUNTER, LINKS_UNRESOLVED_COUNTER,
                                     MAX_NODE_ANCHOR_CHARS, MAX_NODE_ANCHORS, AnchorTexts, ResolveEdges,
                                     link_target)
from ritrag.transforms.forest import build_site_forest
from ritrag.transforms.nodes import page_node_rows, placement_row
from ritrag.transforms.pages import COUNTERS
from ritrag.transforms.parse import parse_page

SITE = "https://docs.example.com"
HOME, INSTALL, CONFIG, API = (f"{SITE}/", f"{SITE}/guide/install.html", f"{SITE}/guide/config.html",
                              f"{SITE}/reference/api.html")


def site_page(url: str, title: str, body: str) -> bytes:
    """A page of the site's theme: a menu linking every page, a breadcrumb trail, a
    pager and a footer around its own text."""
    return f"""<!DOCTYPE html><html><head><title>{title}</title></head><body>
<nav class="menu"><a href="{HOME}">Home</a> <a href="{INSTALL}">Install</a> <a href="{CONFIG}">Config</a>
  <a href="{API}">API</a></nav>
<main>
  <ol class="breadcrumb"><li><a href="{HOME}">Home</a></li><li><a href="{SITE}/guide/">Guide</a></li></ol>
  <h1>{title}</h1>
  {body}
  <div class="pager"><a href="{CONFIG}">Next: Config</a> <a href="{API}">Previous: API</a></div>
</main>
<footer><a href="{API}">API</a> <a href="{SITE}/legal.html">Legal</a></footer>
</body></html>""".encode()


SITE_PAGES = {
    HOME: site_page(HOME, "Example docs", f'<p>Start with the <a href="{INSTALL}">installation guide</a>.</p>'),
    INSTALL: site_page(INSTALL, "Installing", """
      <p>Set <a href="config.html#proxy">proxy settings</a> first, read <a href="../reference/api.html">the API
      reference</a> and <a href="../missing.html">a page not in the index</a>.</p>
      <h2 id="linux">On Linux</h2><p>Use the package manager.</p>"""),
    CONFIG: site_page(CONFIG, "Configuration", """
      <p>Every option is in the <a href="../reference/api.html">API</a>; to begin, see
      <a href="install.html">installing</a>, or <a href="install.html#linux">installing on Linux</a>.</p>
      <h2 id="proxy">Proxy</h2><p>Set the proxy URL.</p>"""),
    API: site_page(API, "API reference", '<p>Behind a firewall? <a href="../guide/config.html#proxy">Proxy '
                                         'configuration</a>.</p>'),
}


def parsed_site():
    return [parse_page(data, url, SITE) for url, data in SITE_PAGES.items()]


def node_rows(pages, granularity: str) -> list[dict]:
    """The site's node rows as the build's forest stage makes them."""
    by_url = {page.url: page for page in pages}
    rows = []
    for placement in build_site_forest(SITE, [PageSkeleton.of(page) for page in pages]).placements:
        page = by_url.get(placement.url) if placement.kind == "page" else None
        rows += page_node_rows(placement, page, granularity)[0] if page else [placement_row(placement)]
    return rows


def edge(source: str, position: int, target: str, text: str) -> dict:
    return {"source_node_id": node_id_for(source), "position": position, "target_node_id": node_id_for(target),
            "anchor_text": text}


def counter(result, name: str) -> int:
    counters = result.metrics().query(MetricsFilter().with_namespace(COUNTERS).with_name(name))["counters"]
    return sum(c.committed for c in counters)


@pytest.mark.parametrize("granularity", ["page", "section"])
def test_body_links_become_edges_and_navigation_none(granularity):
    pages = parsed_site()
    # With sections, "#proxy" and "#linux" name section nodes; without, their pages.
    proxy = f"{CONFIG}#proxy" if granularity == "section" else CONFIG
    linux = f"{INSTALL}#linux" if granularity == "section" else INSTALL
    # INSTALL's third link names a page not in the index: counted, no row.
    expected = [
        edge(HOME, 0, INSTALL, "installation guide"),
        edge(INSTALL, 0, proxy, "proxy settings"),
        edge(INSTALL, 1, API, "the API reference"),
        edge(CONFIG, 0, API, "API"),
        edge(CONFIG, 1, INSTALL, "installing"),
        edge(CONFIG, 2, linux, "installing on Linux"),
        edge(API, 0, proxy, "Proxy configuration"),
    ]

    p = test_pipeline.TestPipeline(runner="FnApiRunner")
    nodes = p | "Nodes" >> Create([link_target(row) for row in node_rows(pages, granularity)])
    edges = (p | "Links" >> Create([(page.url, page.links) for page in pages])
             | ResolveEdges(nodes))
    assert_that(edges, equal_to(expected))
    result = p.run()
    result.wait_until_finish()
    assert counter(result, EDGES_COUNTER) == 7
    assert counter(result, LINKS_UNRESOLVED_COUNTER) == 1
    assert counter(result, EDGES_TO_SECTIONS_COUNTER) == (3 if granularity == "section" else 0)
    assert set(expected[0]) == set(EDGES_SCHEMA.names)


def anchor_edge(target: str, source: str, text: str, position: int = 0) -> dict:
    return {"source_node_id": source, "position": position, "target_node_id": target, "anchor_text": text}


def test_anchor_texts_are_counted_per_linking_page_deduplicated_and_bounded():
    edges = [
        anchor_edge("proxy", "a", "Proxy settings"), anchor_edge("proxy", "b", "proxy settings"),
        anchor_edge("proxy", "c", "HTTP proxy"), anchor_edge("proxy", "a", "a second link of a", position=5),
        anchor_edge("proxy", "d", ""),  # an image without alt text
        # 60 pages, each its own text: the first MAX_NODE_ANCHORS in text order
        *(anchor_edge("many", f"s{i:02d}", f"text {i:02d}") for i in range(60)),
        # long texts: as many as MAX_NODE_ANCHOR_CHARS holds
        *(anchor_edge("long", f"s{i:02d}", f"{i:02d}" + "x" * 198) for i in range(20)),
    ]
    p = test_pipeline.TestPipeline(runner="FnApiRunner")
    anchors = p | Create(edges) | AnchorTexts()
    assert_that(anchors, equal_to([
        ("proxy", ("Proxy settings", "HTTP proxy")),  # two pages' text first, in its least spelling
        ("many", tuple(f"text {i:02d}" for i in range(MAX_NODE_ANCHORS))),
        ("long", tuple(f"{i:02d}" + "x" * 198 for i in range(MAX_NODE_ANCHOR_CHARS // 200))),
    ]))
    p.run().wait_until_finish()

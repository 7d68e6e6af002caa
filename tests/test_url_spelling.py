"""One URL spelling (issue #39 item 4): the crawler's clean URL and the index's
page key drop tracking parameters by one rule (`ritrag.urls.without_tracking_params`),
so a text link carrying `?utm_source=` names the crawled page's node."""
from __future__ import annotations

import pytest
from apache_beam import Create
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from ritrag.ids import node_id_for
from ritrag.schema import PageSkeleton
from ritrag.transforms.crawl.scope import clean_url, crawl_key
from ritrag.transforms.edges import ResolveEdges, link_target
from ritrag.transforms.forest import build_site_forest
from ritrag.transforms.nodes import page_node_rows, placement_row
from ritrag.transforms.parse import parse_page
from ritrag.urls import normalize_url, without_tracking_params

SITE = "https://docs.example.com"


@pytest.mark.parametrize("query, kept", [
    ("", ""),
    ("v=2", "v=2"),
    ("b&a=1", "b&a=1"),  # no tracking parameter: the query as written, not re-encoded
    ("a=x+y&utm_source=news", "a=x+y"),
    ("utm_source=news&utm_medium=email", ""),
    ("utm%5Fsource=news&v=2", "v=2"),  # the name read percent-decoded, as parse_qsl reads it
    ("UTM_Campaign=x&page=2&gclid=abc&fbclid=1", "page=2"),
    ("utm=1&ref=home&source=x", "utm=1&ref=home&source=x"),  # not tracking parameters
])
def test_tracking_parameters_are_dropped_and_the_rest_kept_as_written(query, kept):
    assert without_tracking_params(query) == kept


@pytest.mark.parametrize("url", [
    "https://docs.example.com/guide/install.html?utm_source=news",
    "https://docs.example.com/guide/install.html?v=2&utm_medium=email&utm_source=news",
    "https://docs.example.com/guide/?gclid=abc#top",
    "HTTPS://Docs.Example.com:443/guide/./install.html?utm_campaign=x&q=a%20b",
])
def test_the_page_key_of_a_url_is_the_crawls_key_of_it(url):
    assert normalize_url(url) == crawl_key(url) == normalize_url(clean_url(url))
    assert "utm_" not in normalize_url(url) and "gclid" not in normalize_url(url)


def test_a_link_with_tracking_parameters_resolves_to_the_crawled_pages_node():
    # The crawler fetched the page by a link carrying tracking parameters and
    # recorded it under its clean URL; another page's text links to it with others.
    crawled = clean_url(f"{SITE}/guide/install.html?utm_source=newsletter&v=2")
    assert crawled == f"{SITE}/guide/install.html?v=2"
    install = parse_page(b"<!DOCTYPE html><html><head><title>Installing</title></head><body><main>"
                         b"<h1>Installing</h1><p>Run the installer.</p></main></body></html>", crawled, SITE)
    home = parse_page(
        b'<!DOCTYPE html><html><head><title>Home</title></head><body><main><h1>Home</h1>'
        b'<p>Read <a href="guide/install.html?v=2&amp;utm_medium=email&amp;utm_source=home">the install '
        b'guide</a> and <a href="guide/install.html?v=3">another version</a>.</p></main></body></html>',
        f"{SITE}/", SITE)
    assert [link.url for link in home.links] == [crawled, f"{SITE}/guide/install.html?v=3"]
    rows = []
    pages = {page.url: page for page in (install, home)}
    for placement in build_site_forest(SITE, [PageSkeleton.of(p) for p in pages.values()]).placements:
        page = pages.get(placement.url) if placement.kind == "page" else None
        rows += page_node_rows(placement, page, "page")[0] if page else [placement_row(placement)]

    p = test_pipeline.TestPipeline(runner="FnApiRunner")
    nodes = p | "Nodes" >> Create([link_target(row) for row in rows])
    edges = p | "Links" >> Create([(home.url, home.links)]) | ResolveEdges(nodes)
    assert_that(edges, equal_to([{"source_node_id": node_id_for(home.url), "position": 0,
                                  "target_node_id": node_id_for(crawled), "anchor_text": "the install guide"}]))
    p.run().wait_until_finish()

"""Anchor text as a third BM25 field (issue #30): a page that other pages
name by a word its own text never uses is found by that word, and an index
without anchor documents answers exactly as one scored with two fields.
(The hand-computed three-field score is tests/test_bm25.py's.)"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ritrag.analyzer import analyze
from ritrag.bm25 import ANCHORS, BODY, top_k
from ritrag.serving.api import RitragIndex
from ritrag.serving.retrieval import RetrievalParams
from support import build_index, tiny_page
from test_bm25 import assert_identical, old_fields, old_top_k

# path -> (title, sections). Three pages link to the relay page as "zephyr
# relay"; the relay page never says "zephyr". The other links give most
# pages an anchor document of their own, so the anchors field has
# statistics of more than one row.
LINKED_SITE = {
    "shop/index.html": ("Shop Server", [
        ("Overview", 'The shop server sells widgets. Messages travel through the '
                     '<a href="/shop/relay.html">zephyr relay</a>; see also <a href="/shop/ports.html">port '
                     'settings</a> and <a href="/shop/logs.html">log files</a>.')]),
    "shop/ports.html": ("Ports", [
        ("Listening", 'The server listens on port 8080 for plain traffic and on port 8443 for encrypted '
                      'traffic between the storefront and its workers. Forwarded traffic goes through the '
                      '<a href="/shop/relay.html">zephyr relay</a>. Read the <a href="/shop/logs.html">log '
                      'files</a> when a port is busy.')]),
    "shop/logs.html": ("Logs", [
        ("Rotation", 'Logs rotate daily and fourteen files are kept on the disk of every worker host; old '
                     'files are compressed. Delivery failures are logged by the <a href="/shop/relay.html">zephyr '
                     'relay</a>, whose <a href="/shop/ports.html">listening ports</a> appear at start.')]),
    "shop/relay.html": ("Message forwarding", [
        ("Forwarding", 'The forwarding daemon moves queued messages between hosts and retries failed '
                       'deliveries with backoff. Configure it in the <a href="/shop/tuning.html">tuning '
                       'guide</a>.')]),
    "shop/tuning.html": ("Tuning", [
        ("Workers", 'Raise the number of workers when queues grow; each worker holds one connection. The '
                    '<a href="/shop/index.html">shop overview</a> names the parts.')]),
}


def write_linked_site(directory: Path) -> Path:
    for path, (title, sections) in LINKED_SITE.items():
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        trail = [] if path == "shop/index.html" else [("Shop Server", "shop/")]
        target.write_text(tiny_page(title, trail, sections), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def linked_indexes(tmp_path_factory) -> dict[str, RitragIndex]:
    """The linked site built with anchor documents, without them, and with
    them but without node documents."""
    site = write_linked_site(tmp_path_factory.mktemp("linked_site"))
    out = {}
    for name, flags in (("on", ()), ("off", ("--anchor_docs", "off")), ("no_node_docs", ("--node_docs", "off"))):
        index_dir = tmp_path_factory.mktemp(f"linked_{name}")
        build_index(site, index_dir, "--embedding_model", "hashing:384", *flags)
        out[name] = RitragIndex(str(index_dir))
    return out


def title_of(index: RitragIndex, node_row: int) -> str:
    return index.loaded.nodes["title"][node_row]


def test_the_page_its_in_links_name_ranks_first_for_the_anchor_word(linked_indexes):
    index = linked_indexes["on"]
    idx = index.loaded
    assert "anchors" in idx.bm25.fields
    anchor_rows = np.flatnonzero(idx.chunk_kind == ANCHORS)
    assert "Message forwarding" in {title_of(index, row) for row in idx.chunk_node[anchor_rows].tolist()}
    bm25_only = dict(dense_weight=0.0)  # hashing vectors say nothing about meaning
    with_anchors = index.retrieve("zephyr", params=RetrievalParams(anchor_weight=1.0, **bm25_only)).hits
    assert title_of(index, with_anchors[0][0]) == "Message forwarding"
    (sparse, _) = index.rankings("zephyr", params=RetrievalParams(anchor_weight=1.0)).chunks
    assert title_of(index, int(idx.chunk_node[sparse[0][0]])) == "Message forwarding"
    # Without the field's weight the page does not match at all: its own text never says "zephyr".
    without = index.retrieve("zephyr", params=RetrievalParams(anchor_weight=0.0, **bm25_only)).hits
    assert "Message forwarding" not in {title_of(index, row) for row, _ in without}
    # Anchor documents are no chunks: never a chunk of a node, never read.
    assert not np.isin(anchor_rows, idx.node_chunks[1]).any()
    relay = next(row for row, _ in with_anchors if title_of(index, row) == "Message forwarding")
    text = index.read([idx.nodes["node_id"][relay]])["nodes"][0]["text"]
    assert "zephyr" not in text


def test_an_index_without_anchor_documents_scores_with_two_fields_as_before(linked_indexes):
    index = linked_indexes["off"]
    idx = index.loaded
    assert set(idx.bm25.fields) == {"body", "doc"} and not (idx.chunk_kind == ANCHORS).any()
    for query in ("zephyr", "zephyr relay workers", "port settings log files", "forwarding daemon"):
        terms = analyze(query)
        two = {"doc": 0.5}
        best, own = idx.bm25.chunk_top_k(terms, {**two, "anchors": 1.0}, idx.chunk_node, idx.node_chunks, 50)
        old_chunks, old_own = old_fields(terms, idx.bm25, idx.chunk_node, len(idx.nodes["node_id"]), two)
        assert_identical(best, old_top_k(old_chunks, 50))
        assert_identical(top_k(own["doc"], 50), old_top_k(old_own["doc"], 50))
        # the anchor weight changes nothing where there are no anchors
        assert (index.get_toc(query, params=RetrievalParams(anchor_weight=1.0))
                == index.get_toc(query, params=RetrievalParams(anchor_weight=0.0)))


def test_without_node_documents_the_anchors_are_a_field_of_their_own(linked_indexes):
    index = linked_indexes["no_node_docs"]
    idx = index.loaded
    assert set(idx.bm25.fields) == {"body", "anchors"}
    rankings = index.rankings("zephyr relay", params=RetrievalParams(anchor_weight=1.0))
    (sparse_rows, _), (dense_rows, _) = rankings.chunks
    assert rankings.docs is None and title_of(index, int(idx.chunk_node[sparse_rows[0]])) == "Message forwarding"
    assert (idx.chunk_kind[sparse_rows] == BODY).all() and (idx.chunk_kind[dense_rows] == BODY).all()

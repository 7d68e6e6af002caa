"""The link graph: indexed pages' links resolved to nodes of the index (the edges
table), and the anchor texts other pages link each node with.

  ResolveEdges     (page URL, its ParsedPage.links) x link targets -> EDGES_SCHEMA rows
  AnchorTexts      EDGES_SCHEMA rows -> (node id, the anchor texts of its in-links)
  AnchorDocuments  EDGES_SCHEMA rows x link targets -> anchor-document chunk rows (ordinal -2)

Both are pure (the job writes what they produce). A link names a page URL and
maybe a fragment: it resolves to the section node with that anchor where the
index has one (`--granularity section`), else to the page node, else to nothing:
then it is counted, not kept (the page keeps its links in the pages table, so
an update that adds its target resolves it as a fresh build would).

Only page URLs are shuffled: links travel grouped by the page they name, joined
with that page's node and section nodes; no group holds more than one target
page's nodes, whatever the number of links to it.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import apache_beam as beam

from ritrag.embedder import EmbedderSpec
from ritrag.ids import node_id_for
from ritrag.schema import TARGET_COLUMNS, Link, NodeRow, NodeSkeleton, StoredTarget
from ritrag.transforms.chunk import AnchorDocFn
from ritrag.transforms.counts import COUNTS, CountingDoFn, record_counts
from ritrag.transforms.pages import COUNTERS

# Links kept as edges (of them, to a section node), and links to nothing in the index.
EDGES_COUNTER = "edges"
EDGES_TO_SECTIONS_COUNTER = "edges_to_sections"
LINKS_UNRESOLVED_COUNTER = "links_unresolved"
EDGE_COUNTERS = (EDGES_COUNTER, EDGES_TO_SECTIONS_COUNTER, LINKS_UNRESOLVED_COUNTER)
# The in-link anchor texts kept per node: the most linking pages first, at most
# MAX_NODE_ANCHORS of them, MAX_NODE_ANCHOR_CHARS in all (an index field, not a list
# of every page that links to a popular one).
MAX_NODE_ANCHORS = 50
MAX_NODE_ANCHOR_CHARS = 2000
_PAGE = ""  # the anchor a page node is keyed by among its page's nodes


# What the link stages need of a node a link may name: a link target, a dict of
# these columns (of a NodeRow, `link_target`, or of a live node row read back).
def link_target(node: NodeRow | NodeSkeleton | StoredTarget) -> dict:
    """The link target (TARGET_COLUMNS) of a node row, whole or read back in part."""
    return {name: getattr(node, name) for name in TARGET_COLUMNS}


def node_targets(row: dict) -> Iterable[tuple[str, tuple[str, str]]]:
    """(page URL, (anchor, node id)) of a link target that a link can name: a page
    node (anchor "") or a section node with an anchor; nodes without text
    (site and virtual nodes: no page of the index) are no targets."""
    if row["page_id"] is None or not row["url"]:
        return
    if row["kind"] == "page":
        yield row["url"], (_PAGE, row["node_id"])
    elif "#" in row["url"]:  # a section without an anchor has its page's URL
        page_url, anchor = row["url"].split("#", 1)
        yield page_url, (anchor, row["node_id"])


def links_by_target(page_links: tuple[str, tuple[Link, ...]]
                    ) -> Iterable[tuple[str, tuple[str, tuple[Link, ...]]]]:
    """(target page URL, (source page URL, its links to that page)) of one page's links."""
    source_url, links = page_links
    by_target: dict[str, list[Link]] = defaultdict(list)
    for link in links:
        by_target[link.url].append(link)
    for target_url, to_target in by_target.items():
        yield target_url, (source_url, tuple(to_target))


def edge_row(source_node_id: str, link: Link, target_node_id: str) -> dict:
    """The EDGES_SCHEMA row of one link."""
    return {"source_node_id": source_node_id, "position": link.position, "target_node_id": target_node_id,
            "anchor_text": link.anchor_text}


class ResolveEdgesFn(CountingDoFn):
    """One target page URL's links, joined with its nodes -> their edge rows."""

    def __init__(self):
        super().__init__(COUNTERS)

    def process(self, joined: tuple[str, dict]) -> Iterable[dict]:
        _, group = joined
        nodes = dict(group["targets"])  # anchor -> node id: one page's nodes
        page_node = nodes.get(_PAGE)
        for source_url, links in group["links"]:
            source_node_id = node_id_for(source_url)  # a page node's id is its URL's
            for link in links:
                section_node = nodes.get(link.fragment) if link.fragment else None
                target = section_node or page_node
                if target is None:
                    self.count(LINKS_UNRESOLVED_COUNTER)
                    continue
                self.count(EDGES_COUNTER)
                if section_node:
                    self.count(EDGES_TO_SECTIONS_COUNTER)
                yield edge_row(source_node_id, link, target)


class ResolveEdges(beam.PTransform):
    """(page URL, ParsedPage.links) of every indexed page -> EDGES_SCHEMA rows,
    one per link resolved against `targets` (the link targets, TARGET_COLUMNS,
    of the index's nodes: the granularity is theirs); links to nothing are counted."""

    def __init__(self, targets: beam.PCollection):
        super().__init__()
        self._targets = targets

    def expand(self, page_links):
        targets = self._targets | "NodeTargets" >> beam.FlatMap(node_targets)
        links = page_links | "LinksByTarget" >> beam.FlatMap(links_by_target)
        return record_counts({"targets": targets, "links": links}
                             | "JoinLinksAndTargets" >> beam.CoGroupByKey()
                             | "Resolve" >> beam.ParDo(ResolveEdgesFn()).with_outputs(COUNTS, main="edges")
                             ).edges


def _anchor_votes(votes: Iterable[tuple[int, str]]) -> tuple[int, str]:
    """(linking pages, spelling) of one anchor text: their sum, the least spelling."""
    votes = list(votes)
    return sum(pages for pages, _ in votes), min(spelling for _, spelling in votes)


def bounded_anchors(node_and_ranked: tuple[str, list[tuple[int, str, str]]]) -> tuple[str, tuple[str, ...]]:
    """(node id, its anchor texts in rank order, as many as MAX_NODE_ANCHOR_CHARS holds)."""
    node_id, ranked = node_and_ranked
    kept, chars = [], 0
    for _, _, spelling in ranked:
        if chars + len(spelling) > MAX_NODE_ANCHOR_CHARS:
            break
        kept.append(spelling)
        chars += len(spelling)
    return node_id, tuple(kept)


class AnchorTexts(beam.PTransform):
    """EDGES_SCHEMA rows -> (node id, anchor texts) of every node linked to: the
    texts other pages link it with, one per linking page (its first link to the
    node), the same text in other case or spacing counted once, ranked by the
    number of pages using it (then by text), at most MAX_NODE_ANCHORS and
    MAX_NODE_ANCHOR_CHARS per node. Links without text count for nothing."""

    def expand(self, edges):
        return (edges
                | "WithText" >> beam.Filter(lambda e: e["anchor_text"])
                | "KeyByTargetAndSource" >> beam.Map(
                    lambda e: ((e["target_node_id"], e["source_node_id"]), (e["position"], e["anchor_text"])))
                | "FirstLinkOfEachPage" >> beam.CombinePerKey(min)
                | "KeyByTargetAndText" >> beam.Map(
                    lambda kv: ((kv[0][0], " ".join(kv[1][1].casefold().split())), (1, kv[1][1])))
                | "CountPages" >> beam.CombinePerKey(_anchor_votes)
                | "KeyByTarget" >> beam.Map(lambda kv: (kv[0][0], (kv[1][0], kv[0][1], kv[1][1])))
                # reverse: the least key first, so the most pages, then the text's order
                | "MostUsed" >> beam.combiners.Top.PerKey(MAX_NODE_ANCHORS, key=lambda v: (-v[0], v[1]),
                                                          reverse=True)
                | "Bounded" >> beam.Map(bounded_anchors))


def anchored_nodes(joined: tuple[str, dict]) -> Iterable[tuple[str, str, tuple[str, ...]]]:
    """(node id, its page id, its anchor texts) of a node that has both."""
    node_id, group = joined
    for anchors in group["anchors"]:
        for page_id in group["page"]:
            yield node_id, page_id, anchors


class AnchorDocuments(beam.PTransform):
    """EDGES_SCHEMA rows -> the anchor-document chunk rows (ordinal -2) of the
    nodes they link to (their AnchorTexts), each with its node's page from
    `targets` (the link targets, TARGET_COLUMNS, of the nodes that may be
    linked to), tokens counted by `spec`'s tokenizer."""

    def __init__(self, targets: beam.PCollection, spec: EmbedderSpec):
        super().__init__()
        self._targets, self._spec = targets, spec

    def expand(self, edges):
        anchors = edges | "AnchorTexts" >> AnchorTexts()
        pages = self._targets | "PageOfNode" >> beam.FlatMap(
            lambda r: [(r["node_id"], r["page_id"])] if r["page_id"] else [])
        return ({"anchors": anchors, "page": pages}
                | "JoinAnchorsAndPages" >> beam.CoGroupByKey()
                | "AnchoredNodes" >> beam.FlatMap(anchored_nodes)
                | "AnchorDocs" >> beam.ParDo(AnchorDocFn(self._spec)))

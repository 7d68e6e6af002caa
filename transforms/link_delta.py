"""The incremental update's link stages: the delta of the edges table and of the
anchor documents, so that the live rows after an update are those a fresh build
of the new input writes.

  UpdateEdges       the links of the pages indexed, and the stored links of the
                    unchanged pages that name a page whose nodes changed, resolved
                    against the nodes after the update; per source page, compared
                    with its live edges -> edges to write, sources to tombstone,
                    nodes whose in-links changed
  UpdateAnchorDocs  nodes whose in-links changed -> their anchor documents
                    recomputed from their live and new in-links: new rows, and
                    tombstones of the old ones

A source page's edges are one unit (EDGES_SCHEMA): when any of them changes, the
source is tombstoned (TOMBSTONES_SCHEMA.source_node_id) and all its edges are
written again; a page gone takes its edges with it. Only what changed is read
back: the sets of changed URLs, sources and nodes are side inputs (small: an
update's changes), against which the live edges and pages are filtered.
"""
from __future__ import annotations

from typing import Iterable

import apache_beam as beam

from ritrag.embedder import EmbedderSpec
from ritrag.ids import node_id_for
from ritrag.representation import ANCHOR_DOC_ORDINAL
from ritrag.transforms.edges import AnchorDocuments, ResolveEdges

TOMBSTONE = "tombstone"  # the tagged output of (TOMBSTONES_SCHEMA column, id) pairs
CHANGED_NODES = "changed_nodes"  # UpdateEdges' tagged output: nodes whose in-links changed
EdgeKey = tuple[int, str, str]  # (position, target node, anchor text): an edge of one source


def as_set(ids: beam.PCollection, label: str) -> beam.pvalue.AsDict:
    """A side input holding `ids` (an update's changes, small) for membership tests."""
    return beam.pvalue.AsDict(ids | f"{label}Distinct" >> beam.Distinct()
                              | f"{label}AsKeys" >> beam.Map(lambda i: (i, None)))


def names_any(page_links: tuple, urls: dict) -> bool:
    """Whether a page's (URL, links) names one of `urls`."""
    return any(link.url in urls for link in page_links[1])


def edge_key(edge: dict) -> EdgeKey:
    return edge["position"], edge["target_node_id"], edge["anchor_text"]


def source_delta(joined: tuple[str, dict]) -> Iterable:
    """One source page: its live edges ("old"), its edges resolved now ("new") and
    whether it is gone -> its edges to write (main), its tombstone (TOMBSTONE)
    and the targets of the edges it gains or loses (CHANGED_NODES); nothing when
    its edges are what they were."""
    source, group = joined
    old = {edge_key(e) for e in group["old"]}
    new = set() if group["gone"] else {edge_key(e) for e in group["new"]}
    if old == new:
        return
    if old:
        yield beam.pvalue.TaggedOutput(TOMBSTONE, ("source_node_id", source))
    for position, target, text in sorted(new):
        yield {"source_node_id": source, "position": position, "target_node_id": target, "anchor_text": text}
    for _, target, _ in old ^ new:
        yield beam.pvalue.TaggedOutput(CHANGED_NODES, target)


class UpdateEdges(beam.PTransform):
    """{"indexed": (URL, links) of the pages indexed, "unchanged": (URL, stored
    links) of the unchanged pages, "changed_urls": page URLs whose nodes changed,
    "gone": page nodes gone, "targets": every node a link may name after the
    update (TARGET_COLUMNS), "live_edges": the live edges rows} -> edges rows to
    write (main), (column, id) tombstones (TOMBSTONE), node ids whose in-links
    changed (CHANGED_NODES)."""

    def expand(self, inputs):
        changed_urls = as_set(inputs["changed_urls"], "ChangedUrls")
        relinked = inputs["unchanged"] | "NamingChangedUrls" >> beam.Filter(names_any, changed_urls)
        page_links = (inputs["indexed"], relinked) | "LinksToResolve" >> beam.Flatten()
        new = page_links | "Resolve" >> ResolveEdges(inputs["targets"])
        sources = ((page_links | "SourceIds" >> beam.Map(lambda pl: node_id_for(pl[0])), inputs["gone"])
                   | "Sources" >> beam.Flatten())
        old = inputs["live_edges"] | "OfSources" >> beam.Filter(
            lambda e, ids: e["source_node_id"] in ids, as_set(sources, "Sources"))
        return ({"old": old | "KeyOld" >> beam.Map(lambda e: (e["source_node_id"], e)),
                 "new": new | "KeyNew" >> beam.Map(lambda e: (e["source_node_id"], e)),
                 "gone": inputs["gone"] | "KeyGone" >> beam.Map(lambda i: (i, True))}
                | "JoinBySource" >> beam.CoGroupByKey()
                | "SourceDelta" >> beam.FlatMap(source_delta).with_outputs(TOMBSTONE, CHANGED_NODES, main="edges"))


def anchor_doc_delta(joined: tuple[str, dict]) -> Iterable:
    """One node whose in-links changed: its anchor document now ("new", none when
    nothing links to it with text) and its live one ("old", a chunk ref) -> the
    row to add (main) and the old one's tombstone (TOMBSTONE), unless equal."""
    _, group = joined
    new, old = list(group["new"]), list(group["old"])
    old_ids = {c["chunk_id"] for c in old}
    new_ids = {c["chunk_id"] for c in new}
    yield from (c for c in new if c["chunk_id"] not in old_ids)
    for c in old:
        if c["chunk_id"] not in new_ids:
            yield beam.pvalue.TaggedOutput(TOMBSTONE, ("chunk_id", (c["_file"], c["chunk_id"])))


class UpdateAnchorDocs(beam.PTransform):
    """{"changed_nodes": node ids whose in-links changed, "tombstoned": the
    ("source_node_id", id) tombstones of UpdateEdges, "edges": the edges it
    writes, "live_edges", "targets" (as UpdateEdges'), "live_chunks": live chunk
    refs} -> anchor-document rows to add (main) and chunk tombstones (TOMBSTONE)."""

    def __init__(self, spec: EmbedderSpec):
        super().__init__()
        self._spec = spec

    def expand(self, inputs):
        changed = as_set(inputs["changed_nodes"], "Changed")
        rewritten = as_set(inputs["tombstoned"] | "SourceIds" >> beam.Map(lambda kv: kv[1]), "Rewritten")
        kept = inputs["live_edges"] | "KeptInLinks" >> beam.Filter(
            lambda e, nodes, sources: e["target_node_id"] in nodes and e["source_node_id"] not in sources,
            changed, rewritten)
        written = inputs["edges"] | "NewInLinks" >> beam.Filter(lambda e, nodes: e["target_node_id"] in nodes, changed)
        targets = inputs["targets"] | "ChangedTargets" >> beam.Filter(lambda t, nodes: t["node_id"] in nodes, changed)
        new = ((kept, written) | "InLinks" >> beam.Flatten()
               | "AnchorDocuments" >> AnchorDocuments(targets, self._spec))
        old = inputs["live_chunks"] | "LiveAnchorDocs" >> beam.Filter(
            lambda c, nodes: c["ordinal"] == ANCHOR_DOC_ORDINAL and c["node_id"] in nodes, changed)
        return ({"new": new | "KeyNew" >> beam.Map(lambda c: (c["node_id"], c)),
                 "old": old | "KeyOld" >> beam.Map(lambda c: (c["node_id"], c))}
                | "JoinByNode" >> beam.CoGroupByKey()
                | "AnchorDocDelta" >> beam.FlatMap(anchor_doc_delta).with_outputs(TOMBSTONE, main="anchor_docs"))

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
update's changes), against which the live edges and chunks are filtered as
they are read (ReadLiveRows' `where`).
"""
from __future__ import annotations

from typing import Iterable

import apache_beam as beam

from ritrag.embedder import EmbedderSpec
from ritrag.ids import node_id_for
from ritrag.schema import EDGES_KIND, ChunkRef, ChunkRow, PageLinks, StoredTarget, row_links
from ritrag.reader import IndexReader
from ritrag.representation import ANCHOR_DOC_ORDINAL
from ritrag.transforms.edges import AnchorDocuments, ResolveEdges, link_target
from ritrag.transforms.tables import ReadLiveRows, as_set

TOMBSTONE = "tombstone"  # the tagged output of (TOMBSTONES_SCHEMA column, id) pairs
CHANGED_NODES = "changed_nodes"  # UpdateEdges' tagged output: nodes whose in-links changed
EdgeKey = tuple[int, str, str]  # (position, target node, anchor text): an edge of one source


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


def stored_targets(live: IndexReader, label: str, column: str, ids: beam.PCollection,
                   placed_sites: beam.PCollection, placed_pages: beam.PCollection) -> beam.PCollection:
    """The link targets of the `live` node rows whose `column` holds
    one of `ids`, on pages the update did not place (a page of a site placed
    again, or a page parsed again, has its targets from PlanPageUpdates)."""
    return (ids.pipeline
            | f"{label}Nodes" >> ReadLiveRows(live, "nodes", StoredTarget, where={column: ids})
            | f"{label}NotPlaced" >> beam.Filter(
                lambda r, sites, pages: r.site not in sites and r.page_id not in pages,
                as_set(placed_sites, f"{label}Sites"), as_set(placed_pages, f"{label}Pages"))
            | f"{label}Targets" >> beam.Map(link_target))


class UpdateEdges(beam.PTransform):
    """{"indexed": (URL, links) of the pages indexed, "dead_urls": the URLs of
    the live pages gone or parsed again, "changed_urls": page URLs whose nodes changed,
    "gone": page nodes gone, "targets": the nodes a link may name on the pages
    the update placed (TARGET_COLUMNS), "placed_sites" and "placed_pages": the
    sites and parsed pages it placed} -> edges rows to write (main), (column, id)
    tombstones (TOMBSTONE), node ids whose in-links changed (CHANGED_NODES).
    Of the `live` version, only the unchanged pages that link to a changed URL,
    the resolved sources' edges and the nodes of the pages linked to are read
    (`stored_targets`)."""

    def __init__(self, live: IndexReader):
        super().__init__()
        self._live = live

    def expand(self, inputs):
        relinked = (inputs["changed_urls"].pipeline
                    | "NamingChangedUrls" >> ReadLiveRows(self._live, "pages", PageLinks,
                                                          where={"links.url": inputs["changed_urls"]})
                    | "Unchanged" >> beam.Filter(lambda r, dead: r.url not in dead,
                                                 as_set(inputs["dead_urls"], "Dead"))
                    | "StoredLinks" >> beam.Map(lambda r: (r.url, row_links(r))))
        page_links = (inputs["indexed"], relinked) | "LinksToResolve" >> beam.Flatten()
        linked = page_links | "LinkedPages" >> beam.FlatMap(lambda pl: {node_id_for(link.url) for link in pl[1]})
        targets = ((inputs["targets"], stored_targets(self._live, "Linked", "page_id", linked,
                                                      inputs["placed_sites"], inputs["placed_pages"]))
                   | "AllTargets" >> beam.Flatten())
        new = page_links | "Resolve" >> ResolveEdges(targets)
        sources = ((page_links | "SourceIds" >> beam.Map(lambda pl: node_id_for(pl[0])), inputs["gone"])
                   | "Sources" >> beam.Flatten())
        old = sources.pipeline | "OfSources" >> ReadLiveRows(self._live, EDGES_KIND, where={"source_node_id": sources})
        return ({"old": old | "KeyOld" >> beam.Map(lambda e: (e["source_node_id"], e)),
                 "new": new | "KeyNew" >> beam.Map(lambda e: (e["source_node_id"], e)),
                 "gone": inputs["gone"] | "KeyGone" >> beam.Map(lambda i: (i, True))}
                | "JoinBySource" >> beam.CoGroupByKey()
                | "SourceDelta" >> beam.FlatMap(source_delta).with_outputs(TOMBSTONE, CHANGED_NODES, main="edges"))


def anchor_doc_delta(joined: tuple[str, dict]) -> Iterable:
    """One node whose in-links changed: its anchor document now ("new", a
    ChunkRow, none when nothing links to it with text) and its live one ("old",
    a chunk ref read back) -> the
    row to add (main) and the old one's tombstone (TOMBSTONE), unless equal."""
    _, group = joined
    new, old = list(group["new"]), list(group["old"])
    old_ids = {ref.chunk_id for ref in old}
    new_ids = {c.chunk_id for c in new}
    yield from (c for c in new if c.chunk_id not in old_ids)
    for ref in old:
        if ref.chunk_id not in new_ids:
            yield beam.pvalue.TaggedOutput(TOMBSTONE, ("chunk_id", ref))


class UpdateAnchorDocs(beam.PTransform):
    """{"changed_nodes": node ids whose in-links changed, "tombstoned": the
    ("source_node_id", id) tombstones of UpdateEdges, "edges": the edges it
    writes, "targets", "placed_sites", "placed_pages" (as UpdateEdges')} ->
    anchor-document rows to add (main) and chunk tombstones (TOMBSTONE). Of the
    `live` version, only the in-links, anchor documents and node rows of the
    changed nodes are read."""

    def __init__(self, live: IndexReader, spec: EmbedderSpec):
        super().__init__()
        self._live, self._spec = live, spec

    def expand(self, inputs):
        changed_ids = inputs["changed_nodes"]
        changed = as_set(changed_ids, "Changed")
        rewritten = as_set(inputs["tombstoned"] | "SourceIds" >> beam.Map(lambda kv: kv[1]), "Rewritten")
        kept = (changed_ids.pipeline
                | "InLinksOfChanged" >> ReadLiveRows(self._live, EDGES_KIND, where={"target_node_id": changed_ids})
                | "KeptInLinks" >> beam.Filter(lambda e, sources: e["source_node_id"] not in sources, rewritten))
        written = inputs["edges"] | "NewInLinks" >> beam.Filter(lambda e, nodes: e["target_node_id"] in nodes, changed)
        targets = ((inputs["targets"] | "PlacedChangedTargets" >> beam.Filter(lambda t, nodes: t["node_id"] in nodes, changed),
                    stored_targets(self._live, "Stored", "node_id", changed_ids, inputs["placed_sites"],
                                   inputs["placed_pages"]))
                   | "AllChangedTargets" >> beam.Flatten())
        new = ((kept, written) | "InLinks" >> beam.Flatten()
               | "AnchorDocuments" >> AnchorDocuments(targets, self._spec))
        old = (changed_ids.pipeline
               | "ChunksOfChanged" >> ReadLiveRows(self._live, "chunks", ChunkRef, where={"node_id": changed_ids})
               | "LiveAnchorDocs" >> beam.Filter(lambda c: c.ordinal == ANCHOR_DOC_ORDINAL))
        return ({"new": new | "KeyNew" >> beam.Map(lambda c: (c.node_id, c)),
                 "old": old | "KeyOld" >> beam.Map(lambda c: (c.node_id, c))}
                | "JoinByNode" >> beam.CoGroupByKey()
                | "AnchorDocDelta" >> beam.FlatMap(anchor_doc_delta).with_output_types(ChunkRow).with_outputs(
                    TOMBSTONE, main="anchor_docs"))

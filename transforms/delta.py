"""The incremental update's stages: a new input snapshot against the live
version -> the rows, chunks, tombstones and vectors of one delta segment.

  DiffInput            (transforms/diff.py) input files x live pages table: unchanged
                       (counted), new or changed (to parse), gone (a URL tombstone)
  ParseChangedPages    the new and changed files, parsed as the build parses them
  PlaceChangedForests  the forests of the sites whose skeletons changed, placed again;
                       a page parsed into the skeleton it had keeps its live placement
  PlanPageUpdates      per page: placement x page source x live rows -> `plan_page_update`
  ChunkRows            the new and changed pages' rows, chunked once final (after the
                       metadata stage, when there is one)
  ReplaceRows          re-placed rows of unchanged pages: bodies read back, chunked again
                       where the representation changed
  RemovedChunkTerms    the terms of tombstoned chunks, for signed BM25 deltas
  WriteTombstones      the segment's tombstones table
  ReuseOrEmbedVectors  a live chunk with the same text lends its stored vector; the
                       others go through the model

`plan_page_update` is pure: what one page contributes to the delta, tested
directly. The job (pipelines/update.py) strings these together.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Optional

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import BeamIOError, FileMetadata
from apache_beam.io.filesystems import FileSystems

from ritrag.ids import node_id_for
from ritrag.layout import TOMBSTONES_FILE
from ritrag.reader import IndexReader, read_rows_by_id
from ritrag.storage import is_remote, open_parquet
from ritrag.representation import ANCHOR_DOC_ORDINAL, Representation
from ritrag.schema import (TOMBSTONES_SCHEMA, ChunkRef, ChunkRow, DeadLetter, Link, NodePlacement, NodeRow,
                           NodeSkeleton, PageSkeleton, PageSource, ParsedPage, StoredSkeleton, page_row)
from ritrag.transforms import records  # noqa: F401  (the records' RowCoder)
from ritrag.transforms.chunk import Chunker
from ritrag.transforms.counts import COUNTS, CountingDoFn, record_counts
from ritrag.transforms.edges import link_target, node_targets
from ritrag.transforms.embed import EmbedChunks
from ritrag.transforms.nodes import DEPTH_CAPPED_COUNTER, PlaceSkeletons, page_node_rows, placement_row
from ritrag.transforms.pages import (COUNTERS, DEAD, PageParser, ParsePages, SpillPagesFn, chosen_source,
                                    duplicate_letter, placed_page)
from ritrag.transforms.sources import split_record_source
from ritrag.transforms.sparse import ChunkTerms, chunk_terms
from ritrag.transforms.tables import ReadLiveRows, as_set, parquet_bytes, write_bytes
from ritrag.transforms.sources.warc import read_record
from ritrag.vectors import VectorStore

PLACEMENT_FIELDS = ("parent_id", "site", "kind", "position", "depth", "title", "url",
                    "ancestor_ids", "ancestor_titles", "trail_method", "source_kind")
# A re-placed live row, before its body is read back, and whether its
# representation changed: then ReplaceRows reads its live chunk refs and chunks it again.
RowNeedingBody = tuple[NodeSkeleton, bool]


class OpenForParse(beam.DoFn):
    """Path -> a readable file for ParsePagesFn (the raw bytes were dropped after
    hashing), or a dead letter where the file cannot be opened now (gone since it
    was hashed)."""

    def __init__(self, max_page_bytes: int):
        self._max_page_bytes = max_page_bytes

    def process(self, path: str):
        in_file = split_record_source(path)
        if in_file is not None and in_file.warc_offset is not None:  # a WARC record (or a DeadLetter if unreadable)
            yield read_record(path, self._max_page_bytes)
            return
        try:
            # The path as it is: FileSystems.match would read a name's [ ] ? * as a
            # pattern (`notes[1].html` matched nothing, and failed the whole update).
            metadata = FileSystems.get_filesystem(path).metadata(path)
        except (BeamIOError, OSError) as exc:
            if is_remote(path) or not os.path.islink(path):
                yield DeadLetter(path, "read", "unreadable", f"{type(exc).__name__}: {exc}")
                return
            # A link to nothing: ParsePagesFn refuses it for the reason a build gives.
            metadata = FileMetadata(path, 0, last_updated_in_seconds=0.0)
        yield fileio.ReadableFile(metadata)


# --- which forests change -----------------------------------------------------

def reshaped_sites(joined: tuple[str, dict]) -> Iterable[str]:
    """One URL's skeletons parsed now ("new") and stored ("old") -> the sites
    whose forest they change: none when the page was parsed again into the
    skeleton it had (its text changed, not its place), else theirs. The input
    path a skeleton was read from is no part of the forest (it only chooses
    among several inputs at one URL, and then there are several)."""
    _, group = joined
    new, old = list(group["new"]), list(group["old"])
    if len(new) == 1 and len(old) == 1 and replace(new[0], source="") == replace(old[0], source=""):
        return
    yield from {s.site for s in new + old}


def live_placement(row: NodeSkeleton) -> NodePlacement:
    """The placement a live node row records."""
    values = {name: getattr(row, name) for name in PLACEMENT_FIELDS}
    return NodePlacement(row.node_id, **{name: tuple(v) if isinstance(v, list) else v for name, v in values.items()})


# --- page by page ---------------------------------------------------------------

@dataclass
class PagePlan:
    """What one page (or virtual node) contributes to the delta segment."""

    rows: list[NodeRow] = field(default_factory=list)  # node rows to write, bodies known
    # The live chunks of each row of `rows` to chunk (a page parsed again), by node
    # id: kept apart from the rows, which pass the metadata stage before ChunkRows.
    old_chunks: dict[str, list[ChunkRef]] = field(default_factory=dict)
    rows_needing_body: list[NodeSkeleton] = field(default_factory=list)  # re-placed live rows; body from their file
    rechunk: set[str] = field(default_factory=set)  # the node ids of those whose representation changed
    dead_nodes: list[str] = field(default_factory=list)
    dead_chunks: list[ChunkRef] = field(default_factory=list)
    dead_urls: list[str] = field(default_factory=list)  # pages-table rows
    page_rows: list[dict] = field(default_factory=list)  # pages-table rows to write
    # Its nodes a link may name after the update (TARGET_COLUMNS), the page URLs
    # whose set of such nodes the update changes, the links of the page indexed,
    # and the page node gone with its out-links.
    targets: list[dict] = field(default_factory=list)
    changed_target_urls: list[str] = field(default_factory=list)
    links: tuple[Link, ...] | None = None
    dead_source: str | None = None
    indexed: int = 0
    merged: int = 0
    depth_capped: int = 0  # sections of the page indexed placed at the depth cap


def replaced_placement(row: NodeSkeleton, placement: NodePlacement) -> NodeSkeleton:
    # Lists, as the row read back holds them: a row is re-placed when a field differs.
    values = {name: getattr(placement, name) for name in PLACEMENT_FIELDS}
    return row._replace(**{name: list(v) if isinstance(v, tuple) else v for name, v in values.items()})


def replaced_rows(placement: NodePlacement, old_rows: list[NodeSkeleton]) -> list[NodeSkeleton]:
    """Old rows of an unchanged page (the page and its sections) under the page's
    new placement: only the rows whose placement differs."""
    page = next(r for r in old_rows if r.node_id == placement.node_id)
    base = len(page.ancestor_ids)
    out = []
    for row in old_rows:
        if row.node_id == placement.node_id:
            new = replaced_placement(row, placement)
        else:
            new = row._replace(
                ancestor_ids=[*placement.ancestor_ids, placement.node_id, *row.ancestor_ids[base + 1:]],
                ancestor_titles=[*placement.ancestor_titles, placement.title, *row.ancestor_titles[base + 1:]],
                depth=placement.depth + (row.depth - page.depth),
                site=placement.site, trail_method=placement.trail_method, source_kind=placement.source_kind,
                parent_id=placement.node_id if row.parent_id == page.node_id else row.parent_id)
        if any(getattr(new, f) != getattr(row, f) for f in PLACEMENT_FIELDS):
            out.append(new)
    return out


def plan_page_update(placement: NodePlacement | None, page: ParsedPage | None, n_parsed: int,
                     old_rows: list[NodeSkeleton], old_chunks: list[ChunkRef], granularity: str,
                     representation: Representation) -> PagePlan:
    """`page_plan`, with the nodes of the group a link may name after it, and the
    page URLs whose such nodes it changes (the links to them are resolved again)."""
    plan = page_plan(placement, page, n_parsed, old_rows, old_chunks, granularity, representation)
    if page is not None and plan.indexed:
        plan.targets = [link_target(row) for row in plan.rows if row.page_id]
    elif placement is not None:
        plan.targets = [link_target(row) for row in old_rows if row.page_id]
    before = {t for row in old_rows for t in node_targets(link_target(row))}
    after = {t for row in plan.targets for t in node_targets(row)}
    plan.changed_target_urls = sorted({url for url, _ in before ^ after})
    return plan


def page_plan(placement: NodePlacement | None, page: ParsedPage | None, n_parsed: int,
              old_rows: list[NodeSkeleton], old_chunks: list[ChunkRef], granularity: str,
              representation: Representation) -> PagePlan:
    """The delta of one group: a page (its placement, the page indexed of the
    `n_parsed` freshly parsed at its URL, its live node rows and chunk refs) or a
    virtual/site node. `page` is None when nothing was parsed at the URL, or when
    the page indexed could not be read again (then it is dead-lettered).

    A re-placed row whose representation changed (its path, in a path-aware
    representation) is in the plan's `rechunk`: it is chunked again once its body and its
    live chunks are read back (ReplaceRows, `rechunk_replaced`). Each row of a
    page parsed again has the refs of its live chunks, from
    `old_chunks`, in the plan's `old_chunks`: it is chunked by `ChunkRows`. `old_chunks` need
    only be given for pages parsed again or gone (PlanPageUpdates reads no others).
    Anchor documents are the link stages' (transforms/link_delta.py): they die
    here only with their node's page."""
    plan = PagePlan()
    old_ids = [r.node_id for r in old_rows]
    if placement is None:  # deleted, or merged into another page by its canonical link
        plan.merged = n_parsed
        plan.dead_nodes = old_ids
        plan.dead_chunks = list(old_chunks)
        # Its pages row goes too, so that the page is parsed afresh if it comes back.
        plan.dead_urls = [r.url for r in old_rows if r.kind == "page" and r.node_id == r.page_id]
        plan.dead_source = next((r.node_id for r in old_rows if r.node_id == r.page_id), None)
        return plan
    old_chunks = [c for c in old_chunks if c.ordinal != ANCHOR_DOC_ORDINAL]
    plan.merged = max(n_parsed - 1, 0)
    if placement.kind != "page" or (page is None and not old_rows):  # no text: no chunks
        old = old_rows[0] if old_rows else None
        row = placement_row(placement)
        if old is None or any(getattr(old, f) != getattr(row, f) for f in PLACEMENT_FIELDS):
            plan.rows = [row]
            plan.dead_nodes = old_ids
        return plan
    if page is not None:
        plan.indexed = 1
        plan.rows, plan.depth_capped = page_node_rows(placement, page, granularity)
        plan.page_rows = [page_row(page)]
        plan.links = page.links
        plan.dead_nodes = old_ids
        # The rows are chunked later (`ChunkRows`, after the metadata stage that
        # may change their node documents): each carries the live chunks of its
        # node id; those of node ids the page no longer has die here.
        kept = {row.node_id for row in plan.rows}
        plan.old_chunks = {row.node_id: [c for c in old_chunks if c.node_id == row.node_id] for row in plan.rows}
        plan.dead_chunks = [c for c in old_chunks if c.node_id not in kept]
        return plan
    plan.rows_needing_body = replaced_rows(placement, old_rows)
    plan.dead_nodes = [r.node_id for r in plan.rows_needing_body]
    old_by_id = {r.node_id: r for r in old_rows}
    # Their live chunks are read with their bodies (ReplaceRows): an unchanged
    # page's chunks are not among the group's (PlanPageUpdates).
    plan.rechunk = {row.node_id for row in plan.rows_needing_body
                    if (representation.node_inputs(with_body(row, ""))
                        != representation.node_inputs(with_body(old_by_id[row.node_id], "")))}
    return plan


def with_body(row: NodeSkeleton, body: str) -> NodeRow:
    """A live node row read without its body, as a node row with `body` (with
    "": what `Representation.node_inputs` reads of it)."""
    return NodeRow(**{name: getattr(row, name) for name in NodeRow._fields if name != "body"}, body=body)


@beam.typehints.with_output_types(NodeRow)
class UpdatePagesFn(CountingDoFn):
    """One group -> node rows, chunk rows and tombstones of the delta segment; the
    page indexed is read back from its spill file, or read and parsed again
    (`placed_page`: shuffles carry its source, not its text). OLD_CHUNKS: (node
    id, its live chunk refs) of each node row to chunk (`PagePlan.old_chunks`)."""

    NEED_BODY, CHUNKS, PAGES, TOMBSTONE, OLD_CHUNKS = "need_body", "chunks", "pages", "tombstone", "old_chunks"
    # For the link stages: TARGETS, PagePlan.targets; CHANGED_TARGETS, its
    # changed_target_urls; LINKS, (URL, links) of a page indexed; GONE, dead_source.
    TARGETS, CHANGED_TARGETS, LINKS, GONE = "targets", "changed_targets", "links", "gone"

    def __init__(self, representation: Representation, granularity: str, parser: PageParser):
        super().__init__(COUNTERS)
        self._granularity, self._parser = granularity, parser
        self._representation = representation

    def process(self, joined):
        _, g = joined
        placements = list(g["placement"])
        sources = list(g["parsed"])
        chosen, losers = chosen_source(sources)
        page = placed_page(self._parser, chosen) if placements and chosen else None
        for loser in losers if placements else ():  # as the build's NodeRowsFn: counted merged (plan.merged)
            yield beam.pvalue.TaggedOutput(DEAD, duplicate_letter(loser, chosen))
        if isinstance(page, DeadLetter):
            self.count("pages_dead_lettered")
            yield beam.pvalue.TaggedOutput(DEAD, page)
            page = None
        plan = plan_page_update(placements[0] if placements else None, page, len(sources),
                                list(g["old_nodes"]), list(g["old_chunks"]), self._granularity,
                                self._representation)
        self.count("pages_indexed", plan.indexed)
        self.count("pages_merged_duplicates", plan.merged)
        self.count(DEPTH_CAPPED_COUNTER, plan.depth_capped)
        yield from plan.rows
        for node_id, refs in plan.old_chunks.items():
            yield beam.pvalue.TaggedOutput(self.OLD_CHUNKS, (node_id, refs))
        for row in plan.rows_needing_body:
            yield beam.pvalue.TaggedOutput(self.NEED_BODY, (row, row.node_id in plan.rechunk))
        for row in plan.page_rows:
            yield beam.pvalue.TaggedOutput(self.PAGES, row)
        for node_id in plan.dead_nodes:
            yield beam.pvalue.TaggedOutput(self.TOMBSTONE, ("node_id", node_id))
        for url in plan.dead_urls:
            yield beam.pvalue.TaggedOutput(self.TOMBSTONE, ("url", url))
        for ref in plan.dead_chunks:
            yield beam.pvalue.TaggedOutput(self.TOMBSTONE, ("chunk_id", ref))
        for target in plan.targets:
            yield beam.pvalue.TaggedOutput(self.TARGETS, target)
        for url in plan.changed_target_urls:
            yield beam.pvalue.TaggedOutput(self.CHANGED_TARGETS, url)
        if plan.links:
            yield beam.pvalue.TaggedOutput(self.LINKS, (page.url, plan.links))
        if plan.dead_source:
            yield beam.pvalue.TaggedOutput(self.GONE, plan.dead_source)


RowToChunk = tuple[NodeRow, Optional[list[ChunkRef]]]  # a node row and its live chunks, None: not to chunk


def attach_bodies(file_and_rows: tuple[str, Iterable[RowNeedingBody]]) -> Iterable[tuple[NodeRow, bool]]:
    """Re-placed live rows of one file (without bodies) -> (each as a node row,
    its body read back; whether to chunk it again)."""
    path, rows = file_and_rows
    rows = list(rows)
    found = read_rows_by_id(path, "node_id", [row.node_id for row, _ in rows], ["body"])
    for row, rechunk in rows:
        yield with_body(row, found[row.node_id]["body"]), rechunk


def attach_old_chunks(joined: tuple[str, dict]) -> Iterable[RowToChunk]:
    """A re-placed row (and whether to chunk it again) and its node's live
    chunk refs -> the row, with those refs when it is to be chunked, else None."""
    _, group = joined
    old = sorted(group["old"])
    for row, rechunk in group["row"]:
        yield row, old if rechunk else None


def with_old_chunks(joined: tuple[str, dict]) -> Iterable[RowToChunk]:
    """A node row and the live chunk refs PlanPageUpdates gave its node id (none
    for a row not to chunk) -> (the row, those refs or None)."""
    _, group = joined
    refs = list(group["old"])
    for row in group["row"]:
        yield row, refs[0] if refs else None


def rechunk_replaced(row: NodeRow, old: list[ChunkRef] | None, chunker: Callable[[NodeRow], list[ChunkRow]]
                     ) -> tuple[list[ChunkRow], list[ChunkRef]]:
    """(chunks to add, live chunks to tombstone) of a node row with its body
    and its live chunks `old`: a row with `old` (None: not to chunk) is
    chunked again; chunks whose id survives are kept as they are."""
    if old is None:
        return [], []
    new = chunker(row)
    new_ids, old_ids = {c.chunk_id for c in new}, {ref.chunk_id for ref in old}
    return [c for c in new if c.chunk_id not in old_ids], [ref for ref in old if ref.chunk_id not in new_ids]


@beam.typehints.with_output_types(NodeRow)
class RechunkReplacedFn(CountingDoFn):
    """(node row with its body, its live chunks or None) -> the row; chunks
    (CHUNKS) and chunk tombstones (TOMBSTONE) of those to chunk again."""

    def __init__(self, chunker: Chunker):
        super().__init__(COUNTERS)
        self._chunker = chunker

    def process(self, row_and_old: RowToChunk) -> Iterable[NodeRow]:
        row, old = row_and_old
        chunks, dead = rechunk_replaced(row, old, self._chunker)
        self.count("chunks_added", len(chunks))
        yield row
        for chunk in chunks:
            yield beam.pvalue.TaggedOutput(UpdatePagesFn.CHUNKS, chunk)
        for ref in dead:
            yield beam.pvalue.TaggedOutput(UpdatePagesFn.TOMBSTONE, ("chunk_id", ref))


def removed_chunk_terms(file_and_ids: tuple[str, Iterable[int]], representation: Representation
                        ) -> Iterable[ChunkTerms]:
    path, ids = file_and_ids
    for chunk_id, row in read_rows_by_id(path, "chunk_id", sorted(set(ids)), ["text", "ordinal"]).items():
        yield chunk_terms(chunk_id, row["ordinal"], row["text"], representation)


def write_tombstones(out_dir: str, dead: list[tuple[str, object]]) -> None:
    """`dead`: (column of TOMBSTONES_SCHEMA, id) pairs."""
    rows = [{**dict.fromkeys(TOMBSTONES_SCHEMA.names), column: value}
            for column, value in sorted(set(dead), key=lambda kv: (kv[0], str(kv[1])))]
    write_bytes(os.path.join(out_dir, TOMBSTONES_FILE), parquet_bytes(rows, TOMBSTONES_SCHEMA))


def tombstone_counts(path: str) -> dict[str, int]:
    table = open_parquet(path).read()
    return {column: len(table) - table[column].null_count for column in table.column_names}


# --- vectors: reuse by text, embed the rest -----------------------------------------

def split_reuse(joined: tuple[str, dict]) -> Iterable:
    """Per text hash: new chunks whose text a live chunk has -> (new id, live id) on
    the main output; the others -> (id, text) on 'embed'."""
    _, g = joined
    live = sorted(ref.chunk_id for ref in g["live"])
    for chunk in g["new"]:
        if live:
            yield chunk.chunk_id, live[0]
        else:
            yield beam.pvalue.TaggedOutput("embed", (chunk.chunk_id, chunk.embedded_text))


class ReadStoredVectorsFn(CountingDoFn):
    """(new chunk id, live chunk id) -> (new chunk id, the live chunk's stored
    vector). The files are not hashed whole (`IndexReader.sized_paths`): the
    store checks the chunks it reads (`VectorShard`'s `checked`), so a
    one-page update reads megabytes of a store of gigabytes, not all of it."""

    def __init__(self, vector_files: list[str]):
        super().__init__(COUNTERS)
        self._files = vector_files

    def setup(self):
        self._store = VectorStore.open(self._files, checked=True)

    def process(self, pair: tuple[int, int]):
        new_id, live_id = pair
        self.count("chunks_reused_vectors")
        yield new_id, self._store.vectors([live_id])[0]


# --- the stages, as composite transforms ------------------------------------------

class PlaceChangedForests(beam.PTransform):
    """{"parsed": parsed pages, "old_skeletons", "gone_sites" and "dead_urls"
    (DiffInput's)} -> {"placements": the placement of every node
    whose page changed or whose site's forest changed, "live_nodes": the live node
    rows of the same pages (NodeSkeleton), "sites": the sites placed again,
    "pages": the ids of the pages parsed}.

    A site's forest is a function of its pages' skeletons (PlaceSkeletons): it is
    placed again only when a page of it came, went or was parsed into another
    skeleton. A page parsed again into the skeleton it had keeps its live
    placement, and the other pages of its site are not the update's business, so
    an edit costs its page, not its site."""

    def __init__(self, live: IndexReader):
        super().__init__()
        self._live = live

    def expand(self, inputs):
        parsed = inputs["parsed"] | "ParsedSkeletons" >> beam.Map(PageSkeleton.of)
        reshaped = ((inputs["gone_sites"],
                     {"new": parsed | "KeyParsedByUrl" >> beam.Map(lambda sk: (sk.url, sk)),
                      "old": inputs["old_skeletons"]}
                     | "JoinSkeletonsByUrl" >> beam.CoGroupByKey()
                     | "ChangedForests" >> beam.FlatMap(reshaped_sites))
                    | "AllReshaped" >> beam.Flatten()
                    | "DistinctSites" >> beam.Distinct())
        sites = as_set(reshaped, "Reshaped")
        pipeline = parsed.pipeline
        # The stored skeletons of the unchanged pages of those sites.
        unchanged = (pipeline
                     | "PagesOfSites" >> ReadLiveRows(self._live, "pages", StoredSkeleton, where={"site": reshaped})
                     | "Unchanged" >> beam.Filter(lambda r, dead: r.url not in dead,
                                                  as_set(inputs["dead_urls"], "Dead"))
                     | "StoredSkeletons" >> beam.Map(PageSkeleton.from_row))
        placed = ((unchanged, parsed | "OfReshapedSites" >> beam.Filter(lambda sk, placed: sk.site in placed, sites))
                  | "AllSkeletons" >> beam.Flatten()
                  | "Place" >> PlaceSkeletons())
        parsed_ids = inputs["parsed"] | "ParsedIds" >> beam.Map(lambda pg: node_id_for(pg.url))
        of_sites = pipeline | "NodesOfSites" >> ReadLiveRows(self._live, "nodes", NodeSkeleton,
                                                             where={"site": reshaped})
        of_pages = (pipeline
                    | "NodesOfParsed" >> ReadLiveRows(self._live, "nodes", NodeSkeleton, where={"page_id": parsed_ids})
                    | "OutsideSites" >> beam.Filter(lambda r, placed: r.site not in placed, sites))
        kept = of_pages | "KeptPlacements" >> beam.FlatMap(
            lambda r: [live_placement(r)] if r.node_id == r.page_id else [])
        return {"placements": (placed, kept) | "Placements" >> beam.Flatten(),
                "live_nodes": (of_sites, of_pages) | "LiveNodes" >> beam.Flatten(),
                "sites": reshaped, "pages": parsed_ids}


class ParseChangedPages(beam.PTransform):
    """Paths of new and changed files -> parsed pages ("pages") and dead letters (DEAD)."""

    def __init__(self, parser: PageParser):
        super().__init__()
        self._parser = parser

    def expand(self, paths):
        return (paths
                | "Open" >> beam.ParDo(OpenForParse(self._parser.max_page_bytes))
                | "Parse" >> ParsePages(self._parser, count_read=False))


class PlanPageUpdates(beam.PTransform):
    """{"placements": NodePlacement, "pages": parsed pages, "live_nodes": live node rows
    (NodeSkeleton), "dead_urls": the URLs of live pages gone or parsed again}, joined
    by page with the live chunk refs (ChunkRef) of the pages parsed again or gone ->
    node rows (main) and UpdatePagesFn's NEED_BODY, OLD_CHUNKS, PAGES, TOMBSTONE, ... and DEAD outputs.
    Only those pages' chunks are read: an unchanged page's are the update's business only
    when it is re-placed under a new path, and ReplaceRows reads those. With `spill_dir`,
    the pages are written there as they come and read back (`SpillPagesFn`): a stage
    that changed a page after its parse (--induce_toc llm) must not be undone by parsing
    it again."""

    def __init__(self, live: IndexReader, representation: Representation, granularity: str, parser: PageParser,
                 spill_dir: str | None = None):
        super().__init__()
        self._live = live
        self._fn = UpdatePagesFn(representation, granularity, parser)
        self._spill_dir = spill_dir

    def expand(self, inputs):
        if self._spill_dir:
            parsed = (inputs["pages"]
                      | "SpillPages" >> beam.ParDo(SpillPagesFn(self._spill_dir))
                      | "KeySpilledById" >> beam.MapTuple(lambda url, source: (node_id_for(url), source)))
        else:
            parsed = inputs["pages"] | "KeySourceById" >> beam.Map(
                lambda pg: (node_id_for(pg.url), PageSource.of(pg)))
        touched = ((parsed | "ParsedIds" >> beam.Keys(), inputs["dead_urls"] | "GoneIds" >> beam.Map(node_id_for))
                   | "TouchedPages" >> beam.Flatten())
        old_chunks = inputs["pages"].pipeline | "OldChunks" >> ReadLiveRows(
            self._live, "chunks", ChunkRef, where={"page_id": touched})
        return record_counts(
            {"placement": inputs["placements"] | "KeyPlacement" >> beam.Map(lambda n: (n.node_id, n)),
             "parsed": parsed,
             "old_nodes": inputs["live_nodes"] | "KeyOldNodeByPage" >> beam.Map(
                 lambda r: (r.page_id or r.node_id, r)),
             "old_chunks": old_chunks | "KeyOldChunkByPage" >> beam.Map(lambda c: (c.page_id, c))}
            | "JoinByPage" >> beam.CoGroupByKey()
            | "PlanPages" >> beam.ParDo(self._fn).with_outputs(
                UpdatePagesFn.NEED_BODY, UpdatePagesFn.OLD_CHUNKS, UpdatePagesFn.PAGES, UpdatePagesFn.TOMBSTONE, UpdatePagesFn.TARGETS,
                UpdatePagesFn.CHANGED_TARGETS, UpdatePagesFn.LINKS, UpdatePagesFn.GONE,
                DEAD, COUNTS, main="nodes"))


class ReplaceRows(beam.PTransform):
    """Re-placed rows without bodies -> the rows with their bodies read back (main),
    and the CHUNKS and TOMBSTONE outputs of those chunked again (those marked
    to be: their live chunk refs are read back too, by node id)."""

    def __init__(self, live: IndexReader, chunker: Chunker):
        super().__init__()
        self._live, self._chunker = live, chunker

    def expand(self, rows):
        rechunked = rows | "RechunkIds" >> beam.FlatMap(lambda rr: [rr[0].node_id] if rr[1] else [])
        old = (rows.pipeline
               | "OldChunks" >> ReadLiveRows(self._live, "chunks", ChunkRef, where={"node_id": rechunked})
               | "NoAnchorDocs" >> beam.Filter(lambda c: c.ordinal != ANCHOR_DOC_ORDINAL))
        with_bodies = (rows
                       | "KeyByFile" >> beam.Map(lambda rr: (rr[0].file, rr))
                       | "GroupByFile" >> beam.GroupByKey()
                       | "AttachBodies" >> beam.FlatMap(attach_bodies))
        return record_counts(
            {"row": with_bodies | "KeyRowByNode" >> beam.Map(lambda rr: (rr[0].node_id, rr)),
             "old": old | "KeyOldByNode" >> beam.Map(lambda c: (c.node_id, c))}
            | "JoinByNode" >> beam.CoGroupByKey()
            | "AttachOldChunks" >> beam.FlatMap(attach_old_chunks)
            | "RechunkReplaced" >> beam.ParDo(RechunkReplacedFn(self._chunker)).with_outputs(
                UpdatePagesFn.CHUNKS, UpdatePagesFn.TOMBSTONE, COUNTS, main="nodes"))


class ChunkRows(beam.PTransform):
    """Node rows -> the rows (main) and the CHUNKS and TOMBSTONE outputs of
    those that `old_chunks` (PlanPageUpdates' OLD_CHUNKS: (node id, live chunk
    refs)) names (`rechunk_replaced`): the new and changed pages' rows of
    PlanPageUpdates, chunked once their metadata is final."""

    def __init__(self, chunker: Chunker, old_chunks: beam.PCollection):
        super().__init__()
        self._chunker, self._old_chunks = chunker, old_chunks
        self.with_input_types(NodeRow)

    def expand(self, rows):
        return record_counts(
            {"row": rows | "KeyRowByNode" >> beam.Map(lambda r: (r.node_id, r)), "old": self._old_chunks}
            | "JoinOldChunks" >> beam.CoGroupByKey()
            | "WithOldChunks" >> beam.FlatMap(with_old_chunks)
            | "Rechunk" >> beam.ParDo(RechunkReplacedFn(self._chunker)).with_outputs(
                UpdatePagesFn.CHUNKS, UpdatePagesFn.TOMBSTONE, COUNTS, main="nodes"))


class RemovedChunkTerms(beam.PTransform):
    """Tombstones ((column, id) pairs) -> (sign, term frequencies) of the removed chunks."""

    def __init__(self, representation: Representation):
        super().__init__()
        self._representation = representation

    def expand(self, dead):
        return (dead
                | "DeadChunks" >> beam.Filter(lambda kv: kv[0] == "chunk_id")
                | "DeadChunkByFile" >> beam.Map(lambda kv: (kv[1].file, kv[1].chunk_id))
                | "GroupDeadByFile" >> beam.GroupByKey()
                | "RemovedTerms" >> beam.FlatMap(removed_chunk_terms, self._representation))


class WriteTombstones(beam.PTransform):
    """Tombstones ((column, id) pairs; a chunk's as its ChunkRef) -> the segment's tombstones table."""

    def __init__(self, out_dir: str):
        super().__init__()
        self._out_dir = out_dir

    def expand(self, dead):
        out_dir = self._out_dir
        return (dead
                | "TombstoneIds" >> beam.Map(lambda kv: (kv[0], kv[1].chunk_id) if kv[0] == "chunk_id" else kv)
                | "AllTombstones" >> beam.combiners.ToList()
                | "Write" >> beam.Map(lambda d: write_tombstones(out_dir, d)))


class ReuseOrEmbedVectors(beam.PTransform):
    """New chunk rows -> (chunk id, vector) of every new row the representation
    embeds (`Representation.embeds`): the stored vector of a live row with the
    same text, else the model's. Only the live chunk refs whose text hash a
    new row has are read."""

    def __init__(self, live: IndexReader, embed: EmbedChunks, representation: Representation):
        super().__init__()
        self._live = live
        self._vector_files = live.sized_paths("vectors")
        self._embed = embed
        self._representation = representation

    def expand(self, chunks):
        embeds = self._representation.embeds
        chunks = chunks | "Embedded" >> beam.Filter(lambda c: embeds(c.ordinal))
        live = chunks.pipeline | "SameText" >> ReadLiveRows(
            self._live, "chunks", ChunkRef, where={"text_hash": chunks | "TextHashes" >> beam.Map(
                lambda c: c.text_hash)})
        split = (
            {"new": chunks | "KeyNewByText" >> beam.Map(lambda c: (c.text_hash, c)),
             # Only a live row with a vector has one to lend.
             "live": live | "KeyLiveByText" >> beam.FlatMap(
                 lambda c: [(c.text_hash, c)] if embeds(c.ordinal) else [])}
            | "JoinByText" >> beam.CoGroupByKey()
            | "SplitReuse" >> beam.FlatMap(split_reuse).with_outputs("embed", main="reuse"))
        reused = record_counts(split["reuse"] | "StoredVectors" >> beam.ParDo(
            ReadStoredVectorsFn(self._vector_files)).with_outputs(COUNTS, main="vectors")).vectors
        embedded = split["embed"] | "Embed" >> self._embed
        return (reused, embedded) | "AllVectors" >> beam.Flatten()

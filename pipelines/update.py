"""Incremental re-index: a new input snapshot -> a delta segment on the live version.

    python -m pipelines.update --input DIR_OR_GLOB --index INDEX [runner options]

1. Diff: every input file is hashed and joined by URL with the live pages table:
   unchanged (same raw bytes), new or changed (parsed), deleted (tombstoned).
2. Forest: recomputed for every site from skeletons only: the stored skeletons of
   unchanged pages and the parsed ones of new and changed pages, so moved pages
   land under their new parents and children of deleted pages re-attach. Node ids
   depend on URLs alone, so unchanged pages keep theirs.
3. Page by page (`plan_page_update`): new and changed pages get new node rows and
   chunks; unchanged pages whose placement changed get re-placed rows (bodies read
   back from the live segment); nodes and chunks that no longer exist become
   tombstones. Chunks whose id survives are not touched.
4. New chunks reuse the stored vector of any live chunk with the same text (the
   model never runs on text it has embedded); the rest are embedded and added to
   a copy of the live trained dense index.
5. BM25: postings of the new chunks plus signed deltas of document frequencies,
   N and total length, so global statistics stay exact.
6. Publish: the delta segment, then a manifest listing the live segments plus the
   delta, then CURRENT.

Options that shape the index (base URL, site depth, granularity, model, shards,
representation) come from the live manifest: an update cannot change them, and
one that asks for another representation (--chunk_template, --path_levels,
--node_docs) is refused before anything runs: rebuild instead.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.build import (COUNTERS, DEAD, PAGE_COUNTERS, InputOptions, PageParser, ParsePagesFn,
                             chosen_source, reread_page,
                             counter_values, required,
                             count_input_files, input_root_and_pattern, page_node_rows,
                             place_site, placement_row, prepare_job, publish_and_prune, representation_of,
                             run_pipeline,
                             write_dead_letters)
from ritrag.embedder import EmbedderSpec
from ritrag.representation import Representation, refuse_mixing
from ritrag.ids import node_id_for, normalize_url, raw_hash
from ritrag.layout import (TOMBSTONES_FILE, DeadIds, IndexLayout, Manifest, dead_ids_per_segment,
                           live_mask, new_manifest)
from ritrag.schema import (CHUNKS_SCHEMA, NODES_SCHEMA, PAGES_SCHEMA, TOMBSTONES_SCHEMA, DeadLetter, NodePlacement,
                           PageSkeleton, PageSource, ParsedPage, WarcPage, page_row)
from transforms.chunk import node_chunker
from transforms.progress import LogProgress
from transforms.sparse import BM25_STATS_FILE, BuildSparseIndex, chunk_terms
from transforms.tables import WriteParquetTable, parquet_bytes, write_bytes
from transforms.warc import ReadWarcInput, is_warc_input, read_record, split_record_source

LOG = logging.getLogger("ritrag.update")
UPDATE_COUNTERS = PAGE_COUNTERS + ("pages_unchanged", "pages_deleted", "pages_replaced",
                                   "chunks_added", "chunks_reused_vectors")
PLACEMENT_FIELDS = ("parent_id", "site", "kind", "position", "depth", "title", "url",
                    "ancestor_ids", "ancestor_titles", "trail_method")
NODE_SKELETON_COLUMNS = [f.name for f in NODES_SCHEMA if f.name != "body"]
CHUNK_REF_COLUMNS = ["chunk_id", "node_id", "page_id", "text_hash"]


class IndexOptions(PipelineOptions):
    """Options of every job that changes a published index (update, compact)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--index", help="index directory with a published version")


class UpdateOptions(InputOptions, IndexOptions):
    """--input (the new snapshot) and --index."""


@dataclass(frozen=True)
class LiveFile:
    """One table file of the live version, with the ids later segments killed."""

    path: str
    dead: DeadIds


@dataclass(frozen=True)
class LiveIndex:
    """The live version's files by kind; computed once by the launcher."""

    manifest: Manifest
    files: dict[str, list[LiveFile]]

    @classmethod
    def open(cls, layout: IndexLayout) -> "LiveIndex":
        manifest = layout.load_manifest()
        dead = dead_ids_per_segment(layout, manifest)
        files: dict[str, list[LiveFile]] = {}
        for segment, seg_dead in zip(manifest.segments, dead):
            for kind in ("pages", "nodes", "chunks", "dense", "vectors"):
                for name in layout.segment_files(segment, kind):
                    files.setdefault(kind, []).append(
                        LiveFile(layout.verified_path(segment, name), seg_dead))
        return cls(manifest, files)


def live_rows(live_file: LiveFile, kind: str, columns: list[str] | None = None) -> Iterable[dict]:
    """Rows of one table file that no later segment tombstoned; each row carries
    `_file`, the file it came from, for later point reads."""
    table = pq.read_table(live_file.path, columns=columns)
    key, dead = {"pages": ("url", live_file.dead.urls), "nodes": ("node_id", live_file.dead.node_ids),
                 "chunks": ("chunk_id", live_file.dead.chunk_ids)}[kind]
    for row in table.filter(live_mask(table[key], dead)).to_pylist():
        row["_file"] = live_file.path
        yield row


class ReadLiveRows(beam.PTransform):
    def __init__(self, live: LiveIndex, kind: str, columns: list[str] | None = None):
        super().__init__()
        self._files, self._kind, self._columns = live.files.get(kind, []), kind, columns

    def expand(self, pbegin):
        kind, columns = self._kind, self._columns
        return (pbegin
                | "Files" >> beam.Create(self._files)
                | "Rows" >> beam.FlatMap(lambda f: live_rows(f, kind, columns)))


def read_rows_by_id(path: str, id_column: str, ids: list, columns: list[str]) -> dict:
    """Point reads: the rows of `ids` from one sorted Parquet file (row-group
    statistics prune what is not needed)."""
    table = pq.read_table(path, columns=[id_column, *columns],
                          filters=pc.field(id_column).isin(pa.array(ids)))
    return {row[id_column]: row for row in table.to_pylist()}


# --- 1. diff -----------------------------------------------------------------------

@dataclass(frozen=True)
class InputFile:
    path: str
    raw_hash: str


class ClassifyFn(beam.DoFn):
    """Per URL: unchanged -> stored skeleton; new/changed -> to parse; gone -> tombstone."""

    PARSE, DEAD_URL = "parse", "dead_url"

    def __init__(self):
        self._read = beam.metrics.Metrics.counter(COUNTERS, "pages_read")
        self._unchanged = beam.metrics.Metrics.counter(COUNTERS, "pages_unchanged")
        self._deleted = beam.metrics.Metrics.counter(COUNTERS, "pages_deleted")
        self._replaced = beam.metrics.Metrics.counter(COUNTERS, "pages_replaced")

    def process(self, joined):
        url, group = joined
        inputs, old = list(group["input"]), list(group["old"])
        self._read.inc(len(inputs))
        if not inputs:
            self._deleted.inc()
            yield beam.pvalue.TaggedOutput(self.DEAD_URL, url)
            return
        if len(inputs) == 1 and len(old) == 1 and inputs[0].raw_hash == old[0]["raw_hash"]:
            self._unchanged.inc()
            yield PageSkeleton.from_row(old[0])
            return
        if old:
            self._replaced.inc()
            yield beam.pvalue.TaggedOutput(self.DEAD_URL, url)
        for item in inputs:
            yield beam.pvalue.TaggedOutput(self.PARSE, item.path)


class HashInputFn(beam.DoFn):
    """An input file -> (its URL, its path and raw hash). A file the parser
    refuses to open (outside the input, not a regular file) is not read: its
    empty hash matches no page, so it goes to ParsePagesFn, which dead-letters it."""

    def __init__(self, parser: PageParser):
        self._parser = parser

    def process(self, readable: fileio.ReadableFile | WarcPage | DeadLetter):
        if isinstance(readable, WarcPage):  # a WARC input's record: its URL is in it
            yield normalize_url(readable.url), InputFile(readable.source, raw_hash(readable.payload))
            return
        if isinstance(readable, DeadLetter):  # an unreadable WARC record: read again by ParsePagesFn, dead-lettered
            yield readable.source, InputFile(readable.source, "")
            return
        path = readable.metadata.path
        digest = "" if self._parser.refusal(path) else raw_hash(readable.read())
        yield normalize_url(self._parser.locate(path)[0]), InputFile(path, digest)


class OpenForParse(beam.DoFn):
    """Path -> a readable file for ParsePagesFn (the raw bytes were dropped after hashing)."""

    def process(self, path: str):
        if split_record_source(path):  # a WARC record (or a DeadLetter if it cannot be read)
            yield read_record(path)
            return
        yield fileio.ReadableFile(FileSystems.match([path])[0].metadata_list[0])


# --- 3. page by page ---------------------------------------------------------------

@dataclass
class PagePlan:
    """What one page (or virtual node) contributes to the delta segment."""

    rows: list[dict] = field(default_factory=list)  # node rows to write, bodies known
    rows_needing_body: list[dict] = field(default_factory=list)  # re-placed rows; body from `_file`
    chunks: list[dict] = field(default_factory=list)  # chunk rows to add
    dead_nodes: list[str] = field(default_factory=list)
    dead_chunks: list[tuple[str, int]] = field(default_factory=list)  # (file, chunk id)
    dead_urls: list[str] = field(default_factory=list)  # pages-table rows
    page_rows: list[dict] = field(default_factory=list)  # pages-table rows to write
    indexed: int = 0
    merged: int = 0


def replaced_placement(row: dict, placement: NodePlacement) -> dict:
    new = dict(row)
    for name in PLACEMENT_FIELDS:
        value = getattr(placement, name)
        new[name] = list(value) if isinstance(value, tuple) else value
    return new


def replaced_rows(placement: NodePlacement, old_rows: list[dict]) -> list[dict]:
    """Old rows of an unchanged page (the page and its sections) under the page's
    new placement: only the rows whose placement differs."""
    page = next(r for r in old_rows if r["node_id"] == placement.node_id)
    base = len(page["ancestor_ids"])
    out = []
    for row in old_rows:
        if row["node_id"] == placement.node_id:
            new = replaced_placement(row, placement)
        else:
            new = dict(row)
            new["ancestor_ids"] = [*placement.ancestor_ids, placement.node_id, *row["ancestor_ids"][base + 1:]]
            new["ancestor_titles"] = [*placement.ancestor_titles, placement.title,
                                      *row["ancestor_titles"][base + 1:]]
            new["depth"] = placement.depth + (row["depth"] - page["depth"])
            new["site"], new["trail_method"] = placement.site, placement.trail_method
            if row["parent_id"] == page["node_id"]:
                new["parent_id"] = placement.node_id
        if any(new[f] != row[f] for f in PLACEMENT_FIELDS):
            out.append(new)
    return out


def plan_page_update(placement: NodePlacement | None, page: ParsedPage | None, n_parsed: int,
                     old_rows: list[dict], old_chunks: list[dict], granularity: str,
                     chunker: Callable[[dict], list[dict]], representation: Representation) -> PagePlan:
    """The delta of one group: a page (its placement, the page indexed of the
    `n_parsed` freshly parsed at its URL, its live node rows and chunk refs) or a
    virtual/site node. `page` is None when nothing was parsed at the URL, or when
    the page indexed could not be read again (then it is dead-lettered).

    A re-placed row whose representation changed (its path, in a path-aware
    representation) carries `_old_chunks`, the (file, chunk id) of its live
    chunks: it is chunked again once its body is read back (`rechunk_replaced`)."""
    plan = PagePlan()
    old_ids = [r["node_id"] for r in old_rows]
    if placement is None:  # deleted, or merged into another page by its canonical link
        plan.merged = n_parsed
        plan.dead_nodes = old_ids
        plan.dead_chunks = [(c["_file"], c["chunk_id"]) for c in old_chunks]
        # Its pages row goes too, so that the page is parsed afresh if it comes back.
        plan.dead_urls = [r["url"] for r in old_rows if r["kind"] == "page" and r["node_id"] == r["page_id"]]
        return plan
    plan.merged = max(n_parsed - 1, 0)
    if placement.kind != "page" or (page is None and not old_rows):  # no text: no chunks
        old = old_rows[0] if old_rows else None
        row = placement_row(placement)
        if old is None or any(old[f] != row[f] for f in PLACEMENT_FIELDS):
            plan.rows = [row]
            plan.dead_nodes = old_ids
        return plan
    if page is not None:
        plan.indexed = 1
        plan.rows = page_node_rows(placement, page, granularity)
        plan.page_rows = [page_row(page)]
        plan.dead_nodes = old_ids
        new_chunks = [c for row in plan.rows for c in chunker(row)]
        new_ids = {c["chunk_id"] for c in new_chunks}
        old_ids_set = {c["chunk_id"] for c in old_chunks}
        plan.chunks = [c for c in new_chunks if c["chunk_id"] not in old_ids_set]
        plan.dead_chunks = [(c["_file"], c["chunk_id"]) for c in old_chunks if c["chunk_id"] not in new_ids]
        return plan
    plan.rows_needing_body = replaced_rows(placement, old_rows)
    plan.dead_nodes = [r["node_id"] for r in plan.rows_needing_body]
    old_by_id = {r["node_id"]: r for r in old_rows}
    for row in plan.rows_needing_body:
        if representation.node_inputs(row) != representation.node_inputs(old_by_id[row["node_id"]]):
            row["_old_chunks"] = [(c["_file"], c["chunk_id"]) for c in old_chunks if c["node_id"] == row["node_id"]]
    return plan


class UpdatePagesFn(beam.DoFn):
    """One group -> node rows, chunk rows and tombstones of the delta segment; the
    page indexed is read and parsed again (shuffles carry its source, not its text)."""

    NEED_BODY, CHUNKS, PAGES, TOMBSTONE = "need_body", "chunks", "pages", "tombstone"

    def __init__(self, spec: EmbedderSpec, representation: Representation, granularity: str, parser: PageParser):
        self._spec, self._granularity, self._parser = spec, granularity, parser
        self._representation = representation
        self._indexed = beam.metrics.Metrics.counter(COUNTERS, "pages_indexed")
        self._merged = beam.metrics.Metrics.counter(COUNTERS, "pages_merged_duplicates")
        self._dead = beam.metrics.Metrics.counter(COUNTERS, "pages_dead_lettered")
        self._added = beam.metrics.Metrics.counter(COUNTERS, "chunks_added")

    def setup(self):
        self._chunker = node_chunker(self._spec, self._representation)

    def process(self, joined):
        _, g = joined
        placements = list(g["placement"])
        sources = list(g["parsed"])
        chosen, _ = chosen_source(sources)
        page = reread_page(self._parser, chosen) if placements and chosen else None
        if isinstance(page, DeadLetter):
            self._dead.inc()
            yield beam.pvalue.TaggedOutput(DEAD, page)
            page = None
        plan = plan_page_update(placements[0] if placements else None, page, len(sources),
                                list(g["old_nodes"]), list(g["old_chunks"]), self._granularity,
                                self._chunker, self._representation)
        self._indexed.inc(plan.indexed)
        self._merged.inc(plan.merged)
        self._added.inc(len(plan.chunks))
        yield from plan.rows
        for row in plan.rows_needing_body:
            yield beam.pvalue.TaggedOutput(self.NEED_BODY, row)
        for chunk in plan.chunks:
            yield beam.pvalue.TaggedOutput(self.CHUNKS, chunk)
        for row in plan.page_rows:
            yield beam.pvalue.TaggedOutput(self.PAGES, row)
        for node_id in plan.dead_nodes:
            yield beam.pvalue.TaggedOutput(self.TOMBSTONE, ("node_id", node_id))
        for url in plan.dead_urls:
            yield beam.pvalue.TaggedOutput(self.TOMBSTONE, ("url", url))
        for file, chunk_id in plan.dead_chunks:
            yield beam.pvalue.TaggedOutput(self.TOMBSTONE, ("chunk_id", (file, chunk_id)))


def attach_bodies(file_and_rows: tuple[str, Iterable[dict]]) -> Iterable[dict]:
    path, rows = file_and_rows
    rows = list(rows)
    found = read_rows_by_id(path, "node_id", [r["node_id"] for r in rows], ["body"])
    for row in rows:
        yield {**{k: v for k, v in row.items() if k != "_file"}, "body": found[row["node_id"]]["body"]}


def rechunk_replaced(row: dict, chunker: Callable[[dict], list[dict]]
                     ) -> tuple[dict, list[dict], list[tuple[str, int]]]:
    """(the node row, chunks to add, (file, chunk id) to tombstone) of a re-placed
    row with its body: one that carries `_old_chunks` is chunked again; chunks
    whose id survives are kept as they are."""
    old = row.get("_old_chunks")
    row = {k: v for k, v in row.items() if k != "_old_chunks"}
    if old is None:
        return row, [], []
    new = chunker(row)
    new_ids, old_ids = {c["chunk_id"] for c in new}, {chunk_id for _, chunk_id in old}
    return (row, [c for c in new if c["chunk_id"] not in old_ids],
            [(f, chunk_id) for f, chunk_id in old if chunk_id not in new_ids])


class RechunkReplacedFn(beam.DoFn):
    """Re-placed node rows (bodies attached) -> the rows; chunks (CHUNKS) and
    chunk tombstones (TOMBSTONE) of those whose representation changed."""

    def __init__(self, spec: EmbedderSpec, representation: Representation):
        self._spec, self._representation = spec, representation
        self._added = beam.metrics.Metrics.counter(COUNTERS, "chunks_added")

    def setup(self):
        self._chunker = node_chunker(self._spec, self._representation)

    def process(self, row: dict):
        row, chunks, dead = rechunk_replaced(row, self._chunker)
        self._added.inc(len(chunks))
        yield row
        for chunk in chunks:
            yield beam.pvalue.TaggedOutput(UpdatePagesFn.CHUNKS, chunk)
        for file, chunk_id in dead:
            yield beam.pvalue.TaggedOutput(UpdatePagesFn.TOMBSTONE, ("chunk_id", (file, chunk_id)))


def removed_chunk_terms(file_and_ids: tuple[str, Iterable[int]], representation: Representation
                        ) -> Iterable[tuple[int, dict]]:
    path, ids = file_and_ids
    for chunk_id, row in read_rows_by_id(path, "chunk_id", sorted(set(ids)), ["text", "ordinal"]).items():
        yield chunk_terms({"chunk_id": chunk_id, **row}, representation)


def write_tombstones(out_dir: str, dead: list[tuple[str, object]]) -> None:
    """`dead`: (column of TOMBSTONES_SCHEMA, id) pairs."""
    rows = [{"node_id": None, "chunk_id": None, "url": None, column: value}
            for column, value in sorted(set(dead), key=lambda kv: (kv[0], str(kv[1])))]
    write_bytes(os.path.join(out_dir, TOMBSTONES_FILE), parquet_bytes(rows, TOMBSTONES_SCHEMA))


def tombstone_counts(path: str) -> dict[str, int]:
    table = pq.read_table(path)
    return {column: len(table) - table[column].null_count for column in table.column_names}


# --- 4. vectors: reuse by text, embed the rest -----------------------------------------

def split_reuse(joined: tuple[str, dict]) -> Iterable:
    """Per text hash: new chunks whose text a live chunk has -> (new id, live id) on
    the main output; the others -> (id, text) on 'embed'."""
    _, g = joined
    live = sorted(r["chunk_id"] for r in g["live"])
    for chunk in g["new"]:
        if live:
            yield chunk["chunk_id"], live[0]
        else:
            yield beam.pvalue.TaggedOutput("embed", (chunk["chunk_id"], chunk["embedded_text"]))


class ReadStoredVectorsFn(beam.DoFn):
    """(new chunk id, live chunk id) -> (new chunk id, the live chunk's stored vector)."""

    def __init__(self, vector_files: list[str]):
        self._files = vector_files
        self._reused = beam.metrics.Metrics.counter(COUNTERS, "chunks_reused_vectors")

    def setup(self):
        from ritrag.vectors import VectorStore

        self._store = VectorStore.open(self._files)

    def process(self, pair: tuple[int, int]):
        new_id, live_id = pair
        self._reused.inc()
        yield new_id, self._store.vectors([live_id])[0]


def update_pipeline(p: beam.Pipeline, options: PipelineOptions, live: LiveIndex, segment_dir: str,
                    total_files: int) -> None:
    from transforms.dense import BuildDenseIndex, trained_empty_index_of
    from transforms.embed import EmbedChunks

    opts = options.view_as(UpdateOptions)
    config = live.manifest.config
    spec = EmbedderSpec.from_dict(config["embedder"])
    representation = Representation.from_config(config)
    num_shards, granularity = config["num_shards"], config["granularity"]
    root, pattern = input_root_and_pattern(opts.input)

    old_pages = (p | "LivePages" >> ReadLiveRows(live, "pages")
                 | "KeyOldPageByUrl" >> beam.Map(lambda r: (r["url"], r)))
    # The sites' public bases the build inferred (config.site_bases) key the pages as they did then.
    parser = PageParser(root, config["base_url"], config["site_depth"], opts.max_page_bytes,
                        opts.follow_links_outside_input).with_site_bases(config.get("site_bases"))
    files = (p | "ReadWarc" >> ReadWarcInput(pattern) if is_warc_input(pattern)
             else p | "MatchFiles" >> fileio.MatchFiles(pattern) | "ReadMatches" >> fileio.ReadMatches())
    inputs = files | "HashInputs" >> beam.ParDo(HashInputFn(parser))
    diff = ({"input": inputs, "old": old_pages}
            | "JoinByUrl" >> beam.CoGroupByKey()
            | "Classify" >> beam.ParDo(ClassifyFn()).with_outputs(ClassifyFn.PARSE, ClassifyFn.DEAD_URL,
                                                                   main="unchanged"))
    parsed = (diff[ClassifyFn.PARSE]
              | "Open" >> beam.ParDo(OpenForParse())
              | "Parse" >> beam.ParDo(ParsePagesFn(parser, count_read=False)).with_outputs(DEAD, main="pages"))
    pages = parsed["pages"] | "ParseProgress" >> LogProgress("parse (changed pages)")

    placements = (
        (diff["unchanged"], pages | "Skeleton" >> beam.Map(PageSkeleton.of))
        | "AllSkeletons" >> beam.Flatten()
        | "KeyBySite" >> beam.Map(lambda s: (s.site, s))
        | "GroupBySite" >> beam.GroupByKey()
        | "PlaceSite" >> beam.FlatMap(place_site)
        | "KeyPlacement" >> beam.Map(lambda n: (n.node_id, n)))
    old_nodes = (p | "LiveNodes" >> ReadLiveRows(live, "nodes", NODE_SKELETON_COLUMNS)
                 | "KeyOldNodeByPage" >> beam.Map(lambda r: (r["page_id"] or r["node_id"], r)))
    old_chunks = p | "LiveChunks" >> ReadLiveRows(live, "chunks", CHUNK_REF_COLUMNS)
    delta = (
        {"placement": placements,
         "parsed": pages | "KeySourceById" >> beam.Map(lambda pg: (node_id_for(pg.url), PageSource.of(pg))),
         "old_nodes": old_nodes,
         "old_chunks": old_chunks | "KeyOldChunkByPage" >> beam.Map(lambda c: (c["page_id"], c))}
        | "JoinByPage" >> beam.CoGroupByKey()
        | "PlanPages" >> beam.ParDo(UpdatePagesFn(spec, representation, granularity, parser)).with_outputs(
            UpdatePagesFn.NEED_BODY, UpdatePagesFn.CHUNKS, UpdatePagesFn.PAGES, UpdatePagesFn.TOMBSTONE, DEAD,
            main="nodes"))
    ((parsed[DEAD], delta[DEAD])
     | "DeadLetters" >> beam.Flatten()
     | "AllDeadLetters" >> beam.combiners.ToList()
     | "WriteDeadLetters" >> beam.Map(lambda letters: write_dead_letters(segment_dir, letters)))

    replaced = (delta[UpdatePagesFn.NEED_BODY]
                | "KeyByFile" >> beam.Map(lambda r: (r["_file"], r))
                | "GroupByFile" >> beam.GroupByKey()
                | "AttachBodies" >> beam.FlatMap(attach_bodies)
                | "RechunkReplaced" >> beam.ParDo(RechunkReplacedFn(spec, representation)).with_outputs(
                    UpdatePagesFn.CHUNKS, UpdatePagesFn.TOMBSTONE, main="nodes"))
    ((delta["nodes"], replaced["nodes"]) | "AllNodes" >> beam.Flatten()
     | "WriteNodes" >> WriteParquetTable(segment_dir, "nodes", NODES_SCHEMA, "node_id", num_shards))
    delta[UpdatePagesFn.PAGES] | "WritePages" >> WriteParquetTable(segment_dir, "pages", PAGES_SCHEMA, "url",
                                                                   num_shards)
    dead = ((delta[UpdatePagesFn.TOMBSTONE], replaced[UpdatePagesFn.TOMBSTONE],
             diff[ClassifyFn.DEAD_URL] | "DeadUrls" >> beam.Map(lambda u: ("url", u)))
            | "AllDead" >> beam.Flatten())
    (dead
     | "TombstoneIds" >> beam.Map(lambda kv: (kv[0], kv[1][1]) if kv[0] == "chunk_id" else kv)
     | "AllTombstones" >> beam.combiners.ToList()
     | "WriteTombstones" >> beam.Map(lambda d: write_tombstones(segment_dir, d)))

    chunks = (delta[UpdatePagesFn.CHUNKS], replaced[UpdatePagesFn.CHUNKS]) | "AllChunks" >> beam.Flatten()
    chunks | "WriteChunks" >> WriteParquetTable(segment_dir, "chunks", CHUNKS_SCHEMA, "chunk_id", num_shards)
    removed = (dead
               | "DeadChunks" >> beam.Filter(lambda kv: kv[0] == "chunk_id")
               | "DeadChunkByFile" >> beam.Map(lambda kv: kv[1])
               | "GroupDeadByFile" >> beam.GroupByKey()
               | "RemovedTerms" >> beam.FlatMap(removed_chunk_terms, representation))
    chunks | "Sparse" >> BuildSparseIndex(segment_dir, num_shards, representation, removed=removed)

    split = (
        {"new": chunks | "KeyNewByText" >> beam.Map(lambda c: (c["text_hash"], c)),
         "live": old_chunks | "KeyLiveByText" >> beam.Map(lambda c: (c["text_hash"], c))}
        | "JoinByText" >> beam.CoGroupByKey()
        | "SplitReuse" >> beam.FlatMap(split_reuse).with_outputs("embed", main="reuse"))
    reused = split["reuse"] | "StoredVectors" >> beam.ParDo(
        ReadStoredVectorsFn([f.path for f in live.files.get("vectors", [])]))
    embedded = split["embed"] | "Embed" >> EmbedChunks.from_options(spec, options, device=opts.embed_device)
    trained = trained_empty_index_of(live.files["dense"][0].path)
    ((reused, embedded) | "AllVectors" >> beam.Flatten()
     | "Dense" >> BuildDenseIndex(segment_dir, num_shards, trained=trained))


def publish_update(layout: IndexLayout, live: LiveIndex, segment_id: str, counts: dict[str, int],
                   tombstones: dict[str, int], elapsed_s: float, options: PipelineOptions) -> str:
    segment_dir = layout.segment_dir(segment_id)
    with open(os.path.join(segment_dir, BM25_STATS_FILE), encoding="utf-8") as fh:
        delta = json.load(fh)
    previous = live.manifest.stats["bm25"]
    n_chunks = previous["n_chunks"] + delta["n_chunks"]
    n_terms = previous["n_terms"] + delta["n_terms"]
    bm25 = {"n_chunks": n_chunks, "n_terms": n_terms, "avg_chunk_terms": n_terms / n_chunks if n_chunks else 0.0}
    segment = layout.describe_segment(segment_id, live.manifest.config["num_shards"], counts)
    totals = {k: live.manifest.tombstones.get(k, 0) + n for k, n in tombstones.items()}
    manifest = new_manifest(
        layout, segments=[*live.manifest.segments, segment],
        stats={"bm25": bm25, "pages": counts, "update_seconds": round(elapsed_s, 1)},
        config=live.manifest.config, tombstones=totals)
    return publish_and_prune(layout, manifest, options)


def run(argv: list[str] | None = None) -> str:
    """Run an incremental update; returns the published version name."""
    options = PipelineOptions(argv)
    opts = required(options, UpdateOptions, "input", "index")
    live_representation = Representation.from_config(IndexLayout(opts.index).load_manifest().config)
    refuse_mixing(live_representation, representation_of(options, live_representation))
    with prepare_job(options, opts.index, "update") as (layout, segment_id, segment_dir):
        live = LiveIndex.open(layout)
        started = time.time()
        total_files = count_input_files(input_root_and_pattern(opts.input)[1])
        LOG.info("updating %s (live %s) from %s (%d files) into %s", opts.index, live.manifest.version,
                 opts.input, total_files, segment_dir)
        result = run_pipeline(options, segment_dir,
                              lambda p: update_pipeline(p, options, live, segment_dir, total_files))
        counts = counter_values(result, UPDATE_COUNTERS)
        accounted = (counts["pages_unchanged"] + counts["pages_indexed"] + counts["pages_dead_lettered"]
                     + counts["pages_merged_duplicates"])
        if accounted != counts["pages_read"]:
            raise RuntimeError(f"page accounting mismatch: read {counts['pages_read']} but unchanged + indexed + "
                               f"dead-lettered + merged = {accounted}; not publishing")
        dead = tombstone_counts(os.path.join(segment_dir, TOMBSTONES_FILE))
        published = publish_update(layout, live, segment_id, counts, dead, time.time() - started, options)
        LOG.info("published %s in %.1f s: %s", published, time.time() - started,
                 ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
        return published


if __name__ == "__main__":
    # force: importing Beam has already configured the root logger (at WARNING)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    run()

"""Incremental re-index: a new input snapshot -> a delta segment on the live version.

    python -m ritrag.pipelines.update --input DIR_OR_GLOB --index INDEX [runner options]

1. Diff (transforms/diff.py): every input file is joined by URL with the live
   pages table: unchanged (the size and mtime its page was indexed with, not
   read; else the same raw bytes, read and hashed), new or changed (parsed),
   deleted (tombstoned).
2. Forest: recomputed from skeletons only for every site whose skeletons changed
   (a page came, went, or was parsed into another title, trail or canonical):
   the stored skeletons of its unchanged pages and the parsed ones of its new and
   changed pages, so moved pages land under their new parents and children of
   deleted pages re-attach. A page parsed into the skeleton it had keeps its live
   placement, and the rest of its site is not read. Node ids depend on URLs alone,
   so unchanged pages keep theirs.
3. Page by page (`plan_page_update`): new and changed pages get new node rows and
   chunks; unchanged pages whose placement changed get re-placed rows (bodies read
   back from the live segment); nodes and chunks that no longer exist become
   tombstones. Chunks whose id survives are not touched. When the index was built
   with --induce_toc llm, the new and changed long PDFs without an outline are first
   cut at the model's verified headings, as the build cuts them (docs/METADATA.md);
   when with model metadata, the new and changed pages' nodes are described by the
   model first (cache first: docs/METADATA.md), then chunked. Both ask the endpoint
   --metadata_endpoint names.
4. New chunks reuse the stored vector of any live chunk with the same text (the
   model never runs on text it has embedded); the rest are embedded and added to
   a copy of the live trained dense index.
5. Links (transforms/link_delta.py): the links of the pages indexed, and the
   stored links of unchanged pages that name a page whose nodes changed, are
   resolved against the nodes after the update; a source whose edges differ
   from its live ones is tombstoned and written again, a page gone takes its
   edges along; the nodes whose in-links changed get their anchor documents
   again. The live edges and anchor documents are then a fresh build's.
6. BM25: postings of the new chunks and anchor documents plus signed deltas of
   document frequencies, N and total length, so global statistics stay exact.
7. Publish: the delta segment, then a manifest listing the live segments plus the
   delta, then CURRENT.

What shaped the index (its IndexConfig: base URL, site depth, granularity,
model, shards, representation, dense index, what a chat model is asked) is the
live manifest's: an update cannot change it, and a command line whose flags
ask for another config is refused before anything runs: rebuild instead. An
index built with a chat model needs --metadata_endpoint (where that model is
served) on every update, and one built without cannot be given one.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time

import apache_beam as beam
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions

from ritrag.pipelines.launcher import (BuildOptions, IndexOptions, PublishOptions, check_input_folder,
                                       check_page_accounting, job_counts, job_options, prepare_job, publish_and_prune,
                                       refuse_emptying, required, run_pipeline)
from ritrag.pipelines.options import JobFlags, JobOptionsError, given_flags, merge_flags
from ritrag.bm25 import corpus_stats
from ritrag.embedder import check_backend_available, check_model_files
from ritrag.flags import from_arguments
from ritrag.index_config import MODEL_STEP_ENTRIES, IndexConfig, ModelSteps
from ritrag.layout import BM25_STATS_FILE, DEAD_LETTERS_FILE, IndexLayout, TOMBSTONES_FILE, new_manifest
from ritrag.schema import EDGES_KIND, TABLES
from ritrag.reader import IndexReader, read_trained_dense_index
from ritrag.storage import open_read, remove_tree
from ritrag.transforms.delta import (ChunkRows, PlaceChangedForests, ParseChangedPages, PlanPageUpdates,
                                     RemovedChunkTerms, ReplaceRows, ReuseOrEmbedVectors, UpdatePagesFn,
                                     WriteTombstones, tombstone_counts)
from ritrag.transforms.chunk import Chunker
from ritrag.transforms.diff import STAMP_COUNTER, ClassifyShardFn, DiffInput, DiffOptions
from ritrag.transforms.counts import WriteCounts
from ritrag.transforms.dense import TRAINED, VECTORS, ReadTrainedIndex
from ritrag.transforms.edges import EDGE_COUNTERS
from ritrag.transforms.embed import EmbedChunks, EmbedOptions
from ritrag.transforms.nodes import SITES_PLACED_COUNTER
from ritrag.transforms.metadata.enrich import METADATA_COUNTERS, EnrichNodeMetadata, MetadataOptions, MetadataPlan
from ritrag.transforms.metadata.induce_toc import (PAGES, SPENT, TOC_COUNTERS, InduceTocFromModel, TocPlan,
                                                   asked_steps)
from ritrag.transforms.link_delta import CHANGED_NODES, TOMBSTONE, UpdateAnchorDocs, UpdateEdges
from ritrag.transforms.pages import (DEAD, PAGE_COUNTERS, InputOptions, PageParser, WriteDeadLetters,
                                     input_root_and_pattern)
from ritrag.transforms.progress import SECTIONS_CAPPED_COUNTER, CountSectionsCapped, LogProgress
from ritrag.transforms.segment import SPARSE, WriteSegment
from ritrag.transforms.sparse import BuildSparseIndex
from ritrag.transforms.tables import spill_location

LOG = logging.getLogger("ritrag.update")
UPDATE_COUNTERS = PAGE_COUNTERS + ("pages_unchanged", STAMP_COUNTER, "pages_deleted", "pages_replaced",
                                   "chunks_added", "chunks_reused_vectors", SECTIONS_CAPPED_COUNTER,
                                   SITES_PLACED_COUNTER) + EDGE_COUNTERS
UPDATE_METADATA_COUNTERS = UPDATE_COUNTERS + METADATA_COUNTERS


class UpdateOptions(InputOptions, IndexOptions, DiffOptions):
    """--input (the new snapshot), --index and how the diff reads the input."""


# BuildOptions are accepted so that one command line serves a refresh's first
# build and its later updates; given explicitly, each must match the live index.
FLAGS: JobFlags = merge_flags({InputOptions: None, IndexOptions: None, DiffOptions: None, BuildOptions: None,
                               EmbedOptions: None, MetadataOptions: None, PublishOptions: None}, without=("out",))


def refuse_reshaping(live: IndexConfig, given: dict[str, object]) -> None:
    """An update keeps the config the live index was built with; flags that ask
    for another are refused before anything runs (they would otherwise be
    ignored, or mix two kinds of chunks in one index)."""
    try:
        changes = live.changes_asked(given)
    except ValueError as exc:  # a flag value no config takes (a template without {body})
        raise JobOptionsError(str(exc)) from None
    if changes:
        raise JobOptionsError(f"an update cannot change what the index was built with: {'; '.join(changes)}; "
                              f"rebuild the index (ritrag build) to change it")


def refuse_a_silent_model_mismatch(steps: ModelSteps, endpoint: str | None) -> None:
    """An update asks the index's model what its build asked (`steps`, the
    live config's) of the new and changed pages, so that every node is made
    one way; without the endpoint it would leave them described differently
    from the rest, and an endpoint for an index built without a model would
    describe only them: both are refused before anything runs."""
    if steps.model is None and endpoint is not None:
        raise JobOptionsError("--metadata_endpoint: the index was built without a model (no model metadata, no "
                              "--induce_toc llm), and an update cannot add one to some pages: rebuild the index "
                              "(ritrag build) with --metadata_endpoint and --metadata_model")
    if steps.model is not None and endpoint is None:
        asked = [what for what, on in (
            ("a summary and keywords per node", steps.describes_nodes),
            (f"the headings of PDFs of at least {steps.induce_toc_min_pages} pages without an outline "
             f"(--induce_toc llm)", steps.induces_toc)) if on]
        raise JobOptionsError(f"the index was built asking the model {steps.model!r} for {' and '.join(asked)}, "
                              f"and an update asks the same of its new and changed pages: give --metadata_endpoint, "
                              f"the URL of an endpoint serving {steps.model!r}")


def update_pipeline(p: beam.Pipeline, options: PipelineOptions, live: IndexReader, segment_dir: str,
                    metadata: MetadataPlan | None = None, toc: TocPlan | None = None) -> None:
    """The update's data flow (docs/ARCHITECTURE.md): stages compute PCollections,
    then sinks write them, the delta segment into `segment_dir`; with `toc`, the new
    and changed long PDFs without an outline are cut at the model's headings; with
    `metadata`, the new and changed pages' nodes are described by the model (cache first)."""
    opts = options.view_as(UpdateOptions)
    config = live.manifest.settings.index
    spec, representation, num_shards = config.embedder, config.representation, config.num_shards
    check_backend_available(spec)  # before any work: new chunks must be embedded like the live ones
    check_model_files(spec)  # and by the same model folder, when the index names one
    chunker = Chunker(spec, representation)  # the build's chunking: new and changed nodes, re-placed ones
    root, pattern = input_root_and_pattern(opts.input)
    # The sites' public bases the build inferred (config.site_bases) key the pages as they did then.
    parser = from_arguments(PageParser, opts, root=root, base_url=config.page_base_url,
                            site_depth=config.site_depth).with_site_bases(live.manifest.settings.site_bases)
    # Diff: unchanged pages keep their stored skeleton; new and changed ones are parsed.
    diff = p | "Diff" >> DiffInput(pattern, parser, live, opts.read_every_input)
    parsed = diff["parse"] | "ParseChanged" >> ParseChangedPages(parser)
    # Only new and changed pages are parsed, and how many there are is known only
    # once the diff has hashed every input: their progress is a count and a rate,
    # no share of the input files (one changed page of 296 read "0.3% of 296, ETA 4h35m").
    pages = (parsed["pages"]
             | "CountSectionsCapped" >> CountSectionsCapped()
             | "ParseProgress" >> LogProgress("parse (changed pages)"))
    toc_spent = None  # the tokens of the budget the ToC stage admitted: the metadata stage's budget is what is left
    if toc is not None:
        induced = pages | "InduceToc" >> InduceTocFromModel(toc, os.path.basename(segment_dir))
        pages, toc_spent = induced[PAGES], induced.get(SPENT)
    # Forest: the sites whose skeletons changed placed again, from skeletons
    # only; the pages parsed into the skeleton they had keep their placement.
    # Of the live tables, only the rows these pages and sites touch are read
    # (ReadLiveRows' `where`), so an edit costs its page, not the index.
    placed = ({"parsed": pages, "old_skeletons": diff[ClassifyShardFn.OLD_SKELETON],
               "gone_sites": diff[ClassifyShardFn.GONE_SITE], "dead_urls": diff[ClassifyShardFn.DEAD_URL]}
              | "PlaceChanged" >> PlaceChangedForests(live))
    # Page by page: new rows and chunks, re-placed rows, tombstones.
    delta = ({"placements": placed["placements"], "pages": pages, "live_nodes": placed["live_nodes"],
              "dead_urls": diff[ClassifyShardFn.DEAD_URL]}
             | "PlanPages" >> PlanPageUpdates(live, representation, config.granularity, parser,
                                             spill_location(segment_dir, "pages") if toc else None))
    replaced = delta[UpdatePagesFn.NEED_BODY] | "ReplaceRows" >> ReplaceRows(live, chunker)
    planned = delta["nodes"]
    if metadata is not None:
        planned = planned | "EnrichNodeMetadata" >> EnrichNodeMetadata(metadata, os.path.basename(segment_dir),
                                                                          toc_spent)
    changed = planned | "ChunkRows" >> ChunkRows(chunker, delta[UpdatePagesFn.OLD_CHUNKS])
    nodes = (changed["nodes"], replaced["nodes"]) | "AllNodes" >> beam.Flatten()
    # Links: the edges of the sources whose edges changed; the anchor documents of
    # the nodes whose in-links changed.
    targets = delta[UpdatePagesFn.TARGETS]
    edges = ({"indexed": delta[UpdatePagesFn.LINKS], "dead_urls": diff[ClassifyShardFn.DEAD_URL],
              "changed_urls": delta[UpdatePagesFn.CHANGED_TARGETS], "gone": delta[UpdatePagesFn.GONE],
              "targets": targets, "placed_sites": placed["sites"], "placed_pages": placed["pages"]}
             | "Edges" >> UpdateEdges(live))
    dead_parts = [delta[UpdatePagesFn.TOMBSTONE], changed[UpdatePagesFn.TOMBSTONE], replaced[UpdatePagesFn.TOMBSTONE],
                  edges[TOMBSTONE],
                  diff[ClassifyShardFn.DEAD_URL] | "DeadUrls" >> beam.Map(lambda u: ("url", u))]
    # Chunks, sparse (signed deltas of the global statistics) and dense (into the live trained index).
    chunks = (changed[UpdatePagesFn.CHUNKS], replaced[UpdatePagesFn.CHUNKS]) | "AllChunks" >> beam.Flatten()
    indexed = chunks
    if representation.anchor_docs:
        anchor_docs = ({"changed_nodes": edges[CHANGED_NODES], "tombstoned": edges[TOMBSTONE],
                        "edges": edges["edges"], "targets": targets, "placed_sites": placed["sites"],
                        "placed_pages": placed["pages"]}
                       | "AnchorDocs" >> UpdateAnchorDocs(live, spec))
        dead_parts.append(anchor_docs[TOMBSTONE])
        indexed = (chunks, anchor_docs["anchor_docs"]) | "ChunksAndAnchorDocs" >> beam.Flatten()
    dead = dead_parts | "AllDead" >> beam.Flatten()
    removed = dead | "Removed" >> RemovedChunkTerms(representation)
    sparse = indexed | "Sparse" >> BuildSparseIndex(representation, removed=removed)
    vectors = chunks | "Vectors" >> ReuseOrEmbedVectors(live, EmbedChunks.from_options(spec, options),
                                                                 representation)
    trained = p | "LiveTrainedIndex" >> ReadTrainedIndex(functools.partial(read_trained_dense_index,
                                                                           live.trained_dense_source()))

    # Sinks: the delta segment's files.
    (parsed[DEAD], delta[DEAD]) | "DeadLetters" >> WriteDeadLetters(segment_dir)
    dead | "Tombstones" >> WriteTombstones(segment_dir)
    ({"pages": delta[UpdatePagesFn.PAGES], "nodes": nodes, "chunks": indexed, EDGES_KIND: edges["edges"],
      SPARSE: sparse, VECTORS: vectors, TRAINED: trained} | "WriteSegment" >> WriteSegment(segment_dir, num_shards))
    # Last: every count the stages recorded (what the manifest records), as data.
    p | "WriteCounts" >> WriteCounts(segment_dir)


def only_known_dead_letters(live: IndexReader, segment_dir: str) -> bool:
    """Whether every input this update dead-lettered is one a live segment
    records as dead for the same reason: an image, a stylesheet or a FIFO in
    the input is listed, read and dead-lettered again at every update, and is
    no change (a new one, or one whose reason changed, is)."""
    def pairs(path: str) -> set[tuple[str, str]]:
        with open_read(path) as fh:
            table = pq.read_table(fh, columns=["source", "reason"])
        return set(zip(table["source"].to_pylist(), table["reason"].to_pylist()))

    found = pairs(os.path.join(segment_dir, DEAD_LETTERS_FILE))
    for path in live.segment_files(DEAD_LETTERS_FILE):
        if not found:
            break
        found -= pairs(path)
    return not found


def publish_update(layout: IndexLayout, live: IndexReader, segment_id: str, counts: dict[str, int],
                   tombstones: dict[str, int], elapsed_s: float, options: PipelineOptions, steps: ModelSteps) -> str:
    """Checksum the delta segment, write the manifest of the live segments and
    it (its config the live one's, what the model was asked recorded as this
    update asked it: `steps`), flip CURRENT."""
    segment_dir = layout.segment_dir(segment_id)
    with open_read(os.path.join(segment_dir, BM25_STATS_FILE)) as fh:
        delta = json.load(fh)
    previous = live.manifest.stats["bm25"]
    n_chunks = previous["n_chunks"] + delta["n_chunks"]
    n_terms = previous["n_terms"] + delta["n_terms"]
    bm25 = corpus_stats(n_chunks, n_terms)
    segment = layout.describe_segment(segment_id, live.manifest.settings.index.num_shards, counts)
    totals = {k: live.manifest.tombstones.get(k, 0) + n for k, n in tombstones.items()}
    manifest = new_manifest(
        layout, segments=[*live.manifest.segments, segment],
        stats={"bm25": bm25, "pages": counts, "update_seconds": round(elapsed_s, 1)},
        config={**{k: v for k, v in live.manifest.config.items() if k not in MODEL_STEP_ENTRIES},
                **steps.to_manifest()},
        tombstones=totals)
    return publish_and_prune(layout, manifest, options)


def run(argv: list[str] | None = None) -> str:
    """Run an incremental update; returns the published version name, or the live
    one when no page changed (nothing published)."""
    options = job_options(argv, FLAGS)
    opts = required(options, UpdateOptions, "input", "index")
    check_input_folder(opts.input, opts.index)
    live_config = IndexLayout(opts.index).load_manifest().settings.index
    refuse_reshaping(live_config, given_flags(sys.argv[1:] if argv is None else argv, FLAGS))
    steps = asked_steps(live_config.model_steps)  # the index's, with this ritrag's prompts
    refuse_a_silent_model_mismatch(steps, options.view_as(MetadataOptions).metadata_endpoint)
    try:
        metadata = MetadataPlan.for_nodes(options, opts.index, steps)
        toc = TocPlan.from_options(options, opts.index, steps)
    except ValueError as exc:  # flags that ask for no possible plan: a usage error
        raise JobOptionsError(str(exc)) from None
    with prepare_job(options, opts.index, "update") as (layout, segment_id, segment_dir):
        live = IndexReader(layout)
        live.share_dead_ids()  # with the stages that carry its files
        # The live tables its stages read, hashed up front on every CPU (sha256
        # releases the GIL); the stages made below find them verified.
        live.verify_files(tuple(TABLES), os.cpu_count() or 1)
        started = time.time()
        # No count of the input files here: listing them is the diff's work, once
        # (a second listing cost a stat per file); the manifest records pages_read.
        LOG.info("updating %s (live %s) from %s into %s", opts.index, live.manifest.version, opts.input,
                 segment_dir)
        result = run_pipeline(options, segment_dir,
                              lambda p: update_pipeline(p, options, live, segment_dir, metadata, toc))
        counts = job_counts(result, segment_dir, (*(UPDATE_METADATA_COUNTERS if metadata else UPDATE_COUNTERS),
                                                  *(TOC_COUNTERS if toc else ())))
        check_page_accounting(counts, ("pages_unchanged", "pages_indexed", "pages_dead_lettered",
                                       "pages_merged_duplicates"))
        refuse_emptying(counts, opts.input, live.manifest.version)
        dead = tombstone_counts(os.path.join(segment_dir, TOMBSTONES_FILE))
        unchanged = not (counts["pages_indexed"] or counts["pages_deleted"] or any(dead.values()))
        if unchanged and only_known_dead_letters(live, segment_dir):
            # Nothing to add, remove or report: a version would only make servers reload
            # and add a segment that queries visit (a scheduled update of a quiet site).
            remove_tree(segment_dir)
            LOG.info("no page changed, nothing published: %s stays live (%s)", live.manifest.version,
                     ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
            return live.manifest.version
        published = publish_update(layout, live, segment_id, counts, dead, time.time() - started, options, steps)
        LOG.info("published %s in %.1f s: %s", published, time.time() - started,
                 ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
        return published


if __name__ == "__main__":
    # force: importing Beam has already configured the root logger (at WARNING)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    run()

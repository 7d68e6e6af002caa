"""The full build: a folder (or glob) of HTML pages -> a new published index version.

    python -m ritrag.pipelines.build --input DIR_OR_GLOB --out INDEX [--base_url URL]
        [--site_depth N] [--granularity page|section] [--num_shards N]
        [--embedding_model NAME_OR_PATH] [--dense_factory STRING] [--dense_nprobe N]
        [--dense_rerank N] [--chunk_template T] [--path_levels N] [--node_docs on|off]
        [--node_doc_vectors on|off] [--anchor_docs on|off]
        [--metadata_endpoint URL --metadata_model NAME ...] [--induce_toc llm]
        [runner options]

Stages: read -> parse (dead letters aside) -> with --induce_toc llm, long PDFs
without an outline cut at the model's verified headings (docs/METADATA.md) -> forest (per site, skeletons only)
-> nodes (placements joined with page text) -> with --metadata_endpoint, the
model's summary and keywords per node (docs/METADATA.md) -> chunks; the indexed pages' links
resolved to nodes (edges) -> anchor documents; sparse postings of chunks and
anchor documents, embeddings of chunks -> the trained dense index; sinks write
each into the segment's files. Then, in the launching process, publish: the manifest, with a checksum
of every file, is written last and CURRENT flipped.
Without --runner, the job runs on Beam's in-process FnApiRunner.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from ritrag.pipelines.launcher import (BuildOptions, PublishOptions, check_input_folder, check_page_accounting,
                                       index_config_of, job_counts, job_options, prepare_job, publish_and_prune,
                                       refuse_empty, required, run_pipeline)
from ritrag.pipelines.options import JobFlags, JobOptionsError
from ritrag.index_config import IndexConfig
from ritrag.flags import from_arguments
from ritrag.layout import BM25_STATS_FILE, DENSE_INFO_FILE, IndexLayout, SITE_BASES_FILE, new_manifest
from ritrag.schema import EDGES_KIND
from ritrag.storage import exists, open_read
from ritrag.transforms.chunk import ChunkNodesFn, Chunker
from ritrag.transforms.counts import WriteCounts
from ritrag.transforms.edges import EDGE_COUNTERS, AnchorDocuments, ResolveEdges, link_target
from ritrag.transforms.dense import TRAINED, VECTORS, TrainDenseIndex
from ritrag.transforms.embed import EmbedChunks, EmbedOptions
from ritrag.transforms.metadata.enrich import METADATA_COUNTERS, EnrichNodeMetadata, MetadataOptions, MetadataPlan
from ritrag.transforms.metadata.induce_toc import (PAGES, SPENT, TOC_COUNTERS, InduceTocFromModel, TocPlan,
                                                   asked_steps)
from ritrag.transforms.nodes import LINKS_OUTPUT, PAGES_OUTPUT, BuildForestNodes
from ritrag.transforms.pages import (DEAD, LINKS_CAPPED_COUNTER, PAGE_COUNTERS, InputOptions, PageParser,
                                     ParsePages, ReadInput, WriteDeadLetters, count_input_files,
                                     index_inside_input, input_root_and_pattern)
from ritrag.transforms.progress import SECTIONS_CAPPED_COUNTER, CountSectionsCapped, LogProgress
from ritrag.transforms.site_base import InferSiteBases
from ritrag.transforms.sources.dispatch import HTML_SUFFIXES
from ritrag.transforms.segment import SPARSE, WriteSegment
from ritrag.transforms.sparse import BuildSparseIndex
from ritrag.transforms.tables import spill_location, write_bytes
from ritrag.transforms.sources.warc import crawl_dir_of

LOG = logging.getLogger("ritrag.build")


class BuildJobOptions(BuildOptions, InputOptions):
    """Every flag the build reads (a view: it defines none of its own)."""


FLAGS: JobFlags = {InputOptions: None, BuildOptions: None, EmbedOptions: None, MetadataOptions: None,
                   PublishOptions: None}


def build_pipeline(p: beam.Pipeline, options: PipelineOptions, segment_dir: str, config: IndexConfig,
                   total_files: int | None = None, metadata: MetadataPlan | None = None,
                   toc: TocPlan | None = None) -> None:
    """The build's data flow (docs/ARCHITECTURE.md): stages compute PCollections,
    then sinks write them, every table into `segment_dir`, the index made as `config` says;
    with `toc`, long PDFs without an outline are cut at the model's headings before they
    are placed; with `metadata`, nodes are described by the model (cache first) before they are chunked."""
    opts = options.view_as(InputOptions)
    spec, representation, num_shards = config.embedder, config.representation, config.num_shards
    root, pattern = input_root_and_pattern(opts.input)
    reader = from_arguments(PageParser, opts, root=root, base_url=config.page_base_url, site_depth=config.site_depth)
    index_files = index_inside_input(root, options.view_as(BuildJobOptions).out)  # never input
    readables = p | "ReadInput" >> ReadInput(pattern, reader, index_files)
    # Sites' public bases, from what their pages say of themselves: the parser that
    # keys pages under them is decided once and reaches parsing and node rows as a
    # side input. The user's --base_url wins; WARC records carry their own URLs.
    site_bases, parser = None, reader
    if config.base_url is None and crawl_dir_of(pattern) is None:
        site_bases = p | "InferSiteBases" >> InferSiteBases(pattern, reader, HTML_SUFFIXES)
        parser = beam.pvalue.AsSingleton(site_bases | "ParserWithSiteBases" >> beam.Map(reader.with_site_bases))

    # Pages: every input file parsed, or a dead letter with its reason.
    parsed = readables | "ParsePages" >> ParsePages(parser)
    pages = (parsed["pages"]
             | "CountSectionsCapped" >> CountSectionsCapped()
             | "ParseProgress" >> LogProgress("parse (pages)", total_files))
    toc_spent = None  # the tokens of the budget the ToC stage admitted: the metadata stage's budget is what is left
    if toc is not None:
        induced = pages | "InduceToc" >> InduceTocFromModel(toc, os.path.basename(segment_dir))
        pages, toc_spent = induced[PAGES], induced.get(SPENT)
    # Forest: skeletons placed per site, joined with the page text -> node rows.
    # Each page's first parse is spilled and read back for its node rows (not parsed twice).
    forest = pages | "Forest" >> BuildForestNodes(parser, config.granularity,
                                                 spill_dir=spill_location(segment_dir, "pages"))
    nodes = forest["nodes"] | "NodeProgress" >> LogProgress("forest (nodes)")
    if metadata is not None:
        nodes = nodes | "EnrichNodeMetadata" >> EnrichNodeMetadata(metadata, os.path.basename(segment_dir),
                                                                      toc_spent)
    # Chunks, cut inside each node, in the index's representation.
    node_chunks = (nodes
                   | "Chunk" >> beam.ParDo(ChunkNodesFn(Chunker(spec, representation)))
                   | "ChunkProgress" >> LogProgress("chunk (chunks)"))
    # Edges: the indexed pages' links resolved to nodes; the anchor texts of each
    # node's in-links become its anchor document, a chunks-table row BM25 indexes.
    targets = nodes | "LinkTargets" >> beam.Map(link_target)
    edges = forest[LINKS_OUTPUT] | "Edges" >> ResolveEdges(targets)
    chunks = node_chunks
    if representation.anchor_docs:
        anchor_docs = edges | "AnchorDocuments" >> AnchorDocuments(targets, spec)
        chunks = (node_chunks, anchor_docs) | "ChunksAndAnchorDocs" >> beam.Flatten()
    # Sparse: BM25 postings and global statistics.
    sparse = chunks | "Sparse" >> BuildSparseIndex(representation)
    # Dense: the model's vectors of the rows the representation embeds (chunks; node
    # documents only with node_doc_vectors; anchor documents never) -> the trained index.
    vectors = (node_chunks
               | "Embedded" >> beam.Filter(lambda c: representation.embeds(c.ordinal))
               | "ChunkTexts" >> beam.Map(lambda c: (c.chunk_id, c.embedded_text))
               | "Embed" >> EmbedChunks.from_options(spec, options)
               | "EmbedProgress" >> LogProgress("embed (chunks)"))
    trained = vectors | "TrainDense" >> TrainDenseIndex(config.dense_factory, config.dense_nprobe,
                                                        config.dense_rerank)

    # Sinks: the segment's files.
    if site_bases is not None:
        site_bases | "WriteSiteBases" >> beam.Map(write_site_bases, segment_dir)
    (parsed[DEAD], forest[DEAD]) | "DeadLetters" >> WriteDeadLetters(segment_dir)
    ({"pages": forest[PAGES_OUTPUT], "nodes": nodes, "chunks": chunks, EDGES_KIND: edges, SPARSE: sparse,
      VECTORS: vectors, TRAINED: trained} | "WriteSegment" >> WriteSegment(segment_dir, num_shards))
    # Last: every count the stages recorded (what the manifest records), as data.
    p | "WriteCounts" >> WriteCounts(segment_dir)


def publish_build(layout: IndexLayout, segment_id: str, options: PipelineOptions, config: IndexConfig,
                  counts: dict[str, int], elapsed_s: float) -> str:
    """Checksum the finished segment, write its manifest (which records `config`), flip CURRENT."""
    segment_dir = layout.segment_dir(segment_id)
    with open_read(os.path.join(segment_dir, BM25_STATS_FILE)) as fh:
        bm25 = json.load(fh)
    with open_read(os.path.join(segment_dir, DENSE_INFO_FILE)) as fh:
        dense = json.load(fh)
    segment = layout.describe_segment(segment_id, config.num_shards, counts)
    manifest = new_manifest(
        layout,
        segments=[segment],
        stats={"bm25": bm25, "pages": counts, "build_seconds": round(elapsed_s, 1)},
        config=config.to_manifest(dense, read_site_bases(segment_dir)),
    )
    return publish_and_prune(layout, manifest, options)


def write_site_bases(decided: dict[str, dict], segment_dir: str) -> None:
    write_bytes(os.path.join(segment_dir, SITE_BASES_FILE), json.dumps(decided, sort_keys=True, indent=1).encode())


def read_site_bases(segment_dir: str) -> dict[str, dict]:
    """InferSiteBases' decisions, written by the build; {} when --base_url was given."""
    path = os.path.join(segment_dir, SITE_BASES_FILE)
    if not exists(path):
        return {}
    with open_read(path) as fh:
        return json.load(fh)


def run(argv: list[str] | None = None) -> str:
    """Run a full build; returns the published version name."""
    options = job_options(argv, FLAGS)
    opts = required(options, BuildJobOptions, "input", "out")
    check_input_folder(opts.input, opts.out)
    config = index_config_of(options)
    # What the model is asked is recorded with the prompts' versions it is asked with.
    config = dataclasses.replace(config, model_steps=asked_steps(config.model_steps))
    try:
        metadata = MetadataPlan.for_nodes(options, opts.out, config.model_steps)
        toc = TocPlan.from_options(options, opts.out, config.model_steps)
    except ValueError as exc:  # flags that ask for no possible plan: a usage error
        raise JobOptionsError(str(exc)) from None
    with prepare_job(options, opts.out, "build") as (layout, segment_id, segment_dir):
        started = time.time()
        root, pattern = input_root_and_pattern(opts.input)
        total_files = count_input_files(pattern, index_inside_input(root, opts.out))
        LOG.info("building from %s (%d files) into %s", opts.input, total_files, segment_dir)
        result = run_pipeline(options, segment_dir,
                              lambda p: build_pipeline(p, options, segment_dir, config, total_files, metadata,
                                                       toc))
        counts = job_counts(result, segment_dir, (*PAGE_COUNTERS, LINKS_CAPPED_COUNTER, SECTIONS_CAPPED_COUNTER,
                                                  *EDGE_COUNTERS, *(METADATA_COUNTERS if metadata else ()),
                                                  *(TOC_COUNTERS if toc else ())))
        elapsed = time.time() - started
        check_page_accounting(counts, ("pages_indexed", "pages_dead_lettered", "pages_merged_duplicates"))
        refuse_empty(counts, segment_dir)
        published = publish_build(layout, segment_id, options, config, counts, elapsed)
        rate = counts["pages_read"] / elapsed if elapsed else 0.0
        LOG.info("published %s in %.1f s (%.1f pages/s): %s", published, elapsed, rate,
                 ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
        return published


if __name__ == "__main__":
    # force: importing Beam has already configured the root logger (at WARNING)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    run()

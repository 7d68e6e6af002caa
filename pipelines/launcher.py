"""What every job that publishes an index version shares: its options, the
lease and fresh segment it runs in, running its pipeline, the accounting check
and publication. Not a job itself; jobs (build, update, compact) import it.

A job's `run(argv)` reads as:

    with prepare_job(options, index, "build") as (layout, segment_id, segment_dir):
        result = run_pipeline(options, segment_dir, lambda p: build_pipeline(p, ...))
        counts = counter_values(result)
        check_page_accounting(counts, ...)       # every input file accounted for
        publish_and_prune(layout, manifest, options)
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections import Counter
from typing import Callable, Iterable, Iterator

import apache_beam as beam
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from ritrag.embedder import DEFAULT_MODEL
from ritrag.pipelines.options import JobFlags, parse_job_options
from ritrag.layout import DEAD_LETTERS_FILE, DENSE_INFO_FILE, IndexLayout, prune_versions, segment_id_for
from ritrag.storage import dir_exists, open_read, remove_tree, use_pipeline_options
from ritrag.lease import IndexLease
from ritrag.representation import DEFAULT_PATH_LEVELS, DEFAULT_TEMPLATE, Representation
from ritrag.transforms.pages import PAGE_COUNTERS
from ritrag.transforms.tables import remove_spill_files

LOG = logging.getLogger("ritrag.launcher")


def job_options(argv: list[str] | None, flags: JobFlags) -> PipelineOptions:
    """A job's options from its command line (`parse_job_options`), with Beam's
    file systems configured from them at once: the job reads the live index
    and takes its lease before it builds a pipeline (when Beam would), and an
    s3:// or gs:// path needs its endpoint and credentials for that."""
    options = parse_job_options(argv, flags)
    use_pipeline_options(options)
    return options


class PublishOptions(PipelineOptions):
    """Publishing (every job that writes a version)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--keep_versions", type=int, default=10,
                            help="after publishing, delete older versions beyond this many "
                                 "(and the segments only they used)")
        parser.add_argument("--break_lock", action="store_true",
                            help="take the index's lease even if another job seems to hold it "
                                 "(only when that job is known to be gone; docs/OPERATING.md)")


def publish_and_prune(layout: IndexLayout, manifest, options: PipelineOptions) -> str:
    layout.publish(manifest)
    deleted = prune_versions(layout, options.view_as(PublishOptions).keep_versions)
    if deleted:
        LOG.info("retention: deleted %s", ", ".join(deleted))
    return manifest.version


class IndexOptions(PipelineOptions):
    """The index changed (update, compact)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--index", help="index directory with a published version")


def required(options: PipelineOptions, view: type, *names: str):
    """The view of `options`, after checking that flags `names` were given."""
    opts = options.view_as(view)
    missing = [f"--{n}" for n in names if not getattr(opts, n)]
    if missing:
        raise ValueError(f"missing required option(s): {', '.join(missing)}")
    return opts


class BuildOptions(PipelineOptions):
    """What the index is made of (a build records them; an update reads the live version's)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--out", help="index directory (local path or object-store prefix)")
        parser.add_argument("--base_url", default=None,
                            help="URL that the input directory stands for (default: each site's public "
                                 "URL where its pages name it, else http://localhost/; transforms/site_base.py)")
        parser.add_argument("--site_depth", type=int, default=0,
                            help="URL path segments that name a site (1: one forest per <host>/<product>/)")
        parser.add_argument("--granularity", choices=("page", "section"), default="page",
                            help="a node per page, or also a node per heading section inside pages")
        parser.add_argument("--num_shards", type=int, default=1,
                            help="files per table, BM25 postings and dense index (parallel writers and loaders)")
        parser.add_argument("--embedding_model", default=DEFAULT_MODEL,
                            help="sentence-transformers model name or local path, or hashing:DIM (a "
                                 "model-free stand-in for tests)")
        parser.add_argument("--query_prefix", default="",
                            help="text the model expects before a query (e.g. 'query: ' for E5 models)")
        parser.add_argument("--document_prefix", default="",
                            help="text the model expects before a document (e.g. 'passage: ')")
        parser.add_argument("--dense_factory", default=None,
                            help="FAISS index factory string (default: chosen by corpus size)")
        parser.add_argument("--dense_nprobe", type=int, default=None,
                            help="IVF lists the server probes per query (default: chosen by corpus size)")
        parser.add_argument("--dense_rerank", type=int, default=None,
                            help="the server re-ranks N x k' index candidates exactly; 1: off "
                                 "(default: chosen by corpus size)")
        # The representation (ritrag/representation.py). None: the default at a
        # build, the live index's at an update (which refuses another one).
        parser.add_argument("--chunk_template", default=None,
                            help=f"what the model embeds of a chunk: {{path}}, {{title}}, {{body}} "
                                 f"(default {DEFAULT_TEMPLATE!r}; '{{title}}\\n{{body}}' is the "
                                 f"representation of indexes built before templates)")
        parser.add_argument("--path_levels", type=int, default=None,
                            help=f"most levels of the node path in the representation: the root "
                                 f"and the last ones (default {DEFAULT_PATH_LEVELS})")
        parser.add_argument("--node_docs", choices=("on", "off"), default=None,
                            help="index a per-node document (path, summary, keywords) in BM25 and "
                                 "dense, and keep the path out of chunk postings (default on)")
        parser.add_argument("--anchor_docs", choices=("on", "off"), default=None,
                            help="index the anchor texts other pages link a node with as its anchor "
                                 "document, a third BM25 field, never embedded (default on)")


def representation_of(options: PipelineOptions, base: Representation = Representation()) -> Representation:
    """`base` with the representation flags that were given."""
    opts = options.view_as(BuildOptions)
    given = {"template": (opts.chunk_template.replace("\\n", "\n") if opts.chunk_template is not None else None),
             "path_levels": opts.path_levels,
             "node_docs": None if opts.node_docs is None else opts.node_docs == "on",
             "anchor_docs": None if opts.anchor_docs is None else opts.anchor_docs == "on"}
    return dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})


def counter_values(result, expected: Iterable[str] = PAGE_COUNTERS) -> dict[str, int]:
    """The job's counters by name; `expected` ones are present even if never incremented."""
    values = dict.fromkeys(expected, 0)
    for counter in result.metrics().query(MetricsFilter())["counters"]:
        name = counter.key.metric.name
        value = counter.committed if counter.committed is not None else counter.attempted
        values[name] = values.get(name, 0) + int(value or 0)
    return values


def check_page_accounting(counts: dict[str, int], outcomes: Iterable[str]) -> None:
    """Every page read ended as exactly one of `outcomes` (counter names), or the
    job publishes nothing: an input that vanished silently is a bug, not a detail."""
    outcomes = list(outcomes)
    accounted = sum(counts[name] for name in outcomes)
    if accounted != counts["pages_read"]:
        raise RuntimeError(f"page accounting mismatch: read {counts['pages_read']} but "
                           f"{' + '.join(name.removeprefix('pages_') for name in outcomes)} = {accounted}; "
                           f"not publishing")


class NothingToPublishError(RuntimeError):
    """The job's input gave no chunk to index, so it publishes no version."""


def refuse_empty(counts: dict[str, int], segment_dir: str) -> None:
    """A build with no vector to index (every page empty or dead-lettered) ends
    with its accounting in one line, not a traceback of the dense stage."""
    if FileSystems.exists(os.path.join(segment_dir, DENSE_INFO_FILE)):
        return
    with open_read(os.path.join(segment_dir, DEAD_LETTERS_FILE)) as fh:
        reasons = Counter(pq.read_table(fh, columns=["reason"]).column("reason").to_pylist())
    dead = ", ".join(f"{reason} {n}" for reason, n in reasons.most_common()) or "none"
    raise NothingToPublishError(
        f"nothing to index, not publishing: read {counts['pages_read']} pages; indexed {counts['pages_indexed']} "
        f"(no text to chunk); dead-lettered {counts['pages_dead_lettered']} (by reason: {dead}); the reasons of "
        f"each file are in {os.path.join(segment_dir, DEAD_LETTERS_FILE)}")


@contextlib.contextmanager
def prepare_job(options: PipelineOptions, index_dir: str, owner: str
                ) -> Iterator[tuple[IndexLayout, str, str]]:
    """What every publishing job does first: default to the in-process runner
    (which never tries to download Prism), take the index's lease (a second job
    fails fast, naming this one), and create the fresh segment directory of the
    version it will publish. Yields (layout, segment id, segment dir); the lease
    is given back when the block ends, published or not."""
    standard = options.view_as(StandardOptions)
    if not standard.runner:
        standard.runner = "FnApiRunner"
    layout = IndexLayout(index_dir)
    with IndexLease(layout, owner, options.view_as(PublishOptions).break_lock) as lease:
        segment_id = segment_id_for(layout.next_version())  # chosen under the lease: no other job publishes it
        lease.claim_segment(segment_id)
        segment_dir = layout.segment_dir(segment_id)
        fresh_segment_dir(segment_dir)
        yield layout, segment_id, segment_dir


def fresh_segment_dir(segment_dir: str) -> None:
    """Create the segment directory of a new version (on an object store a
    prefix needs no creating). One left there is debris of a run that crashed
    before publishing (no manifest names it, and the caller holds the lease, so
    no live job writes it): delete it."""
    if dir_exists(segment_dir):
        LOG.warning("removing %s, left by a run that did not publish", segment_dir)
        remove_tree(segment_dir)
    FileSystems.mkdirs(segment_dir)


def run_pipeline(options: PipelineOptions, segment_dir: str, construct: Callable[[beam.Pipeline], None]):
    """Run the job's pipeline (built by `construct`), then delete its spill files
    (also after a failure: a failed job publishes nothing). Returns the result."""
    try:
        with beam.Pipeline(options=options) as p:
            construct(p)
    finally:
        remove_spill_files(segment_dir)
    return p.result

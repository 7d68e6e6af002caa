"""What every job that publishes an index version shares: its options, the
lease and fresh segment it runs in, running its pipeline, the accounting check
and publication. Not a job itself; jobs (build, update, compact) import it.

A job's `run(argv)` reads as:

    with prepare_job(options, index, "build") as (layout, segment_id, segment_dir):
        result = run_pipeline(options, segment_dir, lambda p: build_pipeline(p, ...))
        counts = job_counts(result, segment_dir, expected)   # the pipeline's WriteCounts, as data
        check_page_accounting(counts, ...)       # every input file accounted for
        publish_and_prune(layout, manifest, options)
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
from collections import Counter
from typing import Callable, Iterable, Iterator

import apache_beam as beam
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from ritrag.pipelines.options import JobFlags, JobOptionsError, parse_job_options
from ritrag.flags import add_arguments, option
from ritrag.index_config import INDEX_FLAGS, IndexConfig
from ritrag.layout import DEAD_LETTERS_FILE, DENSE_INFO_FILE, IndexLayout, Publishing, prune_versions, segment_id_for
from ritrag.storage import (dir_exists, exists, is_remote, make_dirs, open_read, remove_tree,
                            use_pipeline_options)
from ritrag.lease import IndexLease
from ritrag.transforms.counts import read_counts
from ritrag.transforms.pages import PAGE_COUNTERS, input_root_and_pattern
from ritrag.transforms.tables import remove_spill_files

LOG = logging.getLogger("ritrag.launcher")


def job_options(argv: list[str] | None, flags: JobFlags) -> PipelineOptions:
    """A job's options from its command line (`parse_job_options`), with the
    storage layer and Beam's file systems configured from them at once: the job
    reads the live index and takes its lease before it builds a pipeline."""
    options = parse_job_options(argv, flags)
    use_pipeline_options(options)
    _share_s3_clients()
    FileSystems.set_options(options)  # the pipeline's sources and sinks, and DoFns run in this process
    return options


# The S3 options Beam's boto3 wrapper reads (apache_beam/io/aws/clients/s3/boto3_client.py).
_S3_CLIENT_OPTIONS = ("s3_access_key_id", "s3_secret_access_key", "s3_session_token", "s3_endpoint_url",
                      "s3_disable_ssl", "s3_region_name", "s3_api_version", "s3_verify")
_s3_clients_lock = threading.Lock()


def _share_s3_clients() -> None:
    """Beam's S3 file system builds a boto3 session and client for every call
    (about 0.2 s of CPU each, reloading botocore's service models). botocore
    clients are thread-safe, so the process keeps one per set of S3 options,
    each Beam wrapper with its own stream state copied from a fresh wrapper of
    that set. Installed by the first job of the process (a remote runner's
    workers pay Beam's own cost)."""
    try:
        from apache_beam.io.aws.clients.s3 import boto3_client
    except ImportError:  # no AWS extra: no S3 file system either
        return
    if getattr(boto3_client.Client, "shares_clients", False):
        return
    beam_client = boto3_client.Client
    fresh: dict[tuple, object] = {}

    class SharedS3Client(beam_client):
        shares_clients = True

        def __init__(self, options):
            key = _s3_options_key(options)
            with _s3_clients_lock:
                if key not in fresh:
                    fresh[key] = beam_client(options)
                self.__dict__.update(fresh[key].__dict__)

    boto3_client.Client = SharedS3Client


def _s3_options_key(options) -> tuple:
    if isinstance(options, dict):
        return tuple(options.get(name) for name in _S3_CLIENT_OPTIONS)
    from apache_beam.options.pipeline_options import S3Options

    s3 = options.view_as(S3Options)
    return tuple(getattr(s3, name, None) for name in _S3_CLIENT_OPTIONS)


class PublishOptions(PipelineOptions):
    """Publishing (every job that writes a version)."""  # (its argument group's title) Publishing's flags

    @classmethod
    def _add_argparse_args(cls, parser):
        add_arguments(parser, Publishing)


def publish_and_prune(layout: IndexLayout, manifest, options: PipelineOptions) -> str:
    layout.publish(manifest)
    deleted = prune_versions(layout, options.view_as(PublishOptions).keep_versions)
    if deleted:
        LOG.info("retention: deleted %s", ", ".join(deleted))
    return manifest.version


@dataclasses.dataclass(frozen=True)
class JobIndex:
    """Where a job writes its versions: the index a build makes (`out`) or the
    one an update or compaction changes (`index`); their flags."""

    out: str | None = option(None, "index directory (local path or object-store prefix)")
    index: str | None = option(None, "index directory with a published version")


class IndexOptions(PipelineOptions):
    """The index changed (update, compact)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        add_arguments(parser, JobIndex, only=("index",))


def check_input_folder(spec: str, index_dir: str) -> None:
    """A local input's folder must exist: a typo, or a folder not mounted, is
    a usage error, not an empty input (which a build would refuse as nothing to
    index, and an update would read as every page deleted). An object store
    has no folders: there, a prefix that lists nothing is an empty input. The
    index may lie inside the input folder (its files are then no input) but
    may not be it."""
    root, _ = input_root_and_pattern(spec)
    if root.rstrip("/") == index_dir.rstrip("/") or (
            not is_remote(root) and os.path.abspath(root) == os.path.abspath(index_dir)):
        raise JobOptionsError(f"input {spec}: the index's own folder; give the index a folder of its own")
    if is_remote(root) or os.path.isdir(root):
        return
    problem = "a file, not a folder: give its folder or a glob" if os.path.isfile(spec) else "no such folder"
    raise JobOptionsError(f"input {spec}: {problem}")


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
        add_arguments(parser, JobIndex, only=("out",))
        for flag in INDEX_FLAGS:  # defined with the IndexConfig they set
            flag.add_to(parser)


def index_config_of(options: PipelineOptions) -> IndexConfig:
    """The IndexConfig a build's flags ask for (a flag left out: the config's default)."""
    opts = options.view_as(BuildOptions)
    return IndexConfig().with_flags({flag.name: getattr(opts, flag.name) for flag in INDEX_FLAGS})


def job_counts(result, segment_dir: str, expected: Iterable[str] = PAGE_COUNTERS) -> dict[str, int]:
    """The job's counts, as its pipeline's WriteCounts wrote them into the
    segment (exact on every runner; `expected` ones present even if never
    counted); what the manifest records and the accounting checks. The
    runner's counters (monitoring: committed where the runner reports them,
    else attempted; none on some runners) are logged alongside."""
    counts = read_counts(segment_dir, expected)
    try:
        counters = result.metrics().query(MetricsFilter())["counters"]
    except NotImplementedError:  # the DaskRunner: "collecting metrics will come later!"
        counters = []
    monitored = Counter()
    for counter in counters:
        value = counter.committed if counter.committed is not None else counter.attempted
        monitored[f"{counter.key.metric.namespace}/{counter.key.metric.name}"] += int(value or 0)
    if monitored:
        LOG.info("runner metrics (monitoring only): %s", ", ".join(f"{k}={v}" for k, v in sorted(monitored.items())))
    return counts


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
    if exists(os.path.join(segment_dir, DENSE_INFO_FILE)):
        return
    with open_read(os.path.join(segment_dir, DEAD_LETTERS_FILE)) as fh:
        reasons = Counter(pq.read_table(fh, columns=["reason"]).column("reason").to_pylist())
    dead = ", ".join(f"{reason} {n}" for reason, n in reasons.most_common()) or "none"
    raise NothingToPublishError(
        f"nothing to index, not publishing: read {counts['pages_read']} pages; indexed {counts['pages_indexed']} "
        f"(no text to chunk); dead-lettered {counts['pages_dead_lettered']} (by reason: {dead}); the reasons of "
        f"each file are in {os.path.join(segment_dir, DEAD_LETTERS_FILE)}")


def refuse_emptying(counts: dict[str, int], input_spec: str, live_version: str) -> None:
    """An update that would leave no live page publishes nothing, as a build
    with nothing to index does: an input that lists no page (a prefix mistyped,
    a mount gone) is far likelier a mistake than a site that removed every page."""
    if counts["pages_unchanged"] + counts["pages_indexed"]:
        return
    raise NothingToPublishError(
        f"nothing left to index, not publishing: the input {input_spec} gave no page (read "
        f"{counts['pages_read']}, dead-lettered {counts['pages_dead_lettered']}), which would delete all "
        f"{counts['pages_deleted']} live pages; {live_version} stays live")


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
    make_dirs(segment_dir)


def run_pipeline(options: PipelineOptions, segment_dir: str, construct: Callable[[beam.Pipeline], None]):
    """Run the job's pipeline (built by `construct`), then delete its spill files
    (also after a failure: a failed job publishes nothing). Returns the result."""
    try:
        with beam.Pipeline(options=options) as p:
            construct(p)
    finally:
        remove_spill_files(segment_dir)
    return p.result

"""The full build: a folder (or glob) of HTML pages -> a new published index version.

    python -m pipelines.build --input DIR_OR_GLOB --out INDEX [--base_url URL]
        [--site_depth N] [--granularity page|section] [--num_shards N]
        [--embedding_model NAME_OR_PATH] [--dense_factory STRING] [--dense_nprobe N]
        [--dense_rerank N] [--chunk_template T] [--path_levels N] [--node_docs on|off]
        [runner options]

Stages: read -> parse (dead letters aside) -> forest (per site, skeletons only)
-> nodes (placements joined with page text) -> chunks -> sparse postings and
embeddings -> dense shards; then, in the launching process, publish: the
manifest, with a checksum of every file, is written last and CURRENT flipped.
Without --runner, the job runs on Beam's in-process FnApiRunner.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import stat
import time
from typing import Callable, Iterable, Iterator

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from ritrag.embedder import DEFAULT_MODEL, EmbedderSpec
from ritrag.ids import raw_hash, site_of
from ritrag.layout import (IndexLayout, IndexLease, is_remote, new_manifest, open_read, prune_versions,
                           segment_id_for)
from ritrag.representation import DEFAULT_PATH_LEVELS, DEFAULT_TEMPLATE, Representation, retrieval_defaults
from ritrag.schema import (CHUNKS_SCHEMA, DEAD_LETTERS_SCHEMA, NODES_SCHEMA, PAGES_SCHEMA, DeadLetter,
                           NodePlacement, PageSkeleton, PageSource, ParsedPage, WarcPage, page_row)
from transforms.chunk import ChunkNodesFn
from transforms.dense import DENSE_INFO_FILE, BuildDenseIndex
from transforms.embed import EmbedChunks
from transforms.fetch import classify_content
from transforms.forest import build_site_forest, expand_sections
from transforms.parse import UnparseablePage, parse_page
from transforms.progress import LogProgress
from transforms.site_base import InferSiteBases, public_url
from transforms.sparse import BM25_STATS_FILE, BuildSparseIndex
from transforms.tables import WriteParquetTable, parquet_bytes, remove_spill_files, write_bytes
from transforms.warc import ReadWarcInput, is_warc_input, read_record, split_record_source

LOG = logging.getLogger("ritrag.build")
COUNTERS = "ritrag.build"
HTML_SUFFIXES = (".html", ".htm", ".xhtml", ".shtml")
DEAD_LETTERS_FILE = "dead_letters.parquet"
# pages_read = pages_indexed + pages_dead_lettered + pages_merged_duplicates
PAGE_COUNTERS = ("pages_read", "pages_parsed", "pages_indexed", "pages_dead_lettered",
                 "pages_merged_duplicates")


class PublishOptions(PipelineOptions):
    """Options of every job that publishes a version."""

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
    if is_remote(layout.root):  # retention of object-store indexes is the bucket's lifecycle rules
        return manifest.version
    deleted = prune_versions(layout, options.view_as(PublishOptions).keep_versions)
    if deleted:
        LOG.info("retention: deleted %s", ", ".join(deleted))
    return manifest.version


class InputOptions(PipelineOptions):
    """Options of every job that reads HTML input (build, update). Beam gathers the
    flags of the direct subclasses of PipelineOptions (to pass them to workers), so
    each flag is defined once, in a direct subclass; a job reads its flags through a
    view class that inherits the ones it needs (`BuildJobOptions`)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--input", help="directory or glob of HTML files (any Beam filesystem)")
        parser.add_argument("--embed_device", default=None, help="cuda, mps or cpu (default: auto)")
        parser.add_argument("--max_page_bytes", type=int, default=20 * 1024 * 1024)
        parser.add_argument("--follow_links_outside_input", action="store_true",
                            help="index files whose real path (symbolic links resolved) lies outside the "
                                 "input directory; by default they are dead letters (outside_input)")


def required(options: PipelineOptions, view: type, *names: str):
    """The view of `options`, after checking that flags `names` were given."""
    opts = options.view_as(view)
    missing = [f"--{n}" for n in names if not getattr(opts, n)]
    if missing:
        raise ValueError(f"missing required option(s): {', '.join(missing)}")
    return opts


class BuildOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--out", help="index directory (local path or object-store prefix)")
        parser.add_argument("--base_url", default=None,
                            help="URL that the input directory stands for (default: each site's public "
                                 "URL where its pages name it, else http://localhost/; transforms/site_base.py)")
        parser.add_argument("--site_depth", type=int, default=0,
                            help="URL path segments that name a site (1: one forest per <host>/<product>/)")
        parser.add_argument("--granularity", choices=("page", "section"), default="page")
        parser.add_argument("--num_shards", type=int, default=1)
        parser.add_argument("--embedding_model", default=DEFAULT_MODEL)
        parser.add_argument("--query_prefix", default="")
        parser.add_argument("--document_prefix", default="")
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


class BuildJobOptions(BuildOptions, InputOptions):
    """Every flag the build reads (a view: it defines none of its own)."""


def representation_of(options: PipelineOptions, base: Representation = Representation()) -> Representation:
    """`base` with the representation flags that were given."""
    opts = options.view_as(BuildOptions)
    given = {"template": (opts.chunk_template.replace("\\n", "\n") if opts.chunk_template is not None else None),
             "path_levels": opts.path_levels,
             "node_docs": None if opts.node_docs is None else opts.node_docs == "on"}
    return dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})


def input_root_and_pattern(spec: str) -> tuple[str, str]:
    """(directory that relative URLs start from, glob of the files to read)."""
    if any(ch in spec for ch in "*?["):
        root = spec[: min(spec.index(ch) for ch in "*?[" if ch in spec)]
        return root.rsplit("/", 1)[0] + "/", spec
    root = spec if spec.endswith("/") else spec + "/"
    return root, root + "**"


DEFAULT_BASE_URL = "http://localhost/"
SITE_BASES_FILE = "site_bases.json"


def page_url(path: str, root: str, base_url: str) -> str:
    relative = path[len(root):] if path.startswith(root) else os.path.basename(path)
    return base_url.rstrip("/") + "/" + relative.lstrip("/")


@dataclasses.dataclass(frozen=True)
class PageParser:
    """How a job turns one input file into a ParsedPage: the same in every pass."""

    root: str
    base_url: str
    site_depth: int
    max_page_bytes: int
    follow_links_outside_input: bool = False
    site_bases: tuple[tuple[str, str], ...] = ()  # (site as the input names it, its public base)

    def refusal(self, path: str) -> DeadLetter | None:
        """Why the file at `path` must not be opened, as a dead letter; None when
        it may be. A local file whose real path lies outside the input root (a
        symbolic link to /etc/passwd, or to another folder) would leak into the
        index; a FIFO or device would block or never end. Object stores have
        neither links nor special files."""
        if is_remote(path):
            return None
        real = os.path.realpath(path)
        root = os.path.realpath(self.root)
        if not self.follow_links_outside_input and os.path.commonpath([root, real]) != root:
            return DeadLetter(path, "read", "outside_input", "its real path lies outside the input directory; "
                                                             "--follow_links_outside_input to index it")
        try:
            mode = os.stat(real).st_mode
        except OSError as exc:
            return DeadLetter(path, "read", "unreadable", f"{type(exc).__name__}: {exc}")
        if not stat.S_ISREG(mode):
            return DeadLetter(path, "read", "not_regular_file", "a FIFO, device, socket or directory")
        return None

    def input_url(self, path: str) -> str:
        """The URL the input names the file at `path` by: base_url + its relative path."""
        return page_url(path, self.root, self.base_url)

    def with_site_bases(self, decided: dict[str, dict] | None) -> "PageParser":
        """This parser, giving the sites that InferSiteBases gave a public base their public URLs."""
        if not decided:
            return self
        return dataclasses.replace(self, site_bases=tuple(sorted(
            (site, d["base"]) for site, d in decided.items() if d["base"])))

    def locate(self, path: str, url: str | None = None) -> tuple[str, str]:
        """(URL, site) of a page: `url` where the input records it (WARC), else the
        input's URL for `path`, under its site's public base where one was inferred.
        Every job keys pages by this URL."""
        url = url or self.input_url(path)
        site = site_of(url, self.site_depth)
        base = dict(self.site_bases).get(site)
        return (public_url(url, site, base), base) if base else (url, site)

    def parse(self, path: str, data: bytes, url: str | None = None) -> ParsedPage:
        """`url`: the page's own URL where the input records it (WARC), else the input's."""
        url, site = self.locate(path, url)
        page = parse_page(data, url, site, max_bytes=self.max_page_bytes)
        return dataclasses.replace(page, source=path, raw_hash=raw_hash(data))


DEAD = "dead"  # the tagged output of dead letters


def parse_or_dead_letter(parser: PageParser, path: str, read: Callable[[], bytes], stage: str,
                         url: str | None = None):
    """The ParsedPage of the file at `path`, or a DeadLetter of `stage` saying why not."""
    try:
        return parser.parse(path, read(), url)
    except UnparseablePage as exc:
        return DeadLetter(path, stage, exc.reason, exc.detail)
    except OSError as exc:
        return DeadLetter(path, stage, "unreadable", f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a parser bug must cost one page, not the job
        LOG.exception("unexpected error parsing %s", path)
        return DeadLetter(path, stage, "parser_error", f"{type(exc).__name__}: {exc}")


class ParsePagesFn(beam.DoFn):
    """(path, bytes) -> ParsedPage, or a DeadLetter on the DEAD output."""

    def __init__(self, parser: PageParser, count_read: bool = True):
        self._parser = parser
        self._count_read = count_read  # an update counts its reads when it diffs the input
        self._read = beam.metrics.Metrics.counter(COUNTERS, "pages_read")
        self._parsed = beam.metrics.Metrics.counter(COUNTERS, "pages_parsed")
        self._dead = beam.metrics.Metrics.counter(COUNTERS, "pages_dead_lettered")
        self._trail_counters: dict[str, beam.metrics.metricbase.Counter] = {}

    def _count_trail(self, page: ParsedPage) -> None:
        """trail_taken_<method> and trail_passed_over_<method>: how the cascade went."""
        for name in (f"trail_taken_{page.trail_method}", *(f"trail_passed_over_{m}" for m in page.trail_passed_over)):
            if name not in self._trail_counters:
                self._trail_counters[name] = beam.metrics.Metrics.counter(COUNTERS, name)
            self._trail_counters[name].inc()

    def process(self, readable: fileio.ReadableFile | WarcPage | DeadLetter, site_bases: dict | None = None):
        if not isinstance(readable, fileio.ReadableFile):  # a WARC input's record (transforms/warc.py)
            yield from self._process_record(readable, site_bases)
            return
        path = readable.metadata.path
        if self._count_read:
            self._read.inc()
        refused = (DeadLetter(path, "read", "not_html") if not path.lower().endswith(HTML_SUFFIXES)
                   else self._parser.refusal(path))
        yield from self._emit(
            refused or parse_or_dead_letter(self._parser.with_site_bases(site_bases), path, readable.read, "parse"))

    def _process_record(self, record: WarcPage | DeadLetter, site_bases: dict | None):
        if self._count_read:
            self._read.inc()
        if isinstance(record, WarcPage) and classify_content(record.content_type, record.payload) != "html":
            record = DeadLetter(record.source, "read", "not_html", record.content_type)
        yield from self._emit(record if isinstance(record, DeadLetter) else parse_or_dead_letter(
            self._parser.with_site_bases(site_bases), record.source, lambda: record.payload, "parse", record.url))

    def _emit(self, page: ParsedPage | DeadLetter):
        """Counts one input's outcome and routes it: a page, or a dead letter."""
        if isinstance(page, DeadLetter):
            self._dead.inc()
            yield beam.pvalue.TaggedOutput(DEAD, page)
        else:
            self._parsed.inc()
            self._count_trail(page)
            yield page


def place_site(site_and_pages: tuple[str, Iterable[PageSkeleton]]) -> Iterable[NodePlacement]:
    site, pages = site_and_pages
    forest = build_site_forest(site, pages)
    beam.metrics.Metrics.counter(COUNTERS, "cycles_broken").inc(forest.broken_cycles)
    return forest.placements


def placement_row(placement: NodePlacement, body: str = "", page: ParsedPage | None = None,
                  page_id: str | None = None) -> dict:
    """The NODES_SCHEMA row of a placed node; `page` and `page_id` for nodes holding page text."""
    return {
        "node_id": placement.node_id,
        "parent_id": placement.parent_id,
        "page_id": page_id,
        "site": placement.site,
        "kind": placement.kind,
        "position": placement.position,
        "depth": placement.depth,
        "title": placement.title,
        "url": placement.url,
        "ancestor_ids": list(placement.ancestor_ids),
        "ancestor_titles": list(placement.ancestor_titles),
        "body": body,
        "summary": page.description if page else "",
        "keywords": list(page.keywords) if page else [],
        "content_hash": page.content_hash if page else "",
        "trail_method": placement.trail_method,
    }


PAGES_OUTPUT = "pages"


def read_file(path: str) -> bytes:
    with FileSystems.open(path) as fh:
        return fh.read()


def reread_page(parser: PageParser, source: PageSource) -> ParsedPage | DeadLetter:
    """The page at `source` read and parsed again, or a DeadLetter if it cannot be,
    or if its file changed since it was first read."""
    if split_record_source(source.source):  # a WARC record: its URL is in it
        record = read_record(source.source)
        if isinstance(record, DeadLetter):
            return dataclasses.replace(record, stage="reread")
        page = parse_or_dead_letter(parser, source.source, lambda: record.payload, "reread", record.url)
    else:
        page = parse_or_dead_letter(parser, source.source, lambda: read_file(source.source), "reread")
    if isinstance(page, ParsedPage) and page.raw_hash != source.raw_hash:
        return DeadLetter(source.source, "reread", "changed_during_build",
                          "the file changed between the job's two reads")
    return page


def chosen_source(sources: Iterable[PageSource]) -> tuple[PageSource | None, int]:
    """(the source indexed of pages parsed at one URL: the least content hash,
    the number of the others, merged into it)."""
    ranked = sorted(sources, key=lambda s: (s.content_hash, s.source))
    return (ranked[0] if ranked else None), max(len(ranked) - 1, 0)


class NodeRowsFn(beam.DoFn):
    """The rows of one URL: its placement joined with the sources of the pages
    parsed at that URL. The page indexed is read and parsed again, so no shuffle
    carries page text: its node rows go to the main output, its pages-table row
    to PAGES_OUTPUT. A page that cannot be read again becomes a dead letter (DEAD)."""

    def __init__(self, parser: PageParser, granularity: str):
        self._parser = parser
        self._granularity = granularity
        self._merged = beam.metrics.Metrics.counter(COUNTERS, "pages_merged_duplicates")
        self._indexed = beam.metrics.Metrics.counter(COUNTERS, "pages_indexed")
        self._dead = beam.metrics.Metrics.counter(COUNTERS, "pages_dead_lettered")

    def process(self, joined: tuple[str, dict], site_bases: dict | None = None):
        _, group = joined
        placements = list(group["placement"])
        sources = list(group["page"])
        if not placements:
            self._merged.inc(len(sources))
            return
        placement = placements[0]
        chosen, merged = chosen_source(sources)
        if chosen is None:  # a trail entry that is not a page of the corpus
            yield placement_row(placement)
            return
        self._merged.inc(merged)
        page = reread_page(self._parser.with_site_bases(site_bases), chosen)
        if isinstance(page, DeadLetter):
            self._dead.inc()
            yield beam.pvalue.TaggedOutput(DEAD, page)
            yield placement_row(placement)  # keeps the children it already placed
            return
        self._indexed.inc()
        yield beam.pvalue.TaggedOutput(PAGES_OUTPUT, page_row(page))
        yield from page_node_rows(placement, page, self._granularity)


def page_node_rows(placement: NodePlacement, page: ParsedPage, granularity: str) -> list[dict]:
    """Node rows holding one placed page's text: the page, and its sections when
    the granularity is "section"."""
    if granularity == "page":
        return [placement_row(placement, page.body, page, placement.node_id)]
    return [placement_row(node, text, page, placement.node_id)
            for node, text in expand_sections(placement, page.sections)]


def write_dead_letters(out_dir: str, letters: list[DeadLetter]) -> None:
    rows = sorted(({"source": d.source, "stage": d.stage, "reason": d.reason, "detail": d.detail}
                   for d in letters), key=lambda r: (r["source"], r["stage"]))
    write_bytes(os.path.join(out_dir, DEAD_LETTERS_FILE), parquet_bytes(rows, DEAD_LETTERS_SCHEMA))


class ParsePages(beam.PTransform):
    """File pattern -> parsed pages (main output) and dead letters (DEAD).
    `site_bases`: InferSiteBases' decisions as a side input, or None."""

    def __init__(self, pattern: str, parser: PageParser, site_bases=None):
        super().__init__()
        self._pattern = pattern
        self._parser = parser
        self._side = {} if site_bases is None else {"site_bases": site_bases}

    def expand(self, pbegin):
        if is_warc_input(self._pattern):
            inputs = pbegin | "ReadWarc" >> ReadWarcInput(self._pattern)
        else:
            inputs = (pbegin
                      | "MatchFiles" >> fileio.MatchFiles(self._pattern)
                      | "ReadMatches" >> fileio.ReadMatches())
        return inputs | "Parse" >> beam.ParDo(ParsePagesFn(self._parser), **self._side).with_outputs(
            DEAD, main="pages")


class BuildForestNodes(beam.PTransform):
    """Parsed pages -> node rows ("nodes"), placed per site from skeletons and
    joined with their text by URL; the pages-table rows of the pages indexed
    (PAGES_OUTPUT); dead letters of pages that could not be read again (DEAD).
    Only skeletons and page sources are shuffled, never page text."""

    def __init__(self, parser: PageParser, granularity: str, site_bases=None):
        super().__init__()
        self._parser = parser
        self._granularity = granularity
        self._side = {} if site_bases is None else {"site_bases": site_bases}

    def expand(self, pages):
        placements = (
            pages
            | "Skeleton" >> beam.Map(lambda p: (p.site, PageSkeleton.of(p)))
            | "GroupBySite" >> beam.GroupByKey()
            | "PlaceSite" >> beam.FlatMap(place_site)
            | "KeyPlacementByLocation" >> beam.Map(lambda n: (n.url if n.kind == "page" else n.node_id, n))
        )
        sources = pages | "KeySourceByUrl" >> beam.Map(lambda p: (p.url, PageSource.of(p)))
        return (
            {"placement": placements, "page": sources}
            | "JoinPlacementAndSource" >> beam.CoGroupByKey()
            | "NodeRows" >> beam.ParDo(NodeRowsFn(self._parser, self._granularity), **self._side
                                       ).with_outputs(PAGES_OUTPUT, DEAD, main="nodes")
        )


def count_input_files(pattern: str) -> int:
    """Files the job will read, for the ETA of progress lines."""
    return sum(len(m.metadata_list) for m in FileSystems.match([pattern]))


def build_pipeline(p: beam.Pipeline, options: PipelineOptions, segment_dir: str, spec: EmbedderSpec,
                   representation: Representation, total_files: int | None = None) -> None:
    opts = options.view_as(BuildJobOptions)
    root, pattern = input_root_and_pattern(opts.input)
    parser = PageParser(root, opts.base_url or DEFAULT_BASE_URL, opts.site_depth, opts.max_page_bytes,
                        opts.follow_links_outside_input)
    site_bases = None
    # The user's --base_url wins over what pages say; WARC records carry their own URLs.
    if opts.base_url is None and not is_warc_input(pattern):
        decided = p | "InferSiteBases" >> InferSiteBases(pattern, parser, HTML_SUFFIXES)
        decided | "WriteSiteBases" >> beam.Map(lambda d: write_bytes(
            os.path.join(segment_dir, SITE_BASES_FILE), json.dumps(d, sort_keys=True, indent=1).encode()))
        site_bases = beam.pvalue.AsSingleton(decided)
    parsed = p | "ParsePages" >> ParsePages(pattern, parser, site_bases)
    pages = parsed["pages"] | "ParseProgress" >> LogProgress("parse (pages)", total_files)
    forest = pages | "Forest" >> BuildForestNodes(parser, opts.granularity, site_bases)
    ((parsed[DEAD], forest[DEAD])
     | "DeadLetters" >> beam.Flatten()
     | "AllDeadLetters" >> beam.combiners.ToList()
     | "WriteDeadLetters" >> beam.Map(lambda letters: write_dead_letters(segment_dir, letters)))
    forest[PAGES_OUTPUT] | "WritePages" >> WriteParquetTable(segment_dir, "pages", PAGES_SCHEMA, "url",
                                                             opts.num_shards)
    nodes = forest["nodes"] | "NodeProgress" >> LogProgress("forest (nodes)")
    nodes | "WriteNodes" >> WriteParquetTable(segment_dir, "nodes", NODES_SCHEMA, "node_id", opts.num_shards)

    chunks = (nodes
              | "Chunk" >> beam.ParDo(ChunkNodesFn(spec, representation))
              | "ChunkProgress" >> LogProgress("chunk (chunks)"))
    chunks | "WriteChunks" >> WriteParquetTable(segment_dir, "chunks", CHUNKS_SCHEMA, "chunk_id", opts.num_shards)
    chunks | "Sparse" >> BuildSparseIndex(segment_dir, opts.num_shards, representation)
    (chunks
     | "ChunkTexts" >> beam.Map(lambda c: (c["chunk_id"], c["embedded_text"]))
     | "Embed" >> EmbedChunks.from_options(spec, options, device=opts.embed_device)
     | "EmbedProgress" >> LogProgress("embed (chunks)")
     | "Dense" >> BuildDenseIndex(segment_dir, opts.num_shards, opts.dense_factory,
                                  opts.dense_nprobe, opts.dense_rerank))


def counter_values(result, expected: Iterable[str] = PAGE_COUNTERS) -> dict[str, int]:
    """The job's counters by name; `expected` ones are present even if never incremented."""
    values = dict.fromkeys(expected, 0)
    for counter in result.metrics().query(MetricsFilter())["counters"]:
        name = counter.key.metric.name
        value = counter.committed if counter.committed is not None else counter.attempted
        values[name] = values.get(name, 0) + int(value or 0)
    return values


def publish_build(layout: IndexLayout, segment_id: str, options: PipelineOptions, spec: EmbedderSpec,
                  representation: Representation, counts: dict[str, int], elapsed_s: float) -> str:
    """Checksum the finished segment, write its manifest, flip CURRENT."""
    opts = options.view_as(BuildJobOptions)
    segment_dir = layout.segment_dir(segment_id)
    with open_read(os.path.join(segment_dir, BM25_STATS_FILE)) as fh:
        bm25 = json.load(fh)
    with open_read(os.path.join(segment_dir, DENSE_INFO_FILE)) as fh:
        dense = json.load(fh)
    segment = layout.describe_segment(segment_id, opts.num_shards, counts)
    manifest = new_manifest(
        layout,
        segments=[segment],
        stats={"bm25": bm25, "pages": counts, "build_seconds": round(elapsed_s, 1)},
        config={
            "embedder": {**spec.to_dict(), "dimension": dense["dim"]},
            "dense": dense,
            "bm25": {"k1": 1.2, "b": 0.75},
            "representation": representation.to_dict(),
            "retrieval": retrieval_defaults(representation),
            "granularity": opts.granularity,
            "num_shards": opts.num_shards,
            "base_url": opts.base_url or DEFAULT_BASE_URL,
            # Per site as the input names it: the public base its pages named, or why none.
            "site_bases": read_site_bases(segment_dir),
            "site_depth": opts.site_depth,
        },
    )
    return publish_and_prune(layout, manifest, options)


def read_site_bases(segment_dir: str) -> dict[str, dict]:
    """InferSiteBases' decisions, written by the build; {} when --base_url was given."""
    path = os.path.join(segment_dir, SITE_BASES_FILE)
    if not FileSystems.exists(path):
        return {}
    with open_read(path) as fh:
        return json.load(fh)


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
    """Create the segment directory of a new version. One left there is debris of
    a run that crashed before publishing (no manifest names it, and the caller
    holds the lease, so no live job writes it): delete it."""
    if FileSystems.exists(segment_dir):
        LOG.warning("removing %s, left by a run that did not publish", segment_dir)
        FileSystems.delete([segment_dir])
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


def run(argv: list[str] | None = None) -> str:
    """Run a full build; returns the published version name."""
    options = PipelineOptions(argv)
    opts = required(options, BuildJobOptions, "input", "out")
    spec = EmbedderSpec(model=opts.embedding_model, query_prefix=opts.query_prefix,
                        document_prefix=opts.document_prefix)
    representation = representation_of(options)
    with prepare_job(options, opts.out, "build") as (layout, segment_id, segment_dir):
        started = time.time()
        total_files = count_input_files(input_root_and_pattern(opts.input)[1])
        LOG.info("building from %s (%d files) into %s", opts.input, total_files, segment_dir)
        result = run_pipeline(options, segment_dir,
                              lambda p: build_pipeline(p, options, segment_dir, spec, representation, total_files))
        counts = counter_values(result)
        elapsed = time.time() - started
        accounted = counts["pages_indexed"] + counts["pages_dead_lettered"] + counts["pages_merged_duplicates"]
        if accounted != counts["pages_read"]:
            raise RuntimeError(f"page accounting mismatch: read {counts['pages_read']} but "
                               f"indexed + dead-lettered + merged = {accounted}; not publishing")
        published = publish_build(layout, segment_id, options, spec, representation, counts, elapsed)
        rate = counts["pages_read"] / elapsed if elapsed else 0.0
        LOG.info("published %s in %.1f s (%.1f pages/s): %s", published, elapsed, rate,
                 ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
        return published


if __name__ == "__main__":
    # force: importing Beam has already configured the root logger (at WARNING)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    run()

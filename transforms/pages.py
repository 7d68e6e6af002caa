"""The pages stage: input files (a folder, a glob, WARC files or a crawl
directory) -> ParsedPage records, every input accounted for.

`ReadInput` is the one reader of a job's input: a crawl directory's current
records; else every file the pattern matches, a WARC file (known by its first
bytes, whatever its name, so one glob may mix WARC and page files) as its
records.

Each file is one page (or several: a forum thread's posts), or a dead letter
with a reason (`DEAD` output): of no kind a parser reads (`unknown_kind`),
outside the input root, not a regular file, unreadable, unparseable. Which
parser reads a file is decided by its content first and its name second,
among the kinds of the registry (transforms/sources/kinds.py): HTML by
transforms/parse, the others through transforms/sources/dispatch.py. No shuffle carries page
text: once placed, a page is either read back from the spill file its first
parse wrote (`SpillPagesFn`, `placed_page`: the build) or read and parsed
again (`reread_page`: the update); `PageParser` keeps the two parses
identical, and a file that changed between them is dead-lettered.

Counts (namespace "ritrag.build", data: transforms/counts.py; summed by the launcher's accounting):
pages_read = pages_indexed + pages_dead_lettered + pages_merged_duplicates
(+ pages_unchanged in an update); trail_taken_<method> and
trail_passed_over_<method> say how the breadcrumb cascade went.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import logging
import os
import re
import stat
import time
from typing import BinaryIO, Callable, Iterable, Iterator

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes, FileMetadata, FileSystem
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from ritrag.flags import add_arguments, option
from ritrag.ids import raw_hash
from ritrag.layout import DEAD_LETTERS_FILE
from ritrag.storage import is_remote
from ritrag.schema import (DEAD_LETTERS_SCHEMA, DeadLetter, PageSource, ParsedPage, WarcPage, page_from_json, page_json,
                           TOC_INDUCED_COUNTER_PREFIX, table_text)
from ritrag.transforms.counts import COUNTS, CountingDoFn, record_counts
from ritrag.transforms.forest import duplicate_winner
from ritrag.transforms.parse import UnparseablePage, parse_page
from ritrag.transforms.parse.decode import DEFAULT_MAX_BYTES
from ritrag.transforms.site_base import public_url
from ritrag.transforms.sources import (HTML, SourceFile, document_url_path, is_multi_page, is_warc, parse_document,
                                      record_source, sniff_kind, split_record_source, web_kind)
from ritrag.transforms.sources.kinds import described_kinds
from ritrag.transforms.sources.sniff import WARC_SNIFF_BYTES
from ritrag.transforms.tables import parquet_bytes, write_bytes
from ritrag.transforms.sources.warc import ReadCrawlDirPages, crawl_dir_of, open_raw, read_record, read_warc_pages
from ritrag.urls import is_normal_form, is_plain_segment, normalize_url, site_of

LOG = logging.getLogger("ritrag.pages")
COUNTERS = "ritrag.build"
DEAD = "dead"  # the tagged output of dead letters
# pages_read = pages_indexed + pages_dead_lettered + pages_merged_duplicates
PAGE_COUNTERS = ("pages_read", "pages_parsed", "pages_indexed", "pages_dead_lettered",
                 "pages_merged_duplicates")
LINKS_CAPPED_COUNTER = "pages_links_capped"  # pages parsed with more links than ParsedPage.links keeps
LINKS_NAVIGATION_COUNTER = "links_navigation"  # link elements of parsed pages left out as navigation
# A file modified this recently when it was read gets no stamp (always read by
# the next update): a second write within the file system's timestamp tick
# (coarse clocks: milliseconds; FAT: 2 s), or within a clock skew between the
# writer and this worker, could keep both size and mtime (git's "racily clean").
STAMP_SETTLE_S = 60.0


@dataclasses.dataclass(frozen=True)
class JobInput:
    """What a job reads pages from: its flag."""

    input: str | None = option(None, f"directory or glob of input files: {described_kinds()}, by content "
                                     "(any Beam filesystem)")


class InputOptions(PipelineOptions):
    """The input of every job that reads pages (build, update). Beam gathers the
    flags of the direct subclasses of PipelineOptions (to pass them to workers), so
    each flag is defined once, in a direct subclass; a job reads its flags through a
    view class that inherits the ones it needs (`BuildJobOptions`)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        add_arguments(parser, JobInput)
        add_arguments(parser, PageParser)  # how a page is read: PageParser's flags


def index_inside_input(root: str, index_dir: str) -> str | None:
    """The prefix, as the input's files are listed under `root`, of the
    index's own files when the index folder lies inside the input folder
    (`ritrag update docs --index docs/.index`); None when it lies elsewhere. A
    job never reads its index as input: each of its files would be a dead
    letter at every update, and every update would publish for them."""
    if is_remote(root) or is_remote(index_dir):
        inside = index_dir.rstrip("/") + "/"
        return inside if inside.startswith(root) and inside != root else None
    relative = os.path.relpath(os.path.abspath(index_dir), os.path.abspath(root))
    if relative == os.curdir or relative.split(os.sep)[0] == os.pardir:
        return None
    return os.path.join(root, relative) + os.sep


def input_root_and_pattern(spec: str) -> tuple[str, str]:
    """(directory that relative URLs start from, glob of the files to read)."""
    if any(ch in spec for ch in "*?["):
        root = spec[: min(spec.index(ch) for ch in "*?[" if ch in spec)]
        return root.rsplit("/", 1)[0] + "/", spec
    root = spec if spec.endswith("/") else spec + "/"
    return root, root + "**"


# What a file name may hold that a URL cannot: control characters (urlsplit
# drops tabs and newlines, so `a\n.html` would be `a.html`), and the bytes of a
# name that is not UTF-8 (Python's surrogateescape gives them as U+DC80-U+DCFF).
# A name's "?" and "#" are characters of the file, not the start of a query or
# fragment: a web server serves "a#1.html" at "a%231.html" (cut at "#", it and
# "a#2.html" would be one URL), and `wget -k` links a saved "p.php?id=3.html" as
# "p.php%3Fid=3.html".
_NOT_IN_URL = re.compile("[\x00-\x1f\x7f?#\udc80-\udcff]")


def _percent_encoded(match: re.Match) -> str:
    code = ord(match.group())
    return f"%{code - 0xDC00 if code >= 0xDC80 else code:02X}"


def page_url(path: str, root: str, base_url: str) -> str:
    """The URL of the input file at `path`: its path under `root`, appended to
    `base_url`, each control character, "?", "#" and each byte of a name that
    is not UTF-8 percent-encoded (as a web server serving the file names it)."""
    relative = path[len(root):] if path.startswith(root) else os.path.basename(path)
    relative = _NOT_IN_URL.sub(_percent_encoded, relative)
    return base_url.rstrip("/") + "/" + document_url_path(relative).lstrip("/")


# Folders' real paths, resolved once per process rather than for each file
# (every file is checked up to three times, and each component of a path costs
# realpath an lstat).
_real_folder = functools.lru_cache(maxsize=4096)(os.path.realpath)


def real_path(path: str) -> str:
    """`os.path.realpath(path)`, with the folders above the file resolved once per process."""
    folder, name = os.path.split(path)
    if name in ("", ".", ".."):
        return os.path.realpath(path)
    real = os.path.join(_real_folder(folder), name)
    return os.path.realpath(real) if os.path.islink(real) else real


@dataclasses.dataclass(frozen=True)
class PageParser:
    """How a job turns one input file into a ParsedPage: the same in every pass.
    The fields a command line sets are InputOptions' flags; a job reads them
    back with `from_arguments`, the rest (the index's) given."""

    root: str = dataclasses.field(metadata={"cli": False})
    base_url: str = dataclasses.field(metadata={"cli": False})
    site_depth: int = dataclasses.field(metadata={"cli": False})
    max_page_bytes: int = option(DEFAULT_MAX_BYTES, "a larger input file (or WARC record) is a dead letter "
                                                    "(too_large)")
    follow_links_outside_input: bool = option(False, "index files whose real path (symbolic links resolved) lies "
                                                     "outside the input directory; by default they are dead "
                                                     "letters (outside_input)")
    # (site as the input names it, its public base)
    site_bases: tuple[tuple[str, str], ...] = dataclasses.field(default=(), metadata={"cli": False})

    def refusal(self, path: str) -> DeadLetter | None:
        """Why the file at `path` must not be opened, as a dead letter; None when
        it may be. A local file whose real path lies outside the input root (a
        symbolic link to /etc/passwd, or to another folder) would leak into the
        index; a FIFO or device would block or never end. Object stores have
        neither links nor special files."""
        if is_remote(path):
            return None
        real = real_path(path)
        root = _real_folder(self.root)
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

    @functools.cached_property
    def _public_bases(self) -> dict[str, str]:
        """`site_bases` as a mapping, made once: `locate` asks it of every file."""
        return dict(self.site_bases)

    def locate(self, path: str, url: str | None = None) -> tuple[str, str]:
        """(URL, site) of a page: `url` where the input records it (WARC), else the
        input's URL for `path`, under its site's public base where one was inferred.
        Every job keys pages by this URL."""
        url = url or self.input_url(path)
        site = site_of(url, self.site_depth)
        base = self._public_bases.get(site)
        return (public_url(url, site, base), base) if base else (url, site)

    def document_url(self, path: str) -> str:
        """The normalized URL of the page of the input file at `path` (a nav file
        names documents by path; an update's diff keys files by it). Without
        public bases no site is needed, so none is computed."""
        return normalize_url(self.locate(path)[0] if self.site_bases else self.input_url(path))

    def document_urls(self, paths: Iterable[str]) -> list[str]:
        """`document_url` of each of `paths`, its folder's part derived once per
        folder (`_folder_url`): a file whose name, as its kind serves it, is a
        plain URL segment (`is_plain_segment`) is at its folder's URL + "/" +
        that name; any other is located whole. An update locates every input
        file: 15-19 us a file one by one, 8-11 us so at 500k files, 7.7 a
        folder (benchmarks/RESULTS.md, session 23)."""
        folders: dict[str, str | None] = {}
        urls = []
        for path in paths:
            folder, _, name = path.rpartition("/")
            if folder not in folders:
                folders[folder] = self._folder_url(folder) if folder else None
            prefix, served = folders[folder], document_url_path(name)
            urls.append(f"{prefix}/{served}" if prefix is not None and is_plain_segment(served)
                        else self.document_url(path))
        return urls

    def _folder_url(self, folder: str) -> str | None:
        """What `document_url` gives each file of `folder` with a plain name,
        before its "/" + name; None where that is not so: the folder's URL is
        not in normal form, or the file's name is part of its site's key
        (`site_depth` reaches below the folder), which a public base may map."""
        probe = f"{folder}/a"
        # A site key holding the name ends with it (a folder named "a" too: then not derived, still right).
        if self.site_bases and site_of(self.input_url(probe), self.site_depth).endswith("/a"):
            return None
        url = self.document_url(probe)
        return url[:-2] if url.endswith("/a") and is_normal_form(url) else None

    def parse(self, path: str, data: bytes, url: str | None = None, kind: str | None = None) -> list[ParsedPage]:
        """The pages of one input: one, or a thread's posts (each `source` then
        names its record). `url`: the page's own URL where the input records it
        (WARC), else the input's; `kind`: what the input says it is (a WARC
        record's content type), else sniffed."""
        url, site = self.locate(path, url)
        kind = kind or sniff_kind(path, data)
        if kind == HTML:
            pages = [(None, parse_page(data, url, site, max_bytes=self.max_page_bytes))]
        else:
            document = SourceFile(path, data, normalize_url(url), site, self.root, self.document_url)
            pages = parse_document(kind, document, self.max_page_bytes)
        digest = raw_hash(data)
        return [dataclasses.replace(page, source=record_source(path, key) if key else path, raw_hash=digest,
                                    source_kind=kind) for key, page in pages]


    def input_pages(self, path: str, data: bytes) -> list[tuple[str, str]]:
        """(URL, source) of every page an input file holds, as an update's diff keys
        them: the file's own URL; a file of several pages (a thread) is parsed to
        find each record's (a file that does not parse holds its own URL only)."""
        own = [(normalize_url(self.locate(path)[0]), path)]
        if not is_multi_page(path, data):
            return own
        pages = parse_or_dead_letter(self, path, lambda: data, "diff")
        return own if isinstance(pages, DeadLetter) else [(page.url, page.source) for page in pages]


# The parser a stage is given: one known when the pipeline is built, or one the
# pipeline decides (the build's, once InferSiteBases has given each site its
# public base) as a singleton side input. Stages pass it to their DoFns as an
# argument of `process`, where it is a PageParser either way.
ParserArg = PageParser | beam.pvalue.AsSingleton


def warc_kind(record: WarcPage) -> str | None:
    """The parser kind of a WARC record's payload (the one sniffer, its declared
    content type a hint), None if it is no web page kind."""
    return web_kind(record.payload, record.content_type)


def parse_or_dead_letter(parser: PageParser, path: str, read: Callable[[], bytes], stage: str,
                         url: str | None = None, kind: str | None = None) -> list[ParsedPage] | DeadLetter:
    """The ParsedPages of the file at `path`, or a DeadLetter of `stage` saying why not."""
    try:
        return parser.parse(path, read(), url, kind)
    except UnparseablePage as exc:
        return DeadLetter(path, stage, exc.reason, exc.detail)
    except OSError as exc:
        return DeadLetter(path, stage, "unreadable", f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a parser bug must cost one page, not the job
        LOG.exception("unexpected error parsing %s", path)
        return DeadLetter(path, stage, "parser_error", f"{type(exc).__name__}: {exc}")


class ParsePagesFn(CountingDoFn):
    """What ReadInput reads -> ParsedPage, or a DeadLetter on the DEAD output."""

    def __init__(self, count_read: bool = True):
        super().__init__(COUNTERS)
        self._count_read = count_read  # an update counts its reads when it diffs the input

    def _count_trail(self, page: ParsedPage) -> None:
        """trail_taken_<method> and trail_passed_over_<method>: how the cascade went."""
        for name in (f"trail_taken_{page.trail_method}", *(f"trail_passed_over_{m}" for m in page.trail_passed_over)):
            self.count(name)

    def process(self, readable: fileio.ReadableFile | WarcPage | DeadLetter, parser: PageParser):
        if not isinstance(readable, fileio.ReadableFile):  # a WARC input's record (transforms/sources/warc.py)
            yield from self._process_record(readable, parser)
            return
        path = readable.metadata.path
        outcome = parser.refusal(path) or parse_or_dead_letter(
            parser, path, lambda: read_bounded(readable.open, parser.max_page_bytes), "parse")
        # A file of one page carries the stamp it was listed with. A file of several
        # pages (a thread and its posts) gets none, so an update always reads it:
        # its posts' URLs are known only from its bytes.
        if not isinstance(outcome, DeadLetter) and len(outcome) == 1 and outcome[0].source == path:
            outcome = [dataclasses.replace(outcome[0], source_stamp=file_stamp(
                readable.metadata.size_in_bytes, readable.metadata.last_updated_in_seconds, time.time()))]
        yield from self._emit(outcome)

    def _process_record(self, record: WarcPage | DeadLetter, parser: PageParser):
        if isinstance(record, WarcPage) and warc_kind(record) is None:
            record = DeadLetter(record.source, "read", "unknown_kind",
                                f"content type {record.content_type or '(none)'!r}, "
                                f"content starts {record.payload[:24].decode('utf-8', 'replace')!r}")
        yield from self._emit(record if isinstance(record, DeadLetter) else parse_or_dead_letter(
            parser, record.source, lambda: record.payload, "parse", record.url, warc_kind(record)))

    def _emit(self, outcome: list[ParsedPage] | DeadLetter):
        """Counts one input's outcome and routes it: its pages (each a page read:
        a thread's posts count one each), or a dead letter."""
        if isinstance(outcome, DeadLetter):
            if self._count_read:
                self.count("pages_read")
            self.count("pages_dead_lettered")
            yield beam.pvalue.TaggedOutput(DEAD, outcome)
            return
        for page in outcome:
            if self._count_read:
                self.count("pages_read")
            self.count("pages_parsed")
            self._count_trail(page)
            if page.links_past_cap:
                self.count(LINKS_CAPPED_COUNTER)
            if page.links_navigation:
                self.count(LINKS_NAVIGATION_COUNTER, page.links_navigation)
            if page.toc_induced:
                self.count(f"{TOC_INDUCED_COUNTER_PREFIX}{page.toc_induced}")
            yield page


def file_stamp(size: int, mtime: float | None, read_at: float | None = None) -> str:
    """A listed input file's size and modification time, as `ParsedPage.source_stamp`
    records it and an update's diff compares it: "" (never equal to a stored
    one, so the file is read) where the file system gives no time, or where the
    file had been modified within STAMP_SETTLE_S of `read_at`, when it was read."""
    if not mtime or (read_at is not None and read_at - mtime < STAMP_SETTLE_S):
        return ""
    return f"{size}:{mtime!r}"


def read_bounded(open_file: Callable[[], BinaryIO], max_bytes: int) -> bytes:
    """The bytes of the file `open_file` opens, read no further than `max_bytes`
    + 1: a longer file is an UnparseablePage("too_large"), never read whole (a
    6 GiB file must not cost 6 GiB to refuse)."""
    with open_file() as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnparseablePage("too_large", f"over {max_bytes} bytes (--max_page_bytes)")
    return data


def read_file(path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The bytes of the input file at `path` (`read_bounded`)."""
    return read_bounded(lambda: FileSystems.open(path), max_bytes)


_FILE_PAGES: collections.OrderedDict = collections.OrderedDict()  # (parser, path, raw hash) -> pages, LRU
_FILE_PAGES_KEPT = 4


def _file_pages(parser: PageParser, path: str, raw_hash: str) -> list[ParsedPage] | DeadLetter:
    """The pages of a file of several pages, kept for its other records: re-reading
    each post of a 10,000-post dump must not parse the dump 10,000 times. Kept
    only when they were parsed from the bytes the first pass hashed, so a file
    that changed meanwhile is parsed again (and its records dead-lettered) each time."""
    key = (parser, path, raw_hash)
    if key in _FILE_PAGES:
        _FILE_PAGES.move_to_end(key)
        return _FILE_PAGES[key]
    pages = parse_or_dead_letter(parser, path, lambda: read_file(path, parser.max_page_bytes), "reread")
    if not isinstance(pages, DeadLetter) and pages and pages[0].raw_hash == raw_hash:
        _FILE_PAGES[key] = pages
        while len(_FILE_PAGES) > _FILE_PAGES_KEPT:
            _FILE_PAGES.popitem(last=False)
    return pages


def reread_page(parser: PageParser, source: PageSource) -> ParsedPage | DeadLetter:
    """The page at `source` read and parsed again, or a DeadLetter if it cannot be,
    or if its file changed since it was first read."""
    in_file = split_record_source(source.source)
    if in_file is None:
        pages = parse_or_dead_letter(parser, source.source, lambda: read_file(source.source, parser.max_page_bytes),
                                     "reread")
    elif in_file.warc_offset is not None:  # a WARC record: its URL is in it
        record = read_record(source.source, parser.max_page_bytes)
        if isinstance(record, DeadLetter):
            return dataclasses.replace(record, stage="reread")
        pages = parse_or_dead_letter(parser, source.source, lambda: record.payload, "reread", record.url,
                                     warc_kind(record))
    else:  # a post of a thread or dump: its file, parsed once for all
        pages = _file_pages(parser, in_file.path, source.raw_hash)
    if isinstance(pages, DeadLetter):
        return dataclasses.replace(pages, source=source.source)
    page = next((p for p in pages if p.source == source.source), None)
    if page is None or page.raw_hash != source.raw_hash:
        return DeadLetter(source.source, "reread", "changed_during_build",
                          "the file changed between the job's two reads")
    return dataclasses.replace(page, source_stamp=source.source_stamp)  # the same bytes the first read listed


SpillRef = tuple[str, int, int]  # (spill file, offset, length) of one ParsedPage as JSON (schema.page_json)


@dataclasses.dataclass(frozen=True)
class SpilledSource(PageSource):
    """A page source whose parsed page its first parse kept in a spill file."""

    spill: SpillRef = ("", 0, 0)


class SpillPagesFn(beam.DoFn):
    """ParsedPage -> (url, SpilledSource): the page appended to its bundle's
    spill file under `spill_dir`, so that the node rows read it back instead of
    parsing the file again (a parse costs 20-40 times the read back). The files
    are the job's own scratch (deleted with the segment's `.spill/` before
    publishing), read only by the job that wrote them; JSON, never pickles."""

    def __init__(self, spill_dir: str):
        self._spill_dir = spill_dir.rstrip("/")

    def start_bundle(self):
        self._file, self._path, self._offset = None, "", 0

    def process(self, page: ParsedPage):
        data = page_json(page)
        if self._file is None:
            # Named by the bundle's first page: a retried bundle that starts alike rewrites the same bytes
            # (deterministic output), one that starts elsewhere writes a file of its own.
            first = hashlib.blake2b(f"{page.source}\x1f{page.raw_hash}".encode("utf-8", "surrogatepass"),
                                    digest_size=16).hexdigest()
            self._path = f"{self._spill_dir}/{first}.jsonl"
            self._file = FileSystems.create(self._path, compression_type=CompressionTypes.UNCOMPRESSED)
            self._offset = 0
        self._file.write(data + b"\n")  # one JSON document a line
        source = SpilledSource(page.url, page.source, page.raw_hash, page.content_hash, page.source_stamp,
                               (self._path, self._offset, len(data)))
        self._offset += len(data) + 1
        yield page.url, source

    def finish_bundle(self):
        if self._file is not None:
            self._file.close()
            self._file = None


def read_spilled_page(ref: SpillRef) -> ParsedPage:
    path, offset, length = ref
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
        fh.seek(offset)
        return page_from_json(fh.read(length))


def placed_page(parser: PageParser, source: PageSource) -> ParsedPage | DeadLetter:
    """The parsed page of a placed source: read back from its spill file, or
    read and parsed again (`reread_page`)."""
    if isinstance(source, SpilledSource):
        return read_spilled_page(source.spill)
    return reread_page(parser, source)


def chosen_source(sources: Iterable[PageSource]) -> tuple[PageSource | None, list[PageSource]]:
    """(the source indexed of pages parsed at one URL, the others, merged into
    it): the forest's rule (`duplicate_winner`), so the node is one input's."""
    return duplicate_winner(sources, lambda s: s.source)


def duplicate_letter(loser: PageSource, winner: PageSource) -> DeadLetter:
    """The dead letter of an input merged into another at its URL. It is counted
    as pages_merged_duplicates, not as pages_dead_lettered: a page read is
    counted once."""
    return DeadLetter(loser.source, "forest", "duplicate_url",
                      f"{loser.url} is indexed from {winner.source}")


def write_dead_letters(out_dir: str, letters: list[DeadLetter]) -> None:
    rows = sorted(({"source": table_text(d.source), "stage": d.stage, "reason": d.reason,
                    "detail": table_text(d.detail)}
                   for d in letters), key=lambda r: (r["source"], r["stage"]))
    write_bytes(os.path.join(out_dir, DEAD_LETTERS_FILE), parquet_bytes(rows, DEAD_LETTERS_SCHEMA))


class WriteDeadLetters(beam.PTransform):
    """Every stage's dead letters (a tuple of PCollections) -> the segment's one
    dead-letters table, written even when it is empty. Dead letters are few
    (one per bad input file), so they are gathered in one list."""

    def __init__(self, out_dir: str):
        super().__init__()
        self._out_dir = out_dir

    def expand(self, dead_letters):
        out_dir = self._out_dir
        return (dead_letters
                | "Flatten" >> beam.Flatten()
                | "ToList" >> beam.combiners.ToList()
                | "Write" >> beam.Map(lambda letters: write_dead_letters(out_dir, letters)))


def _head(path: str) -> bytes:
    """The first bytes of a file, as stored (b"" if it cannot be read: the parse says why)."""
    try:
        with open_raw(path) as fh:
            return fh.read(WARC_SNIFF_BYTES)
    except OSError:
        return b""


def warc_records_or_file(readable: fileio.ReadableFile, parser: PageParser
                         ) -> Iterable[fileio.ReadableFile | WarcPage | DeadLetter]:
    """A matched input file as itself, or, when it is a WARC file (by its first
    bytes), as its records. A file the parser refuses to open is not sniffed."""
    path = readable.metadata.path
    if parser.refusal(path) is None and is_warc(path, _head(path)):
        yield from read_warc_pages(path, parser.max_page_bytes)
    else:
        yield readable


class ReadInput(beam.PTransform):
    """An input pattern -> what the parse reads (`ParsePagesFn`, the update's
    diff): the WarcPage records of a crawl directory's current pages; else every
    matched file, a WARC file as its WarcPage records (and DeadLetters of its
    damage), any other as a ReadableFile."""

    def __init__(self, pattern: str, parser: PageParser, index_files: str | None = None):
        """`index_files`: the prefix of the index's own files, when they lie
        under the input (`index_inside_input`): not read."""
        super().__init__()
        self._pattern = pattern
        self._parser = parser
        self._index_files = index_files

    def expand(self, pbegin):
        crawl_dir = crawl_dir_of(self._pattern)
        if crawl_dir is not None:
            return pbegin | "ReadCrawlDir" >> ReadCrawlDirPages(crawl_dir, self._parser.max_page_bytes)
        matched = pbegin | "MatchFiles" >> fileio.MatchFiles(self._pattern)
        if self._index_files:
            matched |= "NotTheIndex" >> beam.Filter(lambda m, index: not m.path.startswith(index), self._index_files)
        dangling = (pbegin
                    | "Pattern" >> beam.Create([self._pattern])
                    | "DanglingLinks" >> beam.FlatMap(dangling_links, self._index_files))
        return ((matched, dangling)
                | "Listed" >> beam.Flatten()
                | "Reshuffle" >> beam.Reshuffle()  # files (a WARC file is many pages) spread over workers
                | "ReadMatches" >> fileio.ReadMatches()
                | "ReadWarcFiles" >> beam.FlatMap(warc_records_or_file, self._parser))


class ParsePages(beam.PTransform):
    """What ReadInput reads -> parsed pages (main output) and dead letters (DEAD).
    `count_read`: whether each input counts as a page read (an update counts its
    reads when it diffs the input)."""

    def __init__(self, parser: ParserArg, count_read: bool = True):
        super().__init__()
        self._parser = parser
        self._count_read = count_read

    def expand(self, readables):
        return record_counts(readables | "Parse" >> beam.ParDo(ParsePagesFn(self._count_read), self._parser
                                                               ).with_outputs(DEAD, COUNTS, main="pages"))


def count_input_files(pattern: str, index_files: str | None = None) -> int:
    """Files the job will read, for the ETA of progress lines (the index's own
    files left out, where it lies inside the input: `index_inside_input`)."""
    return sum(1 for m in FileSystems.match([pattern])[0].metadata_list
               if not (index_files and m.path.startswith(index_files)))


def local_walk(pattern: str) -> tuple[str, Callable[[str], object]] | None:
    """(the folder to walk, whether a path matches) of a local wildcard
    pattern, as Beam's LocalFileSystem matches it; None for one file or an
    object store's pattern (listed by FileSystems.match)."""
    prefix = re.match(r"^[^[*?]*", pattern).group(0)
    if is_remote(pattern) or prefix == pattern:
        return None
    if pattern == prefix + "**" and prefix.endswith("/"):  # a folder's every file: no test per file (1.5 us)
        return os.path.dirname(prefix), _every_path
    return os.path.dirname(prefix), re.compile(
        FileSystem.translate_pattern(pattern + "*" if pattern.endswith("/") else pattern)).match


def _every_path(path: str) -> bool:
    return True


def dangling_links(pattern: str, index_files: str | None = None) -> Iterator[FileMetadata]:
    """The symbolic links to nothing that a local `pattern` matches, as
    metadata (size 0) a ReadableFile is made of. Beam's listing drops a file
    it cannot stat: the build adds these to what it reads, so that each
    becomes a dead letter (`PageParser.refusal`), not a page lost unseen. Only
    the links are stat'ed (a folder entry says whether it is one)."""
    walk = local_walk(pattern)
    if walk is None:
        if not is_remote(pattern) and os.path.islink(pattern) and not os.path.exists(pattern):
            yield FileMetadata(pattern, 0, last_updated_in_seconds=0.0)
        return
    top, matches = walk
    folders = [top]
    while folders:
        folder = folders.pop()
        if index_files and os.path.join(folder, "").startswith(index_files):
            continue  # the index's own folder: not input
        try:
            with os.scandir(folder) as entries:
                found = list(entries)
        except OSError:  # unreadable or gone: Beam's walk skips it too
            continue
        for entry in found:
            if entry.is_dir(follow_symlinks=False):  # as os.walk: a link to a folder is not followed
                folders.append(entry.path)
            elif entry.is_symlink() and matches(entry.path) and not os.path.exists(entry.path):
                yield FileMetadata(entry.path, 0, last_updated_in_seconds=0.0)

"""The incremental update's diff: a new input snapshot against the live
version's pages table -> what to parse, what is gone, and which sites' forests
may change (transforms/delta.py takes it from there).

  DiffInput  input files listed in batches, located (the URL their path names,
             `LocateInputBatchFn`) and grouped by the pages shard that owns it;
             a file whose URL's live row records the same stamp (size, mtime:
             `file_stamp`) is taken as unchanged without being read
             (`MatchStampsFn`, rsync's quick check); every other file is read
             and hashed (`HashInputBatchFn`). Then each shard compares its
             inputs with its live pages rows (`ClassifyShardFn`): unchanged
             (counted), new or changed (to parse, with the stored skeleton),
             gone (a URL tombstone, with its site).

A stamp is trusted only where it was recorded (a file's own page, read from a
folder or glob, not modified within `STAMP_SETTLE_S` of its read); a file whose
content changed while both its size and mtime stayed (a restore that keeps
times, a clock set back) is missed, as by rsync: `--read_every_input` reads
and hashes every file instead.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Iterable, Iterator

import apache_beam as beam
import pyarrow as pa
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.filesystem import FileMetadata
from apache_beam.options.pipeline_options import PipelineOptions

from ritrag.flags import add_arguments, option
from ritrag.ids import raw_hash, shard_of
from ritrag.reader import IndexReader
from ritrag.schema import DeadLetter, PageSkeleton, StoredSkeleton, WarcPage
from ritrag.transforms.counts import COUNTS, CountingDoFn, record_counts
from ritrag.transforms.pages import (COUNTERS, PageParser, ReadInput, file_stamp, read_bounded,
                                     warc_records_or_file)
from ritrag.transforms.parse import UnparseablePage
from ritrag.transforms.sources import split_record_source
from ritrag.transforms.sources.warc import crawl_dir_of
from ritrag.urls import normalize_url

DIFF_BATCH_FILES = 256  # input files the diff locates, or reads and hashes, per element
STAMP_COUNTER = "pages_trusted_by_stamp"  # of pages_unchanged: files not read, their stamp unchanged


@dataclasses.dataclass(frozen=True)
class DiffSettings:
    """How an update finds the input files that changed: its flags."""

    read_every_input: bool = option(False, "read and hash every input file; by default a file whose size and "
                                           "modification time equal those its page was indexed with is taken "
                                           "as unchanged unread")


class DiffOptions(PipelineOptions):
    """How an update finds the input files that changed."""  # (its argument group's title) DiffSettings' flags

    @classmethod
    def _add_argparse_args(cls, parser):
        add_arguments(parser, DiffSettings)


# The diff's per-file items are plain tuples, which Beam's coder writes itself;
# a dataclass or FileMetadata is pickled, once per file at every shuffle.
ListedFile = tuple[str, int, float]  # (path, size, mtime) as the file system listed it
InputFile = tuple[str, str]  # (path, raw hash; "" where not read: matches no page)


def listed_file(metadata: FileMetadata) -> ListedFile:
    return metadata.path, metadata.size_in_bytes, metadata.last_updated_in_seconds


def file_batches(files: Iterable[ListedFile]) -> Iterator[list[ListedFile]]:
    """`files` in lists of DIFF_BATCH_FILES (the last one shorter): the diff's elements."""
    batch: list[ListedFile] = []
    for listed in files:
        batch.append(listed)
        if len(batch) == DIFF_BATCH_FILES:
            yield batch
            batch = []
    if batch:
        yield batch


def by_url(batches: Iterable[list[tuple[str, object]]]) -> dict[str, list]:
    """A shard's (URL, item) batches -> the items at each URL."""
    items: dict[str, list] = defaultdict(list)
    for batch in batches:
        for url, item in batch:
            items[url].append(item)
    return items


class ClassifyShardFn(CountingDoFn):
    """(pages shard, the inputs at the URLs it owns) -> per URL of the shard,
    its inputs against its live pages row: unchanged -> counted, nothing else
    (the stages that need an unchanged page read it back, filtered);
    new/changed -> its path, to parse (main), and its stored skeleton
    (OLD_SKELETON); gone -> its URL, to tombstone (DEAD_URL, as a changed
    page's), and its site (GONE_SITE: the site's forest changes).

    The shard's live rows are read column-wise, once, and a row becomes a
    record only when its page changed: the diff's elements are the inputs, not the
    index's pages too. A worker holds one shard's inputs and live rows (URL,
    hash, skeleton): the pages over `--num_shards`."""

    DEAD_URL, OLD_SKELETON, GONE_SITE = "dead_url", "old_skeleton", "gone_site"

    def __init__(self, live: IndexReader):
        super().__init__(COUNTERS)
        self._files = live.files("pages")

    def process(self, shard_and_inputs: tuple[int, Iterable[list[tuple[str, InputFile]]]]):
        shard, batches = shard_and_inputs
        inputs_at = by_url(batches)  # one batch is empty: the marker that makes every shard's group exist
        tables = [f.table(["raw_hash", *StoredSkeleton._fields]) for f in self._files if f.shard == shard]
        table = pa.concat_tables(tables) if tables else None
        old_at: dict[str, list[int]] = defaultdict(list)
        hashes = table["raw_hash"].to_pylist() if table is not None else []
        for row, url in enumerate(table["url"].to_pylist() if table is not None else []):
            old_at[url].append(row)
        for url in inputs_at.keys() | old_at.keys():
            inputs, old_rows = inputs_at.get(url, []), old_at.get(url, [])
            self.count("pages_read", len(inputs))
            if len(inputs) == 1 and len(old_rows) == 1 and inputs[0][1] == hashes[old_rows[0]]:
                self.count("pages_unchanged")
                continue
            yield from self._changed(url, inputs, [StoredSkeleton(**table.slice(r, 1).select(StoredSkeleton._fields)
                                                                  .to_pylist()[0]) for r in old_rows])

    def _changed(self, url: str, inputs: list[InputFile], old: list[StoredSkeleton]) -> Iterable:
        if not inputs:
            self.count("pages_deleted")
            yield beam.pvalue.TaggedOutput(self.DEAD_URL, url)
            for row in old:
                yield beam.pvalue.TaggedOutput(self.GONE_SITE, row.site)
            return
        if old:
            self.count("pages_replaced")
            yield beam.pvalue.TaggedOutput(self.DEAD_URL, url)
            for row in old:
                yield beam.pvalue.TaggedOutput(self.OLD_SKELETON, (url, PageSkeleton.from_row(row)))
        for path, _ in inputs:
            # A record of a file of several pages is parsed with its file, which the
            # file's own page sends (every record of a file changes with the file).
            in_file = split_record_source(path)
            if in_file is None or in_file.warc_offset is not None:
                yield path


def hashed_input(parser: PageParser, readable: fileio.ReadableFile | WarcPage | DeadLetter
                 ) -> Iterable[tuple[str, InputFile]]:
    """An input file -> (its URL, its path and raw hash). A file the parser
    refuses to open (outside the input, not a regular file) is not read: its
    empty hash matches no page, so it goes to ParsePagesFn, which dead-letters it."""
    if isinstance(readable, WarcPage):  # a WARC input's record: its URL is in it
        yield normalize_url(readable.url), (readable.source, raw_hash(readable.payload))
        return
    if isinstance(readable, DeadLetter):  # an unreadable WARC record: read again by ParsePagesFn, dead-lettered
        yield readable.source, (readable.source, "")
        return
    path = readable.metadata.path
    if parser.refusal(path):
        yield parser.document_url(path), (path, "")
        return
    try:
        data = read_bounded(readable.open, parser.max_page_bytes)
    except UnparseablePage:  # too large: like a refused file, no page's hash; ParsePagesFn dead-letters it
        yield parser.document_url(path), (path, "")
        return
    for url, source in parser.input_pages(path, data):  # a thread's posts: one each
        yield url, (source, raw_hash(data))


class ShardedBatchFn(beam.DoFn):
    """A batch of listed input files -> (pages shard, the (URL, item) pairs of
    the batch whose URL it owns), one element per shard: the runner's cost per
    element is paid per batch. A directory is skipped, as ReadMatches skips it."""

    def __init__(self, parser: PageParser, num_shards: int):
        self._parser, self._num_shards = parser, num_shards

    def items(self, listed: ListedFile) -> Iterable[tuple[str, object]]:
        raise NotImplementedError

    def process(self, batch: list[ListedFile]):
        by_shard: dict[int, list[tuple[str, object]]] = defaultdict(list)
        for listed in batch:
            if not listed[0].endswith(("/", "\\")):
                for url, item in self.items(listed):
                    by_shard[shard_of(url, self._num_shards)].append((url, item))
        yield from by_shard.items()


class LocateInputBatchFn(ShardedBatchFn):
    """Each file's (URL its path names, the file as listed):
    `PageParser.document_url`, nothing read. For a file of one page that is its page's URL; a file of
    several pages (a WARC file, a thread) has no stamp on any of its pages' rows
    and is read (MatchStampsFn)."""

    def items(self, listed: ListedFile) -> Iterable[tuple[str, ListedFile]]:
        yield self._parser.document_url(listed[0]), listed


class MatchStampsFn(CountingDoFn):
    """(pages shard, the located input files of its URLs) -> (shard, [(URL,
    InputFile)]) of the files taken as unchanged: alone at their URL, whose one
    live row records the same stamp (`file_stamp`: only the page of a file of
    one page has one). The path may differ: a snapshot copied with its times kept (cp -a,
    rsync -a) is the same content at the same URLs. The InputFile carries the
    live row's raw hash, so ClassifyShardFn finds it unchanged as if it had
    been read. Every other file goes to READ, in lists of DIFF_BATCH_FILES, to be
    read and hashed.
    Only the shard's live (url, stamp, hash) columns are held."""

    READ = "read"

    def __init__(self, live: IndexReader):
        super().__init__(COUNTERS)
        self._files = live.files("pages")

    def process(self, shard_and_files: tuple[int, Iterable[list[tuple[str, ListedFile]]]]):
        shard, batches = shard_and_files
        located = by_url(batches)
        stored: dict[str, tuple[str, str] | None] = {}  # url -> (stamp, raw hash); None: several rows
        for f in self._files:
            if f.shard != shard:
                continue
            table = f.table(["url", "source_stamp", "raw_hash"])
            for url, stamp, digest in zip(*(table[c].to_pylist() for c in table.column_names)):
                if url in located:
                    stored[url] = None if url in stored else (stamp, digest)
        unchanged, to_read = [], []
        for url, files in located.items():
            row = stored.get(url)
            if len(files) == 1 and row is not None and row[0] and row[0] == file_stamp(*files[0][1:]):
                unchanged.append((url, (files[0][0], row[1])))
                self.count(STAMP_COUNTER)
            else:
                to_read.extend(files)
        for batch in file_batches(to_read):
            yield beam.pvalue.TaggedOutput(self.READ, batch)
        if unchanged:
            yield shard, unchanged


class HashInputBatchFn(ShardedBatchFn):
    """Each file's pages' (URL, InputFile), the file read and hashed. A WARC
    file is its records (`warc_records_or_file`), hashed as they are read,
    never held together."""

    def items(self, listed: ListedFile) -> Iterable[tuple[str, InputFile]]:
        path, size, mtime = listed
        metadata = FileMetadata(path, size, last_updated_in_seconds=mtime)
        for readable in warc_records_or_file(fileio.ReadableFile(metadata), self._parser):
            yield from hashed_input(self._parser, readable)


class ListFileBatchesFn(beam.DoFn):
    """A file pattern -> its files as listed (`FileSystems.match`, as Beam's
    MatchFiles lists them), DIFF_BATCH_FILES to an element: at a million
    input files the runner's cost per element, paid per file, was most of an
    update that changed one page. A directory is listed as ReadMatches would
    skip it (ShardedBatchFn skips it); no match is no files (the pattern is a
    wildcard: an empty input folder empties the index, as it always did)."""

    def process(self, pattern: str) -> Iterable[list[ListedFile]]:
        yield from file_batches(listed_file(m) for m in FileSystems.match([pattern])[0].metadata_list)


class DiffInput(beam.PTransform):
    """pbegin -> paths to parse (main) with the stored skeletons of those that had
    one (ClassifyShardFn.OLD_SKELETON), URLs to tombstone (ClassifyShardFn.DEAD_URL)
    and the sites of the pages gone (ClassifyShardFn.GONE_SITE). The inputs are
    hashed in batches and grouped by the pages shard that owns their URL
    (ritrag.ids.shard_of, as the pages table is written), and each shard is
    compared with its live rows there."""

    def __init__(self, pattern: str, parser: PageParser, live: IndexReader, read_every_input: bool = False):
        super().__init__()
        self._pattern, self._parser, self._live = pattern, parser, live
        self._read_every_input = read_every_input

    def expand(self, pbegin):
        num_shards, parser = self._live.manifest.settings.index.num_shards, self._parser
        if crawl_dir_of(self._pattern) is not None:  # a crawl's pages, one element each as its directory yields them
            inputs = [pbegin
                      | "Read" >> ReadInput(self._pattern, parser)
                      | "HashInputs" >> beam.FlatMap(lambda readable: hashed_input(parser, readable))
                      | "KeyByShard" >> beam.Map(lambda item: (shard_of(item[0], num_shards), [item]))]
        else:
            to_read = (pbegin
                       | "Pattern" >> beam.Create([self._pattern])
                       | "ListFiles" >> beam.ParDo(ListFileBatchesFn())
                       | "SpreadListed" >> beam.Reshuffle())  # batches over workers
            inputs = []
            if not self._read_every_input:
                stamps = record_counts(to_read
                                       | "Locate" >> beam.ParDo(LocateInputBatchFn(parser, num_shards))
                                       | "GroupLocated" >> beam.GroupByKey()
                                       | "MatchStamps" >> beam.ParDo(MatchStampsFn(self._live)).with_outputs(
                                           MatchStampsFn.READ, COUNTS, main="unchanged"))
                inputs.append(stamps["unchanged"])
                to_read = stamps[MatchStampsFn.READ] | "SpreadToRead" >> beam.Reshuffle()
            inputs.append(to_read | "HashBatches" >> beam.ParDo(HashInputBatchFn(parser, num_shards)))
        every_shard = pbegin | "EveryShard" >> beam.Create([(shard, []) for shard in range(num_shards)])
        return record_counts((*inputs, every_shard)
                             | "Shards" >> beam.Flatten()
                             | "GroupByShard" >> beam.GroupByKey()
                             | "Classify" >> beam.ParDo(ClassifyShardFn(self._live)).with_outputs(
                                 ClassifyShardFn.DEAD_URL, ClassifyShardFn.OLD_SKELETON, ClassifyShardFn.GONE_SITE,
                                 COUNTS, main="parse"))

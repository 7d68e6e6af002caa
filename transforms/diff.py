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
import os
from collections import defaultdict
from typing import Callable, Iterable, Iterator, Union

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.filesystem import FileMetadata
from apache_beam.options.pipeline_options import PipelineOptions

from ritrag.flags import add_arguments, option
from ritrag.ids import raw_hash, shard_of
from ritrag.reader import IndexReader, LiveFile
from ritrag.schema import PAGES_SCHEMA, DeadLetter, PageSkeleton, StoredSkeleton, WarcPage, has_lone_surrogate
from ritrag.storage import is_remote
from ritrag.transforms.counts import COUNTS, CountingDoFn, record_counts
from ritrag.transforms.pages import (COUNTERS, PageParser, ReadInput, dangling_links, file_stamp,
                                     index_inside_input, local_walk, read_bounded, warc_records_or_file)
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


class NonUtf8Path(str):
    """A path whose name is not UTF-8 (Python gives each such byte as a lone
    surrogate). Beam's coders write a str as UTF-8, which refuses lone
    surrogates (one such file failed the whole update); they pickle this
    type, and pickle keeps them. `input_path` makes one where it is needed."""


def input_path(path: str) -> str:
    """`path` as the diff's elements carry it: as it is, or a NonUtf8Path."""
    return NonUtf8Path(path) if has_lone_surrogate(path) else path


# The diff's per-file items are plain tuples, which Beam's coder writes itself;
# a dataclass or FileMetadata is pickled, once per file at every shuffle.
InputPath = Union[str, NonUtf8Path]  # a path as `input_path` gives it (Beam: no UTF-8 coder for it)
ListedFile = tuple[InputPath, int, float]  # (path, size, mtime) as the file system listed it
InputFile = tuple[InputPath, str]  # (path, raw hash; "" where not read: matches no page)
# The files a shard took as unchanged by their stamps, with their live row's raw
# hash: MatchStampsFn's tables, which ClassifyShardFn counts column-wise.
TRUSTED_SCHEMA = pa.schema([pa.field("url", pa.string()), pa.field("path", pa.binary()),  # os.fsencode: any name
                            pa.field("raw_hash", pa.string())])


def listed_files(pattern: str, index_files: str | None = None) -> Iterator[ListedFile]:
    """The files `pattern` matches, as Beam's MatchFiles lists them
    (`FileSystems.match`). A local folder is walked here as Beam's
    LocalFileSystem walks it (os.walk: a link to a folder is not followed; a
    file gone since it was listed is skipped; a link to nothing, which Beam
    drops, is listed, so that its read dead-letters it), with one stat a
    file where Beam makes two (size, then time): 100,000 files listed in 0.85
    instead of 1.36 s (benchmarks/diff_steps.py). Only files the pattern
    matches are stat'ed. `index_files`: the prefix of the index's own files
    where they lie under the input (pages.index_inside_input): not listed."""
    walk = local_walk(pattern)
    if walk is None:
        for m in FileSystems.match([pattern])[0].metadata_list:
            if not (index_files and m.path.startswith(index_files)):
                yield input_path(m.path), m.size_in_bytes, m.last_updated_in_seconds
        for m in dangling_links(pattern):
            yield input_path(m.path), 0, 0.0
        return
    top, matches = walk
    yield from _walked_files(top, matches, index_files)


def _walked_files(top: str, matches: Callable[[str], object], index_files: str | None) -> Iterator[ListedFile]:
    """os.walk's files under `top`, in its order (a folder's files, then each
    of its folders in turn), each stat'ed from its folder entry: no path join
    per name (at 500k files, 5.6-7.0 us a file against os.walk's 8.4). A
    stack, not recursion: any depth."""
    folders = [top]
    while folders:
        folder = folders.pop()
        if index_files and os.path.join(folder, "").startswith(index_files):
            continue  # the index's own folder: not walked
        try:
            with os.scandir(folder) as listing:
                entries = list(listing)
        except OSError:  # unreadable or gone: os.walk skips it too
            continue
        inside = []
        for entry in entries:
            try:
                is_folder = entry.is_dir()
            except OSError:
                is_folder = False
            if is_folder:
                if not entry.is_symlink():  # as os.walk: a link to a folder is not followed
                    inside.append(entry.path)
            elif matches(entry.path):
                try:
                    status = entry.stat()
                except OSError:
                    if not entry.is_symlink():
                        continue  # gone since listed
                    status = entry.stat(follow_symlinks=False)  # a link to nothing: listed, its read dead-letters it
                yield input_path(entry.path), status.st_size, status.st_mtime
        folders.extend(reversed(inside))


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


def shard_pages(files: list[LiveFile], shard: int, columns: list[str]) -> pa.Table:
    """`columns` of the live pages rows of one pages shard (its file in every
    segment), always in the same order."""
    tables = [f.table(columns) for f in files if f.shard == shard]
    return pa.concat_tables(tables) if tables else PAGES_SCHEMA.empty_table().select(columns)


def repeated(values: pa.Array) -> pa.Array:
    """The values that `values` holds more than once."""
    counts = pc.value_counts(values)
    return counts.field("values").filter(pc.greater(counts.field("counts"), 1))


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

    The inputs come as lists of (URL, InputFile), read and hashed, and as
    tables of the files MatchStampsFn took as unchanged (URL, path, raw hash),
    which are counted column-wise: at a million input files a dict per file
    was most of an update that changed one page. The shard's live rows are
    read column-wise too, their skeletons only where a page changed. A worker
    holds one shard's inputs and live (URL, hash, site): the pages over
    `--num_shards`."""

    DEAD_URL, OLD_SKELETON, GONE_SITE = "dead_url", "old_skeleton", "gone_site"

    def __init__(self, live: IndexReader):
        super().__init__(COUNTERS)
        self._files = live.files("pages")

    def process(self, shard_and_inputs: tuple[int, Iterable[list[tuple[str, InputFile]] | pa.Table]]):
        shard, batches = shard_and_inputs
        read_batches, trusted_tables = [], []
        for batch in batches:  # one batch is empty: the marker that makes every shard's group exist
            (trusted_tables if isinstance(batch, pa.Table) else read_batches).append(batch)
        inputs_at = by_url(read_batches)
        trusted = pa.concat_tables(trusted_tables) if trusted_tables else TRUSTED_SCHEMA.empty_table()
        if inputs_at and len(trusted):
            # A URL trusted by its stamp that a file read also names (a record of a
            # file of several pages) has two inputs: it is compared like any other.
            twin = pc.is_in(trusted["url"], value_set=pa.array(list(inputs_at), pa.string()))
            twins = trusted.filter(twin)
            for url, path, digest in zip(*(twins[c].to_pylist() for c in TRUSTED_SCHEMA.names)):
                inputs_at[url].append((input_path(os.fsdecode(path)), digest))
            trusted = trusted.filter(pc.invert(twin))
        # Each trusted URL has one live row, of its hash (MatchStampsFn): unchanged.
        self.count("pages_read", len(trusted))
        self.count("pages_unchanged", len(trusted))
        table = shard_pages(self._files, shard, ["url", "raw_hash", "site"])
        rows = np.flatnonzero(pc.invert(pc.is_in(table["url"], value_set=trusted["url"].combine_chunks())).to_numpy(
            zero_copy_only=False)) if len(trusted) else np.arange(len(table))
        rest = table.take(rows)  # the live rows left to compare, as Python values
        hashes, sites = rest["raw_hash"].to_pylist(), rest["site"].to_pylist()
        old_at: dict[str, list[int]] = defaultdict(list)
        for i, url in enumerate(rest["url"].to_pylist()):
            old_at[url].append(i)
        skeletons: pa.Table | None = None  # read once, where a page changed
        for url in inputs_at.keys() | old_at.keys():
            inputs, old = inputs_at.get(url, []), old_at.get(url, [])
            self.count("pages_read", len(inputs))
            if len(inputs) == 1 and len(old) == 1 and inputs[0][1] == hashes[old[0]]:
                self.count("pages_unchanged")
                continue
            if not inputs:
                self.count("pages_deleted")
                yield beam.pvalue.TaggedOutput(self.DEAD_URL, url)
                for i in old:
                    yield beam.pvalue.TaggedOutput(self.GONE_SITE, sites[i])
                continue
            if old:
                self.count("pages_replaced")
                yield beam.pvalue.TaggedOutput(self.DEAD_URL, url)
                if skeletons is None:
                    skeletons = shard_pages(self._files, shard, list(StoredSkeleton._fields))
                for i in old:
                    row = StoredSkeleton(**skeletons.slice(int(rows[i]), 1).to_pylist()[0])
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
        yield normalize_url(readable.url), (input_path(readable.source), raw_hash(readable.payload))
        return
    if isinstance(readable, DeadLetter):  # an unreadable WARC record: read again by ParsePagesFn, dead-lettered
        yield readable.source, (input_path(readable.source), "")
        return
    path = input_path(readable.metadata.path)
    if parser.refusal(path):
        yield parser.document_url(path), (path, "")
        return
    try:
        data = read_bounded(readable.open, parser.max_page_bytes)
    except UnparseablePage:  # too large: like a refused file, no page's hash; ParsePagesFn dead-letters it
        yield parser.document_url(path), (path, "")
        return
    for url, source in parser.input_pages(path, data):  # a thread's posts: one each
        yield url, (input_path(source), raw_hash(data))


class ShardedBatchFn(beam.DoFn):
    """A batch of listed input files -> (pages shard, the (URL, item) pairs of
    the batch whose URL it owns), one element per shard: the runner's cost per
    element is paid per batch. A directory is skipped, as ReadMatches skips it."""

    def __init__(self, parser: PageParser, num_shards: int):
        self._parser, self._num_shards = parser, num_shards

    def items(self, files: list[ListedFile]) -> Iterable[tuple[str, object]]:
        """The (URL, item) pairs of a batch's files."""
        raise NotImplementedError

    def process(self, batch: list[ListedFile]):
        by_shard: dict[int, list[tuple[str, object]]] = defaultdict(list)
        for url, item in self.items([listed for listed in batch if not listed[0].endswith(("/", "\\"))]):
            by_shard[shard_of(url, self._num_shards)].append((url, item))
        yield from by_shard.items()


class LocateInputBatchFn(ShardedBatchFn):
    """Each file's (URL its path names, the file as listed):
    `PageParser.document_urls`, nothing read. For a file of one page that is its page's URL; a file of
    several pages (a WARC file, a thread) has no stamp on any of its pages' rows
    and is read (MatchStampsFn)."""

    def items(self, files: list[ListedFile]) -> Iterable[tuple[str, ListedFile]]:
        return zip(self._parser.document_urls([path for path, _, _ in files]), files)


class MatchStampsFn(CountingDoFn):
    """(pages shard, the located input files of its URLs) -> (shard, a
    TRUSTED_SCHEMA table) of the files taken as unchanged: alone at their URL,
    whose one live row records the same stamp (`file_stamp`: only the page of a
    file of one page has one). The path may differ: a snapshot copied with its
    times kept (cp -a, rsync -a) is the same content at the same URLs. The
    table carries the live row's raw hash, the one ClassifyShardFn would find
    had the file been read. Every other file goes to READ, in lists of
    DIFF_BATCH_FILES, to be read and hashed.
    The match looks the files' URLs up in the shard's live (url, stamp, hash)
    columns with Arrow: no Python object per live row or unchanged file."""

    READ = "read"

    def __init__(self, live: IndexReader):
        super().__init__(COUNTERS)
        self._files = live.files("pages")

    def process(self, shard_and_files: tuple[int, Iterable[list[tuple[str, ListedFile]]]]):
        shard, batches = shard_and_files
        files = [located for batch in batches for located in batch]
        if not files:
            return
        urls = pa.array([url for url, _ in files], pa.string())
        stamps = pa.array([file_stamp(*listed[1:]) for _, listed in files], pa.string())
        live = shard_pages(self._files, shard, ["url", "source_stamp", "raw_hash"])
        live_urls = live["url"].combine_chunks()
        row = pc.index_in(urls, value_set=live_urls)  # the file's URL's live row (its first), null: none
        same = pc.and_(pc.equal(stamps, live["source_stamp"].take(row)), pc.not_equal(stamps, ""))
        # Alone at its URL, which has one live row: a URL held twice on either side is read.
        alone = pc.invert(pc.is_in(urls, value_set=pa.concat_arrays([repeated(urls), repeated(live_urls)])))
        trusted_files = np.flatnonzero(pc.and_(pc.fill_null(same, False), alone).to_numpy(zero_copy_only=False))
        trusted = pa.table({"url": urls.take(trusted_files),
                            "path": pa.array([os.fsencode(files[i][1][0]) for i in trusted_files.tolist()],
                                             pa.binary()),
                            "raw_hash": live["raw_hash"].take(row.take(trusted_files))})
        self.count(STAMP_COUNTER, len(trusted))
        to_read = np.ones(len(files), bool)
        to_read[trusted_files] = False
        for batch in file_batches(files[i][1] for i in np.flatnonzero(to_read).tolist()):
            yield beam.pvalue.TaggedOutput(self.READ, batch)
        if len(trusted):
            yield shard, trusted.cast(TRUSTED_SCHEMA)


class HashInputBatchFn(ShardedBatchFn):
    """Each file's pages' (URL, InputFile), the file read and hashed. A WARC
    file is its records (`warc_records_or_file`), hashed as they are read,
    never held together."""

    def items(self, files: list[ListedFile]) -> Iterable[tuple[str, InputFile]]:
        for path, size, mtime in files:
            metadata = FileMetadata(path, size, last_updated_in_seconds=mtime)
            for readable in warc_records_or_file(fileio.ReadableFile(metadata), self._parser):
                yield from hashed_input(self._parser, readable)


class ListFileBatchesFn(beam.DoFn):
    """A file pattern -> its files as listed (`listed_files`, as Beam's
    MatchFiles lists them), DIFF_BATCH_FILES to an element: at a million
    input files the runner's cost per element, paid per file, was most of an
    update that changed one page. A directory is listed as ReadMatches would
    skip it (ShardedBatchFn skips it); no match is no files (the pattern is a
    wildcard; an update that would leave no page is refused when it ends:
    launcher.refuse_emptying)."""

    def __init__(self, index_files: str | None = None):
        self._index_files = index_files

    def process(self, pattern: str) -> Iterable[list[ListedFile]]:
        yield from file_batches(listed_files(pattern, self._index_files))


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
        # the index's own files, where they lie under the input: never input
        self._index_files = index_inside_input(parser.root, live.layout.root)

    def expand(self, pbegin):
        num_shards, parser = self._live.manifest.settings.index.num_shards, self._parser
        if crawl_dir_of(self._pattern) is not None:  # a crawl's pages, one element each as its directory yields them
            inputs = [pbegin
                      | "Read" >> ReadInput(self._pattern, parser, self._index_files)
                      | "HashInputs" >> beam.FlatMap(lambda readable: hashed_input(parser, readable))
                      | "KeyByShard" >> beam.Map(lambda item: (shard_of(item[0], num_shards), [item]))]
        else:
            to_read = (pbegin
                       | "Pattern" >> beam.Create([self._pattern])
                       | "ListFiles" >> beam.ParDo(ListFileBatchesFn(self._index_files))
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

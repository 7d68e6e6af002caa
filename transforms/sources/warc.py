"""WARC input (ISO 28500 via warcio): build and update read WARC files, or the
pages a crawl directory's CrawlDB holds as current (ritrag.crawl_dir; the crawl
writes them, ritrag.transforms.crawl.warc_writer).

Every `response` record with HTTP status 200 is a `WarcPage`, its URL the
WARC-Target-URI and its payload the HTTP body (de-chunked and decoded, so Common
Crawl files work too). A WARC input is recognised by its content, not its
name (transforms/sources/dispatch.py `is_warc`). A file that is not a WARC, or
ends in the middle of a record (found by the record digests, or by a block
shorter than its declared Content-Length), yields a `DeadLetter` naming the file
and the offset of the record that failed; the records before it are kept. A
payload is decoded (gzip, chunked) with a cap on its output: one longer than the
job's --max_page_bytes is a `too_large` dead letter, never inflated whole. A
page's `source` is "<file>#<offset>" (record_source.py), which `read_record`
opens again.
"""
from __future__ import annotations

import dataclasses
import os
import zlib
from typing import Iterator

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from warcio.archiveiterator import ArchiveIterator
from warcio.exceptions import ArchiveLoadFailed

from ritrag.crawl_dir import INDEXABLE, WARC_DIR, crawldb_path, is_crawl_dir
from ritrag.schema import DeadLetter, WarcPage
from ritrag.transforms.sources.record_source import record_source, split_record_source

READ_ERRORS = (ArchiveLoadFailed, EOFError, zlib.error, OSError, ValueError)


def open_raw(path: str):
    # UNCOMPRESSED: the gzip members are warcio's to read (Beam would inflate .gz itself)
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def _page(path: str, offset: int, record, max_bytes: int) -> WarcPage | DeadLetter | None:
    """The page of a 200 response record, its payload decoded up to `max_bytes`
    (a longer one is a too_large dead letter); None for any other record."""
    if record.rec_type != "response" or record.http_headers is None:
        return None
    if record.http_headers.get_statuscode() != "200":
        return None
    source = record_source(path, offset)
    payload = record.content_stream().read(max_bytes + 1)
    if len(payload) > max_bytes:
        return DeadLetter(source, "read", "too_large", f"payload over {max_bytes} bytes (--max_page_bytes)")
    return WarcPage(source, record.rec_headers.get_header("WARC-Target-URI") or "", payload,
                    record.http_headers.get_header("Content-Type") or "")


def check_whole(record) -> None:
    """Raise if a record was cut short: warcio ends quietly at the end of a file or
    of a gzip member, but a record is whole only if its block is as long as its
    Content-Length says and, when it declares a digest, the digest was verified.
    Call once the record is read to its end."""
    if record.rec_type is None:
        raise ArchiveLoadFailed("truncated or corrupt record")
    if record.format != "warc":  # warcio also reads ARC, and takes any 5-word line for an ARC header
        raise ArchiveLoadFailed(f"not a WARC record (read as {record.format})")
    missing = getattr(record.raw_stream, "limit", 0)  # warcio's LimitReader: declared bytes not read
    if missing > 0:
        raise ArchiveLoadFailed(f"truncated record: {missing} bytes of its Content-Length missing")
    declares = (record.rec_headers.get_header("WARC-Block-Digest")
                or record.rec_headers.get_header("WARC-Payload-Digest"))
    if declares and record.digest_checker.passed is not True:
        problems = "; ".join(record.digest_checker.problems) or "digest not reached: record cut short"
        raise ArchiveLoadFailed(f"truncated or corrupt record ({problems})")


def read_warc_pages(path: str, max_bytes: int) -> Iterator[WarcPage | DeadLetter]:
    """The 200 response records of one WARC file (a payload over `max_bytes` a
    too_large dead letter), then a DeadLetter at the offset of the first record
    that cannot be read whole (not a WARC, truncated, corrupt)."""
    offset = end = 0
    try:
        with open_raw(path) as fh:
            compressed = fh.read(2) == b"\x1f\x8b"
            fh.seek(0)
            records = ArchiveIterator(fh, check_digests=True)
            for record in records:
                page = _page(path, 0, record, max_bytes)
                records.read_to_end()
                offset = records.get_record_offset()
                check_whole(record)
                if page is not None:
                    yield dataclasses.replace(page, source=record_source(path, offset))
                end = offset + records.get_record_length()
        size = FileSystems.get_filesystem(path).metadata(path).size_in_bytes  # the name as it is, no pattern
        if compressed and end != size:  # a gzip member cut short ends the iteration quietly
            offset = end
            raise ArchiveLoadFailed(f"truncated: {size - end} bytes after the last whole record")
    except READ_ERRORS as exc:
        yield DeadLetter(record_source(path, offset), "read", "bad_warc",
                         f"{type(exc).__name__}: {exc}".strip())


def read_record(source: str, max_bytes: int) -> WarcPage | DeadLetter:
    """The page of the response record at a record source (a payload over
    `max_bytes` a too_large dead letter)."""
    in_file = split_record_source(source)
    path, offset = in_file.path, in_file.warc_offset
    try:
        with open_raw(path) as fh:
            fh.seek(offset)
            records = ArchiveIterator(fh, check_digests=True)
            record = next(records)
            page = _page(path, offset, record, max_bytes)
            records.read_to_end()
            check_whole(record)
    except (StopIteration, *READ_ERRORS) as exc:
        return DeadLetter(source, "read", "bad_warc", f"{type(exc).__name__}: {exc}".strip())
    if page is None:
        return DeadLetter(source, "read", "not_a_page", "not an HTTP 200 response record")
    return page


def indexable_source(row: dict, crawl_dir: str) -> list[str]:
    """The record source ("<warc file>#<offset>") of a page the CrawlDB holds as
    current, or nothing: what `ritrag build` / `update` read from a crawl directory."""
    if row["kind"] != "page" or row["status"] not in INDEXABLE or not row["warc_file"]:
        return []
    return [record_source(os.path.join(crawl_dir, WARC_DIR, row["warc_file"]), row["warc_offset"])]


class ReadCrawlDirPages(beam.PTransform):
    """A crawl directory -> WarcPage records (or DeadLetters) of the pages its
    CrawlDB holds as current (fetched or unchanged); the CrawlDB is read as a
    Beam source, not listed in the launcher."""

    def __init__(self, crawl_dir: str, max_bytes: int):
        super().__init__()
        self._dir = crawl_dir
        self._max_bytes = max_bytes

    def expand(self, pbegin):
        return (pbegin
                | "ReadCrawlDb" >> beam.io.ReadFromParquet(crawldb_path(self._dir),
                                                           columns=["kind", "status", "warc_file", "warc_offset"])
                | "RecordSources" >> beam.FlatMap(indexable_source, self._dir)
                | "Reshuffle" >> beam.Reshuffle()
                | "ReadRecord" >> beam.Map(read_record, self._max_bytes))


def crawl_dir_of(pattern: str) -> str | None:
    """The crawl directory an input pattern names (`<dir>/**`, the pattern of a
    directory input, whose folder holds a CrawlDB), else None."""
    return pattern[:-2] if pattern.endswith("/**") and is_crawl_dir(pattern[:-2]) else None

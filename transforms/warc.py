"""WARC files (ISO 28500, WARC/1.1 via warcio): the crawl writes them, build and
update read them as page input.

Writing: one gzip member per record (what every WARC tool expects, and what makes
a record readable at its offset), a request record and then a response record
per kept page, files rolled at `max_file_bytes`. A shard's records are written in
URL order with record ids derived from (URI, date, type) and gzip members
without timestamps, so the same fetches give the same bytes. The payload is the
decoded body (see transforms.fetch); warcio adds WARC-Block-Digest and
WARC-Payload-Digest.

Reading: every `response` record with HTTP status 200 is a `WarcPage`, its URL
the WARC-Target-URI and its payload the HTTP body (de-chunked and decoded, so
Common Crawl files work too). A WARC input is recognised by its content, not its
name (transforms/sources/dispatch.py `is_warc`). A file that is not a WARC, or
ends in the middle of a record (found by the record digests, or by a block
shorter than its declared Content-Length), yields a `DeadLetter` naming the file
and the offset of the record that failed; the records before it are kept. A
payload is decoded (gzip, chunked) with a cap on its output: one longer than the
job's --max_page_bytes is a `too_large` dead letter, never inflated whole. A
page's `source` is "<file>#<offset>" (`record_source`), which `read_record`
opens again.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import uuid
import zlib
from dataclasses import dataclass
from typing import Iterator

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from warcio.archiveiterator import ArchiveIterator
from warcio.exceptions import ArchiveLoadFailed
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from ritrag.schema import DeadLetter, WarcPage
from ritrag.transforms.fetch import FetchResult

SOFTWARE = "ritrag-crawl"
READ_ERRORS = (ArchiveLoadFailed, EOFError, zlib.error, OSError, ValueError)


def record_source(path: str, offset: int) -> str:
    return f"{path}#{offset}"


def split_record_source(source: str) -> tuple[str, int] | None:
    """(WARC file, offset) of a record source ("<file>#<digits>"), None for a
    plain file path (or a thread's record, "<file>#post-<n>")."""
    path, sep, offset = source.rpartition("#")
    if sep and path and offset.isascii() and offset.isdigit():
        return path, int(offset)
    return None


def _record_id(*parts: str) -> str:
    digest = hashlib.sha256("\x00".join(parts).encode("utf-8")).digest()
    return f"<urn:uuid:{uuid.UUID(bytes=digest[:16], version=5)}>"


@dataclass(frozen=True)
class StoredRecord:
    url: str
    warc_file: str  # the file name, relative to the WARC directory
    offset: int


class WarcFileWriter:
    """Writes records to numbered gzip WARC files `<prefix>-NNNNN.warc.gz`, starting
    a new file once one reaches `max_file_bytes`. Each file is built in memory and
    written whole through Beam's FileSystems (local or object store)."""

    def __init__(self, directory: str, prefix: str, max_file_bytes: int):
        self._directory, self._prefix, self._max = directory, prefix, max_file_bytes
        self._number = 0
        self._buffer: io.BytesIO | None = None
        self._writer: WARCWriter | None = None
        self.files: list[str] = []

    def _name(self) -> str:
        return f"{self._prefix}-{self._number:05d}.warc.gz"

    def _open(self, date: str) -> None:
        self._buffer = io.BytesIO()
        self._writer = WARCWriter(self._buffer, gzip=True, warc_version="1.1")
        info = {"software": SOFTWARE, "format": "WARC File Format 1.1",
                "conformsTo": "https://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/"}
        record = self._writer.create_warcinfo_record(self._name(), info)
        record.rec_headers.replace_header("WARC-Date", date)
        record.rec_headers.replace_header("WARC-Record-ID", _record_id(self._name(), "warcinfo"))
        self._writer.write_record(record)

    def write(self, result: FetchResult) -> StoredRecord:
        """Write the request and response records of a kept fetch."""
        if self._buffer is None:
            self._open(result.fetched_at)
        writer = self._writer
        request_uri = result.url.split("://", 1)[-1]
        request_path = request_uri[request_uri.find("/"):] if "/" in request_uri else "/"
        request = writer.create_warc_record(
            result.url, "request",
            http_headers=StatusAndHeaders(f"GET {request_path} {result.http_version}",
                                          list(result.request_headers), is_http_request=True),
            warc_headers_dict={"WARC-Date": result.fetched_at,
                               "WARC-Record-ID": _record_id(result.url, result.fetched_at, "request")})
        response = writer.create_warc_record(
            result.url, "response", payload=io.BytesIO(result.body),
            http_headers=StatusAndHeaders(f"{result.http_status} {_reason(result.http_status)}",
                                          list(result.response_headers), protocol=result.http_version),
            warc_headers_dict={"WARC-Date": result.fetched_at,
                               "WARC-Record-ID": _record_id(result.url, result.fetched_at, "response"),
                               "WARC-Concurrent-To": _record_id(result.url, result.fetched_at, "request")})
        writer.write_record(request)
        offset = self._buffer.tell()
        writer.write_record(response)
        stored = StoredRecord(result.url, self._name(), offset)
        if self._buffer.tell() >= self._max:
            self.close()
        return stored

    def close(self) -> None:
        if self._buffer is None:
            return
        path = f"{self._directory.rstrip('/')}/{self._name()}"
        # UNCOMPRESSED: the records are gzip members already (Beam would gzip a .gz name again)
        with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            fh.write(self._buffer.getvalue())
        self.files.append(self._name())
        self._buffer, self._writer = None, None
        self._number += 1


def _reason(status: int | None) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


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
        size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
        if compressed and end != size:  # a gzip member cut short ends the iteration quietly
            offset = end
            raise ArchiveLoadFailed(f"truncated: {size - end} bytes after the last whole record")
    except READ_ERRORS as exc:
        yield DeadLetter(record_source(path, offset), "read", "bad_warc",
                         f"{type(exc).__name__}: {exc}".strip())


def read_record(source: str, max_bytes: int) -> WarcPage | DeadLetter:
    """The page of the response record at a record source (a payload over
    `max_bytes` a too_large dead letter)."""
    path, offset = split_record_source(source)
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


class ReadCrawlDirPages(beam.PTransform):
    """A crawl directory -> WarcPage records (or DeadLetters) of the pages its
    CrawlDB holds as current (fetched or unchanged); the CrawlDB is read as a
    Beam source, not listed in the launcher."""

    def __init__(self, crawl_dir: str, max_bytes: int):
        super().__init__()
        self._dir = crawl_dir
        self._max_bytes = max_bytes

    def expand(self, pbegin):
        from ritrag.transforms.crawldb import crawldb_path, indexable_source

        return (pbegin
                | "ReadCrawlDb" >> beam.io.ReadFromParquet(crawldb_path(self._dir),
                                                           columns=["kind", "status", "warc_file", "warc_offset"])
                | "RecordSources" >> beam.FlatMap(indexable_source, self._dir)
                | "Reshuffle" >> beam.Reshuffle()
                | "ReadRecord" >> beam.Map(read_record, self._max_bytes))


def crawl_dir_of(pattern: str) -> str | None:
    """The crawl directory an input pattern names (`<dir>/**`, the pattern of a
    directory input, whose folder holds a CrawlDB), else None."""
    from ritrag.transforms.crawldb import is_crawl_dir

    return pattern[:-2] if pattern.endswith("/**") and is_crawl_dir(pattern[:-2]) else None

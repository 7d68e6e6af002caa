"""WARC writing (ISO 28500, WARC/1.1 via warcio): where a crawl keeps the bodies
it fetched, read back by build and update (ritrag.transforms.sources.warc).

One gzip member per record (what every WARC tool expects, and what makes a
record readable at its offset), a request record and then a response record per
kept page, files rolled at `max_file_bytes`. A shard's records are written in
URL order with record ids derived from (URI, date, type) and gzip members
without timestamps, so the same fetches give the same bytes. The payload is the
decoded body (see ritrag.transforms.crawl.downloader); warcio adds
WARC-Block-Digest and WARC-Payload-Digest.
"""
from __future__ import annotations

import hashlib
import io
import uuid
from dataclasses import dataclass
from http import HTTPStatus

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from ritrag.transforms.crawl.downloader import FetchResult

SOFTWARE = "ritrag-crawl"


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
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""

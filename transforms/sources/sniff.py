"""The one sniffer: which kind of the registry (kinds.py) an input is, by its
content first, then what it declares (a web response's content type), then its
name; and whether a file is a WARC container. Every entry asks it: input files,
the pages inside WARC records, and the crawler deciding what to keep, so the
same bytes are the same kind wherever they come from. Standard library only:
sniffing loads no parser.

A WARC file is not a page but a container of them (`is_warc`: `WARC/` first,
gzip-compressed or not, whatever its name; else a name ending in `.warc` or
`.warc.gz`, which its reader refuses if it is not one): the input reads its
records (transforms/sources/warc.py), and each record's payload is sniffed,
read only as a web kind (`web_kind`), the kinds the crawler keeps.
"""
from __future__ import annotations

import zlib

from ritrag.transforms.sources.kinds import KINDS, WEB_KINDS

BYTE_ORDER_MARK_AND_BLANKS = b"\xef\xbb\xbf \t\r\n"
WARC_SUFFIXES = (".warc", ".warc.gz")
WARC_MAGIC = b"WARC/"
_GZIP_MAGIC = b"\x1f\x8b"
WARC_SNIFF_BYTES = 4096  # enough of a gzip member to inflate its first bytes


def opening_of(data: bytes) -> bytes:
    """The input's first KiB after a byte-order mark and blanks: what content sniffs read."""
    return data[:1024].lstrip(BYTE_ORDER_MARK_AND_BLANKS)


def declared_type(content_type: str) -> str:
    """The media type of a Content-Type value, lower case, its parameters dropped."""
    return content_type.split(";", 1)[0].strip().lower()


def sniff(path: str, data: bytes, content_type: str = "") -> str | None:
    """The name of the kind of an input (module doc), None when no kind claims it."""
    opening = opening_of(data)
    for kind in KINDS:
        if kind.opens_with is not None and kind.opens_with(opening, data):
            return kind.name
    declared = declared_type(content_type)
    for kind in KINDS:
        if declared in kind.content_types:
            return kind.name
    for kind in KINDS:
        if kind.claims_name(path):
            return kind.name
    return None


def web_kind(body: bytes, content_type: str) -> str | None:
    """The kind a web response is read as (one of WEB_KINDS), None if it is of none:
    the crawler keeps only these, and a WARC record holding another is a dead letter."""
    kind = sniff("", body, content_type)
    return kind if kind in WEB_KINDS else None


def is_warc(path: str, head: bytes) -> bool:
    """Whether the file at `path`, whose first bytes (WARC_SNIFF_BYTES of them) are
    `head`, is a WARC file: `WARC/` first, or first once its gzip member is
    inflated; else by its name."""
    opening = head
    if head.startswith(_GZIP_MAGIC):
        try:  # only the first bytes are inflated: a gzip bomb costs nothing here
            opening = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, len(WARC_MAGIC))
        except zlib.error:
            opening = b""
    return opening.startswith(WARC_MAGIC) or path.lower().endswith(WARC_SUFFIXES)

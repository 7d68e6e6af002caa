"""Which parser reads an input: its kind, by content first, then what the input
declares (a web response's content type), then the file name; and the one door
every kind goes through (`parse_document`). This is the one sniffer of every
entry: input files, the pages inside WARC records, and the crawler deciding what
to keep, so the same bytes are the same kind wherever they come from.

Content: a document that opens (after a byte-order mark and blanks) with an
HTML doctype or `<html>` is HTML; `%PDF-` in the first KiB is a PDF (readers
accept bytes before it); XML whose root is `<posts>` is a Stack Exchange dump's
Posts.xml; a JSON object holding a `post_stream` is a Discourse topic, one
holding `title` and `abstract`, `body_text`, `full_text` or `sections` a paper.
Then the declared content type: `text/html` and `application/xhtml+xml` are
HTML, `application/pdf` a PDF. Then the name: HTML suffixes are HTML (as they
always were), `.md` `.markdown` Markdown, `.rst` `.rest` reStructuredText,
`.pdf` a PDF (which its parser refuses if it is not one). Anything else is
dead-lettered as `unknown_kind`, the detail saying what was seen.

A WARC file is not a page but a container of them (`is_warc`: `WARC/` first,
gzip-compressed or not, whatever its name; else a name ending in `.warc` or
`.warc.gz`, which its reader refuses if it is not one): the input reads its records
(transforms/sources/warc.py), and each record's payload is sniffed as above, read only
as one of WEB_KINDS (`web_kind`), the kinds the crawler keeps.

Every kind yields `ParsedPage`s, so the forest, chunks, indexes and serving do
not know which kind a page came from. One file may hold several pages (a
thread's posts): each page's `source` is then `<file>#post-<n>`
(record_source.py), and reading it again parses the file and keeps that record.
"""
from __future__ import annotations

import posixpath
import re
import zlib
from typing import Callable

from ritrag.schema import ParsedPage
from ritrag.transforms.parse import UnparseablePage
from ritrag.transforms.sources.common import RST_SUFFIXES, SourceFile

HTML, MARKDOWN, PDF, DISCOURSE, PAPER = "html", "markdown", "pdf", "discourse", "paper"
STACKEXCHANGE, RST = "stackexchange", "rst"
MULTI_PAGE_KINDS = (DISCOURSE, STACKEXCHANGE)
# What a web response (a fetched body, a WARC record's payload) is read as: one
# page per URL, located by its URL alone.
WEB_KINDS = (HTML, PDF)
HTML_TYPES = ("text/html", "application/xhtml+xml")
PDF_TYPES = ("application/pdf",)
HTML_SUFFIXES = (".html", ".htm", ".xhtml", ".shtml")
MARKDOWN_SUFFIXES = (".md", ".markdown")
WARC_SUFFIXES = (".warc", ".warc.gz")
_JSON_SNIFF_BYTES = 65536
_PAPER_KEYS = (b'"abstract"', b'"body_text"', b'"full_text"', b'"sections"')
# A Stack Exchange dump's Posts.xml: an optional XML declaration, then the <posts> root.
_POSTS_ROOT = re.compile(rb"\A(<\?xml[^>]*\?>)?\s*<posts[\s>]")
WARC_MAGIC = b"WARC/"
_GZIP_MAGIC = b"\x1f\x8b"
WARC_SNIFF_BYTES = 4096  # enough of a gzip member to inflate its first bytes


def document_url_path(relative: str) -> str:
    """The path a document file is served at, relative like its input path:
    Markdown and reStructuredText as the HTML a static-site generator makes of
    it (`guide/setup.md` -> `guide/setup.html`; `index.md` and `README.md`,
    `index.rst` and `README.rst` -> `index.html`, the
    folder's URL), JSON without its suffix (`t/welcome.json` -> `t/welcome`,
    a thread's posts under it); everything else (HTML, PDF) as it is."""
    folder, name = posixpath.split(relative)
    stem, suffix = posixpath.splitext(name)
    suffix = suffix.lower()
    if suffix in MARKDOWN_SUFFIXES + RST_SUFFIXES:
        name = "index.html" if stem.lower() in ("index", "readme") else stem + ".html"
    elif suffix == ".json":
        name = stem
    return posixpath.join(folder, name)


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


def sniff_kind(path: str, data: bytes, content_type: str = "") -> str:
    """The kind of an input (module doc): its content, then `content_type` (what
    a web response declares), then its name; raises UnparseablePage("unknown_kind")."""
    head = data[:1024]
    opening = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if opening[:15].lower().startswith((b"<!doctype html", b"<html")):
        return HTML
    if b"%PDF-" in head:
        return PDF
    if _POSTS_ROOT.match(opening):
        return STACKEXCHANGE
    if opening.startswith(b"{"):
        window = data[:_JSON_SNIFF_BYTES]
        if b'"post_stream"' in window:
            return DISCOURSE
        if b'"title"' in window and any(key in window for key in _PAPER_KEYS):
            return PAPER
    declared = content_type.split(";", 1)[0].strip().lower()
    if declared in HTML_TYPES:
        return HTML
    if declared in PDF_TYPES:
        return PDF
    suffix = posixpath.splitext(path.lower())[1]
    if path.lower().endswith(HTML_SUFFIXES):
        return HTML
    if suffix in MARKDOWN_SUFFIXES:
        return MARKDOWN
    if suffix in RST_SUFFIXES:
        return RST
    if suffix == ".pdf":
        return PDF
    shown = opening[:24].decode("utf-8", "replace") or "empty"
    raise UnparseablePage("unknown_kind", f"name suffix {suffix or '(none)'!r}, "
                                          f"content type {declared or '(none)'!r}, content starts {shown!r}")


def web_kind(body: bytes, content_type: str) -> str | None:
    """The kind a web response is read as (one of WEB_KINDS), None if it is of none:
    the crawler keeps only these, and a WARC record holding another is a dead letter."""
    try:
        kind = sniff_kind("", body, content_type)
    except UnparseablePage:
        return None
    return kind if kind in WEB_KINDS else None


def is_multi_page(path: str, data: bytes) -> bool:
    """Whether the file is of a kind that holds several pages (a thread)."""
    try:
        return sniff_kind(path, data) in MULTI_PAGE_KINDS
    except UnparseablePage:
        return False


def _parsers() -> dict[str, Callable[[SourceFile], list[tuple[str | None, ParsedPage]]]]:
    # Imported on first use: a job reading only HTML never loads pypdf or markdown-it.
    from ritrag.transforms.sources.discourse import parse_discourse
    from ritrag.transforms.sources.markdown import parse_markdown
    from ritrag.transforms.sources.paper import parse_paper
    from ritrag.transforms.sources.pdf import parse_pdf
    from ritrag.transforms.sources.rst import parse_rst
    from ritrag.transforms.sources.stackexchange import parse_stackexchange

    return {MARKDOWN: parse_markdown, PDF: parse_pdf, DISCOURSE: parse_discourse, PAPER: parse_paper,
            STACKEXCHANGE: parse_stackexchange, RST: parse_rst}


def parse_document(kind: str, file: SourceFile, max_bytes: int) -> list[tuple[str | None, ParsedPage]]:
    """The pages of a non-HTML input file, each with its record key (None: the file itself)."""
    if len(file.data) > max_bytes:
        raise UnparseablePage("too_large", f"{len(file.data)} bytes > {max_bytes}")
    return _parsers()[kind](file)

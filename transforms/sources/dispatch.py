"""Which parser reads an input file: its kind, by content first and file name
second, and the one door every kind goes through (`parse_document`).

Content: `%PDF-` in the first KiB is a PDF; a document that opens with an HTML
doctype or `<html>` is HTML; a JSON object holding a `post_stream` is a
Discourse topic, one holding `title` and `abstract`, `body_text`, `full_text`
or `sections` a paper; XML whose root is `<posts>` a Stack Exchange dump's
Posts.xml. Then the name: HTML suffixes are HTML (as they always were), `.md`
`.markdown` Markdown, `.rst` `.rest` reStructuredText, `.pdf` a PDF (which its
parser refuses if it is not one).
Anything else is dead-lettered as `unknown_kind`, the detail saying what was seen.

Every kind yields `ParsedPage`s, so the forest, chunks, indexes and serving do
not know which kind a page came from. One file may hold several pages (a
thread's posts): each page's `source` is then `<file>#<record>`
(`record_source`), and reading it again parses the file and keeps that record.
"""
from __future__ import annotations

import posixpath
import re
from typing import Callable

from ritrag.schema import ParsedPage
from ritrag.transforms.parse import UnparseablePage
from ritrag.transforms.sources.common import SourceFile

HTML, MARKDOWN, PDF, DISCOURSE, PAPER = "html", "markdown", "pdf", "discourse", "paper"
STACKEXCHANGE, RST = "stackexchange", "rst"
MULTI_PAGE_KINDS = (DISCOURSE, STACKEXCHANGE)
HTML_SUFFIXES = (".html", ".htm", ".xhtml", ".shtml")
MARKDOWN_SUFFIXES = (".md", ".markdown")
RST_SUFFIXES = (".rst", ".rest")
_JSON_SNIFF_BYTES = 65536
_PAPER_KEYS = (b'"abstract"', b'"body_text"', b'"full_text"', b'"sections"')
_RECORD = re.compile(r"\A(.+)#(post-\d+)\Z")
# A Stack Exchange dump's Posts.xml: an optional XML declaration, then the <posts> root.
_POSTS_ROOT = re.compile(rb"\A(<\?xml[^>]*\?>)?\s*<posts[\s>]")


def record_source(path: str, record: str) -> str:
    return f"{path}#{record}"


def split_document_source(source: str) -> tuple[str, str] | None:
    """(file, record) of a page source naming one record of a file, None for a whole file."""
    match = _RECORD.match(source)
    return (match.group(1), match.group(2)) if match else None


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


def sniff_kind(path: str, data: bytes) -> str:
    """The kind of an input file (module doc); raises UnparseablePage("unknown_kind")."""
    head = data[:1024]
    if b"%PDF-" in head:
        return PDF
    opening = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if opening[:15].lower().startswith((b"<!doctype html", b"<html")):
        return HTML
    if _POSTS_ROOT.match(opening):
        return STACKEXCHANGE
    if opening.startswith(b"{"):
        window = data[:_JSON_SNIFF_BYTES]
        if b'"post_stream"' in window:
            return DISCOURSE
        if b'"title"' in window and any(key in window for key in _PAPER_KEYS):
            return PAPER
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
    raise UnparseablePage("unknown_kind", f"name suffix {suffix or '(none)'!r}, content starts {shown!r}")


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

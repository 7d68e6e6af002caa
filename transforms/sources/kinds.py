"""The registry of input kinds: every kind a job reads, in the order the sniffer
asks them (transforms/sources/sniff.py). Adding a kind is its module (the
parser) and one entry here; its name goes into `source_kind`, its packages into
setup.py's SOURCES extra (tests/test_boundaries.py checks that they agree).

Content decides first: a document that opens (after a byte-order mark and
blanks) with an HTML doctype or `<html>` is HTML; `%PDF-` in the first KiB is
a PDF (readers accept bytes before it); XML whose root is `<posts>` is a Stack
Exchange dump's Posts.xml; a JSON object holding a `post_stream` is a Discourse
topic, one holding `title` and `abstract`, `body_text`, `full_text` or
`sections` a paper. Then the declared content type (`text/html`,
`application/xhtml+xml`: HTML; `application/pdf`: PDF). Then the name's suffix.
"""
from __future__ import annotations

import re

from ritrag.transforms.sources.base import SourceKind, served_as_html, served_without

HTML_SUFFIXES = (".html", ".htm", ".xhtml", ".shtml")
MARKDOWN_SUFFIXES = (".md", ".markdown")
# The names reStructuredText files go by: the sniffer's and where Sphinx labels are read (rst_labels.py).
RST_SUFFIXES = (".rst", ".rest")
JSON_SNIFF_BYTES = 65536  # how far into a JSON object its telling keys are looked for
_PAPER_KEYS = (b'"abstract"', b'"body_text"', b'"full_text"', b'"sections"')
# A Stack Exchange dump's Posts.xml: an optional XML declaration, then the <posts> root.
_POSTS_ROOT = re.compile(rb"\A(<\?xml[^>]*\?>)?\s*<posts[\s>]")


def _opens_html(opening: bytes, data: bytes) -> bool:
    return opening[:15].lower().startswith((b"<!doctype html", b"<html"))


def _holds_pdf_header(opening: bytes, data: bytes) -> bool:
    return b"%PDF-" in data[:1024]


def _opens_posts_root(opening: bytes, data: bytes) -> bool:
    return _POSTS_ROOT.match(opening) is not None


def _is_discourse_topic(opening: bytes, data: bytes) -> bool:
    return opening.startswith(b"{") and b'"post_stream"' in data[:JSON_SNIFF_BYTES]


def _is_paper(opening: bytes, data: bytes) -> bool:
    window = data[:JSON_SNIFF_BYTES]
    return opening.startswith(b"{") and b'"title"' in window and any(key in window for key in _PAPER_KEYS)


HTML = SourceKind("html", "HTML pages", opens_with=_opens_html, content_types=("text/html", "application/xhtml+xml"),
                  suffixes=HTML_SUFFIXES, web=True)
PDF = SourceKind("pdf", "PDF", "ritrag.transforms.sources.pdf:parse_pdf", opens_with=_holds_pdf_header,
                 content_types=("application/pdf",), suffixes=(".pdf",), web=True,
                 packages=("pypdf>=7.1",))  # the release tested to cut cyclic, too deep and huge outlines
STACKEXCHANGE = SourceKind("stackexchange", "Stack Exchange Posts.xml",
                           "ritrag.transforms.sources.stackexchange:parse_stackexchange",
                           opens_with=_opens_posts_root, multi_page=True)
DISCOURSE = SourceKind("discourse", "Discourse topic JSON", "ritrag.transforms.sources.discourse:parse_discourse",
                       opens_with=_is_discourse_topic, url_path=served_without(".json"), multi_page=True)
PAPER = SourceKind("paper", "paper JSON", "ritrag.transforms.sources.paper:parse_paper", opens_with=_is_paper,
                   url_path=served_without(".json"))
MARKDOWN = SourceKind("markdown", "Markdown docs (with mkdocs.yml nav)",
                      "ritrag.transforms.sources.markdown:parse_markdown", suffixes=MARKDOWN_SUFFIXES,
                      url_path=served_as_html(MARKDOWN_SUFFIXES),
                      packages=("markdown-it-py>=3", "pyyaml>=6"))  # pyyaml: front matter, mkdocs.yml
RST = SourceKind("rst", "reStructuredText", "ritrag.transforms.sources.rst:parse_rst", suffixes=RST_SUFFIXES,
                 url_path=served_as_html(RST_SUFFIXES), packages=("docutils>=0.20",))
TEXT = SourceKind("text", "plain text (.txt)", "ritrag.transforms.sources.text:parse_text", suffixes=(".txt",))

# Content sniffs first in this order (an HTML opening before a PDF header found
# further in), then content types, then suffixes.
KINDS: tuple[SourceKind, ...] = (HTML, PDF, STACKEXCHANGE, DISCOURSE, PAPER, MARKDOWN, RST, TEXT)
BY_NAME = {kind.name: kind for kind in KINDS}
SOURCE_KINDS = tuple(BY_NAME)  # every name ParsedPage.source_kind may hold (besides "")
# What a web response (a fetched body, a WARC record's payload) is read as: one
# page per URL, located by its URL alone.
WEB_KINDS = tuple(kind.name for kind in KINDS if kind.web)


def described_kinds() -> str:
    """The kinds a job reads, as its help lists them."""
    return ", ".join(kind.label for kind in KINDS)

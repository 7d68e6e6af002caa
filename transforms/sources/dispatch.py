"""The one door every input kind goes through: the kind of an input
(`sniff_kind`, the sniffer's answer or a dead letter `unknown_kind` whose detail
says what was seen), the URL its file is served at (`document_url_path`),
whether it holds several pages, and its parser (`parse_document`), all read
from the registry of kinds (transforms/sources/kinds.py).

Every kind yields `ParsedPage`s, so the forest, chunks, indexes and serving do
not know which kind a page came from. One file may hold several pages (a
thread's posts): each page's `source` is then `<file>#post-<n>`
(record_source.py), and reading it again parses the file and keeps that record.
"""
from __future__ import annotations

import functools
import importlib
import posixpath
from typing import Callable

from ritrag.schema import ParsedPage
from ritrag.transforms.sources.common import SourceFile, UnparseablePage
from ritrag.transforms.sources import kinds
# HTML_SUFFIXES: pipelines/build.py names HTML inputs by them.
from ritrag.transforms.sources.kinds import BY_NAME, HTML_SUFFIXES, KINDS
from ritrag.transforms.sources.sniff import declared_type, opening_of, sniff

HTML = kinds.HTML.name  # read by transforms/parse, not through parse_document

Parser = Callable[[SourceFile], list[tuple[str | None, ParsedPage]]]


def document_url_path(relative: str) -> str:
    """The path a document file is served at, relative like its input path: the
    first kind's rule that renames it (Markdown and reStructuredText as the HTML a
    static-site generator makes of it, JSON without its suffix); everything else
    (HTML, PDF) as it is."""
    for kind in KINDS:
        served = kind.url_path(relative)
        if served is not None:
            return served
    return relative


def sniff_kind(path: str, data: bytes, content_type: str = "") -> str:
    """The kind of an input (transforms/sources/sniff.py): its content, then
    `content_type` (what a web response declares), then its name; raises
    UnparseablePage("unknown_kind")."""
    kind = sniff(path, data, content_type)
    if kind is not None:
        return kind
    suffix = posixpath.splitext(path.lower())[1]
    declared = declared_type(content_type)
    shown = opening_of(data)[:24].decode("utf-8", "replace") or "empty"
    raise UnparseablePage("unknown_kind", f"name suffix {suffix or '(none)'!r}, "
                                          f"content type {declared or '(none)'!r}, content starts {shown!r}")


def is_multi_page(path: str, data: bytes) -> bool:
    """Whether the file is of a kind that holds several pages (a thread)."""
    kind = sniff(path, data)
    return kind is not None and BY_NAME[kind].multi_page


@functools.cache
def parser_of(kind: str) -> Parser:
    """The parser of a kind, its module imported on first use: a job reading only
    HTML never loads pypdf or markdown-it."""
    module, _, function = BY_NAME[kind].parser.partition(":")
    return getattr(importlib.import_module(module), function)


def parse_document(kind: str, file: SourceFile, max_bytes: int) -> list[tuple[str | None, ParsedPage]]:
    """The pages of a non-HTML input file, each with its record key (None: the file itself)."""
    if len(file.data) > max_bytes:
        raise UnparseablePage("too_large", f"{len(file.data)} bytes > {max_bytes}")
    return parser_of(kind)(file)

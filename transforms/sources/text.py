"""Plain text (`.txt`: READMEs, RFC-style documents, man-page dumps) -> one page
per file. Text has no markup, so its headings are read from the conventions
plain-text authors use, the first that the file follows:

1. underlined headings (setext / reStructuredText style): a line of text under
   a blank line (or an overline of the same character), then a line of one
   repeated character of `= - ~ ^ * + #`, at least 3 long and half the title's
   length; levels by first appearance of each (character, overlined) style, as
   docutils assigns them, at most MAX_LEVELS;
2. else numbered headings (RFC style), at least 2: `2.`, `3.1.` or `3.1` and a
   capitalised title at the margin, a blank line on each side, no closing
   punctuation; the level is the number's depth;
3. else capitals headings (man pages), at least 2: a line of capitals at the
   margin whose next line is indented text (`NAME`, `SYNOPSIS`).

The title is the file's first non-blank line (a heading there opens the page
rather than a section), the file name when that line is longer than a title.
The text is read as UTF-8; a NUL byte is a binary file, not text. One pass over
the lines: time and memory linear in the file.
"""
from __future__ import annotations

import re

from ritrag.schema import ParsedPage, Section
from ritrag.transforms.sources.common import (SourceFile, UnparseablePage, document_page, heading_anchor,
                                              section_path, url_segment_title)
from ritrag.transforms.sources.nav import document_trail

MAX_TITLE_CHARS = 120  # a longer first line is a paragraph, not a title (nor a heading)
MAX_LEVELS = 6
MIN_MARKED_HEADINGS = 2  # numbered or capitals headings: fewer are a list item or a shout, not a structure
_UNDERLINE = re.compile(r"([=\-~^*+#])\1{2,}")
_NUMBERED = re.compile(r"(\d{1,3}(?:\.\d{1,3}){0,5})\.?[ \t]+([A-Z][^\n]*[^.,;:\s])")
_CAPITALS = re.compile(r"[A-Z][A-Z0-9 ,/()&'-]*[A-Z)]")


def _underlined(lines: list[str]) -> dict[int, tuple[int, str, int]]:
    """{first line: (level, title, lines it spans)} of the underlined headings."""
    styles: list[tuple[str, bool]] = []
    found: dict[int, tuple[int, str, int]] = {}
    i = 0
    while i + 1 < len(lines):
        title, under = lines[i].strip(), lines[i + 1].strip()
        above = lines[i - 1].strip() if i else ""
        over = bool(_UNDERLINE.fullmatch(above)) and above[:1] == under[:1]
        if (title and (not above or over) and not lines[i][:1].isspace() and len(title) <= MAX_TITLE_CHARS
                and not _UNDERLINE.fullmatch(title) and _UNDERLINE.fullmatch(under) and 2 * len(under) >= len(title)):
            style = (under[0], over)
            if style not in styles:
                styles.append(style)
            found[i - 1 if over else i] = (min(styles.index(style) + 1, MAX_LEVELS), title, 3 if over else 2)
            i += 2
            continue
        i += 1
    return found


def _marked(lines: list[str]) -> dict[int, tuple[int, str, int]]:
    """{line: (level, title, 1)} of the numbered headings, else of the capitals headings."""
    def blank(j: int) -> bool:
        return j < 0 or j >= len(lines) or not lines[j].strip()

    numbered: dict[int, tuple[int, str, int]] = {}
    capitals: dict[int, tuple[int, str, int]] = {}
    for i, line in enumerate(lines):
        if not line or line[0].isspace() or len(line) > MAX_TITLE_CHARS:
            continue
        match = _NUMBERED.fullmatch(line)
        if match and blank(i - 1) and blank(i + 1):
            numbered[i] = (min(match.group(1).count(".") + 1, MAX_LEVELS), " ".join(line.split()), 1)
        elif _CAPITALS.fullmatch(line) and not blank(i + 1) and lines[i + 1][0].isspace():
            capitals[i] = (1, line, 1)
    for headings in (numbered, capitals):
        if len(headings) >= MIN_MARKED_HEADINGS:
            return headings
    return {}


def parse_text(file: SourceFile) -> list[tuple[str | None, ParsedPage]]:
    try:
        text = file.data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnparseablePage("undecodable", f"plain text is read as UTF-8: {exc}") from exc
    if "\x00" in text:
        raise UnparseablePage("binary", "a NUL byte: a binary file, not text")
    lines = [line.rstrip() for line in text.splitlines()]
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        raise UnparseablePage("no_content", "a text file of blank lines")
    headings = _underlined(lines) or _marked(lines)
    trail, method, nav_title, nav_order = document_trail(file)
    i = first
    if first in headings:  # the opening heading is the page's title, not a section
        _, title, span = headings.pop(first)
        i += span
    else:  # the opening line is the title, and stays the text's first line
        opening = lines[first].strip()
        title = opening if len(opening) <= MAX_TITLE_CHARS else nav_title or url_segment_title(file.url)
    sections: list[tuple[str, int, str, tuple[str, ...], list[str]]] = [(title, 0, "", (), [])]
    anchors: dict[str, int] = {}
    open_titles: list[tuple[int, str]] = []
    while i < len(lines):
        if i in headings:
            level, heading, span = headings[i]
            path = section_path(open_titles, level, heading)
            sections.append((heading, level, heading_anchor(heading, anchors), path, []))
            i += span
            continue
        pieces = sections[-1][4]
        if lines[i].strip() or (pieces and pieces[-1]):  # runs of blank lines kept as one, none leading
            pieces.append(lines[i])
        i += 1
    page = document_page(file, title=title, trail=trail, trail_method=method, nav_order=nav_order,
                         sections=tuple(Section(t, level, anchor, "\n".join(pieces).strip("\n"), path)
                                        for t, level, anchor, path, pieces in sections))
    return [(None, page)]

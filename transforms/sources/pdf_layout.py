"""Headings induced from a PDF's layout, for a PDF without a usable outline.

Text is read once per page with pypdf's `extract_text(visitor_text=...)`: each
run of text comes with its font dictionary, font size and matrices, so a line
gets the size (Tf size x the vertical scale of text matrix x CTM, rounded to
half a point) and weight (bold from the font's name, /FontWeight or ForceBold
flag) its characters are drawn in. No model, nothing about one document:

* Body style: the (size, bold) style of the most characters.
* A heading line is drawn in one style (at least HEADING_STYLE_SHARE of its
  characters) that is larger than the body (HEADING_SIZE_RATIO) or bold at
  body size where the body is not bold; short (MAX_HEADING_CHARS,
  MAX_HEADING_WORDS); words, not a table row or a page number; not ending
  mid-sentence (',', ';', '-'); and isolated: a block of more than
  MAX_HEADING_LINES consecutive lines in one heading style is a paragraph set
  in it, not a heading (up to that many, the first not opening lowercase nor
  the next numbered, join as one wrapped heading).
* Running headers and footers: a heading that is its page's first or last
  line, whose text (digits ignored) opens or closes RUNNING_PAGES pages or
  more in the same style, is page furniture, dropped. Labels: a text in one
  style on LABEL_PAGES pages or more (and LABEL_PAGE_SHARE of them) names a
  kind of block ('Note', 'Tip', 'Warning'), not a part of the document: dropped.
  A printed table of contents' entry ('2.1 Title 37') too.
* Levels: headings sort by size (larger first), then bold, then numbering
  depth ('Part II' 0; 'Chapter 3', 'Item 7.', 'A.', unnumbered 1; '3.2' 2,
  '3.2.1' 3, ...); each distinct key is one level, at most MAX_LEVELS (deeper
  keys share the last).
* Credible or nothing: at least MIN_HEADINGS headings, at most MAX_HEADING_SHARE
  of the lines, at most MAX_HEADING_STYLES distinct heading styles, at most
  `max_headings`; otherwise [] and the caller keeps one section per page.

Cost: one pass over the runs (a line keeps at most MAX_LINE_STYLES styles),
then passes over the lines: linear in the page text.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

Style = tuple[float, bool]  # (size in points, rounded to half a point; bold)

HEADING_SIZE_RATIO = 1.15
HEADING_STYLE_SHARE = 0.9
MAX_HEADING_CHARS = 120
MAX_HEADING_WORDS = 16
MAX_HEADING_LINES = 3
MAX_LINE_STYLES = 8  # past this a line is mixed whatever comes next: its style dict stays small
RUNNING_PAGES = 3
LABEL_PAGES = 5  # or LABEL_PAGE_SHARE of the pages, whichever is more
LABEL_PAGE_SHARE = 0.05
MIN_HEADINGS = 2
MAX_HEADING_SHARE = 0.25
MAX_HEADING_STYLES = 6
MAX_LEVELS = 6

_BOLD_NAME = re.compile(r"bold|black|heavy|demi|semibd|extrabd", re.IGNORECASE)
_FORCE_BOLD = 1 << 18  # font descriptor /Flags bit 19
_NUMBERING = re.compile(
    r"^(?:(?P<dotted>\d{1,3}(?:\.\d{1,3}){0,5})\.?"
    r"|(?P<keyword>part|chapter|appendix|annex|item|section|article|schedule|note)\s+[0-9ivxlcdm]{1,6}[a-z]?[.:]?"
    r"|(?P<letter>[A-Z])\.)(?=\s|$)", re.IGNORECASE)
_TOP_KEYWORDS = ("part",)
_TRAILING_PAGE = re.compile(r"(?:\s|\.)\d{1,3}$")  # 4 digits are more often a year than a page
_PAGE_NUMBER = re.compile(r"^(?:page\s+)?(?:\d+|[ivxlcdm]+)(?:\s*(?:of|/)\s*\d+)?$", re.IGNORECASE)


@dataclass(frozen=True)
class Line:
    text: str  # whitespace collapsed
    style: Style | None  # None: no single style holds HEADING_STYLE_SHARE of its characters
    top: tuple[Style, int] | None  # its most used style and how many characters (not spaces) it drew


class LineCollector:
    """A pypdf `visitor_text`: the lines of one page's text with the style each is drawn in."""

    def __init__(self):
        self.lines: list[Line] = []
        self._parts: list[str] = []
        self._styles: dict[Style, int] = {}
        self._mixed = False
        self._bold: dict[int, bool] = {}  # id of a font dictionary of this page -> bold

    def __call__(self, text: str, cm: Any, tm: Any, font: Any, font_size: Any) -> None:
        if not text:
            return
        style = (_size(cm, tm, font_size), self._is_bold(font))
        for k, piece in enumerate(text.split("\n")):
            if k:
                self.end_line()
            if not piece:
                continue
            drawn = len(piece) - piece.count(" ")
            self._parts.append(piece)
            if drawn and not self._mixed:
                self._styles[style] = self._styles.get(style, 0) + drawn
                self._mixed = len(self._styles) > MAX_LINE_STYLES

    def end_line(self) -> None:
        text = " ".join("".join(self._parts).split())
        if text:
            chars = sum(self._styles.values())
            top = max(self._styles.items(), key=lambda kv: kv[1], default=None)
            uniform = top is not None and not self._mixed and top[1] >= HEADING_STYLE_SHARE * chars
            self.lines.append(Line(text, top[0] if uniform else None, top))
        self._parts, self._styles, self._mixed = [], {}, False

    def _is_bold(self, font: Any) -> bool:
        if font is None:
            return False
        key = id(font)
        if key not in self._bold:
            self._bold[key] = _font_is_bold(font)
        return self._bold[key]


def _size(cm: Any, tm: Any, font_size: Any) -> float:
    """The drawn size: Tf size times the vertical scale of text matrix x CTM."""
    try:
        c = tm[2] * cm[0] + tm[3] * cm[2]
        d = tm[2] * cm[1] + tm[3] * cm[3]
        size = abs(float(font_size)) * math.hypot(c, d)
    except (TypeError, ValueError, IndexError):
        return 0.0
    return round(size * 2) / 2 if math.isfinite(size) else 0.0


def _font_is_bold(font: Any) -> bool:
    try:
        font = font.get_object()
        descriptor = font.get("/FontDescriptor")
        if descriptor is None and font.get("/DescendantFonts"):
            descriptor = font["/DescendantFonts"][0].get_object().get("/FontDescriptor")
        descriptor = descriptor.get_object() if descriptor is not None else {}
        if _BOLD_NAME.search(str(font.get("/BaseFont") or descriptor.get("/FontName") or "")):
            return True
        weight = descriptor.get("/FontWeight")
        flags = descriptor.get("/Flags")
        return (weight is not None and float(weight) >= 600) or (flags is not None and int(flags) & _FORCE_BOLD != 0)
    except Exception:  # a damaged font dictionary makes its text regular, not the page unreadable
        return False


def numbering_depth(text: str) -> int:
    """How deep a heading's numbering puts it: 'Part II' 0; 'Chapter 3',
    'Item 7.', 'A.' and unnumbered 1; '3.2' 2, '3.2.1' 3."""
    match = _NUMBERING.match(text)
    if match is None or match["letter"]:
        return 1
    if match["keyword"]:
        return 0 if match["keyword"].casefold() in _TOP_KEYWORDS else 1
    return match["dotted"].count(".") + 1


def _reads_as_heading(line: Line, body: Style) -> bool:
    style, text = line.style, line.text
    if style is None or len(text) < 2 or len(text) > MAX_HEADING_CHARS or len(text.split()) > MAX_HEADING_WORDS:
        return False
    size, bold = style
    if not (size >= HEADING_SIZE_RATIO * body[0] or (bold and not body[1] and size >= body[0])):
        return False
    letters = sum(c.isalpha() for c in text)
    drawn = len(text) - text.count(" ")
    if letters < 2 or letters < 0.5 * drawn or _PAGE_NUMBER.match(text):
        return False  # a table row, a figure's numbers, a page number
    numbered = _NUMBERING.match(text)
    if numbered and numbered["dotted"] and _TRAILING_PAGE.search(text, numbered.end()):
        return False  # '2.1 Package management 37': an entry of a printed table of contents
    return text[-1] not in ",;-"


def _pages_of(keyed: Iterable[tuple[Hashable, int]], cap: int) -> dict[Hashable, int]:
    """On how many distinct pages each key is, counted up to `cap` (a key's set costs at most that)."""
    seen: dict[Hashable, set[int]] = {}
    for key, index in keyed:
        pages = seen.setdefault(key, set())
        if len(pages) < cap:
            pages.add(index)
    return {key: len(pages) for key, pages in seen.items()}


def layout_headings(pages: list[list[Line]], max_headings: int) -> list[tuple[int, str, int, str]]:
    """(level, title, page index, its first line) of the headings the layout
    shows, in page order; [] when no credible structure is found (module doc)."""
    drawn: Counter[Style] = Counter()
    for lines in pages:
        for line in lines:
            if line.top is not None:
                drawn[line.top[0]] += line.top[1]
    if not drawn:
        return []
    body = drawn.most_common(1)[0][0]
    found: list[tuple[str, Style, int, str, str | None]] = []  # (title, style, page, first line, furniture key)
    for index, lines in enumerate(pages):
        run: list[Line] = []
        for at, line in enumerate([*lines, None]):
            heading = line is not None and _reads_as_heading(line, body)
            # A wrapped heading goes on in its style; a numbered line opens the next heading.
            if heading and run and run[-1].style == line.style and not _NUMBERING.match(line.text):
                run.append(line)
                continue
            if 0 < len(run) <= MAX_HEADING_LINES:
                title = " ".join(part.text for part in run)
                edge = at - len(run) == 0 or at == len(lines)  # the page's first or last line
                found.append((title, run[0].style, index, run[0].text,
                              re.sub(r"\d+", "#", title.casefold()) if edge else None))
            run = [line] if heading and not line.text[0].islower() else []
    label_pages = max(LABEL_PAGES, math.ceil(LABEL_PAGE_SHARE * len(pages)))
    at_edges = _pages_of((((key, style), index) for _, style, index, _, key in found if key is not None),
                         RUNNING_PAGES)
    anywhere = _pages_of((((title.casefold(), style), index) for title, style, index, _, _ in found), label_pages)
    headings = [(title, style, index, first) for title, style, index, first, key in found
                if at_edges.get((key, style), 0) < RUNNING_PAGES
                and anywhere[(title.casefold(), style)] < label_pages]
    lines_with_text = sum(len(lines) for lines in pages)
    if (len(headings) < MIN_HEADINGS or len(headings) > max_headings
            or len(headings) > MAX_HEADING_SHARE * lines_with_text
            or len({heading[1] for heading in headings}) > MAX_HEADING_STYLES):
        return []
    keys = [(-style[0], not style[1], numbering_depth(title)) for title, style, _, _ in headings]
    rank = {key: min(k + 1, MAX_LEVELS) for k, key in enumerate(sorted(set(keys)))}
    return [(rank[key], title, index, first) for key, (title, _, index, first) in zip(keys, headings)]

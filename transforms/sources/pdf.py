"""PDF -> one document `ParsedPage` (pypdf).

* Text: each page's extracted text, in page order, every page opened by a
  marker line `[p. N]` (N the physical page number, 1-based), so that any node's
  text says which pages it comes from and Read can cite them; a section that
  starts inside a page opens with that page's marker too.
* Sections: the outline (bookmarks) in page order, nesting kept as heading
  levels (outline depth 1 = level 1). A section starts where its title first
  opens a line of its page's text after the previous cut (else where it first
  appears there; at the page's start when the title is not found), and runs to
  the next entry's start: every character of the text belongs to exactly one
  node. A cycle in the outline is cut where an entry comes round again (pypdf).
  An outline is unusable when there is none, pypdf refuses it (over 100 levels
  deep or 100,000 entries) or it has more entries than
  MAX_OUTLINE_ENTRIES_PER_PAGE per page (a generated or hostile outline rather
  than a table of contents, whose cuts would cost entries x page length).
* Without a usable outline, headings induced from the layout (font size,
  weight, isolation, numbering: transforms/sources/pdf_layout.py), cut the same
  way at the line they open, at most MAX_OUTLINE_ENTRIES_PER_PAGE per page;
  when the layout shows no credible headings, one section per page titled
  "Page N". The page's `toc_induced` says which ("layout" or "pages"), a build
  counter (`toc_induced_layout`, `toc_induced_pages`). With `--induce_toc llm`,
  a model's heading tree may cut such a PDF again (`with_headings`, from the
  stage in transforms/metadata/induce_toc.py): "llm".
* Anchors: `page=N` (PDF open parameters: a viewer opens `file.pdf#page=N` at
  page N) for a page's first section; later sections of the same page get none.
* Title: the document information's title, else the file name; description:
  its subject. Placement: the folders (transforms/sources/nav.py).
* Refused (dead letters): `broken_pdf` (pypdf cannot read it), `encrypted`
  (no empty user password opens it), `no_text` (nothing extractable: a scanned
  PDF needs OCR first).
"""
from __future__ import annotations

import dataclasses
import io
import logging

from pypdf import PdfReader
from pypdf.errors import FileNotDecryptedError, PyPdfError
from pypdf.generic import Destination

from ritrag.schema import ParsedPage, Section
from ritrag.transforms.sources.common import (SourceFile, UnparseablePage, document_page, section_path,
                                             url_segment_title, with_sections)
from ritrag.transforms.sources.nav import document_trail
from ritrag.transforms.sources.pdf_layout import Line, LineCollector, layout_headings

# pypdf reports recoverable damage as log warnings: the dead letter or the page is what the job reports.
logging.getLogger("pypdf").setLevel(logging.ERROR)
_READ_ERRORS = (PyPdfError, ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError)
# Real manuals have a few entries per page (a 261-page manual here: 451 entries, at most 6 on one page).
MAX_OUTLINE_ENTRIES_PER_PAGE = 20


def page_marker(number: int) -> str:
    return f"[p. {number}]"


def _in_order(outline: list) -> list[tuple[int, Destination]]:
    """(depth, entry) of a pypdf outline in document order: pypdf nests the list
    of an entry's children right after the entry."""
    flat: list[tuple[int, Destination]] = []
    stack = [(iter(outline), 1)]
    while stack:
        items, level = stack[-1]
        item = next(items, None)
        if item is None:
            stack.pop()
        elif isinstance(item, list):
            stack.append((iter(item), level + 1))
        elif isinstance(item, Destination):
            flat.append((level, item))
    return flat


def outline_entries(reader: PdfReader) -> list[tuple[int, str, int]]:
    """(level, title, page index) of every outline entry that points at a page,
    in page order (outline order among entries of one page); [] when the outline
    is absent or unusable (module doc)."""
    try:
        flat = _in_order(reader.outline)
        if len(flat) > MAX_OUTLINE_ENTRIES_PER_PAGE * len(reader.pages):
            return []
    except _READ_ERRORS:
        return []
    entries = []
    for level, item in flat:
        try:
            index = reader.get_destination_page_number(item)
        except _READ_ERRORS:
            continue
        title = " ".join(str(item.title or "").split())
        if index is not None and index >= 0 and title:
            entries.append((level, title, index))
    return sorted(entries, key=lambda e: e[2])  # stable: outline order within a page


def _open(data: bytes) -> PdfReader:
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted and not reader.decrypt(""):
            raise UnparseablePage("encrypted", "no empty user password opens it")
        len(reader.pages)
    except FileNotDecryptedError as exc:
        raise UnparseablePage("encrypted", str(exc)) from exc
    except _READ_ERRORS as exc:
        raise UnparseablePage("broken_pdf", f"{type(exc).__name__}: {exc}") from exc
    return reader


def _page_texts(reader: PdfReader, collect_lines: bool) -> tuple[list[str], list[list[Line]]]:
    """Each page's text, and with `collect_lines` its lines with their styles
    (pdf_layout.py), read in the same pass."""
    texts, lines = [], []
    for number, page in enumerate(reader.pages, 1):
        collector = LineCollector() if collect_lines else None
        try:
            text = page.extract_text(visitor_text=collector) or ""
        except _READ_ERRORS as exc:
            raise UnparseablePage("broken_pdf", f"page {number}: {type(exc).__name__}: {exc}") from exc
        texts.append("\n".join(line.rstrip() for line in text.strip().splitlines()))
        if collector is not None:
            collector.end_line()
            lines.append(collector.lines)
    return texts, lines


def _line_start(text: str, line: str, start: int) -> int:
    """Where `line` first opens a line of `text` at or after `start`, else -1."""
    if text.startswith(line, start) and (start == 0 or text[start - 1] == "\n"):
        return start
    found = text.find("\n" + line, max(start - 1, 0))
    return found + 1 if found >= 0 else -1


def _cuts(texts: list[str], starts: list[int], entries: list[tuple[int, str, int, str]]) -> list[int]:
    """Offset in the whole text where each entry's section starts (module doc)."""
    cuts = []
    for _, _, index, line in entries:
        page_start = starts[index]
        floor = max(page_start, cuts[-1] if cuts else 0)
        body = page_start + len(page_marker(index + 1)) + 1  # past the page's marker line
        page_text = texts[index]
        start = max(floor - body, 0)
        found = _line_start(page_text, line, start)
        if found < 0:
            found = page_text.find(line, start)
        if found < 0:
            found = page_text.casefold().find(line.casefold(), start)
        # A title opening its page takes the page's marker with it.
        cuts.append(floor if found <= 0 else body + found)
    return cuts


def _entries(outline: list[tuple[int, str, int]], texts: list[str],
             lines: list[list[Line]]) -> tuple[list[tuple[int, str, int, str]], str]:
    """(level, title, page index, line to cut at: "" for the page's start) of
    the sections, and how the ToC was induced ("" from the outline, "layout"
    or "pages": module doc)."""
    if outline:
        return [(level, title, index, title) for level, title, index in outline], ""
    induced = layout_headings(lines, MAX_OUTLINE_ENTRIES_PER_PAGE * len(texts))
    if induced:
        return induced, "layout"
    return [(1, f"Page {n}", n - 1, "") for n in range(1, len(texts) + 1)], "pages"


def document_sections(texts: list[str], entries: list[tuple[int, str, int, str]], title: str) -> tuple[Section, ...]:
    """The sections of a document of page `texts` cut at `entries` (level,
    title, page index, line to cut at: "" for the page's start), in page order:
    the text before the first entry under the document's `title`, then one
    section per entry, each opening with its page's marker (module doc)."""
    pages = [f"{page_marker(n)}\n{text}" for n, text in enumerate(texts, 1)]
    starts, offset = [], 0
    for page in pages:
        starts.append(offset)
        offset += len(page) + 2  # the "\n\n" between pages
    whole = "\n\n".join(pages)
    cuts = _cuts(texts, starts, entries)
    sections = [Section(title, 0, "", whole[:cuts[0]].strip(), ())]
    open_titles: list[tuple[int, str]] = []
    anchored: set[int] = set()
    for k, ((level, heading, index, _), cut) in enumerate(zip(entries, cuts)):
        text = whole[cut:cuts[k + 1] if k + 1 < len(cuts) else len(whole)].strip()
        if not text.startswith(page_marker(index + 1)):
            text = f"{page_marker(index + 1)}\n{text}"
        anchor = "" if index in anchored else f"page={index + 1}"
        anchored.add(index)
        sections.append(Section(heading, level, anchor, text, section_path(open_titles, level, heading)))
    return tuple(sections)


def page_texts(page: ParsedPage) -> list[str]:
    """Each page's text of a parsed PDF, read back from its sections: a marker
    line `[p. N+1]` opens the next page, a repeated `[p. N]` (a section that
    starts inside page N) is passed over. What the cuts trimmed at their
    boundaries (blank lines) is not restored: the texts are the same for the
    same parse, which is what cutting a page again needs."""
    texts: list[list[str]] = []
    for section in page.sections:
        for line in section.text.split("\n"):
            if line == page_marker(len(texts) + 1):
                texts.append([])
            elif texts and line != page_marker(len(texts)):
                texts[-1].append(line)
    return ["\n".join(lines).strip() for lines in texts]


def with_headings(page: ParsedPage, entries: list[tuple[int, str, int, str]], toc_induced: str) -> ParsedPage:
    """A parsed PDF cut again at `entries` (level, title, page index, the text
    to cut at), in page order, as an outline's entries cut it; `toc_induced`
    says where they came from."""
    page = with_sections(page, document_sections(page_texts(page), entries, page.title))
    return dataclasses.replace(page, toc_induced=toc_induced)


def parse_pdf(file: SourceFile) -> list[tuple[str | None, ParsedPage]]:
    reader = _open(file.data)
    outline = outline_entries(reader)
    # The layout is read only where it is needed: a visitor makes pypdf parse every content stream.
    texts, lines = _page_texts(reader, collect_lines=not outline)
    if not any(texts):
        raise UnparseablePage("no_text", f"{len(texts)} pages, no extractable text (a scanned PDF needs OCR)")
    entries, toc_induced = _entries(outline, texts, lines)
    try:
        info = reader.metadata or {}
        title, subject = str(info.get("/Title") or "").strip(), str(info.get("/Subject") or "").strip()
    except _READ_ERRORS:
        title, subject = "", ""
    title = title or url_segment_title(file.url)
    trail, method, _, _ = document_trail(file)
    page = document_page(file, title=title, trail=trail, trail_method=method, description=subject,
                         sections=document_sections(texts, entries, title))
    return [(None, dataclasses.replace(page, toc_induced=toc_induced))]

"""PDF -> one document `ParsedPage` (pypdf).

* Text: each page's extracted text, in page order, every page opened by a
  marker line `[p. N]` (N the physical page number, 1-based), so that any node's
  text says which pages it comes from and Read can cite them; a section that
  starts inside a page opens with that page's marker too.
* Sections: the outline (bookmarks) in page order, nesting kept as heading
  levels (outline depth 1 = level 1). A section starts where its title first
  appears in its page's text after the previous cut (at the page's start when
  the title is not found), and runs to the next entry's start: every character
  of the text belongs to exactly one node. A cycle in the outline is cut where
  an entry comes round again (pypdf). Without a usable outline (none; one pypdf
  refuses: over 100 levels deep or 100,000 entries; or more entries than
  MAX_OUTLINE_ENTRIES_PER_PAGE per page, a generated or hostile outline rather
  than a table of contents, whose cuts would cost entries x page length), one
  section per page titled "Page N". Headings induced from the layout (font
  sizes, numbering) are not done.
* Anchors: `page=N` (PDF open parameters: a viewer opens `file.pdf#page=N` at
  page N) for a page's first section; later sections of the same page get none.
* Title: the document information's title, else the file name; description:
  its subject. Placement: the folders (transforms/sources/nav.py).
* Refused (dead letters): `broken_pdf` (pypdf cannot read it), `encrypted`
  (no empty user password opens it), `no_text` (nothing extractable: a scanned
  PDF needs OCR first).
"""
from __future__ import annotations

import io
import logging

from pypdf import PdfReader
from pypdf.errors import FileNotDecryptedError, PyPdfError
from pypdf.generic import Destination

from ritrag.schema import ParsedPage, Section
from ritrag.transforms.parse import UnparseablePage
from ritrag.transforms.parse.location import url_segment_title
from ritrag.transforms.sources.common import SourceFile, document_page, section_path
from ritrag.transforms.sources.nav import document_trail

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


def _page_texts(reader: PdfReader) -> list[str]:
    texts = []
    for number, page in enumerate(reader.pages, 1):
        try:
            text = page.extract_text() or ""
        except _READ_ERRORS as exc:
            raise UnparseablePage("broken_pdf", f"page {number}: {type(exc).__name__}: {exc}") from exc
        texts.append("\n".join(line.rstrip() for line in text.strip().splitlines()))
    return texts


def _cuts(texts: list[str], starts: list[int], entries: list[tuple[int, str, int]]) -> list[int]:
    """Offset in the whole text where each entry's section starts (module doc)."""
    cuts = []
    for level, title, index in entries:
        page_start = starts[index]
        floor = max(page_start, cuts[-1] if cuts else 0)
        body = page_start + len(page_marker(index + 1)) + 1  # past the page's marker line
        page_text = texts[index]
        found = page_text.find(title, max(floor - body, 0))
        if found < 0:
            found = page_text.casefold().find(title.casefold(), max(floor - body, 0))
        # A title opening its page takes the page's marker with it.
        cuts.append(floor if found <= 0 else body + found)
    return cuts


def parse_pdf(file: SourceFile) -> list[tuple[str | None, ParsedPage]]:
    reader = _open(file.data)
    texts = _page_texts(reader)
    if not any(texts):
        raise UnparseablePage("no_text", f"{len(texts)} pages, no extractable text (a scanned PDF needs OCR)")
    pages = [f"{page_marker(n)}\n{text}" for n, text in enumerate(texts, 1)]
    starts, offset = [], 0
    for page in pages:
        starts.append(offset)
        offset += len(page) + 2  # the "\n\n" between pages
    whole = "\n\n".join(pages)
    entries = outline_entries(reader) or [(1, f"Page {n}", n - 1) for n in range(1, len(pages) + 1)]
    cuts = _cuts(texts, starts, entries)
    try:
        info = reader.metadata or {}
        title, subject = str(info.get("/Title") or "").strip(), str(info.get("/Subject") or "").strip()
    except _READ_ERRORS:
        title, subject = "", ""
    title = title or url_segment_title(file.url)
    sections = [Section(title, 0, "", whole[:cuts[0]].strip(), ())]
    open_titles: list[tuple[int, str]] = []
    anchored: set[int] = set()
    for k, ((level, heading, index), cut) in enumerate(zip(entries, cuts)):
        text = whole[cut:cuts[k + 1] if k + 1 < len(cuts) else len(whole)].strip()
        if not text.startswith(page_marker(index + 1)):
            text = f"{page_marker(index + 1)}\n{text}"
        anchor = "" if index in anchored else f"page={index + 1}"
        anchored.add(index)
        sections.append(Section(heading, level, anchor, text, section_path(open_titles, level, heading)))
    trail, method, _, _ = document_trail(file)
    return [(None, document_page(file, title=title, trail=trail, trail_method=method,
                                 description=subject, sections=tuple(sections)))]

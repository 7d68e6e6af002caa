"""The main content as text split by headings: block and heading marks, the
flattened text cut into `Section`s, and the page title."""
from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple

from lxml import etree

from ritrag.schema import Section
from ritrag.transforms.parse.head import Head
from ritrag.transforms.parse.location import url_segment_title
from ritrag.transforms.parse.survey import SECTION, class_kinds
from ritrag.transforms.parse.text import text_of

# Private-use characters stand for structure in the flattened text: lxml passes
# them through, and Python finds them with str.split (fast) where a regex over
# the whole text would cost as much as parsing the page. Paragraph and line marks
# stand alone; headings, section ends and preformatted blocks are numbered
# between an opening and a closing mark.
_PARAGRAPH, _LINE, _OPEN, _CLOSE = "\ue000", "\ue001", "\ue002", "\ue003"
_HEADING_TAGS = ("h1", "h2", "h3", "h4", "h5", "h6")
_WRAPPER_BLOCKS = ("div", "section", "article", "main", "header", "aside", "figure", "figcaption",
                   "details", "summary", "address", "hr", "caption", "fieldset", "center")
_BLOCK_MARKS: dict[str, tuple[str, str]] = {  # tag -> (mark before its text, mark after it)
    # Blocks are marked on both sides: text runs into a block ("see:<pre>",
    # "<li>item<ul>", "intro<div>") and out of a wrapper ("</div>more text") as
    # often as not. Headings are replaced by marks of their own.
    **dict.fromkeys(("p", "pre", "table", "ul", "ol", "dl", "blockquote"), (_PARAGRAPH, _PARAGRAPH)),
    **dict.fromkeys(_WRAPPER_BLOCKS, (_PARAGRAPH, _PARAGRAPH)),
    **dict.fromkeys(_HEADING_TAGS, ("", _PARAGRAPH)),
    **dict.fromkeys(("li", "tr", "dt", "dd", "br"), ("", _LINE)),
    **dict.fromkeys(("td", "th"), (" | ", "")),  # rows read "| cell | cell"
}
_CELL_TAGS = ("td", "th")
_PERMALINK_CHARS = "¶§ "
_PERMALINK_GLYPHS = re.compile(r"(?:\s*[¶§🔗]|\s+#)+$")
_PERMALINK_ENDINGS = ("¶", "§", "🔗", " #")

# The most sections one page keeps, its own (the text before the first heading)
# included. Every section is a node with its chunks and their vectors, so a page
# of 100,000 empty <h2>s (2.7 MB, well under --max_page_bytes) cost 9 minutes and
# 3.85 GB. Hand-written docs pages run to a few hundred headings at most (a big
# API reference or a long changelog); a page past a thousand is generated, and
# its later headings are still searched and read as text of their parent section.
MAX_PAGE_SECTIONS = 1000


def _mark(kind: str, index: int) -> str:
    """"h": heading `index` starts; "r": the section it opened ended; "v": verbatim
    (preformatted) block `index`."""
    return f"{_OPEN}{kind}{index}{_CLOSE}"


class _Heading(NamedTuple):
    title: str
    level: int
    anchor: str


class _Verbatim(str):
    """Preformatted text: its spaces and line breaks are content."""


def _opens(heading: etree._Element) -> bool:
    """Whether `heading` is the first heading among its siblings: it then titles
    (opens) its parent element."""
    return not any(sibling.tag in _HEADING_TAGS for sibling in heading.itersiblings(preceding=True))


def _heading_anchor(heading: etree._Element, opened: etree._Element | None) -> str:
    """The fragment that scrolls to the heading: its id, the id of the element it
    opens (Sphinx puts ids on sections), or a named anchor inside it (DocBook)."""
    anchor = heading.get("id") or (opened.get("id") if opened is not None else None)
    if anchor:
        return anchor
    for link in heading.iter("a"):
        if link.get("id") or link.get("name"):
            return link.get("id") or link.get("name")
    return ""


def _is_section(el: etree._Element) -> bool:
    return el.tag in ("section", "article") or (
        el.tag == "div" and bool(class_kinds(el.get("class") or "") & SECTION))


def mark_headings(main: etree._Element) -> list[_Heading]:
    """Replace each heading by a mark; where a sectioning element opened by a
    heading closes, mark that the text after it belongs to the enclosing heading."""
    headings = []
    for index, heading in enumerate(list(main.iter(*_HEADING_TAGS))):
        parent = heading.getparent()
        opened = parent if parent is not None and _opens(heading) else None
        title = text_of(heading)
        if _LINE in title or _PARAGRAPH in title:  # "Uses of Class<br>java.lang.Object"
            title = " ".join(title.replace(_LINE, " ").replace(_PARAGRAPH, " ").split())
        if title.endswith(_PERMALINK_ENDINGS):
            title = _PERMALINK_GLYPHS.sub("", title)
        headings.append(_Heading(title, int(heading.tag[1]), _heading_anchor(heading, opened)))
        if opened is not None and opened is not main and _is_section(opened):
            opened.tail = _mark("r", index) + (opened.tail or "")
        heading.clear(keep_tail=True)
        heading.text = _mark("h", index)
    return headings


def mark_pre_blocks(main: etree._Element) -> list[_Verbatim]:
    """Set preformatted text aside, leaving a mark in its place."""
    blocks = []
    for pre in list(main.iter("pre")):
        text = etree.tostring(pre, method="text", encoding=str, with_tail=False)
        pre.clear(keep_tail=True)
        pre.text = _mark("v", len(blocks))
        blocks.append(_Verbatim(text.strip("\n").replace("\xa0", " ")))
    return blocks


def mark_blocks(main: etree._Element) -> None:
    for el in main.iter(*_BLOCK_MARKS):
        before, after = _BLOCK_MARKS[el.tag]
        if before == _PARAGRAPH and el.getparent().tag in _CELL_TAGS:
            if el.tag not in _WRAPPER_BLOCKS:
                continue  # a cell's paragraphs (docutils wraps every cell in <p>) stay on its row
            before = ""
        if before:
            text = el.text
            el.text = before + text if text else before
        if after:
            tail = el.tail
            el.tail = after + tail if tail else after


def _paragraphs(text: str) -> list[str]:
    """The paragraphs of flattened text (its spaces already collapsed), each with
    its lines on lines of their own. A "¶" ending a line is a permalink (Sphinx
    puts one after every definition); finding those links in the tree would cost
    a Python step per link of the page."""
    blocks = [block.strip().rstrip(_PERMALINK_CHARS) for block in text.split(_PARAGRAPH)]
    blocks = [
        "\n".join(filter(None, (line.strip().rstrip(_PERMALINK_CHARS) for line in block.split(_LINE))))
        if _LINE in block else block
        for block in blocks if block
    ]
    return [block for block in blocks if block]


def _section_text(pieces: list[str]) -> str:
    return "\n\n".join(filter(None, (p if isinstance(p, _Verbatim) else p.strip() for p in pieces)))


_SITE_SUFFIX = re.compile(r"^(.*\S)\s+(?:[-–—|·•:»]|::)\s+\S.*$")


def page_title(headings: list[_Heading], head: Head, url: str) -> tuple[str, int | None]:
    """The page title, and the index of the heading that shows it (which opens no
    section of its own: the text under it is the page's first section)."""
    for index, heading in enumerate(headings):
        if heading.level == 1 and heading.title:
            return heading.title, index
    # <title> usually ends with the site's name: "json — Python 3.11 documentation".
    suffix = _SITE_SUFFIX.match(head.title)
    title = head.og_title or (suffix[1] if suffix else head.title) or url_segment_title(url)
    first = next((i for i, h in enumerate(headings) if h.title), None)
    if first is not None and headings[first].title.casefold() == title.casefold():
        return title, first
    return title, None


def split_sections(text: str, headings: list[_Heading], title: str, title_index: int | None,
                    pre_blocks: list[_Verbatim]) -> tuple[Section, ...]:
    """Cut the marked text of the main content into sections (see `Section`)."""
    page = -1  # the page itself: section 0
    pieces: dict[int, list[str]] = {page: []}
    parent: dict[int, int] = {}
    paths: dict[int, tuple[str, ...]] = {page: ()}
    open_headings: list[tuple[int, int]] = []  # (level, heading index), outermost first
    current = page
    # Paragraphs are cut once for the whole page; the marks survive as text.
    parts = "\n\n".join(_paragraphs(text)).split(_OPEN)
    pieces[page].append(parts[0])
    numbered = {"h": headings, "r": headings, "v": pre_blocks}
    for part in parts[1:]:
        mark, closed, following = part.partition(_CLOSE)
        kind, number = mark[:1], mark[1:]
        if not (closed and kind in numbered and number.isdigit() and int(number) < len(numbered[kind])):
            pieces[current].append(part)  # a private-use character of the page itself
            continue
        index = int(number)
        if kind == "v":
            pieces[current].append(pre_blocks[index])
        elif kind == "r":
            if index in parent:
                current = parent[index]
                while open_headings and open_headings[-1][1] != current:
                    open_headings.pop()
        elif index == title_index:
            parent[index], current, open_headings = page, page, [(headings[index].level, page)]
        elif headings[index].title:
            level = headings[index].level
            while open_headings and open_headings[-1][0] >= level:
                open_headings.pop()
            parent[index] = open_headings[-1][1] if open_headings else page
            paths[index] = paths[parent[index]] + (headings[index].title,)
            pieces[index] = []
            open_headings.append((level, index))
            current = index
        pieces[current].append(following)
    return tuple(
        Section(title, 0, "", _section_text(chunks), ()) if index == page else
        Section(headings[index].title, headings[index].level, headings[index].anchor,
                _section_text(chunks), paths[index])
        for index, chunks in pieces.items()
    )


def cap_sections(sections: tuple[Section, ...], title: str, cap: int = MAX_PAGE_SECTIONS
                 ) -> tuple[tuple[Section, ...], int]:
    """(`sections` with those past the first `cap` merged, heading title and text,
    into their nearest kept enclosing section, and how many were merged). Sections
    nest by level, as the forest nests them; a level-0 section is the page's own.
    A page without one (`title` its title) gets one where a merged section needs it."""
    if len(sections) <= cap:
        return sections, 0
    if sections[0].level != 0:  # the merged tail needs the page's own section to land in
        sections = (Section(title, 0, "", "", ()), *sections)
    kept, tail = list(sections[:cap]), sections[cap:]
    merged: dict[int, list[str]] = {}
    open_levels: list[tuple[int, int]] = []  # (level, index in kept) of the enclosing kept sections
    for index, section in enumerate(kept):
        if section.level:
            while open_levels and open_levels[-1][0] >= section.level:
                open_levels.pop()
            open_levels.append((section.level, index))
    for section in tail:
        parent = 0  # the page's own section, which a level-0 section's text joins
        if section.level:
            while open_levels and open_levels[-1][0] >= section.level:
                open_levels.pop()
            parent = open_levels[-1][1] if open_levels else 0
        merged.setdefault(parent, []).extend(filter(None, (section.title if section.level else "", section.text)))
    for index, pieces in merged.items():
        kept[index] = dataclasses.replace(kept[index], text="\n\n".join(filter(None, (kept[index].text, *pieces))))
    return tuple(kept), len(tail)

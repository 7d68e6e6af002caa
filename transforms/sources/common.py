"""What every non-HTML source shares: the file it reads (`SourceFile`), heading
anchors, and the assembly of a `ParsedPage` (its content hash computed as the
HTML parser computes it, so that updates find unchanged documents alike)."""
from __future__ import annotations

import dataclasses
import re
from typing import Callable

import lxml.html
from lxml import etree

from ritrag.schema import Crumb, ParsedPage, Section
from ritrag.transforms.parse.page import page_content_hash


@dataclasses.dataclass(frozen=True)
class SourceFile:
    """One input file and where it sits: `url` (normalized) and `site` as the job
    locates it; `root` the input directory; `url_of` the URL the job gives any
    other input path (a nav file names documents by path)."""

    path: str
    data: bytes
    url: str
    site: str
    root: str = ""
    url_of: Callable[[str], str] | None = None


_NOT_SLUG = re.compile(r"[^\w\s-]")
_SPACES = re.compile(r"[-\s]+")


def heading_anchor(title: str, taken: set[str]) -> str:
    """The anchor static-site generators give a heading (Python-Markdown's toc:
    lowercase, punctuation dropped, spaces to hyphens, repeats suffixed _1, _2)."""
    slug = _SPACES.sub("-", _NOT_SLUG.sub("", title).strip().lower()) or "section"
    anchor, n = slug, 0
    while anchor in taken:
        n += 1
        anchor = f"{slug}_{n}"
    taken.add(anchor)
    return anchor


def document_page(file: SourceFile, *, url: str | None = None, title: str, trail: tuple[Crumb, ...],
                  trail_method: str, sections: tuple[Section, ...], description: str = "",
                  keywords: tuple[str, ...] = (), nav_order: tuple[str, ...] = ()) -> ParsedPage:
    """A document's ParsedPage, content-hashed; `url` for a record other than the file itself."""
    page = ParsedPage(url=url or file.url, canonical_url=url or file.url, site=file.site, title=title,
                      trail=trail, trail_method=trail_method, sections=sections, description=description,
                      keywords=keywords, nav_order=nav_order)
    return dataclasses.replace(page, content_hash=page_content_hash(page))


def section_path(open_titles: list[tuple[int, str]], level: int, title: str) -> tuple[str, ...]:
    """The heading path of a section at `level`, updating `open_titles` (the
    enclosing (level, title) pairs, outermost first) in place."""
    while open_titles and open_titles[-1][0] >= level:
        open_titles.pop()
    open_titles.append((level, title))
    return tuple(t for _, t in open_titles)


def html_text(html: str) -> str:
    """Rendered HTML as plain text: one paragraph per top-level block."""
    if not html.strip():
        return ""
    try:
        fragment = lxml.html.fragment_fromstring(html, create_parent="div")
    except (etree.ParserError, ValueError):
        return ""
    etree.strip_elements(fragment, etree.Comment, "script", "style", with_tail=False)
    blocks = [fragment.text or "", *(f"{child.text_content()}{child.tail or ''}" for child in fragment)]
    return "\n\n".join(" ".join(b.split()) for b in blocks if b.split())

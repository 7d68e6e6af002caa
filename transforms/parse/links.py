"""The links of a page's own text (`read_links`): its main region once boilerplate
is stripped (menus, breadcrumbs, footers, pagers, related bars and in-page tables
of contents are gone by then), less what is still navigation inside it:

* links inside a table of contents that lists other pages (a Sphinx toctree) and
  inside frame elements a marked-up main region keeps as text ("menu",
  "sidebar"): the forest already places those pages as the page's children;
* pager and parent links marked as such (`rel=next|prev|up`, `accesskey=n|p|u`);
* links to the page itself (any fragment: the page already holds its sections),
  to its trail's pages and the site's home pages (its ancestors: the tree says it),
  and to anything but http(s).

Each target is kept once, at its first link; its anchor text is the link's text,
or an image link's alt text. The scan stops at MAX_PAGE_LINKS kept links, so a
page of a million links costs one pass over its link elements.
"""
from __future__ import annotations

from typing import NamedTuple
from urllib.parse import unquote

from lxml import etree

from ritrag.schema import MAX_ANCHOR_CHARS, MAX_PAGE_LINKS, Crumb, Link
from ritrag.transforms.parse.location import Location
from ritrag.transforms.parse.survey import Survey

_PAGER_RELS = frozenset(("next", "prev", "previous", "up"))
_PAGER_ACCESS_KEYS = frozenset(("n", "p", "u"))
_WEB_PREFIXES = ("http://", "https://")


def _navigation_links(main: etree._Element, survey: Survey, marked_main: bool) -> set[etree._Element]:
    """The link elements left inside `main` that are navigation, not text."""
    containers = [toc for toc in survey.tocs if toc is not main]
    if marked_main:  # the frame a marked main region kept as its own text
        containers += [el for el, always in survey.boilerplate if not always]
    found: set[etree._Element] = set()
    for container in containers:
        # Stripped ones hang outside the tree now; the ancestor walk is short.
        if any(ancestor is main for ancestor in container.iterancestors()):
            found.update(container.iter("a"))
    return found


def _anchor_text(link: etree._Element) -> str:
    # Most anchors are a bare text: reading it costs less than walking the element.
    text = " ".join((link.text or "" if len(link) == 0 else "".join(link.itertext())).split())
    if not text:
        image = link.find(".//img")
        text = " ".join((image.get("alt") or "").split()) if image is not None else ""
    return text[:MAX_ANCHOR_CHARS]


def _is_pager(link: etree._Element) -> bool:
    rel = link.get("rel")
    key = link.get("accesskey")
    return bool((rel and _PAGER_RELS.intersection(rel.lower().split()))
                or (key and key.strip().lower() in _PAGER_ACCESS_KEYS))


class PageLinks(NamedTuple):
    links: tuple[Link, ...]
    past_cap: int  # link elements left unread past MAX_PAGE_LINKS
    navigation: int  # link elements of the main region left out as navigation (tocs, frames, pagers)


def read_links(main: etree._Element, marked_main: bool, survey: Survey, loc: Location,
               trail: tuple[Crumb, ...]) -> PageLinks:
    """The page's text links (module doc), how many link elements were left
    unread past MAX_PAGE_LINKS and how many were navigation. Call after
    boilerplate is stripped, before the tree is rewritten into text."""
    navigation = _navigation_links(main, survey, marked_main)
    placed = {*loc.self_urls, *loc.homes, *(crumb.url for crumb in trail)}
    kept: dict[tuple[str, str], Link] = {}
    # href -> the target it names, None when none is kept: pages repeat their hrefs.
    targets: dict[str, tuple[str, str] | None] = {}
    skipped_navigation = 0
    elements = main.iter("a")
    for link in elements:
        if len(kept) == MAX_PAGE_LINKS:
            return PageLinks(tuple(kept.values()), 1 + sum(1 for _ in elements), skipped_navigation)
        href = link.get("href")
        if href is None:
            continue
        if link in navigation or _is_pager(link):
            skipped_navigation += 1
            continue
        if href not in targets:
            page_href, _, fragment = href.strip().partition("#")
            url = loc.resolve(page_href)
            targets[href] = (None if url is None or url in placed or not url.startswith(_WEB_PREFIXES)
                             else (url, unquote(fragment) if "%" in fragment else fragment))
        target = targets[href]
        if target is None or target in kept:
            continue
        kept[target] = Link(*target, _anchor_text(link), len(kept))
    return PageLinks(tuple(kept.values()), 0, skipped_navigation)

"""Where a page sits (its breadcrumb trail, root first, without the site root and the
page itself) comes from the first rule of this cascade that names something other
than the page itself:

1. ``jsonld``       a schema.org BreadcrumbList in JSON-LD, also inside ``@graph`` or
                    as a ``WebPage.breadcrumb``;
2. ``microdata``    a BreadcrumbList in microdata (``itemtype`` / ``itemprop``);
3. ``rdfa``         a BreadcrumbList in RDFa (``typeof`` / ``property``);
4. ``breadcrumb``   the trail a reader sees: ``nav[aria-label*=breadcrumb]``, any
                    element whose class or id says breadcrumb (Bootstrap, Read the
                    Docs, pydata, Docusaurus), or a "path"/"trail" element (MkDocs
                    Material, hand-written sites) that is a short chain of links;
5. ``title_context`` labelled lines right above the page's ``<h1>``, each a short
                    label and one link ("Module java.base", "Package java.lang":
                    the header of API references);
6. ``related_bar``  the top bar of Sphinx's classic themes ("Docs » Library »");
7. ``toc_current``  the chain of ``li.current`` entries of a navigation tree, which
                    most documentation themes highlight in their sidebar;
8. ``up_link``      a parent-only signal: ``a[accesskey=u]`` (DocBook's navheader,
                    Sphinx), ``a[rel=up]``, ``<link rel=up>``. The trail is just the
                    parent; the forest step chains parents across pages;
9. ``nav_bar``      a hierarchical navigation bar: in a list inside ``<nav>`` or
                    ``role=navigation``, the links before the item marked as the page
                    (``aria-current``, an "active"/"current" class, or the one unlinked
                    item styled apart), when every one of them leads into a directory
                    that holds the page, outermost first, over at least two levels
                    (API references' "Overview / Module / Package / Class" bar);
10. ``url``         every directory between the site root and the page.

Structured data comes first because it is written for machines and states the
hierarchy outright; the visible trail next because it is what a reader is shown;
theme conventions, parent-only signals and the URL last because they are partial
or merely implied. A rule whose crumbs name nothing in the site once the page,
the site root and anything outside the site are dropped (a mirror's absolute
links to the original host, a "Home > Page" trail) is passed over and the next
rule tried; the page records the rules it passed over. When no later rule places
the page, the first rule that named the site root is credited (the page sits under
the root), before the URL's directories; markup that named only places outside the
site leaves the page to the URL.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from html import unescape
from typing import Iterator, NamedTuple
from urllib.parse import unquote, urlsplit

from lxml import etree

from ritrag.schema import Crumb
from ritrag.transforms.parse.head import Head
from ritrag.transforms.parse.location import Location, url_segment_title
from ritrag.transforms.parse.survey import CURRENT, Survey, class_kinds
from ritrag.transforms.parse.text import collapse, text_of
from ritrag.urls import origin_of

_string_value = etree.XPath("string()", smart_strings=False)
_CRUMB_EDGE_CHARS = " »›>/|→«‹<·•:\\"
_CRUMB_SEPARATOR = re.compile(r"\s*[»›→]\s*|\s+[>|/\\·•]\s+")


def _class_tokens(el: etree._Element) -> list[str]:
    return (el.get("class") or "").lower().split()


def _local_name(term: str) -> str:
    """"https://schema.org/BreadcrumbList", "schema:name" -> "BreadcrumbList", "name"."""
    return re.split(r"[/:#]", term)[-1]

class _RawCrumb(NamedTuple):
    title: str
    url: str | None
    current: bool = False  # marked as the page being shown (aria-current, .active)


def _clean_crumb_title(title: str) -> str:
    return collapse(title).strip(_CRUMB_EDGE_CHARS)


def _is_current(el: etree._Element | None) -> bool:
    if el is None:
        return False
    aria = el.get("aria-current")
    if aria is not None and aria.lower() != "false":
        return True
    return not {"active", "current"}.isdisjoint(_class_tokens(el))


def _crumb(item: etree._Element, link: etree._Element | None, loc: Location) -> _RawCrumb:
    """The crumb an item shows: its visible text, or what an icon-only link says
    for itself (an unlinked image is decoration, not a place)."""
    title = _clean_crumb_title(_string_value(item))
    if not title and link is not None:
        img = link.find(".//img[@alt]")
        label = link.get("aria-label") or link.get("title") or (img.get("alt") if img is not None else "")
        title = _clean_crumb_title(label or "")
    href = link.get("href") if link is not None else None
    return _RawCrumb(title, loc.resolve(href), _is_current(item) or _is_current(link))


def _finish_trail(raw: list[_RawCrumb], loc: Location) -> tuple[Crumb, ...] | None:
    """The trail as stored, or None when the markup named nothing but the page.

    Drops the entry marked current and what follows it, the page itself at the end
    (an unlinked last entry is the page, by convention, unless the page was found
    already), then leading entries up to the last one that is the site root, a home
    page or outside the site.
    """
    crumbs: list[_RawCrumb] = []
    found_self = False
    for crumb in raw:
        if crumb.current:
            found_self = True
            break
        if crumb.title:
            crumbs.append(crumb)
    while crumbs and crumbs[-1].url in loc.self_urls:
        crumbs.pop()
        found_self = True
    if crumbs and crumbs[-1].url is None and not found_self:
        crumbs.pop()
    crumbs = [c for c in crumbs if c.url not in loc.self_urls]
    if not crumbs:
        return None
    start = 0
    for index, crumb in enumerate(crumbs):
        if crumb.url is None:
            continue
        if crumb.url not in loc.homes and loc.inside_site(crumb.url):
            break
        start = index + 1
    trail: list[Crumb] = []
    seen_urls: set[str] = set()
    for crumb in crumbs[start:]:
        if crumb.url in seen_urls or (trail and trail[-1] == Crumb(crumb.title, crumb.url)):
            continue
        if crumb.url is not None:
            seen_urls.add(crumb.url)
        trail.append(Crumb(crumb.title, crumb.url))
    return tuple(trail)


def _split_crumbs(text: str | None) -> list[_RawCrumb]:
    """Unlinked crumbs of a separator-delimited text ("Docs > Guides"), without
    labels ("You are here:")."""
    parts = (part.strip() for part in _CRUMB_SEPARATOR.split(text or ""))
    titles = (_clean_crumb_title(part) for part in parts if not part.endswith(":"))
    return [_RawCrumb(title, None) for title in titles if title]


# -- 1. JSON-LD

def schema_types(node: dict) -> set[str]:
    types = node.get("@type")
    return {_local_name(t) for t in (types if isinstance(types, list) else [types]) if isinstance(t, str)}


def find_breadcrumbs(node: object) -> dict | str | None:
    """The first BreadcrumbList (or textual ``breadcrumb``) anywhere in a JSON-LD
    document: top level, a list, ``@graph``, ``WebPage.breadcrumb``, any nesting."""
    if isinstance(node, list):
        for item in node:
            found = find_breadcrumbs(item)
            if found is not None:
                return found
    elif isinstance(node, dict):
        if "BreadcrumbList" in schema_types(node):
            return node
        if isinstance(node.get("breadcrumb"), str):
            return node["breadcrumb"]
        for value in node.values():
            found = find_breadcrumbs(value)
            if found is not None:
                return found
    return None


def item_position(value: object) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("inf")  # unnumbered items keep their order, after numbered ones


def _jsonld_crumbs(breadcrumbs: dict | str, loc: Location) -> list[_RawCrumb]:
    if isinstance(breadcrumbs, str):
        return _split_crumbs(unescape(breadcrumbs))
    items = breadcrumbs.get("itemListElement") or []
    items = [i for i in (items if isinstance(items, list) else [items]) if isinstance(i, dict)]
    crumbs = []
    for item in sorted(items, key=lambda i: item_position(i.get("position"))):
        target, name = item.get("item"), item.get("name")
        if isinstance(target, dict):
            name = name or target.get("name")
            target = target.get("@id") or target.get("url")
        href = target if isinstance(target, str) else None
        crumbs.append(_RawCrumb(_clean_crumb_title(unescape(str(name or ""))), loc.resolve(href)))
    return crumbs


def _jsonld_trail(head: Head, loc: Location) -> list[_RawCrumb]:
    for script in head.jsonld:
        try:
            document = json.loads(script.strip().removeprefix("<!--").removesuffix("-->"))
            found = find_breadcrumbs(document)
        except (ValueError, RecursionError):
            continue  # malformed JSON-LD is common; the next rules may still work
        if found is not None:
            return _jsonld_crumbs(found, loc)
    return []


# -- 2. and 3. microdata and RDFa: one vocabulary under two sets of attribute names

_URL_ATTRIBUTES = ("href", "itemid", "resource", "src", "content")


def _with_property(scope: etree._Element, attr: str, name: str) -> Iterator[etree._Element]:
    return (el for el in scope.iter() if name in map(_local_name, (el.get(attr) or "").split()))


def _structured_trail(root: etree._Element, loc: Location,
                      type_attr: str, property_attr: str) -> list[_RawCrumb]:
    for crumb_list in root.iterfind(f".//*[@{type_attr}]"):
        if "BreadcrumbList" not in map(_local_name, crumb_list.get(type_attr).split()):
            continue
        positioned = []
        for order, item in enumerate(_with_property(crumb_list, property_attr, "itemListElement")):
            name_el = next(_with_property(item, property_attr, "name"), None)
            target = next(_with_property(item, property_attr, "item"), None)
            position = next(_with_property(item, property_attr, "position"), None)
            name = "" if name_el is None else name_el.get("content") or _string_value(name_el)
            href = None if target is None else next(filter(None, map(target.get, _URL_ATTRIBUTES)), None)
            rank = float("inf") if position is None else item_position(
                position.get("content") or _string_value(position))
            positioned.append((rank, order, _RawCrumb(_clean_crumb_title(name), loc.resolve(href))))
        if positioned:
            return [crumb for _, _, crumb in sorted(positioned)]
    return []


# -- 4. visible breadcrumbs

_NOT_IN_A_TRAIL = ("p", "table", "pre", "h1", "h2", "h3", "h4", "h5", "h6", "form", "dl")
_MAX_CRUMB_CHARS = 80
# Items a trail container holds beside the trail: Sphinx's right-floated
# index/next/previous links, Read the Docs' "View page source" aside.
_ASIDE_ITEM = re.compile(r"(?:^|[-_])(?:aside|right|float-right|pull-right)$")


def _top_level_items(container: etree._Element) -> list[etree._Element]:
    items = []
    for li in container.iter("li"):
        parent = li.getparent()
        while parent is not container and parent.tag != "li":
            parent = parent.getparent()
        if parent is container and not any(_ASIDE_ITEM.search(t) for t in _class_tokens(li)):
            items.append(li)
    return items


def _inline_crumbs(container: etree._Element, loc: Location) -> list[_RawCrumb]:
    """Crumbs of a trail written as links and separators, without a list."""
    crumbs = _split_crumbs(container.text)
    for child in container:
        link = child if child.tag == "a" and child.get("href") is not None else child.find(".//a[@href]")
        if link is not None:
            crumbs.append(_crumb(child, link, loc))
        else:
            crumbs.extend(c._replace(current=_is_current(child)) for c in _split_crumbs(_string_value(child)))
        crumbs.extend(_split_crumbs(child.tail))
    return crumbs


def _container_crumbs(container: etree._Element, loc: Location) -> list[_RawCrumb]:
    items = _top_level_items(container)
    if not items:
        return _inline_crumbs(container, loc)
    return [_crumb(li, li.find(".//a[@href]"), loc) for li in items]


def _looks_like_trail(crumbs: list[_RawCrumb]) -> bool:
    return (len(crumbs) >= 2 and any(c.url for c in crumbs)
            and all(len(c.title) <= _MAX_CRUMB_CHARS for c in crumbs))


def _breadcrumb_trail(survey: Survey, loc: Location) -> list[_RawCrumb]:
    for container, declared in survey.breadcrumbs:
        if not declared and next(container.iter(*_NOT_IN_A_TRAIL), None) is not None:
            continue  # a "path" section of the text, not a trail; skip reading it
        crumbs = _container_crumbs(container, loc)
        if crumbs and (declared or _looks_like_trail(crumbs)):
            return crumbs
    return []


# -- 5. labelled context lines above the title

_MAX_LABEL_WORDS = 3
_LINE_TAGS = ("div", "p", "span", "small")


def _labelled_link(line: etree._Element, loc: Location) -> _RawCrumb | None:
    """The crumb of a line reading "Label <a>Name</a>" ("Module java.base",
    "Category: Guides"): a short label, then one link. Anything else is None."""
    if line.tag not in _LINE_TAGS:
        return None
    links = line.findall(".//a[@href]")
    if len(links) != 1:
        return None
    text, name = text_of(line), _clean_crumb_title(_string_value(links[0]))
    label = text[: len(text) - len(name)].rstrip(" :") if name and text.endswith(name) else ""
    if not label or len(text) > _MAX_CRUMB_CHARS or len(label.split()) > _MAX_LABEL_WORDS:
        return None
    if not any(ch.isalpha() for ch in label):
        return None  # "« <a>Previous</a>": a pager, not a place
    return _RawCrumb(name, loc.resolve(links[0].get("href")))


def _title_context_trail(root: etree._Element, loc: Location) -> list[_RawCrumb]:
    """The labelled lines right above the page's first <h1>, outermost first:
    API references name the module and package a page belongs to this way."""
    h1 = next(root.iter("h1"), None)
    if h1 is None:
        return []
    crumbs = []
    for line in h1.itersiblings(preceding=True):
        crumb = _labelled_link(line, loc)
        if crumb is None:
            break
        crumbs.append(crumb)
    return crumbs[::-1]


# -- 6. and 7. documentation themes

def _related_bar_trail(survey: Survey, loc: Location) -> list[_RawCrumb]:
    if not survey.related_bars:
        return []
    items = _top_level_items(survey.related_bars[0])
    # Sphinx chains its entries with "»"; a "related" box of links elsewhere on
    # the web (related articles) does not.
    if not any(_string_value(li).rstrip().endswith(_CHAIN_ENDINGS) for li in items):
        return []
    return [_crumb(li, li.find(".//a[@href]"), loc) for li in items]


_CHAIN_ENDINGS = ("»", "›", ">", "→")


def _toc_current_trail(root: etree._Element, loc: Location) -> list[_RawCrumb]:
    # Document order is outermost first; a theme that shows the chain twice (a
    # top bar and a sidebar, a mobile and a desktop menu) repeats URLs, which the
    # trail keeps once.
    crumbs = []
    for li in root.iter("li"):
        if not class_kinds(li.get("class") or "") & CURRENT:
            continue
        link = li.find("a")
        if link is None:
            link = li.find("*/a")  # <li><p><a>, <li><span><a>
        if link is not None and link.get("href") is not None:
            crumbs.append(_crumb(link, link, loc)._replace(current=False))
    return crumbs


# -- 8. parent-only signals

_UP_LINK_HINTS = (b"accesskey", b'rel="up')


def _up_anchor_trail(root: etree._Element, loc: Location) -> list[_RawCrumb]:
    for link in root.iter("a"):
        key, rel = (link.get("accesskey") or "").lower(), (link.get("rel") or "").lower().split()
        if link.get("href") is not None and (key == "u" or "up" in rel):
            # The visible text is often just "Up"; the title attribute names the parent.
            title = _clean_crumb_title(link.get("title") or "") or _crumb(link, link, loc).title
            return [_RawCrumb(title, loc.resolve(link.get("href")))]
    return []


def _link_rel_up_trail(head: Head, loc: Location) -> list[_RawCrumb]:
    if head.up is None:
        return []
    title, href = head.up
    return [_RawCrumb(_clean_crumb_title(title) or url_segment_title(href), loc.resolve(href))]


# -- 9. a hierarchical navigation bar

def _marked_item(items: list[etree._Element]) -> int | None:
    """The index of the item a navigation list marks as the page shown: one marked
    current, else the one unlinked item with a class no other item has (the
    highlighted cell of a bar whose other unlinked items are disabled entries)."""
    for index, li in enumerate(items):
        if _is_current(li) or _is_current(li.find(".//a[@href]")):
            return index
    classes = Counter(li.get("class") for li in items)
    styled = [index for index, li in enumerate(items)
              if li.get("class") and classes[li.get("class")] == 1 and li.find(".//a[@href]") is None]
    return styled[0] if len(styled) == 1 else None


def _holding_level(url: str | None, loc: Location) -> int | None:
    """How deep the directory of a link's target is, if that directory holds the
    page (it is the page's own directory or one above it); else None. A
    directory's index page, normalized to the directory's URL, is the directory."""
    if url is None:
        return None
    if origin_of(url) != origin_of(loc.directory):
        return None
    here = urlsplit(loc.directory).path
    path = urlsplit(url).path.rstrip("/")
    if not here.startswith(path + "/"):
        path = path[: path.rfind("/")]
        if not here.startswith(path + "/"):
            return None
    return path.count("/")


def _nav_bar_trail(survey: Survey, loc: Location) -> list[_RawCrumb]:
    """The links before the marked item of a navigation list, if each leads into a
    directory holding the page, outermost first, and they span two levels or more.
    A site menu fails this: its sections are siblings in one directory or lie
    beside the page's directory, not above it."""
    for nav in survey.navigation:
        for listing in nav.iter("ul", "ol"):
            items = _top_level_items(listing)
            marked = _marked_item(items)
            if not marked:
                continue
            crumbs, levels = [], []
            for li in items[:marked]:
                link = li.find(".//a[@href]")
                if link is None:
                    continue  # a disabled entry names no place
                crumb = _crumb(li, link, loc)
                level = _holding_level(crumb.url, loc)
                if level is None or (levels and level < levels[-1]):
                    break
                crumbs.append(crumb)
                levels.append(level)
            else:
                if len(set(levels)) >= 2:
                    return crumbs
    return []


# -- 10. the URL

def directory_trail(site_url: str, page_url: str) -> tuple[Crumb, ...]:
    """One crumb per directory between the site and the page, titled by its name
    (also how documents that name no trail of their own are placed: transforms/sources)."""
    origin, site_path, page_path = origin_of(site_url), urlsplit(site_url).path.rstrip("/"), urlsplit(page_url).path
    if origin != origin_of(page_url) or not page_path.startswith(site_path + "/"):
        return ()
    directories = page_path[len(site_path) + 1:].split("/")[:-1]
    return tuple(Crumb(unquote(name), origin + "/".join([site_path, *directories[:depth + 1]]))
                 for depth, name in enumerate(directories))


class _Trail(NamedTuple):
    crumbs: tuple[Crumb, ...]
    method: str
    passed_over: tuple[str, ...]  # rules with markup that named nothing in the site


def find_trail(root: etree._Element, survey: Survey, head: Head, loc: Location,
                source: bytes) -> _Trail:
    """The first trail of the cascade (module doc). Rules that must scan elements
    the survey skips run only if the page's bytes hold the word they look for: a
    byte search runs at GB/s, a Python loop at a microsecond per element."""
    structured = b"BreadcrumbList" in source
    rules = (
        ("jsonld", lambda: _jsonld_trail(head, loc)),
        ("microdata", lambda: structured and _structured_trail(root, loc, "itemtype", "itemprop")),
        ("rdfa", lambda: structured and _structured_trail(root, loc, "typeof", "property")),
        ("breadcrumb", lambda: _breadcrumb_trail(survey, loc)),
        ("title_context", lambda: _title_context_trail(root, loc)),
        ("related_bar", lambda: _related_bar_trail(survey, loc)),
        ("toc_current", lambda: b"current" in source and _toc_current_trail(root, loc)),
        ("up_link", lambda: any(hint in source for hint in _UP_LINK_HINTS) and _up_anchor_trail(root, loc)),
        ("up_link", lambda: _link_rel_up_trail(head, loc)),
        ("nav_bar", lambda: _nav_bar_trail(survey, loc)),
    )
    passed_over: list[str] = []
    names_root = None  # the first rule that named the site root (or a home page) and nothing else
    for method, rule in rules:
        raw = rule()
        if not raw:
            continue
        trail = _finish_trail(raw, loc)
        if trail:
            return _Trail(trail, method, tuple(passed_over))
        passed_over.append(method)
        if trail is not None and names_root is None and any(c.url in loc.homes for c in raw):
            names_root = method
    if names_root is not None:
        # No later rule placed the page: the markup that put it under the root
        # outweighs the directories of its URL, which are only a guess.
        return _Trail((), names_root, tuple(m for m in passed_over if m != names_root))
    return _Trail(directory_trail(loc.site, loc.url), "url", tuple(passed_over))

"""One HTML page -> `ParsedPage`: where it sits in its site, its title, its main text
split by headings.

Pure functions over lxml; no Beam. A page is decoded once and parsed once. One
pass over its container elements finds what matters (trail markup, main region,
boilerplate); the page is read for its location, its main region pruned of
boilerplate, and flattened to text by libxml2 (XPath normalize-space) with
private-use marker characters standing in for block boundaries, headings and
preformatted blocks. Python touches containers, blocks and headings, never the
inline elements that make up most of a page: speed is a requirement (at least
40% of a bare `lxml.html.fromstring(data).text_content()`).

Where a page sits (its breadcrumb trail, root first, without the site root and the
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

import codecs
import dataclasses
import json
import re
import threading
from collections import Counter
from functools import lru_cache
from itertools import islice
from html import unescape
from typing import Iterable, Iterator, NamedTuple
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from bs4.dammit import EncodingDetector, UnicodeDammit
from lxml import etree

from ritrag.ids import content_hash, normalize_url
from ritrag.schema import Crumb, ParsedPage, Section

DEFAULT_MAX_BYTES = 20 * 1024 * 1024


class UnparseablePage(Exception):
    """The input is not an HTML page that can be indexed; `reason` is a short code
    ("empty", "binary", "too_large", "undecodable", "no_content") for dead letters."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


# ------------------------------------------------------------------------- decoding

_BINARY_SIGNATURES = (b"%PDF-", b"\x1f\x8b", b"PK\x03\x04", b"\x89PNG", b"\xff\xd8\xff", b"GIF8")
# C0 controls other than tab and line breaks: neither text nor XML has them (and
# in UTF-8 these bytes are never part of a longer character).
_CONTROL_BYTES = bytes([*range(0x00, 0x09), 0x0b, 0x0c, *range(0x0e, 0x20)])
_NOT_CONTROL_BYTES = bytes(b for b in range(256) if b not in _CONTROL_BYTES)
_MAX_CONTROL_RATIO = 0.05  # text has next to none; compressed or binary data ~10%
_SNIFF_BYTES = 8192
# Browsers read these labels as windows-1252 (WHATWG Encoding), and so do pages.
_WINDOWS_1252_ALIASES = {"ascii", "latin-1", "iso8859-1"}


def _declared_codec(data: bytes) -> str | None:
    """The codec the page declares (XML declaration, <meta charset>, <meta
    http-equiv=Content-Type>), found by bs4's EncodingDetector; None when it
    declares none or an unknown one."""
    # Searched in the first 8 KiB, however long the page (bs4's own window is 5%).
    declared = EncodingDetector.find_declared_encoding(data[:_SNIFF_BYTES], is_html=True,
                                                       search_entire_document=True)
    if not declared:
        return None
    try:
        name = codecs.lookup(declared).name
    except LookupError:
        return None
    return "cp1252" if name in _WINDOWS_1252_ALIASES else name


def _decode(data: bytes, declared: str | None) -> tuple[str, str]:
    """The text and the codec that decoded it. A declaration is believed only if
    the bytes decode under it: pages declared UTF-8 but saved as windows-1252 are
    common, and so are UTF-8 pages with windows-1252 smart quotes pasted in
    (bs4's `UnicodeDammit.detwingle` converts those, a byte loop run only here)."""
    for codec in dict.fromkeys((declared or "utf-8", "utf-8")):
        try:
            return data.decode(codec), codec
        except UnicodeDecodeError:
            pass
    if declared in (None, "utf-8"):
        try:
            return UnicodeDammit.detwingle(data).decode("utf-8"), "utf-8+windows-1252"
        except UnicodeDecodeError:
            pass
    # A declared legacy codec with a few bad bytes is still the best guess; bytes
    # that are not UTF-8 and declare nothing else are windows-1252.
    fallback = declared if declared not in (None, "utf-8") else "cp1252"
    text = data.decode(fallback, errors="replace")
    if text.count("\ufffd") > 0.01 * len(text):
        raise UnparseablePage("undecodable", f"not {fallback}")
    return text, fallback


def _utf8_html(data: bytes, max_bytes: int) -> bytes:
    """The page as UTF-8 bytes for lxml: the input itself when it is UTF-8 already,
    so that the common case copies nothing. Trust goes to a byte-order mark, then
    the declared charset, then UTF-8, then windows-1252 (bs4's EncodingDetector
    reads the mark and the declaration)."""
    if len(data) > max_bytes:
        raise UnparseablePage("too_large", f"{len(data)} bytes > {max_bytes}")
    if not data or data.isspace():
        raise UnparseablePage("empty")
    unmarked, marked_codec = EncodingDetector.strip_byte_order_mark(data)
    if marked_codec:
        return unmarked.decode(marked_codec, errors="replace").encode("utf-8")
    sniff = data[:_SNIFF_BYTES]
    if sniff.startswith(_BINARY_SIGNATURES) or (
        len(sniff.translate(None, _NOT_CONTROL_BYTES)) > _MAX_CONTROL_RATIO * len(sniff)
    ):
        raise UnparseablePage("binary", "control bytes or a binary file signature")
    has_nul = b"\x00" in data  # a stray NUL would end libxml2's text early
    if data.isascii() and not has_nul:
        return data  # valid UTF-8, and the same text in any ASCII-based charset it declares
    text, codec = _decode(data, _declared_codec(data))
    if codec == "utf-8" and not has_nul:
        return data
    return text.replace("\x00", "").encode("utf-8")


_thread_state = threading.local()  # an lxml parser must not be shared between threads


def _parser() -> etree.HTMLParser:
    parser = getattr(_thread_state, "parser", None)
    if parser is None:
        parser = etree.HTMLParser(encoding="utf-8", remove_comments=True, remove_pis=True,
                                  no_network=True, huge_tree=True, collect_ids=False)
        _thread_state.parser = parser
    return parser


# ------------------------------------------------------------------------- small helpers

_string_value = etree.XPath("string()", smart_strings=False)
# In C: collapses runs of ASCII whitespace, which is what an HTML text's source
# line breaks and indentation are.
_normalized_string = etree.XPath("normalize-space()", smart_strings=False)
_SPACES = re.compile(r"[\s\u00a0\u2000-\u200a\u202f\u205f\u3000]+")
# Unicode spaces other than the no-break space, which is by far the most common
# (&nbsp;) and is replaced with str.replace: a regex scan of a page's text costs
# several times more.
_RARE_UNICODE_SPACES = re.compile("[\u0085\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")
_CRUMB_EDGE_CHARS = " »›>/|→«‹<·•:\\"
_CRUMB_SEPARATOR = re.compile(r"\s*[»›→]\s*|\s+[>|/\\·•]\s+")


def _collapse_unicode_spaces(text: str) -> str:
    """Text whose ASCII whitespace normalize-space collapsed, with its Unicode
    spaces collapsed too."""
    text = _RARE_UNICODE_SPACES.sub(" ", text.replace("\xa0", " "))
    while "  " in text:
        text = text.replace("  ", " ")
    return text


def _collapse(text: str) -> str:
    return _SPACES.sub(" ", text).strip()


def _text_of(el: etree._Element) -> str:
    text = _normalized_string(el)
    return text if text.isascii() else _collapse(text)  # no-break and other Unicode spaces


def _class_tokens(el: etree._Element) -> list[str]:
    return (el.get("class") or "").lower().split()


def _local_name(term: str) -> str:
    """"https://schema.org/BreadcrumbList", "schema:name" -> "BreadcrumbList", "name"."""
    return re.split(r"[/:#]", term)[-1]


def _url_segment_title(url: str) -> str:
    segments = [s for s in urlsplit(url).path.split("/") if s]
    if not segments:
        return urlsplit(url).hostname or url
    return re.sub(r"\.(?:html?|php|aspx?)$", "", unquote(segments[-1]), flags=re.IGNORECASE)


def _is_inside(el: etree._Element, container: etree._Element) -> bool:
    return any(ancestor is container for ancestor in el.iterancestors())


# ------------------------------------------------------------------------- one pass over the tree

# What an element can be, by its tag, class, id or role; one bit each.
(_CRUMBS, _PATH, _RELATED, _CURRENT, _TOC, _CONTAINER, _WRAPPER, _BOILERPLATE, _CHROME,
 _SECTION, _MAIN, _ROLE_MAIN, _ARTICLE, _NAV, _HEAD, _NAVIGATION) = (1 << bit for bit in range(16))

_CONTAINER_IDS = frozenset(("main-content", "maincontent", "content", "page-content", "main", "primary"))
_CLASS_WORDS = {"related": _RELATED, "current": _CURRENT, "toc": _TOC, "toctree-wrapper": _TOC,
                "body": _CONTAINER, "document": _WRAPPER}
# A <div> that is a section of the document: docutils' "section", DocBook's
# "sect1", "refsect2", "section".
_SECTION_CLASS = re.compile(r"^(?:ref)?sect(?:ion|\d+)?$")

_BREADCRUMB_WORDS = ("breadcrumb", "breadcrumbs", "crumbs")
# "path" and "trail" name many things; such an element only counts as a trail
# when it is a short chain of links.
_PATH_WORDS = ("path", "trail", "navpath")
# Boilerplate, always dropped:
_BOILERPLATE_WORDS = (
    *_BREADCRUMB_WORDS, "navheader", "navfooter", "sphinxsidebar", "related", "skip-link",
    "skip-links", "skiplink", "skip-nav", "skip-to-content", "prev-next", "prevnext", "pager",
    "pagination",
)
# Cookie and consent banners go by many compound names ("cookieConsent",
# "gdpr-cookie-notice", "cookie-law-info-bar"), in classes and ids alike.
_CONSENT_NAME = re.compile(r"consent|cookie-?(?:banner|bar|notice|dialog|popup|law)")
# Dropped only around content that is not marked up as main, where they are the
# page's frame; inside an <article> a "header" holds the article's own title.
_CHROME_WORDS = ("header", "footer", "hd", "ft", "masthead", "sidebar", "menu", "navbar",
                 "nav", "topbar")


class _NamePatterns(NamedTuple):
    breadcrumb: re.Pattern[str]
    path: re.Pattern[str]
    boilerplate: re.Pattern[str]
    chrome: re.Pattern[str]


def _alternatives(words: Iterable[str]) -> str:
    return "|".join(sorted(map(re.escape, words), key=len, reverse=True))


def _class_pattern(words: Iterable[str]) -> re.Pattern[str]:
    # A class token holding the word between [-_] boundaries ("wy-breadcrumbs",
    # "md-path__list"), so that "menuselection" or "guimenu" in running text survive.
    return re.compile(rf"(?:^|[-_])(?:{_alternatives(words)})(?:[-_]|$)")


def _id_pattern(words: Iterable[str]) -> re.Pattern[str]:
    # An id must be the word itself, give or take a common prefix or suffix: ids
    # are often slugs of the text ("topics-pagination", "related-calls").
    return re.compile(rf"^(?:(?:site|page|main|top|bottom|global|left|right)[-_])?"
                      rf"(?:{_alternatives(words)})(?:[-_](?:wrapper|container|inner|area|links|box))?$")


_CLASS_NAMES = _NamePatterns(re.compile("breadcrumb|crumbs"), *map(
    _class_pattern, (_PATH_WORDS, _BOILERPLATE_WORDS, _CHROME_WORDS)))
_ID_NAMES = _NamePatterns(*map(
    _id_pattern, (_BREADCRUMB_WORDS, _PATH_WORDS, _BOILERPLATE_WORDS, _CHROME_WORDS)))
_ROLE_KINDS = {
    **dict.fromkeys(("search", "menu", "menubar", "toolbar"), _BOILERPLATE),
    "navigation": _BOILERPLATE | _NAVIGATION,
    **dict.fromkeys(("banner", "contentinfo", "complementary"), _CHROME),
    "main": _ROLE_MAIN,
    "doc-toc": _TOC,
}
_HEAD_TAGS = ("title", "base", "link", "meta", "script")
_TAG_KINDS = {"main": _MAIN, "article": _ARTICLE, "nav": _NAV, "section": _SECTION,
              **dict.fromkeys(_HEAD_TAGS, _HEAD)}
# The containers that can hold a trail, boilerplate or the main content, and the
# head's elements. Paragraphs, cells, list items, links and phrase tags (the bulk
# of a page) are left out: a Python loop costs about as much per element as
# parsing it does.
_SURVEYED_TAGS = ("div", "ul", "ol", "section", "nav", "header", "footer", "aside", "main",
                  "article", "form", *_TAG_KINDS)


def _name_kinds(name: str, patterns: _NamePatterns) -> int:
    kinds = _CRUMBS if patterns.breadcrumb.search(name) else 0
    if patterns.path.search(name):
        kinds |= _PATH
    if patterns.boilerplate.search(name) or _CONSENT_NAME.search(name):
        return kinds | _BOILERPLATE
    return kinds | (_CHROME if patterns.chrome.search(name) else 0)


@lru_cache(maxsize=1 << 16)
def _class_kinds(value: str) -> int:
    kinds = 0
    for token in value.lower().split():
        kinds |= _name_kinds(token, _CLASS_NAMES) | _CLASS_WORDS.get(token, 0)
        if _SECTION_CLASS.match(token):
            kinds |= _SECTION
    return kinds


@lru_cache(maxsize=1 << 16)
def _id_kinds(value: str) -> int:
    value = value.strip().lower()
    return _name_kinds(value, _ID_NAMES) | (_CONTAINER if value in _CONTAINER_IDS else 0)


@dataclasses.dataclass
class _Survey:
    """The elements that matter, found in one pass over the tree, in document order.

    libxml2's XPath predicates cost about as much per element as a Python loop
    does, so one loop over the container tags replaces a dozen XPath scans.
    """

    head: list[etree._Element] = dataclasses.field(default_factory=list)
    breadcrumbs: list[tuple[etree._Element, bool]] = dataclasses.field(default_factory=list)
    related_bars: list[etree._Element] = dataclasses.field(default_factory=list)
    mains: list[tuple[int, etree._Element]] = dataclasses.field(default_factory=list)
    containers: list[tuple[int, etree._Element]] = dataclasses.field(default_factory=list)
    boilerplate: list[tuple[etree._Element, bool]] = dataclasses.field(default_factory=list)
    tocs: list[etree._Element] = dataclasses.field(default_factory=list)
    navigation: list[etree._Element] = dataclasses.field(default_factory=list)  # <nav>, role=navigation

    def add(self, el: etree._Element, kinds: int) -> None:
        if kinds & _HEAD:
            self.head.append(el)
        if kinds & _NAV and "breadcrumb" in (el.get("aria-label") or "").lower():
            kinds |= _CRUMBS
        if kinds & (_CRUMBS | _PATH):
            self.breadcrumbs.append((el, bool(kinds & _CRUMBS)))
        if kinds & _RELATED and el.tag == "div":
            self.related_bars.append(el)
        for rank, kind in enumerate((_MAIN, _ROLE_MAIN, _ARTICLE)):
            if kinds & kind:
                self.mains.append((rank, el))
                break
        if kinds & (_CONTAINER | _WRAPPER):
            self.containers.append((0 if kinds & _CONTAINER else 1, el))
        if kinds & (_BOILERPLATE | _CHROME):
            self.boilerplate.append((el, bool(kinds & _BOILERPLATE)))
        if kinds & _TOC:
            self.tocs.append(el)
        if kinds & (_NAV | _NAVIGATION):
            self.navigation.append(el)


def _survey(root: etree._Element) -> _Survey:
    survey = _Survey()
    for el in root.iter(*_SURVEYED_TAGS):
        kinds = _TAG_KINDS.get(el.tag, 0)
        value = el.get("class")
        if value is not None:
            kinds |= _class_kinds(value)
        value = el.get("id")
        # A section's id is a slug of its heading ("s-pagination", "related-calls"):
        # it says what the text is about, not what the element is.
        if value is not None and not kinds & _SECTION:
            kinds |= _id_kinds(value)
        value = el.get("role")
        if value is not None:
            kinds |= _ROLE_KINDS.get(value.strip().lower(), 0)
        if kinds:
            survey.add(el, kinds)
    return survey


# ------------------------------------------------------------------------- the page's head

class _Head(NamedTuple):
    """What <head> (and <html>) say about the page."""

    title: str
    base_href: str | None
    canonical: str | None
    up: tuple[str, str] | None  # (title, href) of <link rel=up>
    homes: tuple[str, ...]  # hrefs of <link rel=home|start>
    description: str
    og_title: str
    og_url: str | None
    keywords: tuple[str, ...]
    language: str
    jsonld: tuple[str, ...]


_JSON_LD = "application/ld+json"


def _read_head(root: etree._Element, elements: list[etree._Element]) -> _Head:
    title = base_href = canonical = up = None
    homes: list[str] = []
    meta: dict[str, str] = {}
    keywords: list[str] = []
    jsonld: list[str] = []
    for el in elements:
        if el.tag == "title":
            title = title or _text_of(el)
        elif el.tag == "base":
            base_href = base_href or el.get("href")
        elif el.tag == "link" and el.get("href") is not None:
            rel = (el.get("rel") or "").lower().split()
            if "canonical" in rel:
                canonical = canonical or el.get("href")
            if "up" in rel:
                up = up or (el.get("title") or "", el.get("href"))
            if "home" in rel or "start" in rel:
                homes.append(el.get("href"))
        elif el.tag == "meta" and el.get("content") is not None:
            key = (el.get("name") or el.get("property") or "").strip().lower()
            if key == "keywords":
                # Some generators (javadoc) write one meta element per keyword.
                keywords.extend(k.strip() for k in el.get("content").split(","))
            else:
                meta.setdefault(key, el.get("content"))
        elif el.tag == "script" and el.text and (el.get("type") or "").strip().lower() == _JSON_LD:
            jsonld.append(el.text)
    return _Head(
        title=title or "",
        base_href=base_href,
        canonical=canonical,
        up=up,
        homes=tuple(homes),
        description=_collapse(meta.get("description") or meta.get("og:description") or ""),
        og_title=_collapse(meta.get("og:title", "")),
        og_url=meta.get("og:url"),
        keywords=tuple(dict.fromkeys(k for k in keywords if k)),
        language=(root.get("lang") or root.get("xml:lang") or "").strip(),
        jsonld=tuple(jsonld),
    )


_HEAD_END = re.compile(rb"</head\s*>", re.IGNORECASE)
_HEAD_WINDOW = 256 * 1024  # where a page's head must end to be read alone
_HEAD_ONLY_BYTES = 64 * 1024  # what is read of a page whose head does not end in the window


def declared_page_urls(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[str, ...]:
    """The absolute web URLs a page gives for itself: ``<link rel=canonical>``,
    ``og:url``, the ``url`` / ``@id`` / ``mainEntityOfPage`` of its JSON-LD nodes
    and the last item of its JSON-LD BreadcrumbList (normalized, in that order).
    Only the head is parsed, so that a pass over a whole corpus costs a fraction
    of parsing it; () for input that is not a readable page."""
    end = _HEAD_END.search(data, 0, _HEAD_WINDOW)
    try:
        utf8 = _utf8_html(data[: end.end()] if end else data[:_HEAD_ONLY_BYTES], max_bytes)
        root = etree.fromstring(utf8, _parser())
    except (UnparseablePage, etree.XMLSyntaxError, ValueError):
        return ()
    if root is None:
        return ()
    head = _read_head(root, list(root.iter(*_HEAD_TAGS)))
    urls = [head.canonical, head.og_url]
    for script in head.jsonld:
        try:
            document = json.loads(script.strip().removeprefix("<!--").removesuffix("-->"))
            urls += _jsonld_self_urls(document)
        except (ValueError, RecursionError):
            continue
    absolute = (u.strip() for u in urls if isinstance(u, str))
    return tuple(dict.fromkeys(normalize_url(u) for u in absolute
                               if urlsplit(u).scheme in ("http", "https") and urlsplit(u).netloc))


def _jsonld_self_urls(document: object) -> list[object]:
    nodes = document if isinstance(document, list) else [document]
    nodes = [n for n in nodes if isinstance(n, dict)]
    nodes += [n for top in nodes if isinstance(top.get("@graph"), list) for n in top["@graph"]
              if isinstance(n, dict)]
    urls: list[object] = []
    for node in nodes:
        if "BreadcrumbList" in _schema_types(node):
            continue  # its @id names the list, not the page; its last item is read below
        for key in ("url", "@id", "mainEntityOfPage"):
            value = node.get(key)
            urls.append(value.get("@id") or value.get("url") if isinstance(value, dict) else value)
    breadcrumbs = _find_breadcrumbs(document)
    if isinstance(breadcrumbs, dict):
        items = breadcrumbs.get("itemListElement") or []
        items = [i for i in (items if isinstance(items, list) else [items]) if isinstance(i, dict)]
        if items:
            last = max(enumerate(items), key=lambda item: (_position(item[1].get("position")), item[0]))[1]
            target = last.get("item")
            urls.append(target.get("@id") or target.get("url") if isinstance(target, dict) else target)
    return urls


@dataclasses.dataclass(frozen=True)
class _Location:
    """Where the page is: to resolve the links it contains and to judge them."""

    url: str  # normalized page URL
    canonical: str  # normalized <link rel=canonical>, else the URL
    base: str  # what relative links resolve against (<base href> or the URL)
    directory: str  # the base without its file name, query and fragment
    site: str
    homes: frozenset[str] = frozenset()  # the site root and what the page calls home

    @property
    def self_urls(self) -> tuple[str, str]:
        return self.url, self.canonical

    def resolve(self, href: str | None) -> str | None:
        if href is None:
            return None
        href = href.strip()
        if not href or href.startswith("#"):
            return self.url  # a link to "here", whatever <base> says
        # Only a query-only link depends on more than the base's directory; keying
        # the cache by directory lets the pages of one directory share it.
        return _resolve(self.base if href.startswith("?") else self.directory, href)

    def inside_site(self, url: str) -> bool:
        return url == self.site or url.startswith(self.site.rstrip("/") + "/")


_WEB_SCHEMES = ("http", "https", "file")


@lru_cache(maxsize=1 << 16)
def _resolve(base: str, href: str) -> str | None:
    try:
        absolute = urljoin(base, href)
        if urlsplit(absolute).scheme not in _WEB_SCHEMES:
            return None  # javascript:, mailto:, data: are not places
        return normalize_url(absolute)
    except ValueError:  # "http://[broken", "http://host:port/"
        return None


def _base_url(url: str, base_href: str | None) -> str:
    """<base href> resolved against the page URL; a broken or non-web one is ignored."""
    if base_href and base_href.strip():
        try:
            base = urljoin(url, base_href.strip())
            if urlsplit(base).scheme in _WEB_SCHEMES:
                return base
        except ValueError:
            pass
    return url


def _locate(head: _Head, url: str, site: str) -> _Location:
    page_url = normalize_url(url)
    base = _base_url(url, head.base_href)
    parts = urlsplit(base)
    directory_path = parts.path[: parts.path.rfind("/") + 1] or "/"
    directory = urlunsplit((parts.scheme, parts.netloc, directory_path, "", ""))
    location = _Location(page_url, page_url, base, directory, site)
    return dataclasses.replace(
        location,
        canonical=location.resolve(head.canonical) or page_url,
        homes=frozenset({site, *filter(None, map(location.resolve, head.homes))}),
    )


# ------------------------------------------------------------------------- trails

class _RawCrumb(NamedTuple):
    title: str
    url: str | None
    current: bool = False  # marked as the page being shown (aria-current, .active)


def _clean_crumb_title(title: str) -> str:
    return _collapse(title).strip(_CRUMB_EDGE_CHARS)


def _is_current(el: etree._Element | None) -> bool:
    if el is None:
        return False
    aria = el.get("aria-current")
    if aria is not None and aria.lower() != "false":
        return True
    return not {"active", "current"}.isdisjoint(_class_tokens(el))


def _crumb(item: etree._Element, link: etree._Element | None, loc: _Location) -> _RawCrumb:
    """The crumb an item shows: its visible text, or what an icon-only link says
    for itself (an unlinked image is decoration, not a place)."""
    title = _clean_crumb_title(_string_value(item))
    if not title and link is not None:
        img = link.find(".//img[@alt]")
        label = link.get("aria-label") or link.get("title") or (img.get("alt") if img is not None else "")
        title = _clean_crumb_title(label or "")
    href = link.get("href") if link is not None else None
    return _RawCrumb(title, loc.resolve(href), _is_current(item) or _is_current(link))


def _finish_trail(raw: list[_RawCrumb], loc: _Location) -> tuple[Crumb, ...] | None:
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

def _schema_types(node: dict) -> set[str]:
    types = node.get("@type")
    return {_local_name(t) for t in (types if isinstance(types, list) else [types]) if isinstance(t, str)}


def _find_breadcrumbs(node: object) -> dict | str | None:
    """The first BreadcrumbList (or textual ``breadcrumb``) anywhere in a JSON-LD
    document: top level, a list, ``@graph``, ``WebPage.breadcrumb``, any nesting."""
    if isinstance(node, list):
        for item in node:
            found = _find_breadcrumbs(item)
            if found is not None:
                return found
    elif isinstance(node, dict):
        if "BreadcrumbList" in _schema_types(node):
            return node
        if isinstance(node.get("breadcrumb"), str):
            return node["breadcrumb"]
        for value in node.values():
            found = _find_breadcrumbs(value)
            if found is not None:
                return found
    return None


def _position(value: object) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("inf")  # unnumbered items keep their order, after numbered ones


def _jsonld_crumbs(breadcrumbs: dict | str, loc: _Location) -> list[_RawCrumb]:
    if isinstance(breadcrumbs, str):
        return _split_crumbs(unescape(breadcrumbs))
    items = breadcrumbs.get("itemListElement") or []
    items = [i for i in (items if isinstance(items, list) else [items]) if isinstance(i, dict)]
    crumbs = []
    for item in sorted(items, key=lambda i: _position(i.get("position"))):
        target, name = item.get("item"), item.get("name")
        if isinstance(target, dict):
            name = name or target.get("name")
            target = target.get("@id") or target.get("url")
        href = target if isinstance(target, str) else None
        crumbs.append(_RawCrumb(_clean_crumb_title(unescape(str(name or ""))), loc.resolve(href)))
    return crumbs


def _jsonld_trail(head: _Head, loc: _Location) -> list[_RawCrumb]:
    for script in head.jsonld:
        try:
            document = json.loads(script.strip().removeprefix("<!--").removesuffix("-->"))
            found = _find_breadcrumbs(document)
        except (ValueError, RecursionError):
            continue  # malformed JSON-LD is common; the next rules may still work
        if found is not None:
            return _jsonld_crumbs(found, loc)
    return []


# -- 2. and 3. microdata and RDFa: one vocabulary under two sets of attribute names

_URL_ATTRIBUTES = ("href", "itemid", "resource", "src", "content")


def _with_property(scope: etree._Element, attr: str, name: str) -> Iterator[etree._Element]:
    return (el for el in scope.iter() if name in map(_local_name, (el.get(attr) or "").split()))


def _structured_trail(root: etree._Element, loc: _Location,
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
            rank = float("inf") if position is None else _position(
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


def _inline_crumbs(container: etree._Element, loc: _Location) -> list[_RawCrumb]:
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


def _container_crumbs(container: etree._Element, loc: _Location) -> list[_RawCrumb]:
    items = _top_level_items(container)
    if not items:
        return _inline_crumbs(container, loc)
    return [_crumb(li, li.find(".//a[@href]"), loc) for li in items]


def _looks_like_trail(crumbs: list[_RawCrumb]) -> bool:
    return (len(crumbs) >= 2 and any(c.url for c in crumbs)
            and all(len(c.title) <= _MAX_CRUMB_CHARS for c in crumbs))


def _breadcrumb_trail(survey: _Survey, loc: _Location) -> list[_RawCrumb]:
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


def _labelled_link(line: etree._Element, loc: _Location) -> _RawCrumb | None:
    """The crumb of a line reading "Label <a>Name</a>" ("Module java.base",
    "Category: Guides"): a short label, then one link. Anything else is None."""
    if line.tag not in _LINE_TAGS:
        return None
    links = line.findall(".//a[@href]")
    if len(links) != 1:
        return None
    text, name = _text_of(line), _clean_crumb_title(_string_value(links[0]))
    label = text[: len(text) - len(name)].rstrip(" :") if name and text.endswith(name) else ""
    if not label or len(text) > _MAX_CRUMB_CHARS or len(label.split()) > _MAX_LABEL_WORDS:
        return None
    if not any(ch.isalpha() for ch in label):
        return None  # "« <a>Previous</a>": a pager, not a place
    return _RawCrumb(name, loc.resolve(links[0].get("href")))


def _title_context_trail(root: etree._Element, loc: _Location) -> list[_RawCrumb]:
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

def _related_bar_trail(survey: _Survey, loc: _Location) -> list[_RawCrumb]:
    if not survey.related_bars:
        return []
    items = _top_level_items(survey.related_bars[0])
    # Sphinx chains its entries with "»"; a "related" box of links elsewhere on
    # the web (related articles) does not.
    if not any(_string_value(li).rstrip().endswith(_CHAIN_ENDINGS) for li in items):
        return []
    return [_crumb(li, li.find(".//a[@href]"), loc) for li in items]


_CHAIN_ENDINGS = ("»", "›", ">", "→")


def _toc_current_trail(root: etree._Element, loc: _Location) -> list[_RawCrumb]:
    # Document order is outermost first; a theme that shows the chain twice (a
    # top bar and a sidebar, a mobile and a desktop menu) repeats URLs, which the
    # trail keeps once.
    crumbs = []
    for li in root.iter("li"):
        if not _class_kinds(li.get("class") or "") & _CURRENT:
            continue
        link = li.find("a")
        if link is None:
            link = li.find("*/a")  # <li><p><a>, <li><span><a>
        if link is not None and link.get("href") is not None:
            crumbs.append(_crumb(link, link, loc)._replace(current=False))
    return crumbs


# -- 8. parent-only signals

_UP_LINK_HINTS = (b"accesskey", b'rel="up')


def _up_anchor_trail(root: etree._Element, loc: _Location) -> list[_RawCrumb]:
    for link in root.iter("a"):
        key, rel = (link.get("accesskey") or "").lower(), (link.get("rel") or "").lower().split()
        if link.get("href") is not None and (key == "u" or "up" in rel):
            # The visible text is often just "Up"; the title attribute names the parent.
            title = _clean_crumb_title(link.get("title") or "") or _crumb(link, link, loc).title
            return [_RawCrumb(title, loc.resolve(link.get("href")))]
    return []


def _link_rel_up_trail(head: _Head, loc: _Location) -> list[_RawCrumb]:
    if head.up is None:
        return []
    title, href = head.up
    return [_RawCrumb(_clean_crumb_title(title) or _url_segment_title(href), loc.resolve(href))]


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


def _holding_level(url: str | None, loc: _Location) -> int | None:
    """How deep the directory of a link's target is, if that directory holds the
    page (it is the page's own directory or one above it); else None. A
    directory's index page, normalized to the directory's URL, is the directory."""
    if url is None:
        return None
    target, here = urlsplit(url), urlsplit(loc.directory)
    if (target.scheme, target.netloc) != (here.scheme, here.netloc):
        return None
    path = target.path.rstrip("/")
    if not here.path.startswith(path + "/"):
        path = path[: path.rfind("/")]
        if not here.path.startswith(path + "/"):
            return None
    return path.count("/")


def _nav_bar_trail(survey: _Survey, loc: _Location) -> list[_RawCrumb]:
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

def _url_trail(loc: _Location) -> tuple[Crumb, ...]:
    site, page = urlsplit(loc.site), urlsplit(loc.url)
    site_path = site.path.rstrip("/")
    if (site.scheme, site.netloc) != (page.scheme, page.netloc) or not page.path.startswith(site_path + "/"):
        return ()
    directories = page.path[len(site_path) + 1:].split("/")[:-1]
    return tuple(
        Crumb(unquote(name),
              urlunsplit((site.scheme, site.netloc, "/".join([site_path, *directories[:depth + 1]]), "", "")))
        for depth, name in enumerate(directories)
    )


class _Trail(NamedTuple):
    crumbs: tuple[Crumb, ...]
    method: str
    passed_over: tuple[str, ...]  # rules with markup that named nothing in the site


def _find_trail(root: etree._Element, survey: _Survey, head: _Head, loc: _Location,
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
    return _Trail(_url_trail(loc), "url", tuple(passed_over))


# ------------------------------------------------------------------------- main content

# Never body text, wherever they are.
_DROP_TAGS = ("script", "style", "noscript", "template", "nav", "footer", "button",
              "svg", "iframe", "object", "select", "textarea", "dialog")
# The frame around the content of a page that does not mark its main region.
_CHROME_TAGS = ("header", "aside", "form")


_text_length = etree.XPath("string-length(normalize-space())")
_MIN_MAIN_CHARS = 40


def _find_main(root: etree._Element, survey: _Survey) -> tuple[etree._Element, bool]:
    """The element holding the page's own content, and whether the page marked it
    up as its main region (<main>, role=main, a single <article>)."""
    mains = survey.mains
    # Several top-level articles are a listing (a blog index), not one main text.
    top_articles = [el for _, el in mains
                    if el.tag == "article" and next(el.iterancestors("article"), None) is None]
    if len(top_articles) > 1:
        mains = [(rank, el) for rank, el in mains if el.tag != "article"]
    # An empty or tiny region (a shell filled in by scripts, a stray <main> around
    # a search box) is not the page's content: the next candidate is.
    for candidates, marked in ((mains, True), (survey.containers, False)):
        for _, el in sorted(candidates, key=lambda ranked: ranked[0]):
            if _text_length(el) >= _MIN_MAIN_CHARS:
                return el, marked
    body = root.find("body")
    return (root if body is None else body), False


def _drop(el: etree._Element) -> None:
    """Remove an element but keep the text that follows it."""
    parent = el.getparent()
    if parent is None:
        return
    if el.tail:
        previous = el.getprevious()
        if previous is not None:
            previous.tail = (previous.tail or "") + el.tail
        else:
            parent.text = (parent.text or "") + el.tail
    parent.remove(el)


_SKIP_LINK_WINDOW = 5


def _is_skip_link(link: etree._Element) -> bool:
    if not (link.get("href") or "").startswith("#"):
        return False
    return bool(_class_kinds(link.get("class") or "") & _BOILERPLATE) or (
        (link.text or "").lstrip().lower().startswith(("skip to", "jump to")))


_LANGUAGE_LINKS = etree.XPath(".//a[@hreflang]")
_PICKER_BLOCKS = ("p", "div", "ul", "ol", "nav", "section", "td", "dl")
_MAX_PICKER_LINK_CHARS = 24  # "English", "fr", "Deutsch (Schweiz)"
_MAX_PICKER_LABEL_CHARS = 40  # "Available Languages:", "This page in:" and separators


def _language_pickers(main: etree._Element) -> list[etree._Element]:
    """Blocks that only offer the page in other languages: links marked with
    ``hreflang`` (and their siblings), each short, with at most a short label."""
    pickers: list[etree._Element] = []
    for link in _LANGUAGE_LINKS(main):
        block = link.getparent()
        while block is not None and block is not main and block.tag not in _PICKER_BLOCKS:
            block = block.getparent()
        if block is None or block is main or any(block is p or _is_inside(block, p) for p in pickers):
            continue
        link_texts = [_text_of(a) for a in block.iter("a")]
        if all(len(t) <= _MAX_PICKER_LINK_CHARS for t in link_texts) and (
                len(_text_of(block)) - sum(map(len, link_texts)) <= _MAX_PICKER_LABEL_CHARS):
            pickers.append(block)
    return pickers


def _strip_boilerplate(main: etree._Element, marked_main: bool, survey: _Survey,
                       in_page_tocs: list[etree._Element], has_language_links: bool) -> None:
    etree.strip_elements(main, *(_DROP_TAGS if marked_main else _DROP_TAGS + _CHROME_TAGS),
                         with_tail=False)
    for el in in_page_tocs + (_language_pickers(main) if has_language_links else []):
        _drop(el)
    for el, always in survey.boilerplate:
        # Inside a marked-up main region, a "header" or "sidebar" is the text's own.
        if (always or not marked_main) and _is_inside(el, main):
            _drop(el)
    # Links are not surveyed (too many); a skip link is, by its purpose, among the
    # first links of a page.
    for link in [a for a in islice(main.iter("a"), _SKIP_LINK_WINDOW) if _is_skip_link(a)]:
        _drop(link)


def _find_nav_order(main: etree._Element, survey: _Survey, loc: _Location
                    ) -> tuple[tuple[str, ...], list[etree._Element]]:
    """Same-site pages linked from the page's own tables of contents, in order;
    and those tables of contents that link only to places in the page itself (a
    long page's contents at its top): they repeat its headings, so are no text."""
    order: dict[str, None] = {}
    resolved: dict[str, str | None] = {}
    in_page = []
    for toc in survey.tocs:
        if toc is not main and not _is_inside(toc, main):
            continue
        links = leaves_page = 0
        for link in toc.iter("a"):
            page_href = (link.get("href") or "").split("#", 1)[0]
            if page_href not in resolved:
                resolved[page_href] = loc.resolve(page_href) if page_href.strip() else loc.url
            url = resolved[page_href]
            links += 1
            if url not in loc.self_urls:
                leaves_page += 1
                if url and loc.inside_site(url):
                    order[url] = None
        if links and not leaves_page and toc is not main:
            in_page.append(toc)
    return tuple(order), in_page


# ------------------------------------------------------------------------- text and sections

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
        el.tag == "div" and bool(_class_kinds(el.get("class") or "") & _SECTION))


def _mark_headings(main: etree._Element) -> list[_Heading]:
    """Replace each heading by a mark; where a sectioning element opened by a
    heading closes, mark that the text after it belongs to the enclosing heading."""
    headings = []
    for index, heading in enumerate(list(main.iter(*_HEADING_TAGS))):
        parent = heading.getparent()
        opened = parent if parent is not None and _opens(heading) else None
        title = _text_of(heading)
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


def _mark_pre_blocks(main: etree._Element) -> list[_Verbatim]:
    """Set preformatted text aside, leaving a mark in its place."""
    blocks = []
    for pre in list(main.iter("pre")):
        text = etree.tostring(pre, method="text", encoding=str, with_tail=False)
        pre.clear(keep_tail=True)
        pre.text = _mark("v", len(blocks))
        blocks.append(_Verbatim(text.strip("\n").replace("\xa0", " ")))
    return blocks


def _mark_blocks(main: etree._Element) -> None:
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


def _page_title(headings: list[_Heading], head: _Head, url: str) -> tuple[str, int | None]:
    """The page title, and the index of the heading that shows it (which opens no
    section of its own: the text under it is the page's first section)."""
    for index, heading in enumerate(headings):
        if heading.level == 1 and heading.title:
            return heading.title, index
    # <title> usually ends with the site's name: "json — Python 3.11 documentation".
    suffix = _SITE_SUFFIX.match(head.title)
    title = head.og_title or (suffix[1] if suffix else head.title) or _url_segment_title(url)
    first = next((i for i, h in enumerate(headings) if h.title), None)
    if first is not None and headings[first].title.casefold() == title.casefold():
        return title, first
    return title, None


def _split_sections(text: str, headings: list[_Heading], title: str, title_index: int | None,
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


# ------------------------------------------------------------------------- the page

def _page_hash(page: ParsedPage) -> str:
    # Everything the index stores of the page (the URL is its key), so that a page
    # whose hash is unchanged needs no re-indexing. Section texts are appended
    # raw: JSON-escaping the bulk of the page would cost more than hashing it.
    record = json.dumps([page.title, page.canonical_url, page.trail_method, page.description,
                         page.keywords, page.language, page.nav_order,
                         [(c.title, c.url) for c in page.trail],
                         [(s.title, s.level, s.anchor, s.path, len(s.text)) for s in page.sections]],
                        ensure_ascii=False)
    return content_hash("\x1f".join([record, *(s.text for s in page.sections)]))


def parse_page(data: bytes, url: str, site: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> ParsedPage:
    """Parse one HTML page found at `url`, a page of the site rooted at `site` (a
    normalized URL). Raises `UnparseablePage` for input that is not a page.

    A page with a title but no text is still a page (a section index, a redirect
    stub): it gives its children a parent. One with neither is "no_content".
    """
    utf8 = _utf8_html(data, max_bytes)
    try:
        return _parse_utf8(utf8, url, site)
    except ValueError as exc:
        # lxml keeps characters XML forbids (stray control bytes) in the text it
        # parses but refuses them in text written back, as the marks are. Such
        # pages are rare; cleaning every page up front would cost more than this.
        if "XML compatible" not in str(exc):
            raise
        clean = utf8.translate(None, _CONTROL_BYTES)
        return _parse_utf8(clean.replace(b"\xef\xbf\xbe", b"").replace(b"\xef\xbf\xbf", b""), url, site)


def _parse_utf8(utf8: bytes, url: str, site: str) -> ParsedPage:
    parser = _parser()
    try:
        root = etree.fromstring(utf8, parser)
    except etree.XMLSyntaxError as exc:
        raise UnparseablePage("no_content", str(exc)) from exc
    # libxml2 stops an HTML document at 2,048 nested elements, huge_tree or
    # not, and lxml returns the part before: a page cut there is refused, never
    # indexed with the rest of its text silently gone.
    too_deep = parser.error_log.filter_types([etree.ErrorTypes.ERR_RESOURCE_LIMIT])
    if too_deep:
        raise UnparseablePage("too_deep", too_deep[0].message)
    if root is None:
        raise UnparseablePage("no_content", "no elements")

    survey = _survey(root)
    head = _read_head(root, survey.head)
    loc = _locate(head, url, site)
    trail = _find_trail(root, survey, head, loc, utf8)

    main, marked_main = _find_main(root, survey)
    nav_order, in_page_tocs = _find_nav_order(main, survey, loc)
    _strip_boilerplate(main, marked_main, survey, in_page_tocs, b"hreflang" in utf8)
    pre_blocks = _mark_pre_blocks(main)
    _mark_blocks(main)
    headings = _mark_headings(main)
    text = _normalized_string(main)
    if not text.isascii():
        text = _collapse_unicode_spaces(text)  # normalize-space collapses ASCII whitespace only

    title, title_index = _page_title(headings, head, loc.url)
    sections = _split_sections(text, headings, title, title_index, pre_blocks)
    has_title = any(h.title for h in headings) or head.og_title or head.title
    if not has_title and not any(s.text for s in sections):
        raise UnparseablePage("no_content", "neither text nor a title")
    page = ParsedPage(
        url=loc.url,
        canonical_url=loc.canonical,
        site=site,
        title=title,
        trail=trail.crumbs,
        trail_method=trail.method,
        trail_passed_over=trail.passed_over,
        sections=sections,
        description=head.description,
        keywords=head.keywords,
        language=head.language,
        nav_order=nav_order,
    )
    return dataclasses.replace(page, content_hash=_page_hash(page))

"""One pass over a page's container elements: what each can be (trail markup, main
region, boilerplate, table of contents, navigation, head element), by its tag,
class, id or role, collected into a `Survey` the other modules read."""
from __future__ import annotations

import dataclasses
import re
from functools import lru_cache
from typing import Iterable, NamedTuple

from lxml import etree

# What an element can be, by its tag, class, id or role; one bit each.
(_CRUMBS, _PATH, _RELATED, CURRENT, _TOC, _CONTAINER, _WRAPPER, BOILERPLATE, _CHROME,
 SECTION, _MAIN, _ROLE_MAIN, _ARTICLE, _NAV, _HEAD, _NAVIGATION) = (1 << bit for bit in range(16))

_CONTAINER_IDS = frozenset(("main-content", "maincontent", "content", "page-content", "main", "primary"))
_CLASS_WORDS = {"related": _RELATED, "current": CURRENT, "toc": _TOC, "toctree-wrapper": _TOC,
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
    **dict.fromkeys(("search", "menu", "menubar", "toolbar"), BOILERPLATE),
    "navigation": BOILERPLATE | _NAVIGATION,
    **dict.fromkeys(("banner", "contentinfo", "complementary"), _CHROME),
    "main": _ROLE_MAIN,
    "doc-toc": _TOC,
}
HEAD_TAGS = ("title", "base", "link", "meta", "script")
_TAG_KINDS = {"main": _MAIN, "article": _ARTICLE, "nav": _NAV, "section": SECTION,
              **dict.fromkeys(HEAD_TAGS, _HEAD)}
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
        return kinds | BOILERPLATE
    return kinds | (_CHROME if patterns.chrome.search(name) else 0)


@lru_cache(maxsize=1 << 16)
def class_kinds(value: str) -> int:
    kinds = 0
    for token in value.lower().split():
        kinds |= _name_kinds(token, _CLASS_NAMES) | _CLASS_WORDS.get(token, 0)
        if _SECTION_CLASS.match(token):
            kinds |= SECTION
    return kinds


@lru_cache(maxsize=1 << 16)
def _id_kinds(value: str) -> int:
    value = value.strip().lower()
    return _name_kinds(value, _ID_NAMES) | (_CONTAINER if value in _CONTAINER_IDS else 0)


@dataclasses.dataclass
class Survey:
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
        if kinds & (BOILERPLATE | _CHROME):
            self.boilerplate.append((el, bool(kinds & BOILERPLATE)))
        if kinds & _TOC:
            self.tocs.append(el)
        if kinds & (_NAV | _NAVIGATION):
            self.navigation.append(el)


def survey_tree(root: etree._Element) -> Survey:
    survey = Survey()
    for el in root.iter(*_SURVEYED_TAGS):
        kinds = _TAG_KINDS.get(el.tag, 0)
        value = el.get("class")
        if value is not None:
            kinds |= class_kinds(value)
        value = el.get("id")
        # A section's id is a slug of its heading ("s-pagination", "related-calls"):
        # it says what the text is about, not what the element is.
        if value is not None and not kinds & SECTION:
            kinds |= _id_kinds(value)
        value = el.get("role")
        if value is not None:
            kinds |= _ROLE_KINDS.get(value.strip().lower(), 0)
        if kinds:
            survey.add(el, kinds)
    return survey

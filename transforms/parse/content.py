"""A page's main content: the element that holds it, the boilerplate stripped from
it, and the same-site pages its own tables of contents link to, in order."""
from __future__ import annotations

from itertools import islice

from lxml import etree

from ritrag.transforms.parse.location import Location
from ritrag.transforms.parse.survey import BOILERPLATE, Survey, class_kinds
from ritrag.transforms.parse.text import text_of


def _is_inside(el: etree._Element, container: etree._Element) -> bool:
    return any(ancestor is container for ancestor in el.iterancestors())


# Never body text, wherever they are.
_DROP_TAGS = ("script", "style", "noscript", "template", "nav", "footer", "button",
              "svg", "iframe", "object", "select", "textarea", "dialog")
# The frame around the content of a page that does not mark its main region.
_CHROME_TAGS = ("header", "aside", "form")


_text_length = etree.XPath("string-length(normalize-space())")
_MIN_MAIN_CHARS = 40


def find_main(root: etree._Element, survey: Survey) -> tuple[etree._Element, bool]:
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
    return bool(class_kinds(link.get("class") or "") & BOILERPLATE) or (
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
        link_texts = [text_of(a) for a in block.iter("a")]
        if all(len(t) <= _MAX_PICKER_LINK_CHARS for t in link_texts) and (
                len(text_of(block)) - sum(map(len, link_texts)) <= _MAX_PICKER_LABEL_CHARS):
            pickers.append(block)
    return pickers


def strip_boilerplate(main: etree._Element, marked_main: bool, survey: Survey,
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


def find_nav_order(main: etree._Element, survey: Survey, loc: Location
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

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
"""
from __future__ import annotations

import dataclasses
import json

from lxml import etree

from ritrag.ids import content_hash
from ritrag.schema import ParsedPage
from ritrag.transforms.parse.content import find_main, find_nav_order, strip_boilerplate
from ritrag.transforms.parse.decode import CONTROL_BYTES, DEFAULT_MAX_BYTES, UnparseablePage, html_parser, utf8_html
from ritrag.transforms.parse.head import read_head
from ritrag.transforms.parse.links import read_links
from ritrag.transforms.parse.location import locate
from ritrag.transforms.parse.sections import (cap_sections, mark_blocks, mark_headings, mark_pre_blocks, page_title,
                                              split_sections)
from ritrag.transforms.parse.survey import survey_tree
from ritrag.transforms.parse.text import collapse_unicode_spaces, normalized_string
from ritrag.transforms.parse.trail import find_trail


def page_content_hash(page: ParsedPage) -> str:
    # Everything the index stores of the page (the URL is its key), its links
    # included, so that a page whose hash is unchanged needs no re-indexing.
    # Section texts are appended raw: JSON-escaping the bulk of the page would
    # cost more than hashing it.
    record = json.dumps([page.title, page.canonical_url, page.trail_method, page.description,
                         page.keywords, page.language, page.nav_order,
                         [(c.title, c.url) for c in page.trail],
                         [(link.url, link.fragment, link.anchor_text) for link in page.links],
                         [(s.title, s.level, s.anchor, s.path, len(s.text)) for s in page.sections]],
                        ensure_ascii=False)
    return content_hash("\x1f".join([record, *(s.text for s in page.sections)]))


def finished_page(page: ParsedPage) -> ParsedPage:
    """A page as every parser hands it on: its sections capped (MAX_PAGE_SECTIONS,
    the merged ones counted in `sections_past_cap`), then content-hashed. Every
    input kind's page goes through here, so the cap is one rule for all."""
    sections, past_cap = cap_sections(page.sections, page.title)
    page = dataclasses.replace(page, sections=sections, sections_past_cap=past_cap)
    return dataclasses.replace(page, content_hash=page_content_hash(page))


def parse_page(data: bytes, url: str, site: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> ParsedPage:
    """Parse one HTML page found at `url`, a page of the site rooted at `site` (a
    normalized URL). Raises `UnparseablePage` for input that is not a page.

    A page with a title but no text is still a page (a section index, a redirect
    stub): it gives its children a parent. One with neither is "no_content".
    """
    utf8 = utf8_html(data, max_bytes)
    try:
        return _parse_utf8(utf8, url, site)
    except ValueError as exc:
        # lxml keeps characters XML forbids (stray control bytes) in the text it
        # parses but refuses them in text written back, as the marks are. Such
        # pages are rare; cleaning every page up front would cost more than this.
        if "XML compatible" not in str(exc):
            raise
        clean = utf8.translate(None, CONTROL_BYTES)
        return _parse_utf8(clean.replace(b"\xef\xbf\xbe", b"").replace(b"\xef\xbf\xbf", b""), url, site)


def _parse_utf8(utf8: bytes, url: str, site: str) -> ParsedPage:
    parser = html_parser()
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

    survey = survey_tree(root)
    head = read_head(root, survey.head)
    loc = locate(head, url, site)
    trail = find_trail(root, survey, head, loc, utf8)

    main, marked_main = find_main(root, survey)
    nav_order, in_page_tocs = find_nav_order(main, survey, loc)
    page_hrefs = int(root.xpath("count(//a[@href])"))  # one C-level pass; stripping removes chrome's
    strip_boilerplate(main, marked_main, survey, in_page_tocs, b"hreflang" in utf8)
    chrome_hrefs = page_hrefs - int(main.xpath("count(.//a[@href])"))
    page_links = read_links(main, marked_main, survey, loc, trail.crumbs)
    pre_blocks = mark_pre_blocks(main)
    mark_blocks(main)
    headings = mark_headings(main)
    text = normalized_string(main)
    if not text.isascii():
        text = collapse_unicode_spaces(text)  # normalize-space collapses ASCII whitespace only

    title, title_index = page_title(headings, head, loc.url)
    sections = split_sections(text, headings, title, title_index, pre_blocks)
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
        links=page_links.links,
        links_past_cap=page_links.past_cap,
        links_navigation=chrome_hrefs + page_links.navigation,
    )
    return finished_page(page)

"""The links of a fetched HTML page, for the crawl's discovery: `<a href>`,
`<area href>`, `<link rel=canonical>` (recorded, and followed like a link),
resolved against the page URL and its `<base href>`. `rel=nofollow` is honoured.
An href that does not resolve to a URL (`http://[broken/x`) is skipped and
counted, never fatal to the page."""
from __future__ import annotations

from dataclasses import dataclass, field

from lxml import etree, html

from ritrag.urls import resolve

NOT_FOLLOWED = ("#", "javascript:", "mailto:", "tel:", "data:")


@dataclass(frozen=True)
class PageLinks:
    links: list[str] = field(default_factory=list)  # absolute link targets in document order
    canonical: str = ""  # the canonical URL or ""
    malformed: int = 0  # hrefs skipped because they do not resolve to a URL


def page_links(body: bytes, url: str) -> PageLinks:
    """The links of the page at `url` whose HTML is `body`."""
    try:
        root = html.fromstring(body)
    except (etree.ParserError, ValueError):
        return PageLinks()
    base_hrefs = root.xpath("//base/@href")
    canonical_hrefs = root.xpath("//link[contains(concat(' ', normalize-space(@rel), ' '), ' canonical ')]/@href")
    base = resolve(url, base_hrefs[0]) if base_hrefs else url
    canonical = resolve(base or url, canonical_hrefs[0]) if canonical_hrefs else ""
    malformed = (base is None) + (canonical is None)
    base, canonical = base or url, canonical or ""
    links = []
    for el in root.xpath("//a[@href] | //area[@href]"):
        if "nofollow" in (el.get("rel") or "").lower().split():
            continue
        href = el.get("href").strip()
        if not href or href.startswith(NOT_FOLLOWED):
            continue
        target = resolve(base, href)
        if target is None:
            malformed += 1
        else:
            links.append(target)
    if canonical:
        links.append(canonical)
    return PageLinks(links, canonical, malformed)

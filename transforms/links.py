"""The links of a fetched HTML page, for the crawl's discovery: `<a href>`,
`<area href>`, `<link rel=canonical>` (recorded, and followed like a link),
resolved against the page URL and its `<base href>`. `rel=nofollow` is honoured."""
from __future__ import annotations

from urllib.parse import urljoin

from lxml import etree, html


def page_links(body: bytes, url: str) -> tuple[list[str], str]:
    """(absolute link targets in document order, the canonical URL or "")."""
    try:
        root = html.fromstring(body)
    except (etree.ParserError, ValueError):
        return [], ""
    base_hrefs = root.xpath("//base/@href")
    base = urljoin(url, base_hrefs[0].strip()) if base_hrefs else url
    canonical = ""
    for href in root.xpath("//link[contains(concat(' ', normalize-space(@rel), ' '), ' canonical ')]/@href"):
        canonical = urljoin(base, href.strip())
        break
    links = []
    for el in root.xpath("//a[@href] | //area[@href]"):
        if "nofollow" in (el.get("rel") or "").lower().split():
            continue
        href = el.get("href").strip()
        if href and not href.startswith(("#", "javascript:", "mailto:", "tel:", "data:")):
            links.append(urljoin(base, href))
    if canonical:
        links.append(canonical)
    return links, canonical

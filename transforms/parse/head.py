"""What a page's <head> (and <html>) say about it: title, base, canonical, up and
home links, description, keywords, language, JSON-LD scripts."""
from __future__ import annotations

from typing import NamedTuple

from lxml import etree

from ritrag.transforms.parse.text import collapse, text_of


class Head(NamedTuple):
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


def read_head(root: etree._Element, elements: list[etree._Element]) -> Head:
    title = base_href = canonical = up = None
    homes: list[str] = []
    meta: dict[str, str] = {}
    keywords: list[str] = []
    jsonld: list[str] = []
    for el in elements:
        if el.tag == "title":
            title = title or text_of(el)
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
    return Head(
        title=title or "",
        base_href=base_href,
        canonical=canonical,
        up=up,
        homes=tuple(homes),
        description=collapse(meta.get("description") or meta.get("og:description") or ""),
        og_title=collapse(meta.get("og:title", "")),
        og_url=meta.get("og:url"),
        keywords=tuple(dict.fromkeys(k for k in keywords if k)),
        language=(root.get("lang") or root.get("xml:lang") or "").strip(),
        jsonld=tuple(jsonld),
    )

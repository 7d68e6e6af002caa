"""`declared_page_urls`: the URLs a page names for itself, read from its head
alone (a pass over a whole corpus costs a fraction of parsing it)."""
from __future__ import annotations

import json
import re

from lxml import etree

from ritrag.transforms.parse.decode import DEFAULT_MAX_BYTES, UnparseablePage, html_parser, utf8_html
from ritrag.transforms.parse.head import read_head
from ritrag.transforms.parse.survey import HEAD_TAGS
from ritrag.transforms.parse.trail import find_breadcrumbs, item_position, schema_types
from ritrag.urls import is_web_url, normalize_url

_HEAD_END = re.compile(rb"</head\s*>", re.IGNORECASE)
HEAD_WINDOW = 256 * 1024  # where a page's head must end to be read alone: all this module reads of a page
_HEAD_ONLY_BYTES = 64 * 1024  # what is read of a page whose head does not end in the window


def declared_page_urls(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[str, ...]:
    """The absolute web URLs a page gives for itself: ``<link rel=canonical>``,
    ``og:url``, the ``url`` / ``@id`` / ``mainEntityOfPage`` of its JSON-LD nodes
    and the last item of its JSON-LD BreadcrumbList (normalized, in that order).
    Only the head is parsed, so that a pass over a whole corpus costs a fraction
    of parsing it; () for input that is not a readable page."""
    end = _HEAD_END.search(data, 0, HEAD_WINDOW)
    try:
        utf8 = utf8_html(data[: end.end()] if end else data[:_HEAD_ONLY_BYTES], max_bytes)
        root = etree.fromstring(utf8, html_parser())
    except (UnparseablePage, etree.XMLSyntaxError, ValueError):
        return ()
    if root is None:
        return ()
    head = read_head(root, list(root.iter(*HEAD_TAGS)))
    urls = [head.canonical, head.og_url]
    for script in head.jsonld:
        try:
            document = json.loads(script.strip().removeprefix("<!--").removesuffix("-->"))
            urls += _jsonld_self_urls(document)
        except (ValueError, RecursionError):
            continue
    absolute = (u.strip() for u in urls if isinstance(u, str))
    return tuple(dict.fromkeys(normalize_url(u) for u in absolute if is_web_url(u)))


def _jsonld_self_urls(document: object) -> list[object]:
    nodes = document if isinstance(document, list) else [document]
    nodes = [n for n in nodes if isinstance(n, dict)]
    nodes += [n for top in nodes if isinstance(top.get("@graph"), list) for n in top["@graph"]
              if isinstance(n, dict)]
    urls: list[object] = []
    for node in nodes:
        if "BreadcrumbList" in schema_types(node):
            continue  # its @id names the list, not the page; its last item is read below
        for key in ("url", "@id", "mainEntityOfPage"):
            value = node.get(key)
            urls.append(value.get("@id") or value.get("url") if isinstance(value, dict) else value)
    breadcrumbs = find_breadcrumbs(document)
    if isinstance(breadcrumbs, dict):
        items = breadcrumbs.get("itemListElement") or []
        items = [i for i in (items if isinstance(items, list) else [items]) if isinstance(i, dict)]
        if items:
            last = max(enumerate(items), key=lambda item: (item_position(item[1].get("position")), item[0]))[1]
            target = last.get("item")
            urls.append(target.get("@id") or target.get("url") if isinstance(target, dict) else target)
    return urls

"""Sitemaps (sitemaps.org 0.9): a `<urlset>` of page URLs or a `<sitemapindex>` of
further sitemaps, plain or gzipped. Parsed with lxml without entity expansion or
network access; the decompressed size is capped (a gzip bomb is refused)."""
from __future__ import annotations

import gzip
import io
import zlib
from dataclasses import dataclass

from lxml import etree

GZIP_MAGIC = b"\x1f\x8b"
MAX_SITEMAP_BYTES = 50 * 1024 * 1024  # the protocol's own limit for one uncompressed sitemap


class InvalidSitemap(ValueError):
    """A sitemap that is not one (bad XML, wrong root element, bad gzip, too large)."""


@dataclass(frozen=True)
class Sitemap:
    pages: tuple[str, ...]  # <urlset><url><loc>
    sitemaps: tuple[str, ...]  # <sitemapindex><sitemap><loc>


def gunzip_capped(data: bytes, max_bytes: int) -> bytes:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as fh:
            out = fh.read(max_bytes + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise InvalidSitemap(f"bad gzip: {exc}") from None
    if len(out) > max_bytes:
        raise InvalidSitemap(f"more than {max_bytes} bytes once decompressed")
    return out


def _local(tag: object) -> str:
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def parse_sitemap(data: bytes, max_bytes: int = MAX_SITEMAP_BYTES) -> Sitemap:
    """The URLs a sitemap lists; raises InvalidSitemap."""
    if data.startswith(GZIP_MAGIC):
        data = gunzip_capped(data, max_bytes)
    if len(data) > max_bytes:
        raise InvalidSitemap(f"more than {max_bytes} bytes")
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)
    try:
        root = etree.fromstring(data, parser)
    except etree.XMLSyntaxError as exc:
        raise InvalidSitemap(f"not XML: {exc}") from None
    if root is None:
        raise InvalidSitemap("empty document")
    kind = _local(root.tag)
    if kind not in ("urlset", "sitemapindex"):
        raise InvalidSitemap(f"root element <{kind}> is neither <urlset> nor <sitemapindex>")
    locs = tuple(el.text.strip() for el in root.iter()
                 if _local(el.tag) == "loc" and el.text and el.text.strip())
    return Sitemap(locs, ()) if kind == "urlset" else Sitemap((), locs)

"""Where a page is (`Location`): its normalized URL, canonical URL, base and
directory, site and home pages, to resolve the links it contains and judge them."""
from __future__ import annotations

import dataclasses
import re
from functools import lru_cache
from urllib.parse import unquote, urlsplit

from ritrag.transforms.parse.head import Head
from ritrag.urls import PAGE_SCHEMES, directory_of, normalize_url, path_segments, resolve


def url_segment_title(url: str) -> str:
    segments = path_segments(url)
    if not segments:
        return urlsplit(url).hostname or url
    return re.sub(r"\.(?:html?|php|aspx?)$", "", unquote(segments[-1]), flags=re.IGNORECASE)

@dataclasses.dataclass(frozen=True)
class Location:
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


@lru_cache(maxsize=1 << 16)
def _resolve(base: str, href: str) -> str | None:
    absolute = resolve(base, href)
    if absolute is None or urlsplit(absolute).scheme not in PAGE_SCHEMES:
        return None  # "http://[broken", "http://host:port/"; javascript:, mailto:, data: are not places
    return normalize_url(absolute)


def _base_url(url: str, base_href: str | None) -> str:
    """<base href> resolved against the page URL; a broken or non-web one is ignored."""
    base = resolve(url, base_href) if base_href and base_href.strip() else None
    return base if base is not None and urlsplit(base).scheme in PAGE_SCHEMES else url


def locate(head: Head, url: str, site: str) -> Location:
    page_url = normalize_url(url)
    base = _base_url(url, head.base_href)
    location = Location(page_url, page_url, base, directory_of(base), site)
    return dataclasses.replace(
        location,
        canonical=location.resolve(head.canonical) or page_url,
        homes=frozenset({site, *filter(None, map(location.resolve, head.homes))}),
    )

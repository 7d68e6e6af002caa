"""Which URLs a crawl may fetch, and the one spelling of each.

A crawl keeps the URL it fetches as it was first written (minus the fragment and
tracking parameters), because that is the page's address for the parser (relative
links resolve against it), and de-duplicates by `crawl_key`: the normalized form
of `ritrag.ids.normalize_url` (case, default ports, `index.html`, dot segments,
trailing slashes) without tracking parameters.

Scope, by default, is the seeds' own hosts and path prefixes (the directory of
each seed's path); `--include` regexes widen it, `--exclude` regexes narrow it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ritrag.ids import normalize_url

# Query parameters that mark where a visitor came from, never which page is shown.
TRACKING_PARAM = re.compile(r"^(utm_[a-z]+|gclid|dclid|fbclid|msclkid|yclid|mc_cid|mc_eid|_ga|_gl|ref_src)$",
                            re.IGNORECASE)


class BadUrl(ValueError):
    """A URL that cannot be crawled (malformed, not http(s), no host)."""


def clean_url(url: str) -> str:
    """The URL to fetch: fragment and tracking parameters dropped, scheme and host
    lowercased; raises BadUrl for anything that is not an absolute http(s) URL."""
    text = url.strip()
    if not text or any(ch.isspace() for ch in text):
        raise BadUrl(f"not a URL: {url!r}")
    try:
        parts = urlsplit(text)
        port = parts.port  # raises ValueError on a port that is not a number
    except ValueError as exc:
        raise BadUrl(f"malformed URL {url!r}: {exc}") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise BadUrl(f"not an http(s) URL: {url!r}")
    if not parts.hostname:
        raise BadUrl(f"no host in URL: {url!r}")
    netloc = parts.hostname.lower() + (f":{port}" if port is not None else "")
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        kept = [(k, v) for k, v in pairs if not TRACKING_PARAM.match(k)]
        if len(kept) != len(pairs):
            query = urlencode(kept)
    return urlunsplit((parts.scheme.lower(), netloc, parts.path or "/", query, ""))


def crawl_key(url: str) -> str:
    """The de-duplication key of a (cleaned) URL."""
    return normalize_url(clean_url(url))


def host_of(url: str) -> str:
    """`scheme://host[:port]`: the unit of politeness (robots.txt, concurrency, delay)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def seed_prefix(seed: str) -> str:
    """The scope a seed opens by default: its host and the directory of its path."""
    parts = urlsplit(clean_url(seed))
    directory = parts.path[: parts.path.rfind("/") + 1] or "/"
    return urlunsplit((parts.scheme, parts.netloc, directory, "", ""))


@dataclass(frozen=True)
class Scope:
    """URL prefixes (from the seeds) or include patterns admit a URL; exclude
    patterns reject it whatever else matched."""

    prefixes: tuple[str, ...]
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @classmethod
    def for_seeds(cls, seeds: list[str], include: list[str] = (), exclude: list[str] = ()) -> "Scope":
        for pattern in [*include, *exclude]:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"bad --include/--exclude regex {pattern!r}: {exc}") from None
        return cls(tuple(sorted({seed_prefix(s) for s in seeds})), tuple(include), tuple(exclude))

    def allows(self, url: str) -> bool:
        if any(re.search(p, url) for p in self.exclude):
            return False
        return url.startswith(self.prefixes) or any(re.search(p, url) for p in self.include)

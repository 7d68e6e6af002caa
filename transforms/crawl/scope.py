"""Which URLs a crawl may fetch, and the one spelling of each.

`clean_url` gives the URL exactly as the HTTP client sends it, and every crawl
decision (scope, robots.txt, de-duplication) is made on that string, so what is
checked is what is requested. It is httpx's own serialization (percent-encoding,
IDNA hosts, lowercase scheme and host, no default port) of the URL with
fragment, userinfo and tracking parameters dropped (`ritrag.urls.without_tracking_params`,
the rule the index's page keys drop them by) and its path normalized as a
server would read it: percent-encoded unreserved characters decoded (RFC 3986
6.2.2.2, so `%2E%2E` is `..`), backslashes read as slashes (as browsers read
http(s) links), then dot segments removed (RFC 3986 5.2.4). A path whose dot
segments hide behind an encoded slash (`/docs/..%2F..%2Fsecret`) is refused:
servers disagree on where it leads (nginx decodes `%2F` and climbs, Apache
refuses it), so no check could stand for all of them. A crawl keeps that
URL as the page's address (relative links resolve against it) and
de-duplicates by `crawl_key`: the page key of the cleaned URL
(`ritrag.urls.normalize_url`: `index.html`, trailing slashes).

Scope, by default, is the seeds' own hosts and path prefixes (the directory of
each seed's path); `--include` regexes widen it, `--exclude` regexes narrow it.
A URL is in scope iff its cleaned form is.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

import httpx

from ritrag.urls import WEB_SCHEMES, directory_of, normalize_url, remove_dot_segments, without_tracking_params

# A host name as httpx spells it (lowercase, IDNA-encoded); IPv6 literals are checked by `ipaddress`.
HOST_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?")
PERCENT_ENCODED = re.compile(r"%([0-9A-Fa-f]{2})")
UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")  # RFC 3986 2.3
ENCODED_SLASH = re.compile(r"%2F|%5C", re.IGNORECASE)  # "/" or "\" percent-encoded


class BadUrl(ValueError):
    """A URL that cannot be crawled (malformed, not http(s), no host)."""


def _decode_unreserved(path: str) -> str:
    return PERCENT_ENCODED.sub(lambda m: chr(int(m[1], 16)) if chr(int(m[1], 16)) in UNRESERVED else m[0], path)


def _dots_behind_encoded_slash(path: str) -> bool:
    """Whether a segment holding an encoded slash has a "." or ".." piece between its slashes."""
    return any(piece in (".", "..") for segment in path.split("/") if ENCODED_SLASH.search(segment)
               for piece in ENCODED_SLASH.split(segment))


def _valid_host(host: str) -> bool:
    if ":" in host:
        try:
            return ipaddress.ip_address(host).version == 6
        except ValueError:
            return False
    return bool(HOST_NAME.fullmatch(host))


def clean_url(url: str) -> str:
    """The URL to fetch, check and record (module docstring); raises BadUrl for
    anything that is not an absolute http(s) URL with a valid host and port."""
    text = url.strip()
    if not text or any(ch.isspace() for ch in text):
        raise BadUrl(f"not a URL: {url!r}")
    try:
        parsed = httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise BadUrl(f"malformed URL {url!r}: {exc}") from None
    if parsed.scheme not in WEB_SCHEMES:
        raise BadUrl(f"not an http(s) URL: {url!r}")
    if not parsed.host or not _valid_host(parsed.host):
        raise BadUrl(f"no valid host in URL: {url!r}")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise BadUrl(f"port out of range in URL: {url!r}")
    path, _, query = parsed.raw_path.decode("ascii").partition("?")
    path = _decode_unreserved(path).replace("\\", "/")
    if _dots_behind_encoded_slash(path):
        raise BadUrl(f"dot segments behind an encoded slash in URL: {url!r}")
    path = remove_dot_segments(path)
    query = without_tracking_params(query)
    netloc = parsed.netloc.decode("ascii")
    return str(httpx.URL(f"{parsed.scheme}://{netloc}{path}" + (f"?{query}" if query else "")))


def crawl_key(url: str) -> str:
    """The de-duplication key of a (cleaned) URL."""
    return normalize_url(clean_url(url))


def seed_prefix(seed: str) -> str:
    """The scope a seed opens by default: its host and the directory of its path."""
    return directory_of(clean_url(seed))


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
        """Whether the cleaned form of `url` is in scope; raises BadUrl."""
        url = clean_url(url)
        if any(re.search(p, url) for p in self.exclude):
            return False
        return url.startswith(self.prefixes) or any(re.search(p, url) for p in self.include)

"""URLs: the one place they are normalized, resolved and split.

* `normalize_url` is the key of a page: the one spelling that recognises the
  same page under different spellings (pages are de-duplicated and node ids
  derived from it). Tracking parameters (`TRACKING_PARAM`: `utm_source`,
  `gclid`, ...) say where a visitor came from, never which page is shown, so
  the key drops them (`without_tracking_params`): a link carrying them names
  the page without them.
* `site_of` is the key of a site (a forest root): scheme, host and the first
  `site_depth` path segments.
* `resolve` makes a link absolute against its page and never raises: an href
  that does not resolve to a URL (`http://[broken/x`, a port that is not a
  number) gives None, so one bad link costs its page that link and nothing more.
* `remove_dot_segments` is RFC 3986 5.2.4, the path a server reads.
* `directory_of` and `origin_of` are the directory a page's relative links
  resolve in and the `scheme://host[:port]` a crawl is polite to.
* The schemes: `WEB_SCHEMES` are what a page on the web is at; `PAGE_SCHEMES`
  also admit `file:`, which a local mirror's pages and links may use.

The crawl's own spelling of a URL (`ritrag.transforms.crawl.scope.clean_url`)
is httpx's serialization, so that what is checked is what the HTTP client sends;
it lives with the crawler, which alone depends on httpx. It drops the tracking
parameters with this module's `without_tracking_params`, and its
de-duplication key `crawl_key` is this module's `normalize_url` of it, so the
relation link resolution relies on holds: `normalize_url(u) ==
normalize_url(clean_url(u))` for the URLs pages link by (nothing httpx would
percent-encode or IDNA-encode, no percent-encoded unreserved characters or
backslashes, which only the crawl reads): a text link with `?utm_source=`
names the crawled page's node (tests/test_url_spelling.py).

Why not w3lib (Scrapy's URL library): `canonicalize_url` sorts query
arguments, percent-encodes paths and keeps `index.html` and trailing slashes,
and `safe_url_string` percent-encodes too, so either would change the key of
every page whose URL has a query, a non-ASCII path or a directory index, and so
its node id; both raise on `http://[broken/x` like `urljoin`. What they would
give here is the standard library's `urllib.parse` plus rules this module
states anyway.
"""
from __future__ import annotations

import posixpath
import re
from urllib.parse import SplitResult, unquote_plus, urljoin, urlsplit, urlunsplit

WEB_SCHEMES = ("http", "https")
PAGE_SCHEMES = (*WEB_SCHEMES, "file")

# File names that stand for their directory. `default.html` is left out: on
# documentation sites it is often a page of its own beside `index.html`
# (merging the two would lose one); a server that really serves it as the
# directory index names it by its canonical link, which the forest honours.
_INDEX_FILES = ("index.html", "index.htm", "index.php")
_DEFAULT_PORTS = (("http", 80), ("https", 443))
# Query parameters that mark where a visitor came from, never which page is shown.
TRACKING_PARAM = re.compile(r"^(utm_[a-z]+|gclid|dclid|fbclid|msclkid|yclid|mc_cid|mc_eid|_ga|_gl|ref_src)$",
                            re.IGNORECASE)


def without_tracking_params(query: str) -> str:
    """A query string without its tracking parameters (TRACKING_PARAM, the name
    read as `parse_qsl` reads it: percent-decoded, `+` a space); every other
    parameter kept as written, in order, so a query without tracking
    parameters is returned unchanged."""
    if not query:
        return query
    pieces = query.split("&")
    kept = [p for p in pieces if not TRACKING_PARAM.match(unquote_plus(p.partition("=")[0]))]
    return query if len(kept) == len(pieces) else "&".join(kept)


# A URL that normalize_url returns as it is: a lower-case web origin without
# port or user info (or file:// without host), then "/" or non-empty segments
# of plain characters that are no dot segments, no query or fragment (the
# trailing index file is checked apart). Most URLs a job keys, every input
# file's and most links', are of this form: one match instead of a split, a
# normalization and a join (~20 us, a million times in an update).
_PLAIN_SEGMENT = r"(?!\.\.?(?:/|$))[A-Za-z0-9_.~!$&'()*+,;=%-]+"  # no dot segment, nothing to encode
_NORMAL_FORM = re.compile(r"(?P<origin>https?://[a-z0-9-]+(?:\.[a-z0-9-]+)*|file://)"
                          rf"(?P<path>/|(?:/{_PLAIN_SEGMENT})+)")
_PLAIN_NAME = re.compile(_PLAIN_SEGMENT)


def _in_normal_form(url: str) -> re.Match | None:
    """The origin and path of `url` where normalize_url returns it as it is."""
    match = _NORMAL_FORM.fullmatch(url)
    return match if match and url[url.rfind("/") + 1:].lower() not in _INDEX_FILES else None


def is_normal_form(url: str) -> bool:
    """Whether `url` is of the form normalize_url returns as it is: a
    lower-case web or file origin, then segments of plain characters (no
    query, fragment or dot segment), the last no index file."""
    return _in_normal_form(url) is not None


def is_plain_segment(name: str) -> bool:
    """Whether a URL in normal form + "/" + `name` is in normal form too: the
    segment a file name adds to its folder's URL where normalize_url changes
    nothing (no dot segment, no character to encode, no index file)."""
    return _PLAIN_NAME.fullmatch(name) is not None and name.lower() not in _INDEX_FILES


def normalize_url(url: str) -> str:
    """Canonical form used to recognise the same page under different spellings.

    Lowercases scheme and host, drops fragments, default ports, `index.html`-style
    file names, trailing slashes and tracking parameters, and resolves `.`/`..`
    segments. The rest of the query string is kept as written: on many sites it
    selects a different page.
    """
    if _in_normal_form(url):
        return url
    parts = urlsplit(url.strip())
    scheme, host = _origin(parts)
    path = parts.path or "/"
    path = posixpath.normpath(path) if path not in ("", "/") else "/"
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    head, tail = posixpath.split(path)
    if tail.lower() in _INDEX_FILES:
        path = head
    path = path.rstrip("/") or "/"
    return urlunsplit((scheme, host, path, without_tracking_params(parts.query), ""))


def _origin(parts: SplitResult) -> tuple[str, str]:
    """(scheme, host[:port]) of a split URL as `normalize_url` spells them:
    lower case, no user info, no default port."""
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:  # an IPv6 address, which `hostname` gives without its brackets
        host = f"[{host}]"
    if parts.port and (scheme, parts.port) not in _DEFAULT_PORTS:
        host = f"{host}:{parts.port}"
    return scheme, host


def path_segments(url: str) -> list[str]:
    """The non-empty segments of a URL's path, as written (percent-encoded)."""
    return [s for s in urlsplit(url).path.split("/") if s]


def site_of(url: str, site_depth: int = 0) -> str:
    """Normalized URL of the site (forest root) that `url` belongs to: scheme, host
    and the first `site_depth` path segments (products hosted side by side under
    one host, `docs.example.com/<product>/...`, want `site_depth=1`)."""
    normal = _in_normal_form(url)
    if normal:  # an update asks the site of every input file's URL: string cuts, no split
        segments = normal["path"].split("/")[1:site_depth + 1]
        return normal["origin"] + "/" + "/".join(segments)
    if site_depth == 0:
        # The origin alone, which normalizing the path cannot change (a full normalization cost 2x).
        return urlunsplit((*_origin(urlsplit(url.strip())), "/", "", ""))
    normalized = normalize_url(url)
    parts = urlsplit(normalized)
    segments = path_segments(normalized)[:site_depth]
    path = "/" + "/".join(segments) if segments else "/"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def resolve(base: str, href: str) -> str | None:
    """`href` (surrounding blanks dropped) made absolute against `base`, as written
    (not normalized, any scheme); None when either does not read as a URL."""
    try:
        absolute = urljoin(base, href.strip())
        urlsplit(absolute).port  # raises on a port that is not a number in 0-65535
    except ValueError:  # urlsplit refuses e.g. an unbalanced "[" in the host
        return None
    return absolute


def is_web_url(url: str) -> bool:
    """Whether `url` is an absolute http(s) URL with a host, whose parts read
    (so that `normalize_url` takes it)."""
    try:
        parts = urlsplit(url)
        parts.port  # raises on a port that is not a number in 0-65535
    except ValueError:
        return False
    return parts.scheme in WEB_SCHEMES and bool(parts.netloc)


def remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4 for an absolute path (one starting with "/"), in one pass
    over its segments: "." dropped, ".." drops the segment before it (never
    above the root), a path ending in "." or ".." keeps its final slash."""
    segments = path.split("/")[1:]
    kept: list[str] = []
    for segment in segments:
        if segment == "..":
            if kept:
                kept.pop()
        elif segment != ".":
            kept.append(segment)
    if segments and segments[-1] in (".", ".."):
        kept.append("")
    return "/" + "/".join(kept)


def directory_of(url: str) -> str:
    """`url` without its file name, query and fragment: where its relative links resolve."""
    parts = urlsplit(url)
    directory = parts.path[: parts.path.rfind("/") + 1] or "/"
    return urlunsplit((parts.scheme, parts.netloc, directory, "", ""))


def origin_of(url: str) -> str:
    """`scheme://host[:port]` of a URL."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"

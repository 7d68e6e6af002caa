"""ritrag.urls: the page key, the site key, link resolution that never raises."""
from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ritrag.urls import (directory_of, is_web_url, normalize_url, origin_of, path_segments, remove_dot_segments,
                         resolve, site_of)


@pytest.mark.parametrize("href", ["http://[broken/x", "http://[::1/x", "http://h:port/x", "http://h:99999/x"])
def test_a_href_that_is_not_a_url_resolves_to_none(href):
    assert resolve("https://docs.example.com/a/b.html", href) is None
    assert resolve(href, "c.html") is None  # nor does anything resolve against it


def test_resolve_keeps_what_it_is_given_but_makes_it_absolute():
    base = "https://docs.example.com/a/b.html?q=1"
    assert resolve(base, "  c.html ") == "https://docs.example.com/a/c.html"
    assert resolve(base, "../d/index.html#x") == "https://docs.example.com/d/index.html#x"
    assert resolve(base, "mailto:a@example.com") == "mailto:a@example.com"  # schemes are the caller's to judge


def test_page_key_and_site_key():
    assert normalize_url("HTTPS://Docs.Example.com:443/a/./b/../c/index.html?x=1#frag") == \
        "https://docs.example.com/a/c?x=1"
    assert normalize_url("http://docs.example.com:8080/a/") == "http://docs.example.com:8080/a"
    assert site_of("https://docs.example.com/prod/guide/x.html", 1) == "https://docs.example.com/prod"
    assert site_of("https://docs.example.com/prod/guide/x.html") == "https://docs.example.com/"
    # an IPv6 host keeps its brackets (without them the address reads as a port)
    assert normalize_url("http://[2001:DB8::1]:8080/a/") == "http://[2001:db8::1]:8080/a"
    assert normalize_url("https://user@[::1]:443/x/index.html") == "https://[::1]/x"
    assert site_of("http://[::1]:8080/docs/x.html", 1) == site_of(normalize_url("http://[::1]:8080/docs/x.html"), 1) \
        == "http://[::1]:8080/docs"
    assert site_of("http://[::1]/x.html") == "http://[::1]/"


def test_url_parts():
    assert path_segments("https://h/a//b%20c/") == ["a", "b%20c"]
    assert directory_of("https://h/a/b.html?q#f") == "https://h/a/"
    assert directory_of("https://h") == "https://h/"
    assert origin_of("https://h:8443/a/b") == "https://h:8443"
    assert remove_dot_segments("/a/b/../../../c/.") == "/c/"
    assert [is_web_url(u) for u in ("https://h/x", "file:///x", "http:///x", "http://[broken/x", "/x")] == [
        True, False, False, False, False]


@pytest.mark.parametrize("url", [
    "https://Docs.Example.COM/a/b.html", "HTTP://example.com:80/x", "https://example.com:443", "http://example.com:8080",
    "https://user:pw@Example.com:8443/p?q=1#f", "  https://example.com/../../a  ", "file:///srv/docs/index.html",
    "https://example.com//double//slash/", "https://example.com/index.html", "mailto:a@b.c",
    "relative/path.html", "", "https://example.com/?utm_source=x", "http://[::1]:8080/x", "https://[FE80::1]/",
])
def test_site_of_depth_zero_is_the_normalized_origin(url):
    """site_of(url, 0) takes the origin without normalizing the path: the same
    answer as the site of the normalized URL."""
    normalized = normalize_url(url)
    assert site_of(url) == site_of(normalized) == urlunsplit((*urlsplit(normalized)[:2], "/", "", ""))


# Pieces that each change what normalize_url does (case, ports, user info, dot
# and empty segments, index files, queries, fragments, percent-encodings, odd
# characters), so that random URLs reach both its full path and its shortcut for
# URLs already in normal form.
_ORIGINS = st.sampled_from(["http://example.com", "https://docs.example.org", "HTTP://Example.COM",
                            "https://example.com:443", "http://example.com:8080", "http://user@example.com",
                            "file://", "file://host", "https://exa_mple.com", "http://[::1]:8080",
                            "http://example.com.", "ftp://example.com", " https://example.com"])
_SEGMENTS = st.sampled_from(["a", "B", "docs", "v1.2", ".", "..", "...", "", "index.html", "INDEX.HTM",
                             "index.php", "default.html", "%2e", "%7E", "a%20b", "x;y", "a:b", "a@b", "~u",
                             "é", "a b", "(x)", "a+b", "*", ".hidden", "a\\b", "a\tb"])
_TAILS = st.sampled_from(["", "", "/", "?q=1", "?utm_source=x", "#frag", "?", "#", "?a=1&gclid=2"])


@settings(max_examples=3000, deadline=None)
@given(_ORIGINS, st.lists(_SEGMENTS, max_size=5), _TAILS)
def test_a_url_already_in_normal_form_normalizes_as_any_other(origin, segments, tail):
    """normalize_url returns a URL it recognises as normal as it is, and
    site_of cuts its site from it; that is what the full normalization gives
    (a leading space, which normalizing strips, takes the full path)."""
    url = origin + "".join("/" + s for s in segments) + tail
    assert normalize_url(url) == normalize_url(" " + url)
    for depth in (0, 1, 2):
        assert site_of(url, depth) == site_of(" " + url, depth)

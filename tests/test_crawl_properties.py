"""Property-based tests of the crawler's faces to a hostile site: response
headers (Retry-After, Content-Encoding, Content-Length, Location, any value)
never raise out of the fetch, retry and redirect helpers; links (any relative
or absolute href against a page in a scope) clean to one stable URL that is
exactly what httpx sends, with no dot segment, and scope decides on it.

Derandomized with bounded example counts, so the suite is fast and a failure
reproduces."""
from __future__ import annotations

from html import escape
from urllib.parse import unquote, urljoin, urlsplit

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from ritrag.transforms.crawl.crawldb import CrawlTarget
from ritrag.transforms.crawl.downloader import OUTCOMES, FetchPolicy, fetch, retry_after_s
from ritrag.transforms.crawl.links import page_links
from ritrag.transforms.crawl.round import CrawlConfig, Outcome, fetch_robots, follow_ups
from ritrag.transforms.crawl.scope import BadUrl, Scope, clean_url

FAST = settings(derandomize=True, max_examples=200, deadline=None, database=None)
PAGE = "http://docs.example.com/docs/guide/page.html"
SCOPE = Scope.for_seeds([PAGE], exclude=[r"/private/"])
POLICY = FetchPolicy("prop-bot", timeout_s=5, max_bytes=4096, retries=1, backoff_s=0, max_retry_after_s=5)

# Header values as a server may send them: any text without line breaks (httpx
# decodes header bytes as UTF-8 or Latin-1), and the tricky ones by name.
header_values = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x00"),
                        max_size=40) | st.sampled_from(
    ["²", "٣", "1e308", "9" * 400, "-1", " 7 ", "Wed, 21 Oct 2015 07:28:00 GMT", "Mon, 01 Jan 99999 00:00:00 GMT",
     "gzip, gzip", "zstd", "br", "identity", "x-gzip", "GZIP , identity",
     "http://[broken/x", "//[::1", "http://h:99999/",
     "javascript:alert(1)", "/docs/../../etc/passwd", "\\\\evil\\x", "http://u@127.0.0.1:1/"])
statuses = st.sampled_from([200, 301, 302, 303, 307, 308, 304, 404, 410, 429, 500, 503, 418])
bodies = st.binary(max_size=64) | st.sampled_from([b"\x1f\x8b\x08\x00garbage", b"\x1f\x8b" + b"\x00" * 30])


def answer(status: int, headers: dict[str, str], body: bytes):
    """A MockTransport handler giving this answer (headers as the UTF-8 bytes a server sends)."""
    raw = [(name.encode(), value.encode()) for name, value in headers.items()]
    return lambda request: httpx.Response(status, headers=raw, stream=httpx.ByteStream(body))


@FAST
@given(status=statuses, body=bodies,
       headers=st.dictionaries(st.sampled_from(["Retry-After", "Content-Encoding", "Content-Length", "Location"]),
                               header_values, max_size=4))
def test_any_header_value_gives_an_outcome_never_an_exception(status, body, headers):
    client = httpx.Client(transport=httpx.MockTransport(answer(status, headers, body)))
    result = fetch(client, PAGE, POLICY, accept_any=True, sleep=lambda s: None)
    assert result.outcome in OUTCOMES and 1 <= result.attempts <= POLICY.retries + 1
    assert len(result.body) <= POLICY.max_bytes
    outcome = Outcome(CrawlTarget(PAGE), result.outcome, result)
    for link in follow_ups(outcome, [], CrawlConfig(POLICY, SCOPE)):  # a redirect's target, when it is one
        assert clean_url(link.target.url) == link.target.url and SCOPE.allows(link.target.url)


@FAST
@given(value=header_values)
def test_retry_after_is_a_bounded_delay_or_nothing(value):
    delay = retry_after_s(value, 1_700_000_000.0)
    assert delay is None or delay >= 0


@FAST
@given(locations=st.lists(header_values, min_size=1, max_size=7))
def test_robots_redirects_never_raise_and_never_leave_the_host(locations):
    host = "http://docs.example.com"
    asked: list[str] = []

    def fetch_one(url: str, **kwargs):
        asked.append(url)
        status, headers = (302, {"Location": locations[len(asked) - 1]}) if len(asked) <= len(locations) else (404, {})
        client = httpx.Client(transport=httpx.MockTransport(answer(status, headers, b"")))
        return fetch(client, url, POLICY, **kwargs)

    rules, outcomes = fetch_robots(fetch_one, host)
    assert len(outcomes) == len(asked) <= 6 and all(url.startswith(host + "/") for url in asked)
    assert rules.policy in ("allow_all", "disallow_all", "rules")


# Links: relative and absolute hrefs built from the pieces that confuse URL
# handling (dot segments plain and encoded, backslashes, case, empty segments,
# queries, fragments, odd hosts and ports), and arbitrary text.
pieces = st.sampled_from([".", "..", "%2e", "%2E%2e", ".%2E", "docs", "Docs", "guide", "private", "", "\\", "..\\",
                          "%2f", "%5C", "..%2F..", "%2e%2e%5c", "é", "a;b", "%", "%zz", "~u", "%7E", "index.html",
                          "?q=1", "?utm_source=x",
                          "#top", ":", "@"])
prefixes = st.sampled_from(["", "/", "//", "./", "../", "http://docs.example.com/", "HTTP://DOCS.example.com:80/",
                            "https://docs.example.com:443/", "http://other.example/", "http://[::1]:8080/",
                            "http://docs.example.com:99999/", "http://[broken/", "ftp://docs.example.com/",
                            "http://u:p@docs.example.com/", "//docs.example.com/docs/"])
hrefs = st.builds(lambda prefix, parts: prefix + "/".join(parts), prefixes, st.lists(pieces, max_size=8)) | st.text(
    max_size=30)


def resolved(href: str) -> str | None:
    try:
        return urljoin(PAGE, href)
    except ValueError:
        return None


@FAST
@given(href=hrefs)
def test_a_cleaned_link_is_stable_dot_free_what_httpx_sends_and_what_scope_judges(href):
    url = resolved(href)
    if url is None:
        return
    try:
        clean = clean_url(url)
    except BadUrl:
        try:
            SCOPE.allows(url)
        except BadUrl:
            return
        raise AssertionError(f"scope judged {url!r}, which does not clean")
    assert clean_url(clean) == clean
    parts = urlsplit(clean)
    assert not {".", ".."} & {unquote(segment) for segment in parts.path.split("/")}
    sent = httpx.URL(clean)
    assert str(sent) == clean and sent.raw_path.decode() == parts.path + (f"?{parts.query}" if parts.query else "")
    assert SCOPE.allows(url) == SCOPE.allows(clean)


@FAST
@given(hrefs=st.lists(hrefs, max_size=6), base=st.none() | hrefs)
def test_page_links_never_raise_and_count_what_they_skip(hrefs, base):
    head = "" if base is None else f'<base href="{escape(base)}">'
    body = ("<html><head>" + head + "</head><body>" + "".join(f'<a href="{escape(h)}">x</a>' for h in hrefs)).encode()
    links = page_links(body, PAGE)
    assert len(links.links) + links.malformed <= len(hrefs) + 1

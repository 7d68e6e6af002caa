"""Pure functions of the crawl: scope and URL cleaning, robots policy, sitemaps,
links, content classification, retry delays, WARC round trip and damage."""
from __future__ import annotations

import gzip

import httpx
import pytest

from ritrag.transforms.crawl.crawldb import CrawlTarget, Generate, cut_point, schedule_order, target_record
from ritrag.transforms.crawl.downloader import (DECODE_CHUNK, FetchPolicy, FetchResult, fetch, gunzip_chunks,
                                                retry_after_s, retry_delay)
from ritrag.transforms.crawl.links import page_links
from ritrag.transforms.crawl.robots import ALLOW_ALL, DISALLOW_ALL, RULES, robots_rules
from ritrag.transforms.crawl.round import HostGate, Link, RecentLinks
from ritrag.transforms.crawl.scope import BadUrl, Scope, clean_url, crawl_key, seed_prefix
from ritrag.transforms.crawl.sitemaps import InvalidSitemap, parse_sitemap
from ritrag.transforms.crawl.warc_writer import WarcFileWriter
from ritrag.transforms.sources.sniff import web_kind
from ritrag.transforms.sources.record_source import split_record_source
from ritrag.transforms.sources.warc import read_record, read_warc_pages


@pytest.mark.parametrize("bad", ["", "not a url", "ftp://x/y", "http://", "http://host:port/", "mailto:a@b"])
def test_clean_url_refuses_malformed(bad):
    with pytest.raises(BadUrl):
        clean_url(bad)


def test_clean_url_and_key():
    assert clean_url("HTTP://Docs.Example.COM/a/b.html?utm_source=x&v=2#frag") == "http://docs.example.com/a/b.html?v=2"
    assert crawl_key("http://h:80/a/index.html") == crawl_key("http://h/a/") == crawl_key("http://h/a")
    assert crawl_key("http://h/a?gclid=1") == crawl_key("http://h/a")


def test_scope_prefix_include_exclude():
    assert seed_prefix("https://h/docs/guide/start.html") == "https://h/docs/guide/"
    scope = Scope.for_seeds(["https://h/docs/"], include=[r"^https://h/api/"], exclude=[r"/old/"])
    assert scope.allows("https://h/docs/x.html")
    assert scope.allows("https://h/api/y.html")
    assert not scope.allows("https://h/docs/old/x.html")
    assert not scope.allows("https://other/docs/x.html")
    assert not scope.allows("https://h/blog/x.html")
    with pytest.raises(ValueError):
        Scope.for_seeds(["https://h/"], include=["("])


def test_robots_policy():
    rules = robots_rules(200, "text/plain", b"User-agent: *\nDisallow: /private/\nCrawl-delay: 2\nSitemap: http://h/s.xml\n")
    assert rules.policy == RULES
    assert not rules.allows("http://h/private/x", "bot") and rules.allows("http://h/public", "bot")
    assert rules.crawl_delay("bot") == 2.0 and rules.sitemaps() == ["http://h/s.xml"]
    assert robots_rules(503).policy == DISALLOW_ALL
    assert robots_rules(429).policy == DISALLOW_ALL
    assert robots_rules(None).policy == DISALLOW_ALL
    assert robots_rules(404).policy == ALLOW_ALL
    html = robots_rules(200, "text/html", b"<!doctype html><html>home</html>")
    assert html.policy == ALLOW_ALL and html.reason == "robots_html"


def test_sitemaps_plain_gzip_index_and_invalid():
    urlset = b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc> http://h/a </loc></url></urlset>'
    assert parse_sitemap(urlset).pages == ("http://h/a",)
    assert parse_sitemap(gzip.compress(urlset)).pages == ("http://h/a",)
    index = b'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><sitemap><loc>http://h/s.xml.gz</loc></sitemap></sitemapindex>'
    assert parse_sitemap(index).sitemaps == ("http://h/s.xml.gz",)
    for bad in (b"<html><body>not a sitemap</body></html>", b"<urlset><url>", b"\x1f\x8bnot gzip", b""):
        with pytest.raises(InvalidSitemap):
            parse_sitemap(bad)
    with pytest.raises(InvalidSitemap):  # a gzip bomb: refused once past the cap
        parse_sitemap(gzip.compress(b"<urlset>" + b" " * 10_000 + b"</urlset>"), max_bytes=1000)


def test_page_links_and_canonical():
    html = (b'<html><head><link rel="canonical" href="/c.html"></head><body>'
            b'<a href="b.html#x">b</a><a href="mailto:x@y">m</a><a rel="nofollow" href="n.html">n</a>'
            b'<a href="https://other/z">z</a></body></html>')
    page = page_links(html, "http://h/d/a.html")
    assert page.canonical == "http://h/c.html" and page.malformed == 0
    assert page.links == ["http://h/d/b.html#x", "https://other/z", "http://h/c.html"]


def test_the_crawler_keeps_what_the_one_sniffer_reads_as_a_web_page():
    assert web_kind(b"", "text/html; charset=utf-8") == "html"
    assert web_kind(b"", "application/pdf") == "pdf"
    assert web_kind(b"%PDF-1.7", "") == "pdf"
    assert web_kind(b"<!DOCTYPE html><html>", "application/octet-stream") == "html"
    assert web_kind(b"\xef\xbb\xbf<!DOCTYPE html><html>", "text/plain") == "html"  # a BOM before the doctype
    assert web_kind(b"junk\n%PDF-1.7", "application/octet-stream") == "pdf"  # bytes before the header
    assert web_kind(b"{}", "application/json") is None


def test_retry_delays():
    policy = FetchPolicy("bot", retries=2, backoff_s=0.5, max_retry_after_s=10)
    assert [retry_delay(a, policy, None) for a in (1, 2, 3)] == [0.5, 1.0, None]
    assert retry_delay(1, policy, 3.0) == 3.0
    assert retry_delay(1, policy, 60.0) is None  # longer than we wait: give up
    assert retry_after_s("7", 0) == 7.0
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT", 1445412470.0) == pytest.approx(10.0)


def test_fetch_retries_then_succeeds_and_caps_size():
    """(Bodies as streams: fetch reads the raw stream, as a network transport gives it.)"""
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if request.url.path == "/big":
            return httpx.Response(200, headers={"content-type": "text/html"},
                                  stream=httpx.ByteStream(b"x" * 5000))
        if len(calls) == 1:
            return httpx.Response(503, headers={"retry-after": "0"})
        return httpx.Response(200, headers={"content-type": "text/html", "etag": '"e1"'},
                              stream=httpx.ByteStream(b"<html>ok</html>"))

    client = httpx.Client(transport=httpx.MockTransport(handler))
    policy = FetchPolicy("bot", max_bytes=1000, backoff_s=0.0)
    result = fetch(client, "http://h/a", policy, etag='"e0"', sleep=lambda s: None)
    assert (result.outcome, result.attempts, result.etag, result.body) == ("fetched", 2, '"e1"', b"<html>ok</html>")
    assert calls[0].headers["if-none-match"] == '"e0"' and calls[0].headers["user-agent"] == "bot"
    assert fetch(client, "http://h/big", policy).outcome == "too_large"


def test_gunzip_chunks_bounded_pieces_members_and_trailing_bytes():
    bomb = gzip.compress(bytes(10 * DECODE_CHUNK + 5))
    pieces = gunzip_chunks(bomb[i:i + 7] for i in range(0, len(bomb), 7))
    assert max(len(p) for p in pieces) <= DECODE_CHUNK
    two = gzip.compress(b"one ") + gzip.compress(b"two")
    assert b"".join(gunzip_chunks(iter([two[:21], two[21:]]))) == b"one two"  # a member split anywhere
    assert b"".join(gunzip_chunks(iter([gzip.compress(b"page") + b"\0" * 8]))) == b"page"  # padding ends the body


def test_host_gate_spaces_request_starts():
    slept = []
    gate = HostGate(0.5, sleep=slept.append)
    gate.wait(), gate.wait(), gate.wait()
    assert len(slept) == 2 and slept[1] > slept[0] > 0.4


def _result(url: str, body: bytes) -> FetchResult:
    return FetchResult(url=url, outcome="fetched", http_status=200, body=body, fetched_at="2024-01-01T00:00:00Z",
                       request_headers=(("Host", "h"),),
                       response_headers=(("Content-Type", "text/html"), ("Content-Length", str(len(body)))))


def test_warc_round_trip_is_deterministic(tmp_path):
    outs = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        writer = WarcFileWriter(str(tmp_path / run), "x", max_file_bytes=1500)
        stored = [writer.write(_result(f"http://h/{i}.html", b"<html>%d</html>" % i * 100)) for i in range(3)]
        writer.close()
        outs.append([(tmp_path / run / f).read_bytes() for f in writer.files])
    assert outs[0] == outs[1] and len(outs[0]) >= 2  # rolled by size, same bytes
    pages = [p for f in sorted((tmp_path / "a").iterdir()) for p in read_warc_pages(str(f), 1 << 20)]
    assert [p.url for p in pages] == ["http://h/0.html", "http://h/1.html", "http://h/2.html"]
    again = read_record(pages[1].source, 1 << 20)
    assert again.payload == pages[1].payload == b"<html>1</html>" * 100
    assert split_record_source(pages[1].source).warc_offset == stored[1].offset


def test_damaged_warc_is_dead_lettered_with_file_and_offset(tmp_path):
    writer = WarcFileWriter(str(tmp_path), "x", max_file_bytes=10 ** 9)
    stored = [writer.write(_result(f"http://h/{i}.html", b"<html>%d</html>" % i * 100)) for i in range(2)]
    writer.close()
    data = (tmp_path / writer.files[0]).read_bytes()
    cut = tmp_path / "cut.warc.gz"
    cut.write_bytes(data[:-200])
    out = list(read_warc_pages(str(cut), 1 << 20))
    assert [p.url for p in out[:-1]] == ["http://h/0.html"]
    assert out[-1].reason == "bad_warc" and out[-1].source.startswith(str(cut) + "#")
    assert int(out[-1].source.rsplit("#", 1)[1]) > stored[0].offset
    junk = tmp_path / "junk.warc.gz"
    junk.write_bytes(b"<html>not a warc</html>")
    (letter,) = read_warc_pages(str(junk), 1 << 20)
    assert letter.source == f"{junk}#0" and letter.reason == "bad_warc"


def test_cut_point():
    hist = [((1, 5), 3), ((0, 9), 2), ((1, 2), 4)]
    assert cut_point(hist, 9) is None and cut_point(hist, 100) is None
    assert cut_point(hist, 2) == ((1, 2), 0)
    assert cut_point(hist, 4) == ((1, 2), 2)
    assert cut_point(hist, 0) == ((0, 9), 0)


def test_generate_dedupes_prefers_spelling_and_caps_exactly():
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    links = [target_record(CrawlTarget(f"http://h/p{i}.html", depth=1 + i % 3), "link") for i in range(60)]
    links += [target_record(CrawlTarget("http://h/p1.html?utm_source=x", depth=1), "sitemap"),  # same key as p1
              target_record(CrawlTarget("http://h/p2.html", depth=0), "link"),  # a second spelling, shallower
              target_record(CrawlTarget("http://h/old.html", depth=1), "link")]
    expected_all = {r["url"]: r for r in links if r["url"] not in ("http://h/old.html",)}
    expected_all["http://h/p1.html"] = links[60]  # the sitemap spelling wins over the link
    expected_all.pop("http://h/p1.html?utm_source=x")
    expected_all["http://h/p2.html"] = links[61]  # same via: the shallower one
    ordered = sorted(expected_all.values(), key=lambda r: (schedule_order(r), r["url"]))
    for room, want in ((1000, ordered), (25, ordered[:25]), (0, [])):
        with beam.Pipeline("FnApiRunner") as p:
            got = p | beam.Create(links) | Generate(p | "S" >> beam.Create(["http://h/old.html"]),
                                                     p | "R" >> beam.Create([room]))
            assert_that(got | beam.Map(lambda r: (r["url"], r["via"], r["depth"])),
                        equal_to([(r["url"], r["via"], r["depth"]) for r in want]))


def test_recent_links_drop_repeats_but_pass_better_spellings():
    recent = RecentLinks(size=2)
    assert recent.admit(Link(CrawlTarget("http://h/a", depth=2), "link"))
    assert not recent.admit(Link(CrawlTarget("http://h/a", depth=2), "link"))
    assert recent.admit(Link(CrawlTarget("http://h/a", depth=1), "sitemap"))  # better: passes
    assert not recent.admit(Link(CrawlTarget("http://h/a/index.html", depth=3), "link"))  # same key, worse
    assert recent.admit(Link(CrawlTarget("http://h/b", depth=1), "link"))
    assert recent.admit(Link(CrawlTarget("http://h/c", depth=1), "link"))  # evicts a
    assert recent.admit(Link(CrawlTarget("http://h/a", depth=5), "link"))  # forgotten: passes again

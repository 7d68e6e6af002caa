"""The crawler against a hostile site (tests/crawl_site.py `HostileSite`, raw
sockets on 127.0.0.1 and 127.0.0.3): one test per way issue 25 found to steer
it (items 1-7). Each runs the crawl's per-host DoFn, `FetchHostFn`, with its own
HTTP client; the site's request log witnesses what was requested. The bombs
(items 5 and 7) run in a subprocess under an address-space limit, which reports
its peak memory."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass

import pytest
import zstandard
from apache_beam.pvalue import TaggedOutput
from warcio.archiveiterator import ArchiveIterator

from crawl_site import HostileSite, raw_response
from ritrag.transforms.crawl.crawldb import CrawlTarget
from ritrag.transforms.crawl.downloader import FetchPolicy, retry_after_s
from ritrag.transforms.crawl.robots import ALLOW_ALL, RULES, RobotsRules, robots_rules
from ritrag.transforms.crawl.round import LINKS, ROBOTS, CrawlConfig, FetchHostFn, Link, Outcome, store_shard
from ritrag.transforms.crawl.scope import Scope
from ritrag.transforms.crawl.warc_writer import WarcFileWriter

AGENT = "hostile-test-bot"
ADDRESS_SPACE = 1536 * 1024 * 1024  # the bombs' subprocess limit (1.5 GiB)
BOMB_BYTES = 256 * 1024 * 1024  # what a bomb inflates to
MAX_BYTES = 1024 * 1024  # the crawl's --max_response_bytes in these tests


def config_for(site: HostileSite, *, timeout_s: float = 2.0, retries: int = 0) -> CrawlConfig:
    policy = FetchPolicy(AGENT, timeout_s=timeout_s, max_bytes=MAX_BYTES, retries=retries, backoff_s=0.01)
    return CrawlConfig(policy, Scope.for_seeds([site.base + "docs/"]), per_host_concurrency=1, per_host_delay_s=0)


@dataclass
class HostRound:
    outcomes: list[Outcome]
    links: list[Link]
    robots: list[RobotsRules]

    def by_path(self, site: HostileSite) -> dict[str, Outcome]:
        return {o.target.url.removeprefix(site.host): o for o in self.outcomes}


def targets(site: HostileSite, *paths: str) -> list[CrawlTarget]:
    return [CrawlTarget(site.host + path) for path in paths]


def crawl_round(site: HostileSite, config: CrawlConfig, round_targets: list[CrawlTarget],
                rules: RobotsRules | None = robots_rules(404)) -> HostRound:
    """One round of the host through FetchHostFn; `rules` None: a host new to
    the crawl (robots.txt and sitemaps are read first)."""
    fn = FetchHostFn(config, {} if rules is None else {site.host: rules})
    fn.setup()
    try:
        items = list(fn.process((site.host, round_targets)))
    finally:
        fn.teardown()
    tagged = [item for item in items if isinstance(item, TaggedOutput)]
    return HostRound([item for item in items if isinstance(item, Outcome)],
                     [t.value for t in tagged if t.tag == LINKS], [t.value[1] for t in tagged if t.tag == ROBOTS])


def page(*hrefs: str) -> bytes:
    return ("<html><body>" + "".join(f'<a href="{h}">x</a>' for h in hrefs) + "</body></html>").encode()


# Items 5 and 7 run FetchHostFn in a subprocess whose address space is limited;
# it prints what happened and how far its peak RSS rose during the round.
MEASURED_ROUND = r"""
import json, resource, sys, time
args = json.loads(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (args["address_space"], args["address_space"]))
from apache_beam.pvalue import TaggedOutput
from ritrag.transforms.crawl.crawldb import CrawlTarget
from ritrag.transforms.crawl.downloader import FetchPolicy
from ritrag.transforms.crawl.robots import robots_rules
from ritrag.transforms.crawl.round import ROBOTS, CrawlConfig, FetchHostFn, Outcome
from ritrag.transforms.crawl.scope import Scope

host = args["host"]
policy = FetchPolicy("hostile-test-bot", timeout_s=10, max_bytes=args["max_bytes"], retries=0)
config = CrawlConfig(policy, Scope.for_seeds([host + "/docs/"]), per_host_concurrency=1, per_host_delay_s=0)
fn = FetchHostFn(config, {} if args["read_robots"] else {host: robots_rules(404)})
fn.setup()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.monotonic()
items = list(fn.process((host, [CrawlTarget(host + p) for p in args["paths"]])))
elapsed = time.monotonic() - start
growth_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
out = {"elapsed_s": elapsed, "peak_growth_mib": growth_mib, "outcomes": {}, "robots": {}}
for item in items:
    if isinstance(item, Outcome):
        error = item.error or (item.result.error if item.result else "")
        out["outcomes"][item.target.url[len(host):]] = [item.status, error, len(item.result.body) if item.result else 0]
    elif isinstance(item, TaggedOutput) and item.tag == ROBOTS:
        rules = item.value[1]
        out["robots"] = {"reason": rules.reason,
                         "allows": {p: rules.allows(host + p, "hostile-test-bot") for p in args["check"]}}
print(json.dumps(out))
"""


def measured_round(site: HostileSite, paths: list[str], *, read_robots: bool = False, check: list[str] = (),
                   max_bytes: int = MAX_BYTES, timeout_s: float = 60) -> dict:
    args = {"host": site.host, "paths": paths, "read_robots": read_robots, "check": list(check),
            "max_bytes": max_bytes, "address_space": ADDRESS_SPACE}
    done = subprocess.run([sys.executable, "-c", MEASURED_ROUND, json.dumps(args)], capture_output=True, text=True,
                          timeout=timeout_s, cwd="/")  # not the repository root: the installed ritrag is imported
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def compressed(compressor, size: int) -> bytes:
    """`size` zero bytes through a streaming `compressor` (never all in memory)."""
    block = bytes(1024 * 1024)
    return b"".join([*(compressor.compress(block) for _ in range(size // len(block))), compressor.flush()])


@pytest.mark.timeout(60)
def test_1_header_drip_cannot_outlast_the_whole_response_deadline():
    def drip(sock):  # one header line every 0.25 s for 10 s: no single read waits long
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n")
        for i in range(40):
            time.sleep(0.25)
            sock.sendall(f"X-Drip-{i}: x\r\n".encode())
        sock.sendall(b"Content-Length: 2\r\n\r\nok")

    with HostileSite({"/docs/drip.html": drip}) as site:
        start = time.monotonic()
        (outcome,) = crawl_round(site, config_for(site, timeout_s=1.0), targets(site, "/docs/drip.html")).outcomes
        elapsed = time.monotonic() - start
    assert outcome.status == "fetch_error" and "timeout" in outcome.result.error
    assert elapsed < 3.0, f"the 1 s deadline held the fetch for {elapsed:.1f} s"


@pytest.mark.timeout(60)
def test_2_a_retry_after_that_is_not_ascii_digits_is_ignored():
    for value in ("²", "٣", "1e3", "-5", "0x10", "Wed, 99 Foo 2015", "Mon, 01 Jan 99999 00:00:00 GMT"):
        assert retry_after_s(value, 0) is None, value
    assert retry_after_s(" 7 ", 0) == 7.0
    busy = raw_response(503, b"busy", {"Retry-After": "²"})
    with HostileSite({"/docs/busy.html": busy}) as site:
        (outcome,) = crawl_round(site, config_for(site, retries=1), targets(site, "/docs/busy.html")).outcomes
    assert (outcome.status, outcome.result.attempts) == ("http_error", 2)  # retried after the backoff, not crashed


@pytest.mark.timeout(60)
def test_3_robots_redirects_are_followed_only_within_the_host():
    elsewhere_robots = raw_response(200, b"User-agent: *\nDisallow: /\n", ctype="text/plain")
    with HostileSite({"/robots.txt": elsewhere_robots}, host="127.0.0.3") as elsewhere:
        off_host = raw_response(302, headers={"Location": elsewhere.base + "robots.txt"})
        with HostileSite({"/robots.txt": off_host, "/docs/a.html": raw_response(200, page())}) as site:
            got = crawl_round(site, config_for(site), targets(site, "/docs/a.html"), rules=None)
        assert elsewhere.log == []  # never requested
    (rules,) = got.robots
    assert rules.policy == ALLOW_ALL  # unavailable robots.txt (RFC 9309 2.3.1.2)
    robots_row = got.by_path(site)["/robots.txt"]
    assert robots_row.error.startswith("robots_redirect_off_host: http://127.0.0.3:")
    assert got.by_path(site)["/docs/a.html"].status == "fetched"

    moved = raw_response(301, headers={"Location": "/robots-moved.txt"})
    rules_text = raw_response(200, b"User-agent: *\nDisallow: /docs/private/\n", ctype="text/plain")
    with HostileSite({"/robots.txt": moved, "/robots-moved.txt": rules_text}) as site:
        (rules,) = crawl_round(site, config_for(site), [], rules=None).robots
    assert rules.policy == RULES and not rules.allows(site.base + "docs/private/x", AGENT)


@pytest.mark.timeout(60)
def test_4_dot_segments_are_resolved_before_scope_and_robots():
    hrefs = ["/docs/../secret.html", "/docs/./private/z.html", "/docs/Private/../private/v.html",
             "/docs/%2e%2E/secret2.html", "..\\secret3.html", "/docs/a/..%2f../secret4.html", "/docs/ok.html"]
    routes = {"/robots.txt": raw_response(200, b"User-agent: *\nDisallow: /docs/private/\n", ctype="text/plain"),
              "/docs/index.html": raw_response(200, page(*hrefs))}
    for path in ("/secret.html", "/secret2.html", "/secret3.html", "/secret4.html", "/docs/private/z.html",
                 "/docs/private/v.html", "/docs/ok.html"):
        routes[path] = raw_response(200, page())
    with HostileSite(routes) as site:
        first = crawl_round(site, config_for(site), targets(site, "/docs/index.html"), rules=None)
        second = crawl_round(site, config_for(site), [link.target for link in first.links], rules=first.robots[0])
    served = set(site.paths())
    assert served == {"/robots.txt", "/sitemap.xml", "/docs/index.html", "/docs/ok.html"}, served
    assert {o.target.url.removeprefix(site.host): o.status for o in second.outcomes} == {
        "/docs/private/z.html": "disallowed", "/docs/private/v.html": "disallowed", "/docs/ok.html": "fetched"}


@pytest.mark.timeout(60)
def test_4_a_malformed_href_is_skipped_and_counted_not_fatal():
    routes = {"/docs/broken.html": raw_response(200, page("http://[broken/x", "/docs/ok.html")),
              "/docs/ok.html": raw_response(200, page())}
    with HostileSite(routes) as site:
        got = crawl_round(site, config_for(site), targets(site, "/docs/broken.html", "/docs/ok.html"))
    broken = got.by_path(site)["/docs/broken.html"]
    assert (broken.status, broken.malformed_links) == ("fetched", 1)
    assert [link.target.url for link in got.links] == [site.base + "docs/ok.html"]
    assert got.by_path(site)["/docs/ok.html"].status == "fetched"


@pytest.mark.timeout(60)
def test_4_a_malformed_href_costs_its_page_that_link_and_nothing_more():
    """A page whose links, <base> and canonical include hrefs that do not parse as
    URLs (a broken IPv6 host, a port that is not a number): the host's other pages
    it links to are still found and fetched in the next round."""
    seed = ('<html><head><base href="http://[broken/"><link rel="canonical" href="http://[broken/c">'
            '</head><body><a href="http://[broken/x">x</a><a href="http://h:port/y">y</a>'
            '<a href="/docs/a.html">a</a><a href="b.html">b</a></body></html>').encode()
    routes = {"/docs/index.html": raw_response(200, seed), "/docs/a.html": raw_response(200, page()),
              "/docs/b.html": raw_response(200, page())}
    with HostileSite(routes) as site:
        first = crawl_round(site, config_for(site), targets(site, "/docs/index.html"))
        second = crawl_round(site, config_for(site), [link.target for link in first.links])
    (index,) = first.outcomes
    assert (index.status, index.canonical_url, index.malformed_links) == ("fetched", "", 4)
    assert {o.target.url.removeprefix(site.host): o.status for o in second.outcomes} == {
        "/docs/a.html": "fetched", "/docs/b.html": "fetched"}


@pytest.mark.timeout(90)
def test_5_stacked_and_unasked_encodings_cannot_inflate_past_the_cap():
    gzip_bomb = compressed(zlib.compressobj(9, zlib.DEFLATED, 31), BOMB_BYTES)
    gzip_gzip = gzip.compress(gzip_bomb)
    zstd_bomb = compressed(zstandard.ZstdCompressor().compressobj(), BOMB_BYTES)
    small = b"<html><body>" + b"fine " * 1000 + b"</body></html>"

    def coded(body: bytes, coding: str) -> bytes:
        return raw_response(200, body, {"Content-Encoding": coding})

    routes = {"/docs/gzip-gzip.html": coded(gzip_gzip, "gzip, gzip"), "/docs/zstd.html": coded(zstd_bomb, "zstd"),
              "/docs/gzip.html": coded(gzip_bomb, "gzip"), "/docs/small.html": coded(gzip.compress(small), "x-gzip")}
    assert len(gzip_gzip) < 1000 and len(zstd_bomb) < 20_000
    with HostileSite(routes) as site:
        got = measured_round(site, sorted(routes))
    outcomes = got["outcomes"]
    assert outcomes["/docs/gzip-gzip.html"][:2] == ["fetch_error", "unsupported Content-Encoding 'gzip, gzip' "
                                                                   "(accepted: gzip)"]
    assert outcomes["/docs/zstd.html"][:2] == ["fetch_error", "unsupported Content-Encoding 'zstd' (accepted: gzip)"]
    assert outcomes["/docs/gzip.html"][0] == "too_large"
    assert outcomes["/docs/small.html"] == ["fetched", "", len(small)]
    assert got["peak_growth_mib"] < 48, got  # the bombs inflate to 256 MiB; the cap is 1 MiB


@pytest.mark.timeout(60)
def test_6_no_cookie_is_kept_sent_or_archived(tmp_path):
    routes = {f"/docs/{name}.html": raw_response(200, page(), {"Set-Cookie": f"{name}={'v' * 3000}; Path=/"})
              for name in ("a", "b", "c")}
    with HostileSite(routes) as site:
        got = crawl_round(site, config_for(site), targets(site, *sorted(routes)))
    assert len(site.log) == 3 and [o.status for o in got.outcomes] == ["fetched"] * 3
    assert not [headers for _, _, headers in site.log if any(k.lower() == "cookie" for k in headers)]
    writer = WarcFileWriter(str(tmp_path), "t", max_file_bytes=10 ** 9)
    store_shard(got.outcomes, writer, "c1")
    requests = 0
    with open(tmp_path / writer.files[0], "rb") as fh:
        for record in ArchiveIterator(fh):
            if record.rec_type == "request":
                requests += 1
                assert record.http_headers.get_header("Cookie") is None
    assert requests == 3


@pytest.mark.timeout(90)
def test_7_robots_txt_is_read_up_to_500_kib():
    filler = "".join(f"Disallow: /docs/filler{i}/*.html$\n" for i in range(150_000))  # ~4.6 MB of rules
    robots = f"User-agent: *\nDisallow: /docs/early/\n{filler}Disallow: /docs/late/\n".encode()
    with HostileSite({"/robots.txt": raw_response(200, robots, ctype="text/plain")}) as site:
        got = measured_round(site, [], read_robots=True, check=["/docs/early/a.html", "/docs/late/a.html"],
                             max_bytes=FetchPolicy.max_bytes)  # the crawl's default response cap (20 MiB)
    assert got["robots"] == {"reason": "robots_truncated",
                             "allows": {"/docs/early/a.html": False, "/docs/late/a.html": True}}
    assert got["elapsed_s"] < 2.5 and got["peak_growth_mib"] < 100, got  # all 5.4 MB: 3.5 s, 237 MiB


@pytest.mark.parametrize("location", ["javascript:alert(1)", "mailto:a@b.example", "http://[broken/x"])
def test_a_location_that_is_not_a_web_url_is_an_http_error(location):
    with HostileSite({"/docs/r": raw_response(302, headers={"Location": location})}) as site:
        (outcome,) = crawl_round(site, config_for(site), targets(site, "/docs/r")).outcomes
    assert outcome.status == "http_error" and "not an http(s) URL" in outcome.result.error


def test_a_redirect_chain_past_the_limit_ends_in_a_redirect_limit_row(tmp_path):
    from ritrag.crawl_dir import read_crawldb
    from ritrag.pipelines import crawl

    routes = {f"/docs/r{i}": raw_response(302, headers={"Location": f"/docs/r{i + 1}"}) for i in range(50)}
    with HostileSite(routes) as site:
        crawl.run(["--seed", site.base + "docs/r0", "--out", str(tmp_path / "c"), "--per_host_delay_s", "0",
                   "--timeout_s", "5", "--max_redirects", "5"])
    rows = {r["url"].removeprefix(site.base): r for r in read_crawldb(str(tmp_path / "c")) if r["kind"] == "page"}
    assert [rows[f"docs/r{i}"]["status"] for i in range(6)] == ["redirect"] * 6
    assert rows["docs/r6"]["status"] == "redirect_limit" and "docs/r7" not in rows

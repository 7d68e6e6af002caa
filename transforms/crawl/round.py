"""One fetch round of a crawl (Nutch's fetch + parse steps) as Beam DoFns over
pure functions.

Politeness. The round's targets are grouped by host (`scheme://host[:port]`), so
one `process` call of `FetchHostFn` holds every URL of a host in the round: it
alone talks to that host, through one `HostGate` (at most
`per_host_concurrency` requests in flight, request starts at least
`max(per_host_delay_s, robots Crawl-delay)` apart). On a distributed runner this
is what guarantees the limits: GroupByKey sends one host's URLs to one key, and
a key is processed by one worker at a time. (A runner that retries a failed
bundle fetches that host's URLs again: the limits hold per attempt.)

Storing. Results are keyed by shard (hash of the URL) and `StoreShardFn` writes
each shard's kept bodies to its own WARC files in URL order, so a shard's files
are a function of its fetches; a body whose sha256 equals the previous crawl's is
not stored again (status unchanged), nor is a 304's.
"""
from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator

import apache_beam as beam

from ritrag.flags import option
from ritrag.ids import shard_of
from ritrag.transforms.counts import CountingDoFn
from ritrag.transforms.crawl.crawldb import CrawlTarget, crawldb_row, link_rank, not_modified_result
from ritrag.transforms.crawl.downloader import FetchPolicy, FetchResult, crawl_client, fetch
from ritrag.transforms.crawl.links import PageLinks, page_links
from ritrag.transforms.crawl.robots import MAX_ROBOTS_BYTES, MAX_ROBOTS_REDIRECTS, RobotsRules, robots_rules
from ritrag.transforms.crawl.scope import BadUrl, Scope, clean_url, crawl_key
from ritrag.transforms.crawl.sitemaps import InvalidSitemap, parse_sitemap
from ritrag.transforms.crawl.warc_writer import WarcFileWriter
from ritrag.urls import origin_of

COUNTERS = "ritrag.crawl"
MAX_SITEMAPS_PER_HOST = 1000
LINKS, ROBOTS = "links", "robots"
RECENT_LINKS = 100_000  # crawl_keys a host's round remembers to drop repeated links early


@dataclass(frozen=True)
class CrawlConfig:
    policy: FetchPolicy = field(metadata={"cli": False})  # its own flags: FetchPolicy's fields
    scope: Scope = field(metadata={"cli": False})  # from the seeds and the job's --include/--exclude
    per_host_concurrency: int = option(2, "requests in flight to one host")
    per_host_delay_s: float = option(1.0, "seconds between request starts to one host (robots.txt Crawl-delay "
                                          "raises it)")
    max_crawl_delay_s: float = option(30.0, "a robots.txt Crawl-delay is honoured up to this")
    max_depth: int = option(20, "link hops from a seed")
    max_redirects: int = option(5, "redirect hops followed from one URL")
    respect_robots: bool = field(default=True, metadata={"cli": False})


class HostGate:
    """Request starts to one host at least `delay_s` apart (all threads together)."""

    def __init__(self, delay_s: float, sleep: Callable[[float], None] = time.sleep):
        self._delay, self._sleep = delay_s, sleep
        self._lock = threading.Lock()
        self._next = 0.0

    def wait(self) -> None:
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + self._delay
        if start > now:
            self._sleep(start - now)


@dataclass(frozen=True)
class Outcome:
    """What happened to one target: a CrawlDB status and the fetch (None if never requested)."""

    target: CrawlTarget
    status: str
    result: FetchResult | None = None
    canonical_url: str = ""
    error: str = ""
    malformed_links: int = 0  # hrefs of the page skipped because they do not resolve to a URL


@dataclass(frozen=True)
class Link:
    """A URL found in a round; `via` ranks spellings of the same URL (sitemap first)."""

    target: CrawlTarget
    via: str  # "sitemap" | "redirect" | "link"


def on_host(urls: Iterable[str], host: str) -> list[str]:
    """The cleaned forms of those `urls` that are on `host` (scheme://authority)."""
    kept = []
    for url in urls:
        try:
            url = clean_url(url)
        except BadUrl:
            continue
        if origin_of(url) == host:
            kept.append(url)
    return kept


def fetch_robots(fetch_one: Callable[..., FetchResult], host: str) -> tuple[RobotsRules, list[Outcome]]:
    """robots.txt of a host (policy: transforms/crawl/robots.py): one byte more than
    MAX_ROBOTS_BYTES is read, so that a longer file is known to be cut;
    redirects are followed up to MAX_ROBOTS_REDIRECTS hops within the host."""
    url, outcomes, left_host = f"{host}/robots.txt", [], False
    for hop in range(MAX_ROBOTS_REDIRECTS + 1):
        result = fetch_one(url, accept_any=True, truncate_at=MAX_ROBOTS_BYTES + 1)
        outcomes.append(Outcome(CrawlTarget(url, "robots", redirects=hop), result.outcome, result))
        if result.outcome != "redirect":
            break
        same_host = on_host([result.location], host)
        if not same_host:
            left_host = True
            break
        url = same_host[0]
    reachable = result.outcome not in ("fetch_error",)
    rules = robots_rules(result.http_status if reachable else None, result.content_type, result.body)
    note = f"robots_redirect_off_host: {result.location[:200]}" if left_host else rules.reason
    if note:
        outcomes[-1] = replace(outcomes[-1], error=note)
    return rules, outcomes


def discover_sitemaps(fetch_one: Callable[..., FetchResult], host: str, rules: RobotsRules,
                      config: CrawlConfig) -> Iterator[Outcome | Link]:
    """Sitemaps of a host (robots `Sitemap:` lines, else /sitemap.xml; indexes
    followed, gzip read): one Outcome per sitemap, a Link per in-scope page."""
    listed = on_host(rules.sitemaps(), host)
    queue = listed or [f"{host}/sitemap.xml"]
    seen: set[str] = set()
    while queue and len(seen) < MAX_SITEMAPS_PER_HOST:
        url = queue.pop(0)
        if url in seen:
            continue
        seen.add(url)
        target = CrawlTarget(url, "sitemap")
        if config.respect_robots and not rules.allows(url, config.policy.user_agent) and url not in listed:
            yield Outcome(target, "disallowed")
            continue
        result = fetch_one(url, accept_any=True)
        if result.outcome != "fetched":
            yield Outcome(target, result.outcome, result)
            continue
        try:
            sitemap = parse_sitemap(result.body)
        except InvalidSitemap as exc:
            yield Outcome(target, "invalid_sitemap", result, error=str(exc))
            continue
        yield Outcome(target, "fetched", result)
        queue.extend(on_host(sitemap.sitemaps, host))
        for page in sitemap.pages:
            try:
                page = clean_url(page)
            except BadUrl:
                continue
            if config.scope.allows(page):
                yield Link(CrawlTarget(page, depth=1, discovered_from=url), "sitemap")


def follow_ups(outcome: Outcome, links: list[str], config: CrawlConfig) -> list[Link]:
    """The `links` of a fetched page (next depth) or the target of a redirect (same depth)."""
    result, target = outcome.result, outcome.target
    candidates: list[tuple[str, CrawlTarget, str]] = []
    if outcome.status == "redirect":
        candidates = [(result.location, replace(target, url=result.location, discovered_from=target.url,
                                                redirects=target.redirects + 1), "redirect")]
    elif outcome.status == "fetched" and links and target.depth < config.max_depth:
        candidates = [(u, CrawlTarget(u, depth=target.depth + 1, discovered_from=target.url), "link")
                      for u in links]
    out, keys = [], set()
    for raw, new, via in candidates:
        try:
            url = clean_url(raw)
        except BadUrl:
            continue
        key = crawl_key(url)
        if key in keys or not config.scope.allows(url):
            continue
        keys.add(key)
        out.append(Link(replace(new, url=url, etag="", last_modified="", sha256="", warc_file="",
                                warc_offset=None), via))
    return out


class RecentLinks:
    """The links one host's round already emitted (an LRU of crawl_key -> rank,
    at most `size`): a repeat that is no better than the one emitted is dropped
    here, before the pipeline sees it. Navigation repeats the same links on every
    page, so this removes most of them in bounded memory; Generate still
    de-duplicates exactly, and a better spelling always passes."""

    def __init__(self, size: int = RECENT_LINKS):
        self._size, self._ranks = size, OrderedDict()

    def admit(self, link: "Link") -> bool:
        key, rank = crawl_key(link.target.url), link_rank(link.target.url, link.via, link.target.depth)
        held = self._ranks.get(key)
        if held is not None and held <= rank:
            self._ranks.move_to_end(key)
            return False
        self._ranks[key] = rank
        self._ranks.move_to_end(key)
        if len(self._ranks) > self._size:
            self._ranks.popitem(last=False)
        return True


def crawl_host(host: str, targets: list[CrawlTarget], config: CrawlConfig, fetch_one: Callable[..., FetchResult],
               rules: RobotsRules | None, with_sitemaps: bool,
               gate_factory: Callable[[float], HostGate] = HostGate) -> Iterator[Outcome | Link | RobotsRules]:
    """Everything one round does with one host: robots.txt (when not known yet:
    the rules are yielded for later rounds), sitemaps (first round of the host),
    then the targets, at most `per_host_concurrency` at a time."""
    if rules is None:  # a host new to this crawl: its rules are yielded for later rounds
        rules, outcomes = fetch_robots(fetch_one, host) if config.respect_robots else (robots_rules(404), [])
        yield rules
        yield from outcomes
    agent = config.policy.user_agent
    delay = max(config.per_host_delay_s, min(rules.crawl_delay(agent), config.max_crawl_delay_s))
    gate = gate_factory(delay)
    gated = lambda url, **kw: fetch_one(url, before_request=gate.wait, **kw)  # noqa: E731
    recent = RecentLinks()
    if with_sitemaps:
        yield from (item for item in discover_sitemaps(gated, host, rules, config)
                    if not isinstance(item, Link) or recent.admit(item))

    def one(target: CrawlTarget) -> tuple[Outcome, list[str]]:
        """The target's outcome and its page's links (one parse gives both)."""
        if target.redirects > config.max_redirects:
            return Outcome(target, "redirect_limit", error=f"more than {config.max_redirects} redirects"), []
        try:  # targets are clean already, but for rows of a CrawlDB written by an older cleaner
            url = clean_url(target.url)
        except BadUrl as exc:
            return Outcome(target, "bad_url", error=str(exc)), []
        if config.respect_robots and not rules.allows(url, agent):
            return Outcome(target, "disallowed"), []
        result = gated(url, etag=target.etag, last_modified=target.last_modified)
        status = "unchanged" if result.outcome == "not_modified" else result.outcome
        page = page_links(result.body, url) if result.outcome == "fetched" else PageLinks()
        return Outcome(target, status, result, page.canonical, malformed_links=page.malformed), page.links

    with ThreadPoolExecutor(max_workers=max(1, config.per_host_concurrency)) as pool:
        for outcome, links in pool.map(one, targets):
            yield outcome
            yield from filter(recent.admit, follow_ups(outcome, links, config))


class FetchHostFn(beam.DoFn):
    """(host, targets) -> Outcomes (main), Links (LINKS), (host, RobotsRules) (ROBOTS).
    `robots`: the rules of the hosts earlier rounds met; a host not in it gets its
    robots.txt and sitemaps read first."""

    def __init__(self, config: CrawlConfig, robots: dict[str, RobotsRules]):
        self._config, self._robots = config, robots
        self._requests = beam.metrics.Metrics.counter(COUNTERS, "http_requests")
        self._malformed_links = beam.metrics.Metrics.counter(COUNTERS, "malformed_links")

    def setup(self):
        self._client = crawl_client()

    def teardown(self):
        self._client.close()

    def _fetch(self, url: str, accept_any: bool = False, **kwargs) -> FetchResult:
        result = fetch(self._client, url, self._config.policy, accept_any=accept_any, **kwargs)
        self._requests.inc(result.attempts)
        return result

    def process(self, host_targets: tuple[str, Iterable[CrawlTarget]]):
        host, targets = host_targets
        targets = sorted(targets, key=lambda t: t.url)
        for item in crawl_host(host, targets, self._config, self._fetch, self._robots.get(host),
                               host not in self._robots):
            if isinstance(item, RobotsRules):
                yield beam.pvalue.TaggedOutput(ROBOTS, (host, item))
            elif isinstance(item, Link):
                yield beam.pvalue.TaggedOutput(LINKS, item)
            else:
                self._malformed_links.inc(item.malformed_links)
                yield item


def store_shard(outcomes: Iterable[Outcome], writer, crawl_id: str) -> list[dict]:
    """CrawlDB rows of one shard's outcomes, writing kept bodies (in URL order) with
    `writer` (a WarcFileWriter); unchanged bodies are not written."""
    rows = []
    for o in sorted(outcomes, key=lambda o: (o.target.kind, o.target.url)):
        t, r = o.target, o.result
        if o.status == "unchanged":  # a 304: the previous record stays the page's record
            rows.append(crawldb_row(t, "unchanged", crawl_id, not_modified_result(t, r), t.sha256, t.warc_file, t.warc_offset,
                                    o.canonical_url))
            continue
        if t.kind != "page" or r is None or not r.kept:
            rows.append(crawldb_row(t, o.status, crawl_id, r, canonical_url=o.canonical_url, error=o.error))
            continue
        sha = hashlib.sha256(r.body).hexdigest()
        if sha == t.sha256 and t.warc_file:
            rows.append(crawldb_row(t, "unchanged", crawl_id, r, sha, t.warc_file, t.warc_offset, o.canonical_url))
            continue
        stored = writer.write(r)
        rows.append(crawldb_row(t, o.status, crawl_id, r, sha, stored.warc_file, stored.offset, o.canonical_url))
    writer.close()
    return rows


class StoreShardFn(CountingDoFn):
    """(shard, outcomes) -> CrawlDB rows, counted by kind_status (data: the
    crawl's row counts); bodies to `<warc_dir>/<prefix>-sSSSSS-NNNNN.warc.gz`."""

    def __init__(self, warc_dir: str, file_prefix: str, crawl_id: str, max_file_bytes: int):
        super().__init__(COUNTERS)
        self._dir, self._prefix, self._crawl_id, self._max = warc_dir, file_prefix, crawl_id, max_file_bytes

    def process(self, shard_outcomes: tuple[int, Iterable[Outcome]]):
        shard, outcomes = shard_outcomes
        writer = WarcFileWriter(self._dir, f"{self._prefix}-s{shard:05d}", self._max)
        for row in store_shard(outcomes, writer, self._crawl_id):
            self.count(f"{row['kind']}_{row['status']}")
            yield row


def shard_key(outcome: Outcome, num_shards: int) -> tuple[int, Outcome]:
    return shard_of(outcome.target.url, num_shards), outcome

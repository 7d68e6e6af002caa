"""The crawler's side of the CrawlDB (ritrag.crawl_dir: where it lies, its
statuses, reading it): the targets of a round, the rows it writes, and the two
steps between fetch rounds, as Beam transforms (Nutch's generate and updatedb),
so that no process holds a crawl's URLs.

`Generate`: candidate URLs (target records, ritrag.schema.CRAWL_TARGET_SCHEMA:
seeds and re-visits, or the links a round found) -> the next fetch list: one
record per crawl_key not scheduled before (a CoGroupByKey with the scheduled
keys), its best spelling (re-visit, seed, sitemap, redirect, link; then depth,
length), at most `room` of them. The cap is exact without a global sort: a
histogram of (depth, URL-hash bucket) -- at most depths x RANK_BUCKETS counts --
gives the boundary bucket; buckets before it are kept whole and only the
boundary bucket (~1/RANK_BUCKETS of one depth's URLs) is sorted by URL.

`UpdateCrawlDb`: the previous CrawlDB and this crawl's rows, grouped by
(kind, url): this crawl's rows replace the previous rows of the same URL;
redirect rows get `final_url` = the end of their chain (`RedirectHops`, a map
of the redirect rows only).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable

import apache_beam as beam

from ritrag.crawl_dir import scan_crawldb
from ritrag.ids import shard_of
from ritrag.transforms.crawl.downloader import FetchResult
from ritrag.transforms.crawl.scope import crawl_key

REVISIT = ("fetched", "unchanged", "kept_other", "skipped_type", "redirect", "too_large",
           "disallowed")  # previous pages every re-crawl asks for again
# Pages that failed: re-tried on a back-off schedule (`retry_due`), whether or not a page links them again.
FAILURES = ("gone", "http_error", "fetch_error", "redirect_limit")
MAX_RETRY_GAP = 16  # crawls: a URL that keeps failing is still tried at least this often
VIA_RANK = {"revisit": 0, "seed": 1, "sitemap": 2, "redirect": 3, "link": 4}  # which spelling of a URL wins
RANK_BUCKETS = 4096  # URL-hash buckets per depth of Generate's cap


@dataclass(frozen=True)
class CrawlTarget:
    """One URL to fetch in a round, with what earlier crawls knew of it."""

    url: str
    kind: str = "page"
    depth: int = 0
    discovered_from: str = ""
    redirects: int = 0  # hops followed to reach this URL
    etag: str = ""
    last_modified: str = ""
    sha256: str = ""
    warc_file: str = ""
    warc_offset: int | None = None
    content_type: str = ""  # of the stored body: a 304 describes none
    failures: int = 0  # crawls in a row whose fetch of this URL failed (FAILURES)


def crawldb_row(target: CrawlTarget, status: str, crawl_id: str, result: FetchResult | None = None,
                sha256: str = "", warc_file: str = "", warc_offset: int | None = None,
                canonical_url: str = "", error: str = "") -> dict:
    r = result or FetchResult(url=target.url, outcome="")
    return {"url": target.url, "kind": target.kind, "status": status, "depth": target.depth,
            "discovered_from": target.discovered_from, "crawl_id": crawl_id, "fetched_at": r.fetched_at,
            "http_status": r.http_status, "attempts": r.attempts if result else 0,
            "content_type": r.content_type, "etag": r.etag, "last_modified": r.last_modified,
            "sha256": sha256, "final_url": r.location or target.url, "canonical_url": canonical_url,
            "warc_file": warc_file, "warc_offset": warc_offset, "error": error or r.error,
            "failures": target.failures + 1 if status in FAILURES else 0, "idle_crawls": 0}


def not_modified_result(target: CrawlTarget, result: FetchResult) -> FetchResult:
    """A 304's result with the validators and type of the body it confirms: a
    304 need not repeat Last-Modified (nor any validator but ETag, RFC 9110
    15.4.5), and a row that lost them would make the next crawl a plain GET."""
    return dataclasses.replace(result, etag=result.etag or target.etag,
                               last_modified=result.last_modified or target.last_modified,
                               content_type=target.content_type or result.content_type)


TARGET_FIELDS = tuple(f.name for f in dataclasses.fields(CrawlTarget))


def target_record(target: CrawlTarget, via: str) -> dict:
    """A CRAWL_TARGET_SCHEMA record: a URL to fetch and how it was found."""
    return {**{name: getattr(target, name) for name in TARGET_FIELDS}, "via": via}  # (asdict deep-copies: slow)


def record_target(record: dict) -> CrawlTarget:
    return CrawlTarget(**{k: record[k] for k in TARGET_FIELDS})


def row_failures(row: dict) -> int:
    """The row's failures in a row (a CrawlDB written before they were counted: one, if it failed)."""
    failures = row.get("failures")
    return int(failures) if failures is not None else int(row["status"] in FAILURES)


def retry_due(row: dict) -> bool:
    """Whether a re-crawl asks for a previous page again. Pages that answered
    are asked every crawl; a page that failed f crawls in a row is asked when
    min(2**(f-1), MAX_RETRY_GAP) crawls have passed since it was last asked
    (the next crawl, then every 2nd, 4th, ... 16th), so a dead link costs a
    request per 16 crawls at most while a page back from an outage returns soon."""
    if row["status"] in REVISIT:
        return True
    if row["status"] not in FAILURES:
        return False  # bad_url (a seed's text), invalid_sitemap: nothing to ask again
    return (row.get("idle_crawls") or 0) + 1 >= min(2 ** (row_failures(row) - 1), MAX_RETRY_GAP)


RESTING = "resting"  # revisit_record's output of failed pages not due this crawl: their URLs


def revisit_record(row: dict):
    """A previous CrawlDB page row as a re-crawl target (with the validators for
    a conditional GET) when `retry_due`; a failed page not due yet is yielded
    as RESTING, its URL, so that links found this crawl do not ask for it either."""
    if row["kind"] != "page":
        return
    if not retry_due(row):
        if row["status"] in FAILURES:
            yield beam.pvalue.TaggedOutput(RESTING, {"url": row["url"]})
        return
    yield target_record(CrawlTarget(row["url"], "page", row["depth"], row["discovered_from"], 0, row["etag"],
                                    row["last_modified"], row["sha256"], row["warc_file"], row["warc_offset"],
                                    row["content_type"], row_failures(row)), "revisit")


def spelling_rank(record: dict) -> tuple:
    return link_rank(record["url"], record["via"], record["depth"])


def link_rank(url: str, via: str, depth: int) -> tuple:
    """Of several spellings of one URL, the lowest rank is scheduled."""
    return VIA_RANK[via], depth, len(url), url


def schedule_order(record: dict) -> tuple[int, int]:
    """Generate's cap keeps targets in this order (then by URL): shallow first."""
    return record["depth"], shard_of(record["url"], RANK_BUCKETS)


def cut_point(histogram: Iterable[tuple[tuple[int, int], int]], room: int) -> tuple[tuple[int, int], int] | None:
    """Where `room` cuts a fetch list whose schedule_order histogram is given:
    None when all fit, else (boundary key, how many of its URLs to keep)."""
    total = 0
    for key, n in sorted(histogram):
        if total + n > room:
            return key, max(room - total, 0)
        total += n
    return None


def best_new(keyed: tuple[str, dict]) -> list[dict]:
    """A crawl_key's best spelling, unless it was scheduled."""
    _, groups = keyed
    if any(True for _ in groups["scheduled"]):
        return []
    return list(groups["candidate"])


class SplitAtCut(beam.DoFn):
    """Targets before the cut (main), in the boundary bucket (BOUNDARY), after it (dropped)."""

    BOUNDARY = "boundary"

    def process(self, record: dict, cut):
        if cut is None or schedule_order(record) < cut[0]:
            yield record
        elif schedule_order(record) == cut[0]:
            yield beam.pvalue.TaggedOutput(self.BOUNDARY, record)


class Generate(beam.PTransform):
    """Candidate target records -> the fetch list (see the module docstring).
    `scheduled`: crawl_keys already scheduled; `room`: a one-element PCollection."""

    def __init__(self, scheduled: beam.PCollection, room: beam.PCollection):
        super().__init__()
        self._scheduled, self._room = scheduled, room

    def expand(self, candidates):
        best = (candidates  # a combiner: spellings are reduced before the shuffle (links repeat a lot)
                | "KeyCandidates" >> beam.Map(lambda r: (crawl_key(r["url"]), r))
                | "BestSpelling" >> beam.CombinePerKey(lambda records: min(records, key=spelling_rank)))
        new = ({"candidate": best, "scheduled": self._scheduled | "KeyScheduled" >> beam.Map(lambda k: (k, None))}
               | "JoinScheduled" >> beam.CoGroupByKey()
               | "BestNew" >> beam.FlatMap(best_new))
        cut = (new
               | "OrderKey" >> beam.Map(lambda r: (schedule_order(r), 1))
               | "Histogram" >> beam.CombinePerKey(sum)
               | "HistogramList" >> beam.combiners.ToList()
               | "CutPoint" >> beam.Map(cut_point, room=beam.pvalue.AsSingleton(self._room)))
        split = new | "SplitAtCut" >> beam.ParDo(SplitAtCut(), cut=beam.pvalue.AsSingleton(cut)).with_outputs(
            SplitAtCut.BOUNDARY, main="kept")
        boundary = (split[SplitAtCut.BOUNDARY]
                    | "OneBoundary" >> beam.Map(lambda r: (None, r))
                    | "GroupBoundary" >> beam.GroupByKey()
                    | "TakeBoundary" >> beam.FlatMap(
                        lambda kv, cut: sorted(kv[1], key=lambda r: r["url"])[:cut[1]],
                        cut=beam.pvalue.AsSingleton(cut)))
        return (split["kept"], boundary) | "Targets" >> beam.Flatten()


def redirect_hops(previous_dir: str, current_rows: Iterable[dict]) -> dict[str, str]:
    """url -> next hop of every page the new CrawlDB holds as a redirect: the
    previous redirects, then this crawl's page rows (url, status, final_url)
    replacing them. Memory: the redirect rows only."""
    hops = {r["url"]: r["final_url"] for r in scan_crawldb(previous_dir, ["url", "kind", "status", "final_url"])
            if r["kind"] == "page" and r["status"] == "redirect"}
    for row in current_rows:
        if row["status"] == "redirect":
            hops[row["url"]] = row["final_url"]
        else:
            hops.pop(row["url"], None)
    return hops


def chain_end(row: dict, hops: dict[str, str]) -> dict:
    """A redirect row with final_url = the end of its chain (as far as the rows go)."""
    if row["kind"] != "page" or row["status"] != "redirect":
        return row
    seen, url = {row["url"]}, row["final_url"]
    while url in hops and url not in seen:
        seen.add(url)
        url = hops[url]
    return {**row, "final_url": url}


def newest_rows(keyed: tuple[tuple[str, str], dict]) -> list[dict]:
    """This crawl's rows of a URL, else the previous ones, one more crawl idle."""
    _, groups = keyed
    current = list(groups["current"])
    if current:
        return current
    return [{**row, "failures": row_failures(row), "idle_crawls": (row.get("idle_crawls") or 0) + 1}
            for row in groups["previous"]]


class UpdateCrawlDb(beam.PTransform):
    """{"previous": rows, "current": rows} -> the new CrawlDB rows (module docstring)."""

    def __init__(self, hops: dict[str, str]):
        super().__init__()
        self._hops = hops

    def expand(self, rows):
        key = lambda r: ((r["kind"], r["url"]), r)  # noqa: E731
        return ({name: pcoll | f"Key{name.title()}" >> beam.Map(key) for name, pcoll in rows.items()}
                | "JoinByUrl" >> beam.CoGroupByKey()
                | "Newest" >> beam.FlatMap(newest_rows)
                | "ChainEnd" >> beam.Map(chain_end, self._hops))

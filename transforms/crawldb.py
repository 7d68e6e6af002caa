"""The CrawlDB (CRAWL_DIR/crawldb.parquet, ritrag.schema.CRAWLDB_SCHEMA): what the
crawls know of every URL, and the targets of the next fetch round.

A crawl writes one row per URL it dealt with (each page scheduled, robots.txt,
sitemap); at its end the rows of this crawl replace the previous rows of the same
URL (`merge`), and redirect chains are followed to fill `final_url`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import pyarrow.parquet as pq

from ritrag.schema import CRAWLDB_SCHEMA
from transforms.fetch import FetchResult

CRAWLDB_FILE = "crawldb.parquet"
WARC_DIR = "warc"
# unchanged: 304, or the same payload sha256 as the previous crawl (body not stored again);
# disallowed: robots.txt said no (never requested); redirect_limit: too many hops;
# bad_url: a malformed seed; invalid_sitemap: a sitemap that did not parse.
STATUSES = ("fetched", "unchanged", "kept_other", "skipped_type", "redirect", "redirect_limit", "gone",
            "http_error", "fetch_error", "too_large", "disallowed", "bad_url", "invalid_sitemap")
INDEXABLE = ("fetched", "unchanged")  # pages whose WARC record build and update read
REVISIT = ("fetched", "unchanged", "kept_other", "skipped_type", "redirect", "too_large", "http_error",
           "fetch_error", "disallowed")  # previous pages a re-crawl asks for again (gone ones stay gone)


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


def crawldb_row(target: CrawlTarget, status: str, crawl_id: str, result: FetchResult | None = None,
                sha256: str = "", warc_file: str = "", warc_offset: int | None = None,
                canonical_url: str = "", error: str = "") -> dict:
    r = result or FetchResult(url=target.url, outcome="")
    return {"url": target.url, "kind": target.kind, "status": status, "depth": target.depth,
            "discovered_from": target.discovered_from, "crawl_id": crawl_id, "fetched_at": r.fetched_at,
            "http_status": r.http_status, "attempts": r.attempts if result else 0,
            "content_type": r.content_type, "etag": r.etag, "last_modified": r.last_modified,
            "sha256": sha256, "final_url": r.location or target.url, "canonical_url": canonical_url,
            "warc_file": warc_file, "warc_offset": warc_offset, "error": error or r.error}


def read_crawldb(crawl_dir: str) -> list[dict]:
    path = os.path.join(crawl_dir, CRAWLDB_FILE)
    if not os.path.exists(path):
        return []
    return pq.read_table(path, schema=CRAWLDB_SCHEMA).to_pylist()


def resolve_final_urls(rows: list[dict]) -> None:
    """Set each redirect row's final_url to the end of its chain (as far as the rows go)."""
    hop = {r["url"]: r["final_url"] for r in rows if r["kind"] == "page" and r["status"] == "redirect"}
    for row in rows:
        if row["status"] != "redirect":
            continue
        seen, url = {row["url"]}, row["final_url"]
        while url in hop and url not in seen:
            seen.add(url)
            url = hop[url]
        row["final_url"] = url


def merge(previous: list[dict], current: list[dict]) -> list[dict]:
    """The new CrawlDB: this crawl's rows, and the previous rows of URLs it did not touch."""
    touched = {(r["kind"], r["url"]) for r in current}
    rows = [r for r in previous if (r["kind"], r["url"]) not in touched] + current
    resolve_final_urls(rows)
    return sorted(rows, key=lambda r: (r["kind"], r["url"]))


def revisit_targets(previous: list[dict]) -> list[CrawlTarget]:
    """The previous crawl's pages, with the validators for conditional GETs."""
    return [CrawlTarget(r["url"], "page", r["depth"], r["discovered_from"], 0, r["etag"], r["last_modified"],
                        r["sha256"], r["warc_file"], r["warc_offset"])
            for r in previous if r["kind"] == "page" and r["status"] in REVISIT]


def indexable_sources(crawl_dir: str) -> list[str]:
    """Record sources ("<warc file>#<offset>") of the pages the CrawlDB holds as
    current: what `ritrag build` / `update` read from a crawl directory."""
    from transforms.warc import record_source

    return sorted(record_source(os.path.join(crawl_dir, WARC_DIR, r["warc_file"]), r["warc_offset"])
                  for r in read_crawldb(crawl_dir)
                  if r["kind"] == "page" and r["status"] in INDEXABLE and r["warc_file"])


def is_crawl_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, CRAWLDB_FILE))

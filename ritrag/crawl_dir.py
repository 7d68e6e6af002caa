"""A crawl directory: what `ritrag crawl` writes and `ritrag build` / `update`
read. `crawldb.parquet` (ritrag.schema.CRAWLDB_SCHEMA) holds what the crawls
know of every URL, `warc/` the WARC files holding the bodies of the pages they
kept. The crawler (ritrag.transforms.crawl) writes both; the build's input side
(ritrag.transforms.sources.warc) reads the pages the CrawlDB holds as current.
"""
from __future__ import annotations

import os
from typing import Iterator

import pyarrow as pa

from ritrag.schema import CRAWLDB_SCHEMA
from ritrag.storage import exists, open_parquet

CRAWLDB_FILE = "crawldb.parquet"
WARC_DIR = "warc"
# The values of the CrawlDB's `status` column.
# unchanged: 304, or the same payload sha256 as the previous crawl (body not stored again);
# disallowed: robots.txt said no (never requested); redirect_limit: too many hops;
# bad_url: a malformed seed; invalid_sitemap: a sitemap that did not parse.
STATUSES = ("fetched", "unchanged", "kept_other", "skipped_type", "redirect", "redirect_limit", "gone",
            "http_error", "fetch_error", "too_large", "disallowed", "bad_url", "invalid_sitemap")
INDEXABLE = ("fetched", "unchanged")  # pages whose WARC record build and update read
SCAN_BATCH_ROWS = 65_536


def crawldb_path(crawl_dir: str) -> str:
    return os.path.join(crawl_dir, CRAWLDB_FILE)


def is_crawl_dir(path: str) -> bool:
    return exists(crawldb_path(path))


def scan_crawldb(crawl_dir: str, columns: list[str]) -> Iterator[dict]:
    """The CrawlDB's rows (only `columns`), streamed a batch at a time."""
    path = crawldb_path(crawl_dir)
    if not exists(path):
        return
    for batch in open_parquet(path).iter_batches(batch_size=SCAN_BATCH_ROWS, columns=columns):
        yield from batch.to_pylist()


def read_crawldb(crawl_dir: str) -> list[dict]:
    """The whole CrawlDB in memory (tests, small crawls; jobs stream it)."""
    path = crawldb_path(crawl_dir)
    if not exists(path):
        return []
    table = open_parquet(path).read()
    for field in CRAWLDB_SCHEMA:  # columns added since (the re-try schedule's counts) read as 0
        if field.name not in table.column_names:
            table = table.append_column(field.name, pa.array([0] * table.num_rows, field.type))
    return table.select(CRAWLDB_SCHEMA.names).cast(CRAWLDB_SCHEMA).to_pylist()

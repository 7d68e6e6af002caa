"""The crawl job against a real HTTP server on 127.0.0.1 (tests/crawl_site.py):
robots, sitemaps, scope, politeness, retries, redirects, caps, accounting,
re-crawls with conditional GETs, the re-try schedule of failed pages. No
deadline here is one a loaded machine can miss: the deadline that must fire
(/slow.html) is met by a server that holds its answer until the site closes."""
from __future__ import annotations

import shutil
from collections import Counter

import pyarrow.parquet as pq
import pytest

from ritrag.pipelines import crawl
from support import SAMPLE
from crawl_site import CrawlSite
from ritrag.crawl_dir import CRAWLDB_FILE
from ritrag.transforms.sources.warc import read_warc_pages

SITE = "sphinx"
MAX_BYTES = 200_000


def crawl_flags(site: CrawlSite, out, *extra: str) -> list[str]:
    return ["--seed", site.base, "--seed", "not a url", "--out", str(out), "--per_host_concurrency", "2",
            "--per_host_delay_s", "0", "--timeout_s", "5", "--retries", "1", "--retry_backoff_s", "0.01",
            "--max_response_bytes", str(MAX_BYTES), "--warc_shards", "2", *extra]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    shutil.copytree(SAMPLE / SITE, root / SITE)
    with CrawlSite(root, flaky=f"{SITE}/faq.html", busy=f"{SITE}/glossary.html",
                   redirect_target=f"{SITE}/support.html", huge_bytes=MAX_BYTES * 2,
                   await_overlap=True) as site:
        out = tmp_path_factory.mktemp("crawl")
        counts = crawl.run(crawl_flags(site, out))
        rows = pq.read_table(out / CRAWLDB_FILE).to_pylist()
        yield site, out, counts, rows, list(site.log)


def by_url(rows, site):
    return {r["url"].replace(site.base, "/"): r for r in rows}


def test_every_page_of_the_site_is_fetched_and_stored(served):
    site, out, counts, rows, log = served
    pages = by_url([r for r in rows if r["kind"] == "page"], site)
    for path in site.page_paths():
        assert pages["/" + path]["status"] in ("fetched",), (path, pages["/" + path])
    stored = [p for f in sorted((out / "warc").iterdir()) for p in read_warc_pages(str(f), MAX_BYTES)]
    assert sorted(p.url for p in stored) == sorted(site.base + p for p in site.page_paths())


def test_outcomes_of_the_misbehaving_paths(served):
    site, out, counts, rows, log = served
    pages = by_url([r for r in rows if r["kind"] == "page"], site)
    assert pages["/private/secret.html"]["status"] == "disallowed"
    assert pages["/redirect/a"]["status"] == "redirect"
    assert pages["/redirect/a"]["final_url"] == site.base + f"{SITE}/support.html"
    assert pages["/loop/a"]["status"] == pages["/loop/b"]["status"] == "redirect"
    assert pages["/missing.html"]["status"] == "gone" and pages["/missing.html"]["http_status"] == 404
    assert pages["/gone.html"]["http_status"] == 410
    assert pages["/slow.html"]["status"] == "fetch_error" and "timeout" in pages["/slow.html"]["error"]
    assert pages["/data.json"]["status"] == "skipped_type"
    assert pages["/huge.html"]["status"] == "too_large"
    assert pages[f"/{SITE}/faq.html"]["attempts"] == 2  # 500, then 200
    assert pages[f"/{SITE}/glossary.html"]["attempts"] == 2  # 429 Retry-After 1, then 200
    assert pages["/"]["status"] == "gone"  # the seed: no index at the root
    (bad,) = [r for r in rows if r["status"] == "bad_url"]
    assert bad["url"] == "not a url" and "not a URL" in bad["error"]
    assert by_url([r for r in rows if r["kind"] == "sitemap"], site)["/sitemaps/pages.xml.gz"]["status"] == "fetched"
    assert [r["status"] for r in rows if r["kind"] == "robots"] == ["fetched"]


def test_disallowed_and_out_of_scope_never_requested(served):
    site, out, counts, rows, log = served
    assert not [r for r in log if r.path.startswith("/private/")]
    assert {r.host for r in log} == {f"127.0.0.1:{site.port}"}  # the localhost:PORT sitemap entry: out of scope
    assert all(r.headers.get("User-Agent", "").startswith("ritrag-crawl/") for r in log)


def test_per_host_concurrency_never_exceeded(served):
    site, *_ = served
    assert site.max_in_flight == 2  # reached (requests overlapped), never exceeded


def test_every_url_accounted_for_once(served):
    site, out, counts, rows, log = served
    requested = Counter(r.path for r in log)
    page_rows = [r for r in rows if r["kind"] == "page" and r["status"] != "bad_url"]
    assert len({r["url"] for r in page_rows}) == len(page_rows)
    for r in page_rows:
        path = "/" + r["url"].split("/", 3)[3]
        assert requested[path] == (r["attempts"]), (path, r)
    assert sum(requested.values()) == sum(r["attempts"] for r in rows)
    assert sum(counts.values()) == len(rows)


FAILED_PATHS = ("/missing.html", "/gone.html", "/slow.html")  # 404, 410, timeout: failures, not seeds


@pytest.fixture(scope="module")
def recrawls(served, tmp_path_factory):
    """Crawls 2, 3 and 4 of the unchanged site into a copy of the first crawl's
    directory: (requests of each crawl, CrawlDB rows after each)."""
    site, out, *_ = served
    again = tmp_path_factory.mktemp("recrawl") / "crawl"
    shutil.copytree(out, again)
    crawls = []
    for _ in range(3):
        start = len(site.log)
        crawl.run(crawl_flags(site, again))
        crawls.append((site.log[start:], by_url(pq.read_table(again / CRAWLDB_FILE).to_pylist(), site)))
    return site, crawls


def test_every_recrawl_asks_conditionally_for_every_unchanged_page(recrawls):
    """The site's 304s repeat no validator: each row keeps the ones it had, so
    crawls 2, 3 and 4 all ask with If-None-Match and If-Modified-Since."""
    site, crawls = recrawls
    pages = {"/" + p for p in site.page_paths()}
    for number, (log, rows) in enumerate(crawls, start=2):
        asked = [r for r in log if r.path in pages]
        assert sorted(r.path for r in asked) == sorted(pages), number
        assert all(r.headers.get("If-None-Match") and r.headers.get("If-Modified-Since") for r in asked), number
        assert all(r.status == 304 for r in asked), number
        for path in pages:
            row = rows[path]
            assert row["status"] == "unchanged" and row["etag"] and row["last_modified"], (number, row)
            assert row["content_type"].startswith("text/html") and row["sha256"] and row["warc_file"], (number, row)


def test_failed_pages_are_retried_on_their_schedule_linked_or_not(recrawls):
    """A page that failed once is asked again by the next crawl, after two
    failures every second crawl: crawl 2 asks, crawl 3 does not (though the
    sitemap lists them again), crawl 4 does."""
    site, crawls = recrawls
    asked = [{r.path for r in log} for log, _ in crawls]
    for path in FAILED_PATHS:
        assert [path in a for a in asked] == [True, False, True], path
    rows = [rows for _, rows in crawls]
    assert [(r["/missing.html"]["failures"], r["/missing.html"]["idle_crawls"]) for r in rows] == [(2, 0), (2, 1), (3, 0)]
    assert rows[1]["/missing.html"]["status"] == "gone" and rows[1]["/slow.html"]["status"] == "fetch_error"
    assert all(r[f"/{SITE}/index.html"]["failures"] == 0 for r in rows)

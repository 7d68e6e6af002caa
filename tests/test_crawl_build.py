"""crawl -> build equals building the served folder; a re-crawl with nothing
changed gets 304s and an update that indexes nothing; after pages change, appear
and go, re-crawl + update equals a fresh build of the new site; damaged WARC
input is dead-lettered with file and offset."""
from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest

from pipelines import build, crawl, update
from serving.api import RitragIndex
from tests.conftest import SAMPLE
from tests.crawl_site import CrawlSite
from tests.test_update import live_table
from transforms.crawldb import CRAWLDB_FILE

SITE = "sphinx"
BUILD = ["--embedding_model", "hashing:384", "--site_depth", "1"]


def crawl_flags(site, out):
    return ["--seed", site.base + f"{SITE}/index.html", "--out", str(out), "--per_host_delay_s", "0",
            "--timeout_s", "2", "--retries", "1", "--retry_backoff_s", "0.01", "--warc_shards", "2"]


def statuses(out):
    rows = pq.read_table(out / CRAWLDB_FILE).to_pylist()
    return {r["url"]: r["status"] for r in rows if r["kind"] == "page"}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    shutil.copytree(SAMPLE / SITE, root / SITE)
    with CrawlSite(root, flaky="none", busy="none", redirect_target=f"{SITE}/index.html", huge_bytes=10) as s:
        yield s


@pytest.mark.slow
def test_crawl_build_update_cycle(site, tmp_path):
    out = tmp_path / "crawl"
    crawl.run(crawl_flags(site, out))
    from_warc, from_files = tmp_path / "from_warc", tmp_path / "from_files"
    build.run(["--input", str(out), "--out", str(from_warc), *BUILD])
    build.run(["--input", str(site.root), "--out", str(from_files), "--base_url", site.base, *BUILD])
    for kind in ("nodes", "chunks", "pages"):
        assert live_table(from_warc, kind) == live_table(from_files, kind), kind
    query = "configure extensions"
    assert RitragIndex(str(from_warc)).get_toc(query) == RitragIndex(str(from_files)).get_toc(query)

    # nothing changed: 304s, no new WARC files, an update that indexes nothing
    warcs = sorted((out / "warc").iterdir())
    site.log.clear()
    crawl.run(crawl_flags(site, out))
    pages = [r for r in site.log if r.path.startswith(f"/{SITE}/")]
    assert pages and all(r.status == 304 for r in pages)
    assert sorted((out / "warc").iterdir()) == warcs
    assert set(statuses(out).values()) <= {"unchanged", "gone", "redirect", "skipped_type", "too_large",
                                           "disallowed", "fetch_error"}
    before = RitragIndex(str(from_warc)).get_toc(query)
    version = update.run(["--input", str(out), "--index", str(from_warc)])
    manifest = json.loads((from_warc / "versions" / f"{version}.json").read_text())
    assert manifest["segments"][-1]["counts"]["pages_indexed"] == 0
    assert manifest["segments"][-1]["counts"].get("chunks_added", 0) == 0
    after = RitragIndex(str(from_warc)).get_toc(query)
    assert {**after, "version": None} == {**before, "version": None}
    assert live_table(from_warc, "nodes") == live_table(from_files, "nodes")

    # change one page, add one, delete one; re-crawl + update == fresh build of the new folder
    (site.root / SITE / "faq.html").write_text((site.root / SITE / "faq.html").read_text().replace(
        "</body>", "<p>Frequently rotated answers about crawling.</p></body>"))
    shutil.copy(site.root / SITE / "support.html", site.root / SITE / "support-copy.html")
    (site.root / SITE / "glossary.html").unlink()
    crawl.run(crawl_flags(site, out))
    st = statuses(out)
    assert st[site.base + f"{SITE}/glossary.html"] == "gone"
    assert st[site.base + f"{SITE}/faq.html"] == "fetched"
    assert st[site.base + f"{SITE}/support-copy.html"] == "fetched"
    update.run(["--input", str(out), "--index", str(from_warc)])
    fresh = tmp_path / "fresh"
    build.run(["--input", str(site.root), "--out", str(fresh), "--base_url", site.base, *BUILD])
    for kind in ("nodes", "chunks", "pages"):
        assert live_table(from_warc, kind) == live_table(fresh, kind), kind


def test_damaged_warc_input_is_dead_lettered(tmp_path):
    from transforms.fetch import FetchResult
    from transforms.warc import WarcFileWriter

    body = (SAMPLE / SITE / "faq.html").read_bytes()
    writer = WarcFileWriter(str(tmp_path / "w"), "x", 10 ** 9)
    (tmp_path / "w").mkdir()
    for name in ("a", "b"):
        writer.write(FetchResult(url=f"http://h/{SITE}/{name}.html", outcome="fetched", http_status=200, body=body,
                                 fetched_at="2024-01-01T00:00:00Z", response_headers=(("Content-Type", "text/html"),)))
    writer.close()
    data = (tmp_path / "w" / writer.files[0]).read_bytes()
    (tmp_path / "w" / writer.files[0]).write_bytes(data[:-300])
    (tmp_path / "w" / "junk.warc.gz").write_bytes(b"not a warc at all")
    index = tmp_path / "index"
    build.run(["--input", str(tmp_path / "w" / "*.warc.gz"), "--out", str(index), *BUILD])
    letters = pq.read_table(next(index.glob("segments/*/dead_letters.parquet"))).to_pylist()
    assert {(l["source"].rsplit("/", 1)[1].split("#")[0], l["reason"]) for l in letters} == {
        (writer.files[0], "bad_warc"), ("junk.warc.gz", "bad_warc")}
    assert all("#" in l["source"] for l in letters)
    assert [r["url"] for r in live_table(index, "pages").values()] == [f"http://h/{SITE}/a.html"]

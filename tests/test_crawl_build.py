"""The scheduled loop (`refresh`: crawl -> build, then crawl -> update) against a
served site: the first build equals building the served folder; a refresh with
nothing changed gets 304s and publishes an empty delta; after pages change,
appear and go, a refresh equals a fresh build of the new site. A crawl takes
its directory's lease. Damaged WARC input is dead-lettered with file and offset."""
from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest

from crawl_site import CrawlSite
from ritrag import cli
from ritrag.crawl_dir import CRAWLDB_FILE
from ritrag.layout import IndexLayout
from ritrag.lease import LEASE_FILE, IndexLease, IndexLockedError
from ritrag.pipelines import build, crawl, refresh
from ritrag.serving.api import RitragIndex
from ritrag.transforms.crawl.downloader import FetchResult
from ritrag.transforms.crawl.warc_writer import WarcFileWriter
from support import SAMPLE, live_table

SITE = "sphinx"
BUILD = ["--embedding_model", "hashing:384", "--site_depth", "1"]


CRAWL = ["--per_host_delay_s", "0", "--timeout_s", "2", "--retries", "1", "--retry_backoff_s", "0.01",
         "--warc_shards", "2"]


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
def test_refresh_cycle(site, tmp_path, capsys):
    """`refresh` (crawl -> build the first time, crawl -> update after) against
    the served site, the second run through `ritrag refresh`."""
    crawl_dir, index = tmp_path / "crawl", tmp_path / "index"
    flags = ["--crawl_dir", str(crawl_dir), "--index", str(index), *CRAWL, *BUILD]
    first = refresh.run(["--seed", site.base + f"{SITE}/index.html", *flags])
    assert first["built"] and first["crawl"]["page_fetched"] == len(site.page_paths())
    from_files = tmp_path / "from_files"
    build.run(["--input", str(site.root), "--out", str(from_files), "--base_url", site.base, *BUILD])
    for kind in ("nodes", "chunks", "pages"):
        assert live_table(index, kind) == live_table(from_files, kind), kind
    query = "configure extensions"
    before = RitragIndex(str(index)).get_toc(query)
    assert before == RitragIndex(str(from_files)).get_toc(query)

    # nothing changed: 304s, no new WARC files, and no new version (the update publishes nothing)
    warcs = sorted((crawl_dir / "warc").iterdir())
    site.log.clear()
    capsys.readouterr()
    assert cli.main(["refresh", site.base + f"{SITE}/index.html", *flags]) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    pages = [r for r in site.log if r.path.startswith(f"/{SITE}/")]
    # every page asked conditionally and unchanged; links to nothing (404 in the first crawl) asked again
    assert {r.path for r in pages if r.status == 304} == {"/" + p for p in site.page_paths()}
    assert {r.status for r in pages} == {304, 404}
    assert sorted((crawl_dir / "warc").iterdir()) == warcs
    assert set(statuses(crawl_dir).values()) <= {"unchanged", "gone", "redirect", "skipped_type", "too_large",
                                                 "disallowed", "fetch_error"}
    assert not second["built"] and second["version"] == first["version"]
    assert sorted(p.name for p in (index / "versions").iterdir()) == [f"{first['version']}.json"]
    assert RitragIndex(str(index)).get_toc(query) == before
    assert live_table(index, "nodes") == live_table(from_files, "nodes")

    # change one page, add one, delete one: refresh == fresh build of the new folder
    (site.root / SITE / "faq.html").write_text((site.root / SITE / "faq.html").read_text().replace(
        "</body>", "<p>Frequently rotated answers about crawling.</p></body>"))
    shutil.copy(site.root / SITE / "support.html", site.root / SITE / "support-copy.html")
    (site.root / SITE / "glossary.html").unlink()
    refresh.run(["--seed", site.base + f"{SITE}/index.html", *flags])
    st = statuses(crawl_dir)
    assert st[site.base + f"{SITE}/glossary.html"] == "gone"
    assert st[site.base + f"{SITE}/faq.html"] == "fetched"
    assert st[site.base + f"{SITE}/support-copy.html"] == "fetched"
    fresh = tmp_path / "fresh"
    build.run(["--input", str(site.root), "--out", str(fresh), "--base_url", site.base, *BUILD])
    for kind in ("nodes", "chunks", "pages"):
        assert live_table(index, kind) == live_table(fresh, kind), kind


def test_a_crawl_takes_the_crawl_directorys_lease(tmp_path):
    with IndexLease(IndexLayout(str(tmp_path)), "another crawl"):
        with pytest.raises(IndexLockedError, match="another crawl"):
            crawl.run(["--seed", "http://127.0.0.1:9/", "--out", str(tmp_path)])
        assert [p.name for p in tmp_path.iterdir()] == [LEASE_FILE]  # refused before anything was written


def test_damaged_warc_input_is_dead_lettered(tmp_path):
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

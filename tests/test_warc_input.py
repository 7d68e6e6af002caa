"""WARC input is recognised by its content, whatever its name (issue 24, item 3),
and one sniffer decides the kind of a page wherever its bytes come from: a file,
a WARC record, the crawler."""
from __future__ import annotations

import io
import shutil

import pytest
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from crawl_site import CrawlSite
from ritrag.pipelines import build, crawl
from ritrag.schema import WarcPage
from ritrag.transforms.pages import warc_kind
from ritrag.transforms.sources import sniff_kind
from ritrag.transforms.sources.warc import read_warc_pages
from support import SAMPLE, live_table

BUILD = ["--embedding_model", "hashing:384", "--site_depth", "1"]
CRAWL = ["--per_host_delay_s", "0", "--timeout_s", "2", "--retries", "1", "--retry_backoff_s", "0.01",
         "--warc_shards", "2", "--max_pages", "6"]
BOM_HTML = b"\xef\xbb\xbf<!DOCTYPE html><html><head><title>Bom</title></head><body><p>Byte order mark.</p></body></html>"


@pytest.fixture(scope="module")
def crawl_dir(tmp_path_factory):
    """A crawl folder of a few pages of the sample's Sphinx site."""
    root = tmp_path_factory.mktemp("served")
    shutil.copytree(SAMPLE / "sphinx", root / "sphinx")
    out = tmp_path_factory.mktemp("crawl")
    with CrawlSite(root, flaky="none", busy="none", redirect_target="sphinx/index.html", huge_bytes=10) as site:
        crawl.run(["--seed", site.base + "sphinx/index.html", "--out", str(out), *CRAWL])
    return out


def test_renamed_warc_copies_build_the_same_index_as_the_crawl_folder(crawl_dir, tmp_path):
    copies = tmp_path / "warc-copies"
    copies.mkdir()
    warcs = sorted((crawl_dir / "warc").iterdir())
    assert len(warcs) >= 2 and all(w.name.endswith(".warc.gz") for w in warcs)
    for number, warc in enumerate(warcs):  # gzip content under names that do not say so, or say nothing
        shutil.copy(warc, copies / (f"copy-{number}.warc" if number % 2 == 0 else f"copy-{number}"))
    (copies / "bom.html").write_bytes(BOM_HTML)  # a glob may mix WARC and page files
    from_crawl, from_copies = tmp_path / "from_crawl", tmp_path / "from_copies"
    build.run(["--input", str(crawl_dir), "--out", str(from_crawl), *BUILD])
    build.run(["--input", str(copies / "*"), "--out", str(from_copies), "--base_url", "http://files.example/",
               *BUILD])
    for kind in ("nodes", "chunks"):
        crawled, copied = live_table(from_crawl, kind), live_table(from_copies, kind)
        assert crawled and {k: v for k, v in copied.items() if k in crawled} == crawled, kind
    extra = [row for key, row in live_table(from_copies, "nodes").items()
             if key not in live_table(from_crawl, "nodes")]
    assert [row["title"] for row in extra if row["kind"] == "page"] == ["Bom"]


def web_record(url: str, payload: bytes, content_type: str) -> bytes:
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=True)
    writer.write_record(writer.create_warc_record(
        url, "response", payload=io.BytesIO(payload),
        http_headers=StatusAndHeaders("200 OK", [("Content-Type", content_type)], protocol="HTTP/1.1")))
    return out.getvalue()


@pytest.mark.parametrize("name, data, kind", [
    ("bom.html", BOM_HTML, "html"),
    ("prefixed.pdf", b"\x00junk before the header\n%PDF-1.7\n", "pdf"),
])
def test_the_same_bytes_are_the_same_kind_as_a_file_and_as_a_warc_record(tmp_path, name, data, kind):
    (tmp_path / "one.bin").write_bytes(web_record(f"http://h/{name}", data, "application/octet-stream"))
    [record] = read_warc_pages(str(tmp_path / "one.bin"), 1 << 20)
    assert isinstance(record, WarcPage) and record.payload == data
    assert sniff_kind(name, data) == warc_kind(record) == kind

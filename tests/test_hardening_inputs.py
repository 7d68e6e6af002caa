"""Issue 37, the input side: index files that other users can read (item 4),
file names that are not UTF-8 (5), inputs larger than --max_page_bytes read no
further than the limit (6), Markdown nested past markdown-it's limit (9),
Discourse posts sharing a number (10), paper sections numbered in their
titles (12)."""
from __future__ import annotations

import codecs
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from support import build_index

import ritrag.layout
from ritrag.ids import node_id_for
from ritrag.layout import IndexLayout, IndexLoadError
from ritrag.storage import write_atomic


def umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# --- item 4: the umask's mode; an unreadable CURRENT is no missing CURRENT -------

@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_write_atomic_gives_the_mode_the_umask_gives(tmp_path, mask):
    old = os.umask(mask)
    try:
        write_atomic(str(tmp_path / "CURRENT"), b"v000001\n")
    finally:
        os.umask(old)
    assert (tmp_path / "CURRENT").stat().st_mode & 0o777 == 0o666 & ~mask
    assert [p.name for p in tmp_path.iterdir()] == ["CURRENT"]  # no temporary file left


def test_current_and_manifests_have_the_mode_of_the_segment_files(tiny_hash_index):
    layout = IndexLayout(str(tiny_hash_index))
    version = layout.current_version()
    expected = 0o666 & ~umask()
    segment_files = [p for p in (tiny_hash_index / "segments").rglob("*.parquet")]
    assert segment_files and {p.stat().st_mode & 0o666 for p in segment_files} == {expected}
    for path in (layout.current_path, layout.manifest_path(version)):
        assert os.stat(path).st_mode & 0o777 == expected, path


def test_a_current_that_cannot_be_read_is_reported_as_such_not_as_missing(tiny_hash_index, monkeypatch):
    def refused(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(ritrag.layout, "open_read", refused)
    with pytest.raises(IndexLoadError, match="PermissionError.*Permission denied") as raised:
        IndexLayout(str(tiny_hash_index)).current_version()
    assert "missing" not in str(raised.value)


# --- item 5: file names that are not UTF-8 ---------------------------------------

# Every byte that cannot stand alone in UTF-8, every control character, and a
# backslash next to an undecodable byte (the stored form doubles backslashes).
ODD_NAMES = ([b"byte-%02x-" % b + bytes([b]) + b".html" for b in range(0x80, 0x100)]
             + [b"ctl-%02x-" % b + bytes([b]) + b".html" for b in [*range(0x01, 0x20), 0x7f]]
             + [b"back\\slash-\xff.html", b"dir-\xfe\x80/page-\xc3.md", b"ok.html"]
             # "?" and "#" are the file's: cut there, each pair would be one URL
             + [b"hash#1.html", b"hash#2.html", b"list.php?utm_source=a.html", b"list.php?utm_source=b.html"])


def test_names_that_are_not_utf8_are_indexed_and_their_bytes_kept(tmp_path):
    site = tmp_path / "site"
    for name in ODD_NAMES:
        path = os.path.join(os.fsencode(site), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(b"# A document\n\nMarkdown text.\n" if name.endswith(b".md") else
                     b"<html><head><title>%s</title></head><body><p>Text of the page.</p></body></html>"
                     % name.hex().encode())
    # a link as `wget -k` writes it to a saved page whose URL had a query
    (site / "ok.html").write_text('<html><head><title>ok</title></head><body><p>See '
                                  '<a href="list.php%3Futm_source=a.html">the list</a>.</p></body></html>')
    out = tmp_path / "index"
    build_index(site, out, "--embedding_model", "hashing:384")
    [segment] = (out / "segments").iterdir()
    pages = pq.read_table(next(segment.glob("pages-*.parquet"))).to_pylist()
    edges = pq.ParquetDataset(sorted(segment.glob("edges-*.parquet"))).read().to_pylist()
    listed = node_id_for("https://docs.example.com/list.php%3Futm_source=a.html")
    assert [(e["source_node_id"], e["target_node_id"]) for e in edges] == [
        (node_id_for("https://docs.example.com/ok.html"), listed)]
    dead = pq.read_table(segment / "dead_letters.parquet").to_pylist()
    assert dead == []  # each file a page, none a dead letter
    stored = sorted(codecs.escape_decode(row["source"].encode("utf-8"))[0] for row in pages)
    assert stored == sorted(os.path.join(os.fsencode(site), name) for name in ODD_NAMES)  # bytes round-trip
    assert len({row["url"] for row in pages}) == len(ODD_NAMES)  # one URL each: none merged
    assert {"https://docs.example.com/byte-ff-%FF.html", "https://docs.example.com/hash%231.html",
            "https://docs.example.com/list.php%3Futm_source=a.html"} <= {row["url"] for row in pages}


# --- item 6: no input is read past --max_page_bytes + 1 ---------------------------

BIG = 8 << 30  # a sparse file: no disk, but 8 GiB to whoever reads it whole
BUILD_ADDRESS_SPACE = 5 << 30  # a build of a few pages maps 3.2 GiB (Beam, pyarrow, threads)


def bounded_build(args: list[str], address_space: int) -> dict:
    """`ritrag.pipelines.build.run(args)` in a subprocess under `address_space`:
    {"version", "rss_growth_mb": peak RSS above the RSS after imports}."""
    import subprocess
    import sys
    import textwrap

    program = textwrap.dedent(f'''
        import json, resource
        resource.setrlimit(resource.RLIMIT_AS, ({address_space}, {address_space}))
        from ritrag.pipelines import build
        start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        version = build.run({args!r})
        growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start
        print(json.dumps({{"version": version, "rss_growth_mb": growth / 1024}}))
    ''')
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_input_far_past_the_limit_costs_a_build_no_more_than_the_limit(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "small.html").write_text('<html><head><link rel="canonical" href="https://docs.example.com/small.html">'
                                     '<title>Small</title></head><body><p>A small page.</p></body></html>')
    with open(site / "huge.html", "wb") as fh:
        fh.write(b"<html><head><title>Huge</title></head><body><p>")
        fh.truncate(BIG)
    assert os.stat(site / "huge.html").st_blocks * 512 < 1 << 20  # sparse indeed
    out = tmp_path / "index"
    # No --base_url: the head pass (InferSiteBases) reads every HTML file too.
    result = bounded_build(["--input", str(site), "--out", str(out), "--embedding_model", "hashing:384",
                            "--max_page_bytes", str(8 << 20)], BUILD_ADDRESS_SPACE)
    assert result["rss_growth_mb"] < 200, result
    [segment] = (out / "segments").iterdir()
    dead = pq.read_table(segment / "dead_letters.parquet").to_pylist()
    assert [(Path(d["source"]).name, d["reason"]) for d in dead] == [("huge.html", "too_large")]
    assert [Path(r["source"]).name for r in pq.read_table(next(segment.glob("pages-*.parquet"))).to_pylist()] \
        == ["small.html"]


def test_reading_a_file_reads_no_more_than_the_limit_and_one_byte(tmp_path):
    from ritrag.transforms.pages import read_bounded
    from ritrag.transforms.parse import UnparseablePage

    path = tmp_path / "page.html"
    path.write_bytes(b"x" * 1000)
    opened = []

    def open_file():
        opened.append(open(path, "rb"))
        return opened[-1]

    assert read_bounded(open_file, 1000) == b"x" * 1000
    with pytest.raises(UnparseablePage, match="over 999 bytes") as refused:
        read_bounded(open_file, 999)
    assert refused.value.reason == "too_large" and opened[-1].closed


# --- item 9: Markdown nested past markdown-it's limit ------------------------------

def parse_file(path: Path, root: Path):
    from ritrag.transforms.pages import PageParser, parse_or_dead_letter, read_file

    parser = PageParser(str(root) + "/", "http://localhost/", 1, 1 << 24)
    return parse_or_dead_letter(parser, str(path), lambda: read_file(str(path)), "parse")


def nested_list(depth: int) -> str:
    return "# Nested\n\n" + "".join("  " * i + f"- item at level {i}\n" for i in range(depth))


def nested_quotes(depth: int) -> str:
    return "# Quoted\n\n" + "".join(">" * i + f" quote at level {i}\n\n" for i in range(1, depth + 1))


@pytest.mark.parametrize("markdown, deepest", [(nested_list(10), "item at level 9"),
                                               (nested_list(40), "item at level 39"),
                                               (nested_quotes(20), "quote at level 20"),
                                               (nested_quotes(90), "quote at level 90")])
def test_markdown_nested_deep_keeps_every_line_of_its_text(tmp_path, markdown, deepest):
    (tmp_path / "deep.md").write_text(markdown)
    [page] = parse_file(tmp_path / "deep.md", tmp_path)
    lines = [line for line in markdown.splitlines()[1:] if line.strip()]
    assert all(line.lstrip(" ->").strip() in page.body for line in lines)
    assert deepest in page.body


@pytest.mark.parametrize("markdown", [nested_list(60), nested_quotes(1000)])
def test_markdown_nested_past_the_limit_is_a_dead_letter_not_cut_text(tmp_path, markdown):
    (tmp_path / "deeper.md").write_text(markdown)
    letter = parse_file(tmp_path / "deeper.md", tmp_path)
    assert (letter.reason, letter.detail) == ("too_deep", "blocks nested 100 levels deep (a list counts two)")

"""An update's quick check: a file whose size and mtime equal those its page was
indexed with is taken as unchanged without being read (transforms/diff.py);
`--read_every_input` reads and hashes every file instead."""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ritrag.layout import IndexLayout
from ritrag.pipelines import update
from ritrag.reader import IndexReader
from ritrag.transforms.pages import PageParser
from ritrag.urls import site_of
from support import TINY_SITE, build_index, live_table, tiny_page, write_tiny_site

HOUR_AGO = time.time() - 3600


def age(directory: Path, when: float = HOUR_AGO) -> None:
    """Every file's mtime set to `when`: files written by a test are seconds old,
    and a file modified within STAMP_SETTLE_S of its read gets no stamp."""
    for path in directory.rglob("*.html"):
        os.utime(path, (when, when))


def counts(index: Path) -> dict:
    return IndexLayout(str(index)).load_manifest().stats["pages"]


def same_size_edit(path: Path, old: bytes, new: bytes) -> None:
    """Change the file's bytes, keeping its size and its mtime."""
    assert len(old) == len(new)
    stat = path.stat()
    data = path.read_bytes()
    assert old in data
    path.write_bytes(data.replace(old, new, 1))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size


@pytest.fixture(scope="module")
def aged_index(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("stamps")
    site = write_tiny_site(root / "site")
    age(site)
    index = root / "index"
    build_index(site, index, "--embedding_model", "hashing:384")
    return site, index


def test_a_build_records_each_file_page_with_its_size_and_mtime(aged_index):
    site, index = aged_index
    pages = IndexReader(str(index)).table("pages", ["url", "source", "source_stamp"]).to_pylist()
    assert len(pages) == len(TINY_SITE)
    for row in pages:
        stat = os.stat(row["source"])
        assert row["source_stamp"] == f"{stat.st_size}:{os.path.getmtime(row['source'])!r}"


def test_a_file_modified_just_before_its_read_gets_no_stamp(tmp_path):
    # Dated an hour after now, so however long the build takes to read them they
    # were modified within STAMP_SETTLE_S of the read (a clock ahead of the reader's
    # is the same case): no elapsed time decides what this test sees.
    site = write_tiny_site(tmp_path / "site")
    age(site, time.time() + 3600)
    build_index(site, tmp_path / "index", "--embedding_model", "hashing:384")
    stamps = IndexReader(str(tmp_path / "index")).table("pages", ["source_stamp"])["source_stamp"].to_pylist()
    assert stamps == [""] * len(TINY_SITE)


@pytest.mark.timeout(600)
def test_unchanged_stamps_are_trusted_unread_and_read_every_input_reads_them(aged_index, tmp_path):
    import shutil

    site, built = aged_index
    snapshot = tmp_path / "site"
    shutil.copytree(site, snapshot, copy_function=shutil.copy2)  # copy2 keeps the mtimes
    index = tmp_path / "index"
    shutil.copytree(built, index)

    # One page edited as an editor does (new mtime), one with its size and mtime kept.
    title, trail, _ = TINY_SITE["shop/v3/logging.html"]
    (snapshot / "shop/v3/logging.html").write_text(tiny_page(
        title, trail, [("Rotation", "Logs rotate hourly; keep thirty files.")]))
    same_size_edit(snapshot / "shop/v2/config.html", b"port 8080", b"port 9090")

    update.run(["--input", str(snapshot), "--index", str(index)])
    first = counts(index)
    assert first["pages_trusted_by_stamp"] == len(TINY_SITE) - 1  # every file but the edited one, unread
    assert first["pages_unchanged"] == len(TINY_SITE) - 1
    assert first["pages_indexed"] == 1
    bodies = " ".join(r["body"] for r in live_table(index, "nodes").values())
    assert "keep thirty files" in bodies
    assert "port 9090" not in bodies  # the edit that kept size and mtime is missed, as by rsync's quick check

    update.run(["--input", str(snapshot), "--index", str(index), "--read_every_input"])
    second = counts(index)
    assert second["pages_trusted_by_stamp"] == 0
    assert second["pages_indexed"] == 1  # the edit that kept size and mtime, found by its hash
    assert "port 9090" in " ".join(r["body"] for r in live_table(index, "nodes").values())


@pytest.mark.timeout(600)
def test_a_new_file_at_a_trusted_url_and_a_deleted_one_are_still_found(aged_index, tmp_path):
    import shutil

    site, built = aged_index
    snapshot = tmp_path / "site"
    shutil.copytree(site, snapshot, copy_function=shutil.copy2)
    index = tmp_path / "index"
    shutil.copytree(built, index)
    (snapshot / "shop/v2/config.html").unlink()
    (snapshot / "shop/v3/metrics.html").write_text(tiny_page(
        "Metrics", [("Shop Server", "shop/"), ("Version 3", "shop/v3/")],
        [("Endpoint", "Prometheus scrapes /metrics on the admin port.")]))
    update.run(["--input", str(snapshot), "--index", str(index)])
    result = counts(index)
    assert result["pages_deleted"] == 1
    assert result["pages_indexed"] == 1
    assert result["pages_trusted_by_stamp"] == len(TINY_SITE) - 1
    urls = {r["url"] for r in live_table(index, "pages").values()}
    assert any(u.endswith("shop/v3/metrics.html") for u in urls)
    assert not any(u.endswith("shop/v2/config.html") for u in urls)


@pytest.mark.timeout(900)
def test_a_file_of_several_pages_has_no_stamp_and_is_read_so_none_of_its_pages_is_lost(tmp_path):
    import shutil

    from support import ROOT

    site = tmp_path / "mixed"
    shutil.copytree(ROOT / "sample" / "mixed", site)
    for path in site.rglob("*"):
        if path.is_file():
            os.utime(path, (HOUR_AGO, HOUR_AGO))
    index = tmp_path / "index"
    build_index(site, index, "--embedding_model", "hashing:384")
    pages = IndexReader(str(index)).table("pages", ["url", "source", "source_stamp"]).to_pylist()
    by_file: dict[str, int] = {}
    for row in pages:
        by_file[row["source"].split("#")[0]] = by_file.get(row["source"].split("#")[0], 0) + 1
    threads = {path for path, count in by_file.items() if count > 1}
    assert threads  # the forum topic and the Q&A dump: files of several pages
    assert all(row["source_stamp"] == "" for row in pages if row["source"].split("#")[0] in threads)
    stamped = sum(1 for row in pages if row["source_stamp"])
    assert stamped > 0

    # one new page, so that the update publishes its counts (with no change it would publish nothing)
    (site / "added.html").write_text(tiny_page("Added notes", [], [("Kites", "Box kites fly in steady wind.")]))
    update.run(["--input", str(site), "--index", str(index)])
    result = counts(index)
    assert result["pages_deleted"] == 0 and result["pages_indexed"] == 1
    assert result["pages_trusted_by_stamp"] == stamped  # the files of one page, unread
    assert result["pages_unchanged"] == len(pages)  # every post of every thread read and found unchanged
    urls = {r["url"] for r in live_table(index, "pages").values()}
    assert urls > {r["url"] for r in pages} and len(urls) == len(pages) + 1


def test_the_diff_lists_a_folder_as_beams_match_files_does(tmp_path):
    """`listed_files` walks a local folder itself (one stat a file); what it
    lists is what Beam's FileSystems.match lists, odd entries included."""
    from apache_beam.io.filesystems import FileSystems

    from ritrag.transforms.diff import listed_files

    root = tmp_path / "in"
    (root / "a" / ".hidden").mkdir(parents=True)
    (root / "a" / "page.html").write_text("<p>one</p>")
    (root / "a" / ".hidden" / "x.html").write_text("<p>two</p>")
    (root / "new\nline.html").write_text("<p>three</p>")
    (root / "sp ace.md").write_text("# four")
    os.symlink(root / "a" / "page.html", root / "link.html")
    os.symlink(tmp_path / "missing", root / "dangling.html")  # Beam drops it (its stat fails); listed here
    os.symlink(root / "a", root / "folder-link")  # a link to a folder: not walked by either
    os.mkfifo(root / "fifo.html")
    os.utime(root / "sp ace.md", (1_000_000_000.5, 1_000_000_000.25))
    dangling = os.lstat(root / "dangling.html")
    for pattern in (f"{root}/**", f"{root}/a/*", f"{root}/*.html", f"{root}/**.md"):
        expected = sorted([(m.path, m.size_in_bytes, m.last_updated_in_seconds)
                           for m in FileSystems.match([pattern])[0].metadata_list]
                          + [(str(root / "dangling.html"), dangling.st_size, dangling.st_mtime)]
                          * (pattern in (f"{root}/**", f"{root}/*.html")))
        assert sorted(listed_files(pattern)) == expected, pattern
    assert len(list(listed_files(f"{root}/**"))) == 7
    assert list(listed_files(f"{tmp_path}/nowhere/**")) == []


def test_stamps_trust_a_file_alone_at_its_url_and_the_shard_still_finds_twins_and_gone_pages(aged_index):
    """The diff's two shard steps, fed directly: MatchStampsFn trusts a file by
    its stamp only where it is the one file at a URL with one live row (a second
    file at a URL sends both to be read); ClassifyShardFn counts the trusted ones
    unchanged, compares a trusted URL that a read file also names like any
    other (both parsed, the old page tombstoned), and finds a live page no
    input names gone."""
    from collections import defaultdict

    from ritrag.ids import shard_of
    from ritrag.transforms.diff import ClassifyShardFn, MatchStampsFn

    _, index = aged_index
    live = IndexReader(str(index))
    num_shards = live.manifest.settings.index.num_shards
    rows = sorted(live.table("pages", ["url", "source"]).to_pylist(), key=lambda r: r["url"])
    twin_url, named_twice, gone = rows[0]["url"], rows[1]["url"], rows[2]["url"]
    located = defaultdict(list)
    for row in rows[:2] + rows[3:]:
        status = os.stat(row["source"])
        located[shard_of(row["url"], num_shards)].append((row["url"], (row["source"], status.st_size,
                                                                        status.st_mtime)))
    located[shard_of(twin_url, num_shards)].append((twin_url, ("/elsewhere/twin.md", 10, 1_000_000_000.0)))

    trusted, to_read = {}, []
    match = MatchStampsFn(live)
    for shard, files in located.items():
        for out in match.process((shard, [files])):
            if isinstance(out, tuple):
                trusted[shard] = out[1]
            else:
                to_read += out.value
    trusted_urls = {u for table in trusted.values() for u in table["url"].to_pylist()}
    assert trusted_urls == {r["url"] for r in rows} - {twin_url, gone}
    assert sorted(path for path, _, _ in to_read) == sorted([rows[0]["source"], "/elsewhere/twin.md"])

    classify = ClassifyShardFn(live)
    outputs = defaultdict(list)
    for shard in range(num_shards):
        inputs = [trusted[shard]] if shard in trusted else []
        read = [(url, (path, "not-the-stored-hash")) for url, (path, _, _) in located[shard] if url == twin_url]
        if shard == shard_of(named_twice, num_shards):  # a record of another file names a trusted URL
            read.append((named_twice, ("/elsewhere/thread.html", "another-hash")))
        for out in classify.process((shard, inputs + [read, []])):
            tag = getattr(out, "tag", "parse")
            outputs[tag].append(out.value if tag != "parse" else out)
    assert sorted(outputs[ClassifyShardFn.DEAD_URL]) == sorted([twin_url, named_twice, gone])
    assert sorted(url for url, _ in outputs[ClassifyShardFn.OLD_SKELETON]) == sorted([twin_url, named_twice])
    assert sorted(outputs["parse"]) == sorted([rows[0]["source"], "/elsewhere/twin.md", rows[1]["source"],
                                               "/elsewhere/thread.html"])
    assert len(outputs[ClassifyShardFn.GONE_SITE]) == 1
    counts = dict(out.value.value for out in classify.finish_bundle())
    assert counts == {"pages_read": len(rows) + 1, "pages_unchanged": len(rows) - 3, "pages_replaced": 2,
                      "pages_deleted": 1}


@pytest.mark.timeout(900)
def test_an_update_takes_odd_file_names_as_a_build_does(aged_index, tmp_path):
    """A name that is not UTF-8 reaches the diff's elements as lone surrogates,
    which Beam's str coder refuses, and a name with [ ] was read as a pattern
    when the changed file was opened: either failed the whole update. Now both
    files, and one with "#" in its name, are indexed as a build indexes them
    (same URLs, sources), beside a
    FIFO and a dangling link, which are dead-lettered or skipped as before."""
    import shutil

    site, built = aged_index
    snapshot = tmp_path / "site"
    shutil.copytree(site, snapshot, copy_function=shutil.copy2)
    index = tmp_path / "index"
    shutil.copytree(built, index)
    odd = os.path.join(os.fsencode(snapshot / "shop"), b"caf\xe9-notes.html")
    with open(odd, "w") as fh:
        fh.write(tiny_page("Cafe notes", [("Shop Server", "shop/")],
                           [("Beans", "The grinder keeps seven burr settings for espresso.")]))
    (snapshot / "shop" / "notes[1].html").write_text(tiny_page(
        "Mooring notes", [("Shop Server", "shop/")], [("Masts", "Zeppelins moor at masts of steel lattice.")]))
    (snapshot / "shop" / "notes#2.html").write_text(tiny_page(
        "Airship notes", [("Shop Server", "shop/")], [("Hangars", "Airships wait in hangars of timber.")]))
    os.mkfifo(snapshot / "shop" / "pipe.html")
    os.symlink(tmp_path / "missing.html", snapshot / "shop" / "dangling.html")
    update.run(["--input", str(snapshot), "--index", str(index)])
    assert counts(index)["pages_indexed"] == 3
    fresh = tmp_path / "fresh"
    build_index(snapshot, fresh, "--embedding_model", "hashing:384")
    def sources(at: Path) -> dict[str, str]:  # unchanged pages keep the source they were read from
        return {r["url"]: r["source"] for r in IndexReader(str(at)).table("pages", ["url", "source"]).to_pylist()}

    updated, rebuilt = sources(index), sources(fresh)
    assert updated.keys() == rebuilt.keys()
    assert any(url.endswith("/shop/notes%232.html") for url in updated)  # "#" is the name's, not a fragment
    for name in ("caf\\xe9-notes.html", "notes[1].html", "notes#2.html"):
        odd_url = next(url for url, source in rebuilt.items() if source.endswith(name))
        assert updated[odd_url] == rebuilt[odd_url]


# Folder and file names as inputs hold them: plain ones, and what a URL must
# encode, normalize_url changes or a kind renames (index files, README.md, a
# JSON file served without its suffix, dot segments, case, a name not UTF-8).
_NAMES = st.sampled_from(["a.html", "b", "index.html", "INDEX.HTM", "README.md", "guide.md", "t.json", "x.rst",
                          "a#1.html", "p.php?id=3.html", "sp ace.html", "..x", ".hidden", "é.html", "ctl\x01.html",
                          "caf\udce9.html", "A~b!$&'()*+,;=%-_.html", "x.md.html", "index.php",
                          "&gclid=1.html"])
_FOLDERS = st.lists(st.sampled_from(["docs", "Docs", "v1.2", "sp ace", "q?x", "é", "_", "a", "aaa", "index.html"]),
                    max_size=3)


@settings(max_examples=300, deadline=None)
@given(files=st.lists(st.tuples(_FOLDERS, _NAMES), min_size=1, max_size=12),
       base_url=st.sampled_from(["http://localhost/", "https://Docs.Example.com:443/root/", "file:///", "http://h/x?q=1"]),
       site_depth=st.integers(0, 3), bases=st.sets(st.integers(0, 11), max_size=4))
def test_document_urls_are_each_files_document_url(files, base_url, site_depth, bases):
    """The diff locates a batch of files by folder (`PageParser.document_urls`):
    each URL is the one `document_url` gives the file alone, with public bases
    for some of the sites, at any site depth (a site keyed by a file's own name too)."""
    root = "/in/"
    paths = [root + "/".join([*folders, name]) for folders, name in files]
    plain = PageParser(root, base_url, site_depth)
    sites = sorted({site_of(plain.input_url(p), site_depth) for p in paths})
    site_bases = tuple(sorted((site, f"https://public{i}.example/p{i}/") for i, site in enumerate(sites) if i in bases))
    for parser in (plain, dataclasses.replace(plain, site_bases=site_bases)):
        assert parser.document_urls(paths) == [parser.document_url(p) for p in paths]

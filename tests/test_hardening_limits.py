"""Issue 37, limits an input meets and how a job reports what it met: sections
per page capped (item 8); paper sections nested by their numbers, an update's
parse progress over the pages it parses, a full disk as one JSON line (item 12)."""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from support import BASE, tiny_page

from ritrag.layout import IndexLayout
from ritrag.pipelines import update
from ritrag.schema import Section
from ritrag.serving.api import RitragIndex
from ritrag.transforms.pages import PageParser
from ritrag.transforms.parse.sections import MAX_PAGE_SECTIONS, cap_sections
from ritrag.transforms.progress import progress_line
from ritrag.transforms.sources.common import SourceFile
from ritrag.transforms.sources.paper import parse_paper

SAMPLE_SITE = Path(__file__).resolve().parent.parent / "sample" / "pages" / "flask"


# --- item 8: sections per page -------------------------------------------------

def test_sections_past_the_cap_join_their_nearest_kept_parent_with_their_text():
    sections = (Section("Page", 0, "", "intro", ()), Section("A", 1, "a", "text a", ("A",)),
                Section("B", 2, "b", "text b", ("A", "B")), Section("C", 2, "c", "text c", ("A", "C")),
                Section("D", 3, "d", "text d", ("A", "C", "D")), Section("E", 1, "e", "text e", ("E",)),
                Section("F", 2, "f", "", ("E", "F")))
    capped, merged = cap_sections(sections, "Page", cap=3)
    assert merged == 4
    assert [(s.title, s.text) for s in capped] == [
        ("Page", "intro\n\nE\n\ntext e\n\nF"),  # E closes A: E and its child F join the page
        ("A", "text a\n\nC\n\ntext c\n\nD\n\ntext d"),  # C (a sibling of B) and its child D join A
        ("B", "text b")]
    assert cap_sections(sections, "Page", cap=7) == (sections, 0)


def test_a_page_without_its_own_section_gets_one_for_the_merged_tail():
    sections = tuple(Section(f"H{i}", 1, f"h{i}", f"text {i}", (f"H{i}",)) for i in range(4))
    capped, merged = cap_sections(sections, "Page", cap=3)
    assert merged == 2
    assert [(s.title, s.level, s.text) for s in capped] == [
        ("Page", 0, "H2\n\ntext 2\n\nH3\n\ntext 3"), ("H0", 1, "text 0"), ("H1", 1, "text 1")]


def test_every_input_kind_is_capped_where_pages_are_finished(tmp_path):
    headings = MAX_PAGE_SECTIONS + 50
    (tmp_path / "many.md").write_text("# Many\n\nIntro.\n\n" + "".join(
        f"## Part {i}\n\nWords of part {i}.\n\n" for i in range(headings)))
    (tmp_path / "many.html").write_text("<html><head><title>Many</title></head><body><main><h1>Many</h1>"
                                        + "".join(f"<h2>Part {i}</h2><p>Words of part {i}.</p>"
                                                  for i in range(headings)) + "</main></body></html>")
    parser = PageParser(str(tmp_path) + "/", BASE + "/", 1, 1 << 24)
    for name in ("many.md", "many.html"):
        [page] = parser.parse(str(tmp_path / name), (tmp_path / name).read_bytes())
        assert len(page.sections) == MAX_PAGE_SECTIONS, name
        assert page.sections_past_cap == headings + 1 - MAX_PAGE_SECTIONS, name
        assert f"Part {headings - 1}\n\nWords of part {headings - 1}." in page.sections[0].text, name


# A build of a few pages maps about 3.2 GiB (Beam, pyarrow, threads); 5 GiB
# leaves room for the page and fails the build where the cost runs away.
BUILD_ADDRESS_SPACE = 5 << 30
# Before the cap, this page cost 20,001 nodes and 40,000 chunks (about 40 KB of
# memory a section, 9 minutes for 100,000); after it, the cap's 1,000 nodes.
MANY_SECTIONS = 20_000


def bounded_build(args: list[str]) -> dict:
    """`ritrag.pipelines.build.run(args)` in a subprocess under BUILD_ADDRESS_SPACE
    -> {"rss_growth_mb"}: its peak RSS above the RSS after its imports (measured
    in the child: RUSAGE_CHILDREN keeps the largest child of the whole session)."""
    program = textwrap.dedent(f'''
        import json, resource
        from ritrag.pipelines import build
        start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        build.run({args!r})
        growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start
        print(json.dumps({{"rss_growth_mb": growth / 1024}}))
    ''')
    import resource

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (BUILD_ADDRESS_SPACE, BUILD_ADDRESS_SPACE))

    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=600,
                          preexec_fn=limited)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_page_of_many_headings_costs_the_cap_of_nodes_and_keeps_its_text(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "many.html").write_text(
        "<!doctype html><html><head><title>Many headings</title></head><body><main><h1>Many headings</h1>"
        "<p>The page opens.</p>"
        + "".join(f"<h2>Heading {i}</h2><p>body{i}</p>" for i in range(MANY_SECTIONS - 1))
        + "<h2>Last heading</h2><p>The zebracorn grazes at the very end.</p></main></body></html>")
    (site / "other.html").write_text(tiny_page("Other page", [], [("Some", "Text of another page.")]))
    out = tmp_path / "index"
    result = bounded_build(["--input", str(site), "--out", str(out), "--base_url", BASE + "/",
                            "--granularity", "section", "--embedding_model", "hashing:384"])
    [segment] = (out / "segments").iterdir()
    nodes = [row for path in segment.glob("nodes-*.parquet")
             for row in pq.read_table(path, columns=["url"]).to_pylist()]
    many = [n for n in nodes if n["url"].startswith(f"{BASE}/many.html")]
    assert len(many) == MAX_PAGE_SECTIONS  # the page node and its first 999 heading sections
    counts = IndexLayout(str(out)).load_manifest().stats["pages"]
    assert counts["sections_capped"] == MANY_SECTIONS + 1 - MAX_PAGE_SECTIONS
    assert result["rss_growth_mb"] < 600, result
    index = RitragIndex(str(out))
    [tree] = index.get_toc("zebracorn grazes", n=1)["trees"]
    hit = tree
    while not hit.get("hit"):
        [hit] = hit["children"]
    assert hit["title"] == "Many headings"  # the merged tail is the page node's text
    [node] = index.read([hit["id"]], max_chars=10 ** 7)["nodes"]
    assert node["text"].endswith("Last heading\n\nThe zebracorn grazes at the very end.")


# --- item 12: paper sections nested by their numbers ------------------------------

def paper_outline(tmp_path: Path, paper: dict) -> list[tuple[str, int, tuple[str, ...]]]:
    path = tmp_path / "paper.json"
    path.write_text(json.dumps(paper))
    [(_, page)] = parse_paper(SourceFile(str(path), path.read_bytes(), f"{BASE}/paper", BASE))
    return [(s.title, s.level, s.path) for s in page.sections[1:]]


def test_s2orc_sections_numbered_in_their_names_nest_by_the_number(tmp_path):
    body = [{"section": name, "sec_num": None, "text": f"Text of {name}."}
            for name in ("1 Introduction", "2 Method", "2.1 Data", "2.1.1 Cleaning", "2.2. Model", "3 Results",
                         "A.1 Proofs", "A Study of Errors")]
    assert paper_outline(tmp_path, {"title": "P", "abstract": "Abs.", "body_text": body}) == [
        ("1 Introduction", 1, ("1 Introduction",)), ("2 Method", 1, ("2 Method",)),
        ("2.1 Data", 2, ("2 Method", "2.1 Data")),
        ("2.1.1 Cleaning", 3, ("2 Method", "2.1 Data", "2.1.1 Cleaning")),
        ("2.2. Model", 2, ("2 Method", "2.2. Model")), ("3 Results", 1, ("3 Results",)),
        ("A.1 Proofs", 2, ("3 Results", "A.1 Proofs")),  # an appendix's subsection: no "A" section precedes it
        ("A Study of Errors", 1, ("A Study of Errors",))]  # a capital opening a word is no number


def test_flat_section_lists_nest_by_the_number_where_no_level_is_given(tmp_path):
    plain = {"title": "P", "abstract": "Abs.", "sections": [
        {"heading": "2 Method", "text": "m"}, {"heading": "2.1 Data", "text": "d"},
        {"heading": "2.2 Data again", "text": "d", "level": 1}]}  # a level given is the level
    assert [(t, level) for t, level, _ in paper_outline(tmp_path, plain)] == [
        ("2 Method", 1), ("2.1 Data", 2), ("2.2 Data again", 1)]
    qasper = {"title": "Q", "abstract": "Abs.", "full_text": [
        {"section_name": "2 Method", "paragraphs": ["m"]}, {"section_name": "2.1 Data", "paragraphs": ["d"]},
        {"section_name": "Intro ::: Scope", "paragraphs": ["s"]}]}
    assert [(t, level) for t, level, _ in paper_outline(tmp_path, qasper)] == [
        ("2 Method", 1), ("2.1 Data", 2), ("Scope", 2)]


# --- item 12: an update's progress is over the pages it parses --------------------

def test_a_progress_line_without_a_total_has_no_share_and_no_eta():
    assert progress_line("parse (changed pages)", 1, 56.0, None) == "parse (changed pages): 1 in 56 s (0.018/s)"
    assert progress_line("parse (pages)", 74, 37.0, 296) == "parse (pages): 74 in 37 s (2.0/s), 25.0% of 296, ETA 1m51s"


@pytest.mark.slow
def test_an_update_reports_its_parse_as_a_count_not_a_share_of_all_inputs(tiny_hash_index, tiny_site, tmp_path,
                                                                          caplog):
    site = tmp_path / "site"
    shutil.copytree(tiny_site, site)
    (site / "shop/v3/logging.html").write_text(tiny_page(
        "Logging", [("Shop Server", "shop/"), ("Version 3", "shop/v3/")], [("Rotation", "Logs rotate hourly.")]))
    index = tmp_path / "index"
    shutil.copytree(tiny_hash_index, index)
    with caplog.at_level(logging.INFO, logger="ritrag.progress"):
        update.run(["--input", str(site), "--index", str(index)])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("parse (changed pages)")]
    assert lines and lines[-1].startswith("parse (changed pages): 1 in "), lines  # one page of 7 changed
    assert not any("%" in line or "ETA" in line for line in lines), lines


# --- item 12: a full disk is one JSON line ----------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 300 KiB tmpfs (mount needs root; skipped where it is refused)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


@pytest.mark.slow
def test_a_build_that_fills_its_disk_fails_with_one_json_line(small_disk, tmp_path):
    done = subprocess.run([sys.executable, "-m", "ritrag.cli", "build", str(SAMPLE_SITE), "--out",
                           str(small_disk / "index"), "--embedding_model", "hashing:384"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert [e["error"]["reason"] for e in errors] == ["no_space"], done.stderr[-3000:]
    assert "No space left on device" in errors[0]["error"]["message"]
    assert not any(line.startswith(" ") for line in done.stderr.splitlines())  # no trace of any kind
    assert not (small_disk / "index" / "CURRENT").exists()

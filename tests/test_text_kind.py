"""The plain-text kind (transforms/sources/text.py): sniffed by its `.txt` name
after every content rule, one page per file, headings from underlines, else RFC
numbers, else man-page capitals; no text lost or owned twice; bad text a dead
letter; and a build of a folder of text files, through the installed command."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ritrag.transforms.parse.sections import MAX_PAGE_SECTIONS
from ritrag.transforms.pages import PageParser, parse_or_dead_letter, read_file
from ritrag.transforms.sources import document_url_path, sniff_kind

BASE = "http://localhost/"


def parse(tmp_path: Path, name: str, text: str | bytes):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    parser = PageParser(str(tmp_path) + "/", BASE, 1, 1 << 24)
    return parse_or_dead_letter(parser, str(path), lambda: read_file(str(path)), "parse")


def outline(page):
    return [(s.level, s.title, s.path) for s in page.sections]


def words(text: str) -> list[str]:
    return text.split()


@pytest.mark.parametrize("name, data, kind", [
    ("notes.txt", b"just words", "text"),
    ("NOTES.TXT", b"just words", "text"),
    ("page.txt", b"<!DOCTYPE html><html><p>HTML whatever the name</p></html>", "html"),  # content first
    ("paper.txt", b'{"title": "t", "abstract": "a"}', "paper"),
])
def test_a_txt_name_is_text_after_every_content_rule(name, data, kind):
    assert sniff_kind(name, data) == kind
    assert document_url_path("docs/" + name) == "docs/" + name  # served as it is


def test_underlined_headings_nest_by_first_appearance_and_keep_every_word(tmp_path):
    text = ("=====\nGuide\n=====\n\nIntro line.\n\nInstall\n=======\n\nRun it.\nTwice.\n\n\n\nFrom source\n-----------\n"
            "Build it.\n\nUse\n===\nCall it.\n")
    [page] = parse(tmp_path, "guide.txt", text)
    assert page.title == "Guide" and page.url == BASE + "guide.txt"
    # The title's style keeps its level, as an opening H1 does in Markdown.
    assert outline(page) == [(0, "Guide", ()), (2, "Install", ("Install",)),
                             (3, "From source", ("Install", "From source")), (2, "Use", ("Use",))]
    assert [s.text for s in page.sections] == ["Intro line.", "Run it.\nTwice.", "Build it.", "Call it."]
    assert [s.anchor for s in page.sections] == ["", "install", "from-source", "use"]
    heading_lines = {"=====", "Guide", "Install", "=======", "From", "source", "-----------", "Use", "==="}
    assert words(" ".join(s.text for s in page.sections)) == [w for w in words(text) if w not in heading_lines]


def test_a_rule_under_a_long_line_or_an_indented_line_is_no_heading(tmp_path):
    [page] = parse(tmp_path, "a.txt", "Title\n\n" + "word " * 30 + "\n---\n\n    indented\n    ===\n")
    assert outline(page) == [(0, "Title", ())] and "---" in page.sections[0].text


def test_rfc_numbered_headings_when_nothing_is_underlined(tmp_path):
    text = ("Hypertext Widgets\n\n1.  Introduction\n\nWidgets are small.\n\n2.  Terms\n\n2.1.  Widget\n\n"
            "A thing.\n\n3. Install the widget.\n\nNot a heading: it ends a sentence.\n")
    [page] = parse(tmp_path, "rfc9999.txt", text)
    assert page.title == "Hypertext Widgets"
    assert outline(page) == [(0, "Hypertext Widgets", ()), (1, "1. Introduction", ("1. Introduction",)),
                             (1, "2. Terms", ("2. Terms",)), (2, "2.1. Widget", ("2. Terms", "2.1. Widget"))]
    assert page.sections[0].text == "Hypertext Widgets"  # an opening line that is no heading stays text
    assert "3. Install the widget." in page.sections[-1].text


def test_man_page_capitals_headings(tmp_path):
    text = ("LS(1)                User Commands                LS(1)\n\nNAME\n       ls - list directory contents\n\n"
            "SYNOPSIS\n       ls [OPTION]... [FILE]...\n\nSEE ALSO\n       dir(1)\n")
    [page] = parse(tmp_path, "ls.1.txt", text)
    assert [s.title for s in page.sections[1:]] == ["NAME", "SYNOPSIS", "SEE ALSO"]
    assert page.sections[2].text == "       ls [OPTION]... [FILE]..."


def test_one_marked_line_is_no_structure_and_a_long_first_line_no_title(tmp_path):
    [page] = parse(tmp_path, "notes.txt", "word " * 40 + "\n\n1.  Only one\n\nNOTE\n    once\n")
    assert page.title == "notes.txt" and len(page.sections) == 1  # the URL's last segment names it


@pytest.mark.parametrize("data, reason", [
    (b"", "no_content"),
    (b"\n  \n\t\n", "no_content"),
    (b"caf\xe9 latin-1", "undecodable"),
    (b"text\x00with a NUL", "binary"),
])
def test_bad_text_is_a_dead_letter(tmp_path, data, reason):
    dead = parse(tmp_path, "bad.txt", data)
    assert dead.reason == reason, dead


def test_cost_is_linear_in_the_lines(tmp_path):
    # 20,000 underlined headings: one page, its sections capped as every kind's are, no word lost.
    [page] = parse(tmp_path, "many.txt", "Top\n===\n" + "\nH\n---\nx\n" * 20_000)
    assert page.title == "Top" and len(page.sections) == MAX_PAGE_SECTIONS
    assert page.sections_past_cap == 20_001 - MAX_PAGE_SECTIONS
    assert sum(words(s.text).count("x") for s in page.sections) == 20_000


def test_a_folder_of_text_files_builds_with_the_installed_command(tmp_path):
    script = Path(sys.executable).with_name("ritrag")
    if not script.exists():
        pytest.skip("no ritrag console script beside this interpreter")
    helped = subprocess.run([str(script), "build", "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "plain text (.txt)" in " ".join(helped.stdout.split())
    docs = tmp_path / "docs"
    (docs / "guide").mkdir(parents=True)
    (docs / "README.txt").write_text("Widgets\n=======\n\nWhat widgets are.\n\nUsage\n-----\n\nTurn the crank.\n")
    (docs / "guide" / "install.txt").write_text("Installing\n==========\n\nPut it on the shelf.\n")
    out = tmp_path / "idx"
    done = subprocess.run([str(script), "build", str(docs), "--out", str(out), "--granularity", "section",
                           "--embedding_model", "hashing:384"], cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    segment = next((out / "segments").iterdir())
    nodes = pq.read_table(next(segment.glob("nodes-*.parquet"))).to_pylist()
    pages = {n["title"]: n for n in nodes if n["kind"] == "page"}
    assert set(pages) == {"Widgets", "Installing"} and {pages[t]["source_kind"] for t in pages} == {"text"}
    assert any(n["title"] == "Usage" and n["parent_id"] == pages["Widgets"]["node_id"] for n in nodes)
    toc = subprocess.run([str(script), "toc", str(out), "turn the crank", "--n", "3"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert toc.returncode == 0 and "Usage" in toc.stdout, toc.stderr[-2000:]

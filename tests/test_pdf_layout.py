"""Headings induced from a PDF's layout (transforms/sources/pdf_layout.py), on
PDFs written here with raw content streams (pypdf alone), whose headings are
typographic only: no outline, no tagged structure."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

from ritrag.transforms.pages import PageParser, parse_or_dead_letter, read_file
from ritrag.transforms.sources.pdf_layout import numbering_depth

BASE = "http://localhost/"
BODY = 10.0
REGULAR, BOLD = "/F1", "/F2"
FILLER = ("The committee reviewed the figures of the year and found them in line with the plan set out "
          "before, save for the costs of the new plant, which ran higher than the budget allowed for.")


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def _fonts() -> DictionaryObject:
    def font(name):
        return DictionaryObject({NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
                                 NameObject("/BaseFont"): NameObject(name)})
    return DictionaryObject({NameObject(REGULAR): font("/Helvetica"), NameObject(BOLD): font("/Helvetica-Bold")})


def line_ops(lines: list[tuple[str, float, bool]], header: str = "", number: int = 0) -> str:
    """A page's content stream: `lines` of (text, size, bold) from the top down,
    and a running header and a page number in small type when given."""
    ops, y = [], 760.0
    if header:  # in a heading's style: running headers must be told apart by repetition
        ops.append(f"BT {BOLD} {BODY:g} Tf 50 780 Td ({_escape(header)}) Tj ET")
    for text, size, bold in lines:
        y -= size * 1.5
        ops.append(f"BT {BOLD if bold else REGULAR} {size:g} Tf 50 {y:g} Td ({_escape(text)}) Tj ET")
    if number:
        ops.append(f"BT {REGULAR} 8 Tf 300 30 Td ({number}) Tj ET")
    return "\n".join(ops)


def write_pdf(path: Path, contents: list[str]) -> Path:
    """A PDF with one page per content stream, sharing a regular and a bold
    font, no outline."""
    writer = PdfWriter()
    fonts = _fonts()
    for content in contents:
        page = writer.add_blank_page(width=612, height=792)
        stream = DecodedStreamObject()
        stream.set_data(content.encode("latin-1"))
        page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): fonts})
        page.replace_contents(stream)
    writer.add_metadata({"/Title": "Generated report"})
    with open(path, "wb") as fh:
        writer.write(fh)
    return path


def body(n: int, start: int = 0) -> list[tuple[str, float, bool]]:
    return [(f"{start + k} " + FILLER[:80], BODY, False) for k in range(n)]


def parse(path: Path):
    parser = PageParser(str(path.parent) + "/", BASE, 1, 1 << 26)
    return parse_or_dead_letter(parser, str(path), lambda: read_file(str(path)), "parse")


def forty_page_report() -> tuple[list[str], list[tuple[str, int, int]]]:
    """40 pages: 4 chapters (20 pt bold) of 10 pages, each of 3 sections (14 pt
    bold) of 2 subsections (body size, bold), no numbering; a running header
    and page numbers on every page. Returns the pages' content streams and the
    (title, level, page) of each heading as drawn."""
    plan: dict[int, list[tuple[str, int]]] = {}  # page index -> (heading, level) in page order
    expected = []
    for chapter in range(4):
        first = chapter * 10
        headings = [(f"Chapter of {['Revenue', 'Operations', 'Governance', 'Outlook'][chapter]}", 1, first)]
        for section in range(3):
            page = first + 1 + section * 3
            headings.append((f"Section {'ABC'[section]} of part {chapter + 1}", 2, page))
            headings.append((f"Details on matter {chapter + 1}{'ABC'[section]}1", 3, page))
            headings.append((f"Further notes {chapter + 1}{'ABC'[section]}2", 3, page + 1))
        for title, level, page in headings:
            plan.setdefault(page, []).append((title, level))
            expected.append((title, level, page))
    sizes = {1: (20.0, True), 2: (14.0, True), 3: (BODY, True)}
    contents = []
    for index in range(40):
        lines = body(3, 100 * index)
        for title, level in plan.get(index, []):
            lines += [(title, *sizes[level]), *body(6, 100 * index + len(lines))]
        contents.append(line_ops(lines, header=f"Northwind Holdings Annual Report 2025, page {index + 1}",
                                 number=index + 1))
    return contents, expected


def test_a_40_page_report_nests_its_typographic_headings_as_drawn(tmp_path):
    contents, expected = forty_page_report()
    [page] = parse(write_pdf(tmp_path / "report.pdf", contents))
    assert page.toc_induced == "layout"
    assert [(s.title, s.level) for s in page.sections[1:]] == [(t, level) for t, level, _ in expected]
    assert page.sections[0].title == "Generated report" and page.sections[0].text.startswith("[p. 1]")
    # A section's path is its chapter, section and own title, as drawn.
    by_title = {s.title: s for s in page.sections}
    assert by_title["Further notes 3B2"].path == ("Chapter of Governance", "Section B of part 3", "Further notes 3B2")
    # Each heading opens its section; the first on a page carries the page's anchor and marker.
    anchored = set()
    for section, (title, _, index) in zip(page.sections[1:], expected):
        assert section.text.startswith(f"[p. {index + 1}]\n") and f"\n{title}\n" in section.text + "\n", title
        assert section.anchor == ("" if index in anchored else f"page={index + 1}")
        anchored.add(index)
    # Nothing lost or owned twice; running headers and page numbers are text, not headings.
    for n in range(40):
        assert page.body.count(f"[p. {n + 1}]\n") >= 1
    assert page.body.count(FILLER[:80]) == sum(c.count(FILLER[:80]) for c in contents)
    assert not any("Northwind" in s.title for s in page.sections)


def test_an_annual_report_nests_by_numbering_and_skips_table_rows(tmp_path):
    """Headings all in one bold body-size style: 'PART I' over 'Item 1.', '1' over
    '1.1'; bold table rows (mostly figures) and a bold page number are no headings."""
    pages = [
        [("PART I", BODY, True), *body(2), ("Item 1. Business", BODY, True), *body(4),
         ("Total revenue 1,204 1,118 7.7%", BODY, True), *body(2)],
        [("Item 1A. Risk Factors", BODY, True), *body(3), ("3.2 Market Risk", BODY, True), *body(3),
         ("3.2.1 Interest Rates", BODY, True), *body(3), ("12", BODY, True)],
        [("PART II", BODY, True), *body(2), ("Item 7. Management Discussion", BODY, True), *body(5)],
    ]
    [page] = parse(write_pdf(tmp_path / "10k.pdf", [line_ops(lines) for lines in pages]))
    assert page.toc_induced == "layout"
    assert [(s.title, s.level) for s in page.sections[1:]] == [
        ("PART I", 1), ("Item 1. Business", 2), ("Item 1A. Risk Factors", 2), ("3.2 Market Risk", 3),
        ("3.2.1 Interest Rates", 4), ("PART II", 1), ("Item 7. Management Discussion", 2)]
    assert "Total revenue 1,204" in page.sections[2].text and "\n12" in page.sections[5].text


def test_a_wrapped_heading_is_one_heading_and_a_bold_paragraph_is_none(tmp_path):
    pages = [[("Results of the year under", 16.0, True), ("review by the board", 16.0, True), *body(5),
              *[(f"Bold paragraph line {k} goes on", BODY, True) for k in range(5)], *body(3),
              ("Outlook", 16.0, True), *body(4)]]
    [page] = parse(write_pdf(tmp_path / "wrapped.pdf", [line_ops(lines) for lines in pages]))
    assert [(s.title, s.level) for s in page.sections[1:]] == [
        ("Results of the year under review by the board", 1), ("Outlook", 1)]
    assert page.sections[1].text.startswith("[p. 1]\nResults of the year under\nreview by the board\n")


@pytest.mark.parametrize("case", ["one style", "a single heading", "a heading on every line", "too many styles"])
def test_a_pdf_without_credible_headings_keeps_page_sections(tmp_path, case):
    pages = {
        "one style": [body(10), body(10)],
        "a single heading": [[("Summary", 16.0, True), *body(10)], body(10)],
        "a heading on every line": [[line for k in range(12) for line in ((f"Heading {k}", 16.0, True), *body(1))]] * 2,
        "too many styles": [[line for k in range(8) for line in ((f"Topic {k}", 12.0 + 2 * k, True), *body(4))]],
    }[case]
    [page] = parse(write_pdf(tmp_path / "flat.pdf", [line_ops(lines) for lines in pages]))
    assert page.toc_induced == "pages"
    assert [(s.title, s.anchor) for s in page.sections[1:]] == [
        (f"Page {n}", f"page={n}") for n in range(1, len(pages) + 1)]


def test_a_pdf_with_an_outline_keeps_it():
    parser = PageParser(str(Path(__file__).resolve().parent.parent / "sample" / "mixed") + "/", BASE, 1, 1 << 24)
    path = Path(__file__).resolve().parent.parent / "sample" / "mixed" / "manuals" / "field-guide.pdf"
    [page] = parse_or_dead_letter(parser, str(path), lambda: read_file(str(path)), "parse")
    assert page.toc_induced == "" and [s.title for s in page.sections[1:]] == ["1 Probes", "1.1 Cleaning", "2 Alarms"]


@pytest.mark.timeout(300)
def test_a_build_counts_induced_tocs_and_inspect_reports_them(tmp_path):
    """One site of three PDFs: one with an outline, one whose ToC comes from its
    layout, one cut by pages; the build counts toc_induced_<how> per document,
    `ritrag inspect` reports them, and the layout's sections are nodes with page
    anchors."""
    import pyarrow.parquet as pq

    from ritrag.evaluation.forest_report import forest_report, render_html, render_text
    from ritrag.pipelines import build

    site = tmp_path / "in" / "reports"
    site.mkdir(parents=True)
    shutil.copy(Path(__file__).resolve().parent.parent / "sample" / "mixed" / "manuals" / "field-guide.pdf", site)
    contents, expected = forty_page_report()
    write_pdf(site / "annual.pdf", contents[:10])
    write_pdf(site / "flat.pdf", [line_ops(body(10)), line_ops(body(10))])
    out = tmp_path / "index"
    build.run(["--input", str(tmp_path / "in"), "--out", str(out), "--site_depth", "1",
               "--embedding_model", "hashing:384", "--granularity", "section"])
    report = forest_report(str(out))
    assert report["toc_induced"] == {"layout": 1, "pages": 1}
    text = render_text(report)
    assert "ToCs induced (documents without one of their own, by how): layout 1, pages 1" in text
    assert "ToCs induced" in render_html(report)
    segment = next((out / "segments").iterdir())
    nodes = pq.read_table(next(segment.glob("nodes-*.parquet")), columns=["title", "url"]).to_pylist()
    urls = {n["title"]: n["url"] for n in nodes}
    assert urls["Section B of part 1"] == BASE + "reports/annual.pdf#page=5"
    assert urls["Page 2"] == BASE + "reports/flat.pdf#page=2"


# A real typeset PDF (DocBook, FOP) from a Debian package, with its outline: the
# outline says what the layout's headings should be.
REAL_PDF = Path("/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf")


@pytest.mark.skipif(not REAL_PDF.exists(), reason="Debian's shared-mime-info package is not installed")
def test_a_real_pdf_without_its_outline_gets_the_outline_back_from_its_layout(tmp_path):
    import re

    from pypdf import PdfReader
    from pypdf.generic import NameObject

    from ritrag.transforms.sources.pdf import outline_entries

    outline = outline_entries(PdfReader(str(REAL_PDF)))
    writer = PdfWriter(clone_from=str(REAL_PDF))
    del writer._root_object[NameObject("/Outlines")]
    stripped = tmp_path / "spec.pdf"
    with open(stripped, "wb") as fh:
        writer.write(fh)
    [page] = parse(stripped)
    assert page.toc_induced == "layout"
    letters = lambda text: re.sub(r"[^a-z]+", "", text.casefold())  # noqa: E731
    induced = {letters(s.title): s.level for s in page.sections[1:]}  # its titles are unique
    found = [(level, induced[letters(title)]) for level, title, _ in outline if letters(title) in induced]
    assert len(found) >= 0.9 * len(outline) and len(found) >= 0.9 * len(induced)
    step = lambda a, b: (b > a) - (b < a)  # noqa: E731
    # Where the outline goes deeper, stays or comes back, the induced levels do the same.
    assert all(step(o1, o2) == step(i1, i2) for (o1, i1), (o2, i2) in zip(found, found[1:]))


def test_numbering_depth():
    assert [numbering_depth(t) for t in ("Part II", "Chapter 3", "Item 7.", "Item 1A. Risk", "A. Scope",
                                         "Overview", "3.2 Risk Factors", "3.2.1 Rates", "2021 results")] == [
        0, 1, 1, 1, 1, 1, 2, 3, 1]


HOSTILE_CHANGES = 100_000


def hostile_contents(changes: int = HOSTILE_CHANGES, pages: int = 10) -> list[str]:
    """`changes` font-size changes, a different size (5 to 55 pt) for each word,
    a new line every 10 words, spread over `pages` pages."""
    per_page = changes // pages
    contents = []
    for p in range(pages):
        ops = ["BT 50 780 Td 12 TL"]
        for k in range(per_page):
            ops.append(f"{REGULAR if k % 3 else BOLD} {5 + (p * per_page + k) % 500 / 10:g} Tf (w{k}) Tj")
            if k % 10 == 9:
                ops.append("T*")
        contents.append("\n".join(ops + ["ET"]))
    return contents


_MEASURE = """
import json, sys, time
from pypdf import PdfReader
from ritrag.transforms.pages import PageParser, parse_or_dead_letter, read_file
def status(field):
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(field))
path, parse = sys.argv[1], sys.argv[2] == "parse"
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")  # resets the peak resident size (VmHWM): the imports' peak is not the parse's
before, started = status("VmRSS:"), time.process_time()
if parse:
    [page] = parse_or_dead_letter(PageParser(path.rsplit("/", 1)[0] + "/", "http://localhost/", 1, 1 << 26),
                                  path, lambda: read_file(path), "parse")
    outcome = {"toc_induced": page.toc_induced, "chars": len(page.body)}
else:  # pypdf's own extraction, the floor of any PDF's cost
    outcome = {"chars": sum(len(p.extract_text()) for p in PdfReader(path).pages)}
print(json.dumps({**outcome, "cpu_s": time.process_time() - started, "grown": status("VmHWM:") - before}))
"""


def _measured(path: Path, what: str) -> dict:
    limit = 2 << 30  # address space: a runaway costs this subprocess, not the suite
    done = subprocess.run([sys.executable, "-c", f"import resource; resource.setrlimit(resource.RLIMIT_AS, "
                           f"({limit}, {limit})); exec({_MEASURE!r})", str(path), what],
                          capture_output=True, text=True, cwd=path.parent, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_a_hostile_pdf_of_100k_font_size_changes_costs_memory_bounded_by_its_size(tmp_path):
    """Parsed in a subprocess under an address-space limit: the peak resident
    size it grows by is pypdf's own extraction's and a small multiple of the
    file's size more, whatever the number of styles; it keeps page sections."""
    path = write_pdf(tmp_path / "hostile.pdf", hostile_contents())
    size = path.stat().st_size
    parsed, extracted = _measured(path, "parse"), _measured(path, "extract")
    print("file bytes", size, "parse", parsed, "pypdf alone", extracted)
    assert parsed["chars"] >= HOSTILE_CHANGES * 2  # every word kept
    assert parsed["toc_induced"] == "pages"  # a size per word is no hierarchy
    # Measured (2-core Xeon, 2.3 MB file): parse 3.0 s CPU, +22 MiB peak; pypdf's
    # extraction alone 2.6 s, +12 MiB; the rest is the parse's copies of the file and
    # its text (reading the layout itself costs < 1 MiB). A copy per change would be GiBs.
    assert parsed["grown"] < extracted["grown"] + 8 * size

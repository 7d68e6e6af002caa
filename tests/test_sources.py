"""Input kinds besides HTML (transforms/sources): sniffing, each parser's tree
(titles, order, section boundaries, no text lost or owned twice), dead letters
of bad input, and one mixed build whose forest holds every kind."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ritrag.schema import PageSource
from ritrag.transforms.pages import PageParser, parse_or_dead_letter, read_file, reread_page
from ritrag.transforms.parse import UnparseablePage
from ritrag.transforms.sources import document_url_path, sniff_kind
from ritrag.transforms.sources.markdown import rendered_blocks, split_front_matter

SAMPLE = Path(__file__).resolve().parent.parent / "sample"
MIXED = SAMPLE / "mixed"
BASE = "http://localhost/"


def _make_pdf():
    spec = importlib.util.spec_from_file_location("make_pdf", SAMPLE / "make_pdf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse(path: Path, root: Path = MIXED):
    parser = PageParser(str(root) + "/", BASE, 1, 1 << 24)
    return parse_or_dead_letter(parser, str(path), lambda: read_file(str(path)), "parse")


def by_title(pages):
    return {p.title: p for p in pages}


# --- kinds ------------------------------------------------------------------

@pytest.mark.parametrize("name, data, kind", [
    ("a.html", b"<p>no doctype</p>", "html"),
    ("a.md", b"<!DOCTYPE html><html><p>HTML whatever the name</p></html>", "html"),
    ("a.bin", b"%PDF-1.7\n...", "pdf"),
    ("a.json", b'{"title": "t", "post_stream": {"posts": []}}', "discourse"),
    ("a", b'{"title": "t", "abstract": "a", "body_text": []}', "paper"),
    ("docs/a.MD", b"# Title", "markdown"),
    ("Posts.xml", b'\xef\xbb\xbf<?xml version="1.0" encoding="utf-8"?>\n<posts>\n  <row Id="1"/>', "stackexchange"),
    ("dump", b"<posts><row/></posts>", "stackexchange"),
    ("docs/intro.rst", b"Intro\n=====\n", "rst"),
    ("a.pdf", b"not a pdf", "pdf"),
])
def test_kind_is_sniffed_from_content_then_name(name, data, kind):
    assert sniff_kind(name, data) == kind


def test_unknown_kind_names_what_was_seen():
    with pytest.raises(UnparseablePage) as err:
        sniff_kind("mkdocs.yml", b"site_name: x\n")
    assert err.value.reason == "unknown_kind" and "'.yml'" in err.value.detail and "site_name" in err.value.detail


def test_document_urls():
    assert document_url_path("a/b/setup.md") == "a/b/setup.html"
    assert document_url_path("a/README.md") == "a/index.html"
    assert document_url_path("t/welcome.json") == "t/welcome"
    assert document_url_path("a/manual.pdf") == "a/manual.pdf"
    assert document_url_path("a/page.html") == "a/page.html"


# --- Markdown ---------------------------------------------------------------

def test_markdown_front_matter_and_plain_text():
    meta, rest = split_front_matter("---\ntitle: T\ntags: [a, b]\n---\n# T\n\nbody\n")
    assert meta == {"title": "T", "tags": ["a", "b"]} and rest == "# T\n\nbody\n"
    assert split_front_matter("---\n- not a mapping\n---\ntext") == ({}, "---\n- not a mapping\n---\ntext")
    blocks = rendered_blocks("Some *emphasis* and `code`.\n\n- one\n- two\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
                             "```\nx = 1\n```\n\n<!-- hidden -->\n")
    assert blocks == [("Some emphasis and code.", False), ("one", False), ("two", True), ("a | b\n1 | 2", False),
                      ("x = 1", False)]


def test_markdown_sections_lose_and_repeat_no_text():
    [page] = parse(MIXED / "handbook/docs/guide/config.md")
    assert page.title == "Configuration" and page.trail_method == "mkdocs_nav"
    assert [(s.title, s.level, s.anchor, s.path) for s in page.sections] == [
        ("Configuration", 0, "", ()), ("Probes", 2, "probes", ("Probes",)),
        ("Calibration", 3, "calibration", ("Probes", "Calibration")), ("Alarms", 2, "alarms", ("Alarms",))]
    source = (MIXED / "handbook/docs/guide/config.md").read_text()
    for sentence in ("Tidepool reads one TOML file at start-up.", "every month.", "to a webhook."):
        assert page.body.count(sentence) == 1 and sentence in source
    assert "#" not in page.body and "|---|" not in page.body


def test_markdown_front_matter_gives_title_description_keywords():
    [page] = parse(MIXED / "handbook/docs/install.md")
    assert page.title == "Installing Tidepool"  # the opening H1 repeats it: no section of its own
    assert page.description.startswith("Put the controller") and page.keywords == ("install", "hardware")
    assert [s.title for s in page.sections[1:]] == ["Wiring the probe board", "Installing the software"]
    assert "pip install tidepool\ntidepool init" in page.body


def test_mkdocs_nav_places_documents_and_folders_the_rest():
    home, guide, config, reference, changelog = (parse(MIXED / "handbook/docs" / p)[0] for p in (
        "index.md", "guide/index.md", "guide/config.md", "reference.md", "changelog.md"))
    home_url, guide_url = BASE + "handbook/docs", BASE + "handbook/docs/guide"
    assert home.url == home_url and home.trail == () and home.nav_order == (
        BASE + "handbook/docs/install.html", guide_url)
    assert [(c.title, c.url) for c in guide.trail] == [("Home", home_url)]
    assert guide.nav_order == (BASE + "handbook/docs/guide/config.html", BASE + "handbook/docs/guide/tuning.html")
    assert [(c.title, c.url) for c in config.trail] == [("Home", home_url), ("User guide", guide_url)]
    assert [(c.title, c.url) for c in reference.trail] == [("Home", home_url), ("Reference", None)]
    assert changelog.trail_method == "folders" and [c.title for c in changelog.trail] == ["docs"]


def test_docusaurus_category_labels_name_folders(tmp_path):
    docs = tmp_path / "site/docs"
    (docs / "guides/advanced").mkdir(parents=True)
    (docs / "guides/_category_.json").write_text('{\n\t"label": "User guides",\n\t"position": 2\n}')
    (docs / "guides/advanced/_category_.yml").write_text("label: Going further\n")
    (docs / "guides/advanced/tuning.md").write_text("# Tuning\n\nText.\n")
    [page] = parse(docs / "guides/advanced/tuning.md", tmp_path)
    assert [(c.title, c.url) for c in page.trail] == [
        ("docs", BASE + "site/docs"), ("User guides", BASE + "site/docs/guides"),
        ("Going further", BASE + "site/docs/guides/advanced")]
    (docs / "guides/_category_.json").write_text("{not json")
    from ritrag.transforms.sources.nav import _category_label
    _category_label.cache_clear()
    [page] = parse(docs / "guides/advanced/tuning.md", tmp_path)
    assert [c.title for c in page.trail] == ["docs", "guides", "Going further"]


def test_markdown_without_headings_is_one_section_and_empty_is_dead(tmp_path):
    (tmp_path / "notes.md").write_text("Just a paragraph.\n\nAnd another.\n")
    [page] = parse(tmp_path / "notes.md", tmp_path)
    assert page.title == "notes" and [s.text for s in page.sections] == ["Just a paragraph.\n\nAnd another."]
    (tmp_path / "empty.md").write_text("<!-- nothing -->\n")
    assert parse(tmp_path / "empty.md", tmp_path).reason == "no_content"


def test_markdown_links_resolve_to_the_pages_their_files_are_served_as(tmp_path):
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide/setup.md").write_text(
        "# Setup\n\nRead [the *usage* notes](../usage.md#first-steps), the [index](README.md), "
        "[usage again](../usage.md#first-steps), [a page](other.html), ![an image](logo.png) and "
        "[the web](https://Example.org/x/#top).\n\n## Later\n\n"
        "[here](#later), [myself](setup.md), [outside](../../../etc/passwd.md), [rooted](/abs.md), "
        "[mail](mailto:a@b.c), [![Logo](logo.png)](../usage.md)\n")
    [page] = parse(tmp_path / "guide/setup.md", tmp_path)
    assert [(link.url, link.fragment, link.anchor_text, link.position) for link in page.links] == [
        (f"{BASE}usage.html", "first-steps", "the usage notes", 0),
        (f"{BASE}guide", "", "index", 1),  # README.md is its folder's page
        (f"{BASE}guide/other.html", "", "a page", 2),
        ("https://example.org/x", "top", "the web", 3),
        (f"{BASE}usage.html", "", "Logo", 4),  # an image link: its alt text
    ]
    assert page.links_past_cap == 0


def test_rst_hyperlinks_and_doc_roles_resolve_like_markdown_links(tmp_path):
    (tmp_path / "install.rst").write_text(
        "Install\n=======\n\nSee `the usage notes <usage.rst#first-steps>`_, `Example`_, "
        "https://example.org/bare and `a section`_ of this page.\n\n"
        ".. _Example: https://example.org/named\n\nA section\n---------\n\nText, :doc:`usage`.\n")
    [page] = parse(tmp_path / "install.rst", tmp_path)
    assert [(link.url, link.fragment, link.anchor_text) for link in page.links] == [
        (f"{BASE}usage.html", "first-steps", "the usage notes"),
        ("https://example.org/named", "", "Example"),
        ("https://example.org/bare", "", "https://example.org/bare"),
        (f"{BASE}usage.html", "", "usage"),  # :doc:, its page (#first-steps was another target)
    ]


# --- PDF --------------------------------------------------------------------

def test_pdf_outline_gives_nested_sections_with_pages():
    [page] = parse(MIXED / "manuals/field-guide.pdf")
    assert page.title == "Tidepool Field Guide" and page.description == "Pocket reference"
    assert [(s.title, s.level, s.anchor) for s in page.sections] == [
        ("Tidepool Field Guide", 0, ""), ("1 Probes", 1, "page=2"), ("1.1 Cleaning", 2, ""), ("2 Alarms", 1, "page=3")]
    texts = [s.text for s in page.sections]
    assert texts[1] == "[p. 2]\n1 Probes\nKeep probes wet; a dry pH bulb is ruined."
    assert texts[2] == "[p. 2]\n1.1 Cleaning\nSoak the bulb in vinegar for ten minutes."
    assert texts[3].startswith("[p. 3]\n2 Alarms")
    for line in (line for lines in _make_pdf().PAGES for line in lines):
        assert page.body.count(line) == 1, line


def test_pdf_without_outline_is_cut_by_page(tmp_path):
    _make_pdf().write(str(tmp_path / "plain.pdf"), outline=[])
    [page] = parse(tmp_path / "plain.pdf", tmp_path)
    assert [(s.title, s.anchor) for s in page.sections[1:]] == [("Page 1", "page=1"), ("Page 2", "page=2"),
                                                                ("Page 3", "page=3")]
    assert page.sections[0].text == "" and page.sections[3].text.startswith("[p. 3]\n2 Alarms")


def test_bad_pdfs_are_dead_letters(tmp_path):
    _make_pdf().write(str(tmp_path / "locked.pdf"), password="secret")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.7\n1 0 obj << /Type /Catalog >> endobj\n%%EOF")
    _make_pdf().write(str(tmp_path / "blank.pdf"), pages=[[], []], outline=[])
    assert parse(tmp_path / "locked.pdf", tmp_path).reason == "encrypted"
    assert parse(tmp_path / "broken.pdf", tmp_path).reason == "broken_pdf"
    assert parse(tmp_path / "blank.pdf", tmp_path).reason == "no_text"


@pytest.mark.timeout(60)
def test_a_pdf_with_10000_bookmarks_falls_back_to_pages(tmp_path):
    from ritrag.transforms.sources.pdf import MAX_OUTLINE_ENTRIES_PER_PAGE

    make_pdf = _make_pdf()
    marks = [(f"Mark {n}", n % 3, None) for n in range(10_000)]
    assert len(marks) > MAX_OUTLINE_ENTRIES_PER_PAGE * len(make_pdf.PAGES)
    make_pdf.write(str(tmp_path / "marks.pdf"), outline=marks)
    [page] = parse(tmp_path / "marks.pdf", tmp_path)
    assert [(s.title, s.level, s.anchor) for s in page.sections] == [
        ("Tidepool Field Guide", 0, ""), ("Page 1", 1, "page=1"), ("Page 2", 1, "page=2"), ("Page 3", 1, "page=3")]
    for line in (line for lines in make_pdf.PAGES for line in lines):
        assert page.body.count(line) == 1, line


@pytest.mark.timeout(60)
@pytest.mark.parametrize("closing", ["last /Next -> first", "child /First -> its parent"])
def test_a_pdf_with_a_cyclic_outline_keeps_each_entry_once(tmp_path, closing):
    from pypdf import PdfReader, PdfWriter
    from pypdf.generic import NameObject

    _make_pdf().write(str(tmp_path / "plain.pdf"), outline=[])
    writer = PdfWriter(clone_from=str(tmp_path / "plain.pdf"))
    probes = writer.add_outline_item(title="1 Probes", page_number=1)
    cleaning = writer.add_outline_item(title="1.1 Cleaning", page_number=1, parent=probes)
    alarms = writer.add_outline_item(title="2 Alarms", page_number=2)
    if closing == "last /Next -> first":
        alarms.get_object()[NameObject("/Next")] = probes
    else:
        cleaning.get_object()[NameObject("/First")] = probes
    with open(tmp_path / "cycle.pdf", "wb") as fh:
        writer.write(fh)
    outlines = PdfReader(str(tmp_path / "cycle.pdf")).trailer["/Root"]["/Outlines"]  # the file holds the cycle
    if closing == "last /Next -> first":
        assert outlines["/Last"]["/Next"]["/Title"] == "1 Probes"
    else:
        assert outlines["/First"]["/First"]["/First"]["/Title"] == "1 Probes"

    [page] = parse(tmp_path / "cycle.pdf", tmp_path)
    assert [(s.title, s.level, s.anchor) for s in page.sections] == [
        ("Tidepool Field Guide", 0, ""), ("1 Probes", 1, "page=2"), ("1.1 Cleaning", 2, ""), ("2 Alarms", 1, "page=3")]
    for line in (line for lines in _make_pdf().PAGES for line in lines):
        assert page.body.count(line) == 1, line


@pytest.mark.timeout(60)
def test_a_pdf_outline_deeper_than_pypdf_reads_falls_back_to_pages(tmp_path):
    from pypdf import PdfWriter

    _make_pdf().write(str(tmp_path / "plain.pdf"), outline=[])
    writer = PdfWriter(clone_from=str(tmp_path / "plain.pdf"))
    parent = None
    for depth in range(150):  # pypdf reads outlines at most 100 levels deep
        parent = writer.add_outline_item(title=f"Level {depth}", page_number=depth % 3, parent=parent)
    with open(tmp_path / "deep.pdf", "wb") as fh:
        writer.write(fh)
    [page] = parse(tmp_path / "deep.pdf", tmp_path)
    assert [s.title for s in page.sections[1:]] == ["Page 1", "Page 2", "Page 3"]


# --- Discourse --------------------------------------------------------------

def test_discourse_posts_hang_under_the_post_they_answer():
    pages = parse(MIXED / "forum/t/heater-keeps-switching.json")
    topic_url = BASE + "forum/t/heater-keeps-switching"
    assert [(p.url, p.source.rpartition("/")[2]) for p in pages] == [
        (topic_url, "heater-keeps-switching.json"),
        *((f"{topic_url}/{n}", f"heater-keeps-switching.json#post-{n}") for n in (2, 3, 4, 5))]
    parents = {p.url: p.trail[-1].url for p in pages}
    assert parents[f"{topic_url}/2"] == topic_url and parents[f"{topic_url}/3"] == f"{topic_url}/2"
    assert parents[f"{topic_url}/4"] == f"{topic_url}/3"
    missing = pages[4]
    assert parents[missing.url] == topic_url and missing.trail_method == "reply_to_missing"
    assert pages[1].description == "accepted answer" and pages[0].keywords == ("heater", "pid")
    assert pages[0].body.startswith("Since upgrading to 1.2") and "<p>" not in pages[0].body


def test_a_post_is_read_again_by_its_record_source():
    parser = PageParser(str(MIXED) + "/", BASE, 1, 1 << 24)
    path = str(MIXED / "forum/t/heater-keeps-switching.json")
    post = parser.parse(path, read_file(path))[2]
    assert reread_page(parser, PageSource.of(post)) == post


def test_discourse_reply_cycle_and_bad_json(tmp_path):
    posts = [{"post_number": 1, "cooked": "<p>q</p>"},
             {"post_number": 2, "reply_to_post_number": 3, "cooked": "<p>a</p>"},
             {"post_number": 3, "reply_to_post_number": 2, "cooked": "<p>b</p>"}]
    (tmp_path / "c.json").write_text(json.dumps({"title": "Loop", "post_stream": {"posts": posts}}))
    pages = parse(tmp_path / "c.json", tmp_path)
    # The loop is cut where the walk up from post 2 closes it: post 3 under the topic, post 2 under 3.
    assert len(pages) == 3 and [len(p.trail) for p in pages] == [0, 2, 1]
    (tmp_path / "bad.json").write_text('{"title": "x", "post_stream": {"posts": [')
    assert parse(tmp_path / "bad.json", tmp_path).reason == "invalid_json"


def test_a_post_links_to_the_posts_it_quotes_and_to_the_web(tmp_path):
    quote = ('<aside class="quote no-group" data-username="{user}" data-post="{n}" data-topic="{topic}">'
             '<div class="title"><a href="/t/loop/7/{n}">{user}:</a></div><blockquote><p>...</p></blockquote></aside>')
    posts = [{"post_number": 1, "cooked": '<p>See <a href="https://example.org/spec">the spec</a>.</p>'},
             {"post_number": 2, "cooked": quote.format(user="ann", n=1, topic=7) + "<p>Agreed.</p>"},
             {"post_number": 3, "cooked": quote.format(user="bob", n=2, topic=7)
              + quote.format(user="cy", n=4, topic=8) + "<p>Both.</p>"}]
    (tmp_path / "t.json").write_text(json.dumps({"id": 7, "title": "Quotes", "post_stream": {"posts": posts}}))
    topic, second, third = parse(tmp_path / "t.json", tmp_path)
    assert [(link.url, link.anchor_text) for link in topic.links] == [("https://example.org/spec", "the spec")]
    assert [(link.url, link.anchor_text) for link in second.links] == [(topic.url, "ann")]
    # the forum's own /t/ links name no page of the input; a quote of another topic neither
    assert [(link.url, link.anchor_text) for link in third.links] == [(second.url, "bob")]


# --- papers -----------------------------------------------------------------

def test_paper_sections_keep_numbers_and_nesting(tmp_path):
    [page] = parse(MIXED / "papers/probe-drift.json")
    assert page.description == "Ada Marsh, Tomas Reed" and page.sections[0].text.startswith("Glass pH electrodes")
    assert [(s.title, s.level, s.path[:1]) for s in page.sections[1:]] == [
        ("1 Introduction", 1, ("1 Introduction",)), ("2 Method", 1, ("2 Method",)),
        ("2.1 Calibration schedules", 2, ("2 Method",)), ("3 Results", 1, ("3 Results",))]
    assert page.sections[1].text.count("\n\n") == 1  # two paragraphs of one section, one section
    qasper = {"title": "Q", "abstract": "A.", "full_text": [
        {"section_name": "Intro", "paragraphs": ["p1"]}, {"section_name": "Intro ::: Scope", "paragraphs": ["p2"]}]}
    (tmp_path / "q.json").write_text(json.dumps(qasper))
    [page] = parse(tmp_path / "q.json", tmp_path)
    assert [(s.title, s.level, s.text) for s in page.sections] == [("Q", 0, "A."), ("Intro", 1, "p1"),
                                                                   ("Scope", 2, "p2")]


def test_stackexchange_answers_hang_under_their_question_accepted_first():
    pages = parse(MIXED / "qa/Posts.xml")
    by_url = {p.url.removeprefix(BASE + "qa/"): p for p in pages}
    assert list(by_url) == ["questions", "questions/1", "questions/4", "questions/6", "a/2", "a/3", "a/5", "a/7"]
    assert by_url["questions"].description == "3 questions, 4 answers; rows of other post types, not indexed: 1"
    question, accepted = by_url["questions/1"], by_url["a/3"]
    assert [c.title for c in question.trail] == ["Questions", "ph-probe"]  # the first tag, a virtual node
    assert question.trail[-1].url == BASE + "qa/questions/tagged/ph-probe"
    assert question.keywords == ("ph-probe", "calibration")
    assert by_url["questions/4"].keywords == ("heater", "controller")  # the newer |a|b| form
    assert question.description == "score 7, 2 answers, accepted answer 3"
    assert by_url["questions/4"].description == "score 3, 1 answer"  # not "1 answers"
    assert question.nav_order == (BASE + "qa/a/3", BASE + "qa/a/2")  # accepted, then by score
    assert (accepted.title, accepted.description, accepted.trail[-1].url) == (
        "Accepted answer 3", "accepted answer, score 9", BASE + "qa/questions/1")
    assert accepted.body == ("Calibrate every two weeks with fresh pH 7 and pH 10 buffers.\n\n"
                             "Drift above 0.2 between calibrations means the junction is fouled: soak it in "
                             "storage solution.")
    assert (by_url["a/7"].trail_method, [c.title for c in by_url["a/7"].trail]) == ("answer_to_missing", ["Questions"])
    assert by_url["questions/6"].trail_method == "questions"
    assert {p.source.rsplit("/", 1)[1] for p in pages} >= {"Posts.xml", "Posts.xml#post-3"}


def test_stackexchange_bad_xml_and_empty_dumps_are_dead_letters(tmp_path):
    (tmp_path / "Posts.xml").write_bytes(b'<posts><row Id="1" PostTypeId="1" Title="t"></posts>')
    assert parse(tmp_path / "Posts.xml", tmp_path).reason == "invalid_xml"
    (tmp_path / "Posts.xml").write_bytes(b'<posts><row Id="1" PostTypeId="5" Body="wiki"/></posts>')
    letter = parse(tmp_path / "Posts.xml", tmp_path)
    assert letter.reason == "no_content" and "1 rows of other types" in letter.detail


def test_stackexchange_answer_is_read_again_by_its_record_source():
    parser = PageParser(str(MIXED) + "/", BASE, 1, 1 << 24)
    answer = next(p for p in parse(MIXED / "qa/Posts.xml") if p.url.endswith("/a/5"))
    again = reread_page(parser, PageSource.of(answer))
    assert again == answer and again.source.endswith("Posts.xml#post-5")


def test_records_of_one_file_are_read_again_from_one_parse_of_unchanged_bytes(tmp_path, monkeypatch):
    import ritrag.transforms.pages as pages_module

    dump = tmp_path / "Posts.xml"
    shutil.copy(MIXED / "qa/Posts.xml", dump)
    parser = PageParser(str(tmp_path) + "/", BASE, 1, 1 << 24)
    records = [p for p in parse(dump, tmp_path) if "#post-" in p.source]
    reads = []
    monkeypatch.setattr(pages_module, "read_file", lambda path, *limit: reads.append(path) or dump.read_bytes())
    assert [reread_page(parser, PageSource.of(p)) for p in records] == records
    assert len(reads) == 1
    original = dump.read_bytes()
    dump.write_bytes(original.replace(b'Score="9"', b'Score="8"'))
    changed = PageSource.of(next(p for p in parse(dump, tmp_path) if p.source.endswith("#post-3")))
    dump.write_bytes(original)  # changed back before the second read: not what the first pass saw
    assert reread_page(parser, changed).reason == "changed_during_build"
    dump.write_bytes(original.replace(b'Score="9"', b'Score="8"'))
    assert reread_page(parser, changed).description == "accepted answer, score 8"


def test_rst_sections_follow_the_section_tree_and_lose_no_text():
    [page] = parse(MIXED / "sphinx/install.rst")
    assert page.url == BASE + "sphinx/install.html" and page.title == "Installing"
    assert [(s.title, s.level, s.anchor, s.path) for s in page.sections] == [
        ("Installing", 0, "", ()), ("Requirements", 1, "requirements", ("Requirements",)),
        ("From source", 1, "from-source", ("From source",)),
        ("Checking the install", 2, "checking-the-install", ("From source", "Checking the install"))]
    assert page.body == ("Install the package on the controller board.\n\nPython 3.11\nA free serial port\n\n"
                         "Clone the repository, then run:\n\npip install .\n\nRun tidepool --version.")


def test_rst_sphinx_markup_becomes_text_and_the_toctree_orders_children():
    [index] = parse(MIXED / "sphinx/index.rst")
    assert index.url == BASE + "sphinx" and index.title == "Tidepool controller"
    assert index.body == ("The controller reads the probes and drives the heater and the dosing pumps.\n\n"
                          "Every reading is logged; see logging.")  # a note's text, a :ref:'s title
    assert index.nav_order == (BASE + "sphinx/install.html", BASE + "sphinx/configure.html", BASE + "sphinx/api")
    [configure] = parse(MIXED / "sphinx/configure.rst")
    assert configure.sections[1].anchor == "log-files"
    assert configure.sections[1].text.endswith('\n\n[probe.ph]\nport = "/dev/ttyUSB0"')  # code-block verbatim
    [api] = parse(MIXED / "sphinx/api/index.rst")
    assert api.body == "read_probe(name)\n\nReturn the last reading of the probe called name."


def test_rst_without_text_is_a_dead_letter_and_a_lone_paragraph_a_page(tmp_path):
    (tmp_path / "empty.rst").write_text(".. a comment only\n")
    assert parse(tmp_path / "empty.rst", tmp_path).reason == "no_content"
    (tmp_path / "notes.rst").write_text("Just a paragraph, *no* title.\n")
    [page] = parse(tmp_path / "notes.rst", tmp_path)
    assert (page.title, page.body) == ("notes", "Just a paragraph, no title.")
    (tmp_path / "latin1.rst").write_bytes("Caf\xe9\n====\n".encode("latin-1"))
    assert parse(tmp_path / "latin1.rst", tmp_path).reason == "undecodable"


# --- a mixed build ----------------------------------------------------------

@pytest.mark.slow
def test_a_mixed_build_places_every_kind_in_one_forest(tmp_path):
    from ritrag.pipelines import build
    from ritrag.serving.api import RitragIndex

    src = tmp_path / "in"
    shutil.copytree(MIXED, src)
    (src / "flask").mkdir()
    for name in ("index.html", "installation.html"):
        shutil.copy(SAMPLE / "pages/flask" / name, src / "flask" / name)
    out = tmp_path / "idx"
    build.run(["--input", str(src), "--out", str(out), "--site_depth", "1", "--granularity", "section",
               "--embedding_model", "hashing:384"])  # publishes only if read = indexed + dead + merged
    segment = next((out / "segments").iterdir())
    nodes = {r["node_id"]: r for r in pq.read_table(next(segment.glob("nodes-*.parquet"))).to_pylist()}
    by_url = {r["url"]: r for r in nodes.values() if r["url"]}

    def parent_url(url):
        return nodes[by_url[url]["parent_id"]]["url"]

    topic = BASE + "forum/t/heater-keeps-switching"
    assert parent_url(topic + "/4") == topic + "/3" and parent_url(topic + "/5") == topic
    assert parent_url(BASE + "handbook/docs/guide/config.html") == BASE + "handbook/docs/guide"
    assert parent_url(BASE + "handbook/docs/guide/config.html#calibration") == (
        BASE + "handbook/docs/guide/config.html#probes")
    assert parent_url(BASE + "manuals/field-guide.pdf#page=3") == BASE + "manuals/field-guide.pdf"
    assert by_url[BASE + "papers/probe-drift#21-calibration-schedules"]["depth"] == 3
    dead = pq.read_table(segment / "dead_letters.parquet").to_pylist()
    assert [(Path(d["source"]).name, d["reason"]) for d in dead] == [("mkdocs.yml", "unknown_kind")]
    pages = pq.read_table(next(segment.glob("pages-*.parquet"))).num_rows
    assert pages == 5 + 7 + 1 + 1 + 2 + 8 + 4  # posts, Markdown documents, PDF, paper, HTML pages, Q&A, rST
    assert parent_url(BASE + "qa/a/3") == BASE + "qa/questions/1"
    assert parent_url(BASE + "qa/questions/1") == BASE + "qa/questions/tagged/ph-probe"
    assert by_url[BASE + "qa/questions/tagged/ph-probe"]["kind"] == "virtual"

    trees = RitragIndex(str(out)).get_toc("pH probe calibration heater")["trees"]
    assert {"forum", "handbook", "manuals", "papers"} <= {tree["title"] for tree in trees}

    kinds = {url: by_url[url]["source_kind"] for url in (
        topic, topic + "/4", BASE + "handbook/docs/guide/config.html",
        BASE + "handbook/docs/guide/config.html#calibration", BASE + "handbook/docs/guide",
        BASE + "manuals/field-guide.pdf#page=3", BASE + "papers/probe-drift", BASE + "flask/installation.html")}
    assert list(kinds.values()) == ["discourse", "discourse", "markdown", "markdown", "markdown", "pdf", "paper",
                                    "html"]
    roots = {r["site"]: r["source_kind"] for r in nodes.values() if r["parent_id"] is None}
    assert roots == {BASE + "forum": "discourse", BASE + "handbook": "markdown", BASE + "manuals": "pdf",
                     BASE + "papers": "paper", BASE + "flask": "html", BASE + "qa": "stackexchange",
                     BASE + "sphinx": "rst"}
    assert [n["url"] for n in sorted((n for n in nodes.values() if n["parent_id"] == by_url[BASE + "sphinx"]["node_id"]
                                      and n["kind"] == "page"), key=lambda n: n["position"])] == [
        BASE + "sphinx/install.html", BASE + "sphinx/configure.html", BASE + "sphinx/api"]  # the toctree's order

    from ritrag.evaluation.forest_report import forest_report, render_html, render_text
    report = forest_report(str(out))
    assert dict(report["sites"][BASE + "forum"]["source_kinds"]) == {"discourse": 5}
    assert "source kinds: markdown 7" in render_text(report)
    assert "pages by source kind" in render_html(report)


def test_a_site_or_virtual_node_takes_the_one_source_kind_below_it():
    from ritrag.schema import Crumb, PageSkeleton
    from ritrag.transforms.forest import build_site_forest

    site = BASE + "s/"

    def page(path, crumbs, kind):
        return PageSkeleton(site + path, site + path, site, path, tuple(Crumb(t, site + u) for t, u in crumbs),
                            "folders", (), kind)

    forest = build_site_forest(site, [page("a/x.html", [("A", "a/")], "markdown"),
                                      page("a/y.html", [("A", "a/")], "markdown"),
                                      page("a/y/1", [("A", "a/"), ("y", "a/y.html")], "discourse"),
                                      page("b/z.pdf", [("B", "b/")], "pdf")])
    kinds = {n.title if n.kind != "site" else "root": (n.kind, n.source_kind) for n in forest.placements}
    assert kinds == {"root": ("site", ""), "A": ("virtual", ""), "a/x.html": ("page", "markdown"),
                     "a/y.html": ("page", "markdown"), "a/y/1": ("page", "discourse"), "B": ("virtual", "pdf"),
                     "b/z.pdf": ("page", "pdf")}


@pytest.mark.slow
def test_an_update_of_mixed_kinds_matches_a_fresh_build(tmp_path):
    from ritrag.pipelines import build, update
    from support import live_table

    flags = ["--site_depth", "1", "--granularity", "section", "--embedding_model", "hashing:384"]
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(MIXED, a)
    shutil.copytree(MIXED, b)
    with open(b / "handbook/docs/guide/config.md", "a") as fh:
        fh.write("\n## Logging\n\nReadings are logged to /var/log/tidepool.\n")
    topic = json.loads((b / "forum/t/heater-keeps-switching.json").read_text())
    topic["post_stream"]["posts"].append({"post_number": 6, "username": "reefkeeper", "reply_to_post_number": 2,
                                          "cooked": "<p>Does kd = 0 slow the recovery?</p>"})
    (b / "forum/t/heater-keeps-switching.json").write_text(json.dumps(topic))
    (b / "manuals/field-guide.pdf").unlink()
    with open(b / "sphinx/configure.rst", "a") as fh:
        fh.write("\nAlarms\n------\n\nAn alarm sounds when a reading leaves its range.\n")
    answer = '<row Id="9" PostTypeId="2" ParentId="4" Score="6" Body="&lt;p&gt;Use a solid-state relay.&lt;/p&gt;"/>'
    posts = (b / "qa/Posts.xml").read_text().replace("</posts>", answer + "\n</posts>")
    (b / "qa/Posts.xml").write_text(posts)
    updated, fresh = tmp_path / "updated", tmp_path / "fresh"
    build.run(["--input", str(a), "--out", str(updated), *flags])
    update.run(["--input", str(b), "--index", str(updated)])
    build.run(["--input", str(b), "--out", str(fresh), *flags])
    for kind in ("nodes", "chunks", "pages"):
        assert live_table(updated, kind) == live_table(fresh, kind), kind
    nodes = live_table(updated, "nodes")
    urls = {r["url"]: r for r in nodes.values()}
    assert not any("field-guide.pdf" in (r["url"] or "") for r in nodes.values())  # every node of the PDF
    post = urls[BASE + "forum/t/heater-keeps-switching/6"]
    assert nodes[post["parent_id"]]["url"] == BASE + "forum/t/heater-keeps-switching/2"
    assert post["source_kind"] == "discourse"  # a new page's kind; an unchanged one's comes from its pages row
    assert urls[BASE + "papers/probe-drift"]["source_kind"] == "paper"
    answer = urls[BASE + "qa/a/9"]
    assert nodes[answer["parent_id"]]["url"] == BASE + "qa/questions/4" and answer["source_kind"] == "stackexchange"
    alarms = urls[BASE + "sphinx/configure.html#alarms"]
    assert nodes[alarms["parent_id"]]["url"] == BASE + "sphinx/configure.html" and alarms["source_kind"] == "rst"
    assert BASE + "handbook/docs/guide/config.html#logging" in urls

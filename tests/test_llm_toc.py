"""A model-induced ToC for long PDFs (`--induce_toc llm`: transforms/metadata/toc.py,
induce_toc.py; docs/METADATA.md) against the local scripted chat-completions
server: a PDF without an outline, in plain type (so its parse cuts it by pages),
gets the model's headings as nested sections; a heading not on its page is
dropped; a malformed or failing answer keeps the parse's sections, counted; each
window is asked after the last headings proposed before it; the cache spares a
rebuild every request; an update cuts as the build did, with the index's
settings, and refuses others; without the flag nothing is asked."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from ritrag.evaluation.forest_report import forest_report, render_text
from ritrag.layout import IndexLayout
from ritrag.pipelines import update
from ritrag.pipelines.options import JobOptionsError
from ritrag.schema import ParsedPage, Section
from ritrag.transforms.metadata.base import MetadataFailure
from ritrag.transforms.metadata.induce_toc import DocumentQuestions, WindowCandidatesFn
from ritrag.transforms.metadata.toc import (CONTEXT_CHARS, CONTEXT_HEADER, CONTEXT_HEADINGS, MAX_HEADINGS_PER_WINDOW,
                                            MAX_WINDOWS, TOC_SYSTEM_PROMPT, WINDOW_CHARS, ProposedHeading,
                                            context_lines, parse_toc_answer, verified_headings, windows)
from ritrag.transforms.sources.pdf import page_texts
from chat_endpoint import FakeEndpoint
from support import build_index, live_table
from test_pdf_layout import BODY, FILLER, line_ops, parse, write_pdf

# What each page prints, in plain type (no size, no weight: the parse finds no
# headings, so it cuts by pages), and the headings the scripted model reads there.
PAGES = {
    1: ["Getting Started", "Unpacking the probe"],
    2: ["Calibration"],
    3: ["Cleaning and care"],
    4: ["Alarms", "Alarm codes"],
}
MODEL_HEADINGS = [
    {"title": "Getting Started", "level": 1, "page": 1},
    {"title": "Unpacking  the PROBE", "level": 2, "page": 1},  # whitespace and case as a model may give them
    {"title": "Calibration", "level": 1, "page": 2},
    {"title": "Quantum flux alignment", "level": 2, "page": 2},  # on no page: dropped
    {"title": "Cleaning and care", "level": 2, "page": 3},
    {"title": "Alarms", "level": 1, "page": 4},
    {"title": "Alarm codes", "level": 3, "page": 4},  # two levels deeper: nested one deeper
]


def manual_pdf(path: Path, edition: str = "") -> Path:
    contents = []
    for number, headings in PAGES.items():
        lines = [(f"{number}0 {edition}" + FILLER[:80], BODY, False)]
        for k, heading in enumerate(headings):
            lines += [(heading, BODY, False), *[(f"{number}{k}{j} " + FILLER[:80], BODY, False) for j in range(3)]]
        contents.append(line_ops(lines))
    return write_pdf(path, contents)


def long_manual_pdf(path: Path) -> Path:
    """The manual, every page longer than half a window: one window a page."""
    contents = []
    for number, headings in PAGES.items():
        lines = [(f"{number}0 " + FILLER * 40, BODY, False)]
        for k, heading in enumerate(headings):
            lines += [(heading, BODY, False), (f"{number}{k} " + FILLER[:80], BODY, False)]
        contents.append(line_ops(lines))
    return write_pdf(path, contents)


def is_toc_question(body: dict) -> bool:
    return body["messages"][0]["content"] == TOC_SYSTEM_PROMPT


def toc_questions(endpoint: FakeEndpoint) -> list[dict]:
    return [body for body in endpoint.log if is_toc_question(body)]


def shown_pages(body: dict) -> set[int]:
    return {int(n) for n in re.findall(r"^\[p\. (\d+)\]$", body["messages"][-1]["content"], re.MULTILINE)}


def model(toc_answer=None):
    """The scripted model: a window's headings (those of the pages it shows), or
    `toc_answer`'s action for a ToC question; a plain summary for a node's metadata."""
    def script(body: dict, n: int) -> tuple:
        if not is_toc_question(body):
            return ("ok", json.dumps({"summary": "A part of the manual.", "keywords": ["manual"]}))
        if toc_answer is not None:
            return toc_answer
        pages = shown_pages(body)
        return ("ok", json.dumps({"headings": [h for h in MODEL_HEADINGS if h["page"] in pages]}))
    return script


def toc_flags(endpoint: FakeEndpoint, *extra: str) -> tuple[str, ...]:
    return ("--embedding_model", "hashing:384", "--granularity", "section", "--metadata_endpoint", endpoint.url,
            "--metadata_model", "fake-model", "--metadata_deadline_s", "5", "--metadata_max_attempts", "1",
            "--induce_toc", "llm", "--induce_toc_min_pages", "3", *extra)


def counts_of(index: Path) -> dict:
    return IndexLayout(str(index)).load_manifest().stats["pages"]


def sections(index: Path) -> dict[str, dict]:
    return {row["title"]: row for row in live_table(index, "nodes").values() if row["kind"] == "section"}


def pdf_site(tmp_path_factory, name: str, write_pdf) -> Path:
    """An input folder holding one PDF, written by `write_pdf`, under manuals/."""
    site = tmp_path_factory.mktemp(name) / "in" / "manuals"
    site.mkdir(parents=True)
    write_pdf(site / "probe.pdf")
    return site.parent


@pytest.fixture(scope="module")
def manual_site(tmp_path_factory) -> Path:
    return pdf_site(tmp_path_factory, "llm_toc", manual_pdf)


@pytest.fixture(scope="module")
def induced(manual_site, tmp_path_factory):
    index = tmp_path_factory.mktemp("llm_toc_index") / "index"
    with FakeEndpoint(model()) as endpoint:
        build_index(manual_site, index, *toc_flags(endpoint))
    return index, endpoint


# --- the contract, pure -------------------------------------------------------------

def test_the_parse_of_the_manual_is_cut_by_pages_and_its_page_texts_read_back(tmp_path):
    [page] = parse(manual_pdf(tmp_path / "probe.pdf"))
    assert page.toc_induced == "pages" and [s.title for s in page.sections[1:]] == [f"Page {n}" for n in PAGES]
    texts = page_texts(page)
    assert len(texts) == 4 and all(heading in texts[n - 1] for n, hs in PAGES.items() for heading in hs)
    assert not any("[p." in text for text in texts)


def test_windows_hold_whole_pages_under_the_cap_and_cut_a_page_past_it():
    texts = ["a" * 5000, "b" * 5000, "c" * 5000, "d" * 30000]
    got = windows(texts)
    assert [(w.first, w.last) for w in got] == [(0, 1), (2, 2), (3, 3)]
    assert all(len(w.text) <= WINDOW_CHARS for w in got)
    assert got[0].text.startswith("[p. 1]\n") and "\n\n[p. 2]\n" in got[0].text


def test_verification_drops_what_is_not_on_its_page_and_nests_like_an_outline():
    texts = ["Intro\nGetting   Started\nbody", "Setup\nbody", "More\nUsage\nbody"]
    proposed = [(0, 1, (ProposedHeading(2, "getting started", 1), ProposedHeading(1, "Invented", 1),
                        ProposedHeading(4, "Setup", 2), ProposedHeading(1, "Usage", 3))),
                (2, 2, (ProposedHeading(1, "Usage", 3), ProposedHeading(1, "Intro", 1),
                        ProposedHeading(2, "More", 3)))]
    headings, dropped = verified_headings(proposed, texts)
    # Invented: on no page; Usage named by the first window: a page it did not show;
    # Intro: a page before the last kept heading; More: on its page, but before Usage.
    assert headings == [(1, "Getting Started", 0, "Getting   Started"), (2, "Setup", 1, "Setup"),
                        (1, "Usage", 2, "Usage")] and dropped == 4


def test_a_pdf_past_the_windows_a_document_may_ask_is_not_asked_about():
    """The stage's cost is bounded per document: a PDF of more than MAX_WINDOWS
    windows passes as parsed, counted, and asks nothing."""
    pages = [Section(f"Page {n}", 1, f"page={n}", f"[p. {n}]\n" + "word " * (WINDOW_CHARS // 5), (f"Page {n}",))
             for n in range(1, MAX_WINDOWS + 2)]
    page = ParsedPage(url="http://localhost/huge.pdf", canonical_url="http://localhost/huge.pdf",
                      site="http://localhost/", title="Huge", trail=(), trail_method="url",
                      sections=(Section("Huge", 0, "", "", ()), *pages), source_kind="pdf", toc_induced="pages")
    candidates = WindowCandidatesFn(3)
    assert list(candidates.process(page)) == [page]
    counted = dict(output.value.value for output in candidates.finish_bundle())  # the counts, as data
    assert counted == {"toc_llm_documents": 1, "toc_llm_too_long": 1}


@pytest.mark.parametrize("content", [
    "not json", '{"headings": {}}', '{"headings": [], "extra": 1}', '[{"title": "A", "level": 1, "page": 1}]',
    '{"headings": [{"title": "A", "level": 0, "page": 1}]}', '{"headings": [{"title": "A", "level": 1}]}',
    '{"headings": [{"title": "", "level": 1, "page": 1}]}', '{"headings": [{"title": "A", "level": 1, "page": 0}]}',
    '{"headings": [{"title": "A", "level": true, "page": 1}]}',
    json.dumps({"headings": [{"title": "A", "level": 1, "page": 1}] * (MAX_HEADINGS_PER_WINDOW + 1)}),
])
def test_an_answer_other_than_the_heading_list_asked_for_is_refused(content):
    with pytest.raises(MetadataFailure):
        parse_toc_answer(content)


def test_a_window_is_shown_the_last_headings_so_far_within_the_cap():
    assert context_lines([]) == ""
    so_far = [ProposedHeading(1 + n % 3, f"Heading {n} " + "x" * 100, n + 1) for n in range(20)]
    shown = context_lines(so_far).split("\n")
    assert len(shown) < CONTEXT_HEADINGS and len("\n".join(shown)) <= CONTEXT_CHARS
    assert shown[-1] == f"- level {1 + 19 % 3}, p. 20: {so_far[-1].title}"  # the last ones, in order
    assert [line.split(": ", 1)[1] for line in shown] == [h.title for h in so_far[-len(shown):]]
    short = [ProposedHeading(1, f"H{n}", n + 1) for n in range(20)]
    assert len(context_lines(short).split("\n")) == CONTEXT_HEADINGS


def test_a_fenced_heading_list_is_read():
    assert parse_toc_answer('```json\n{"headings": [{"title": " A  b ", "level": 2, "page": 3}]}\n```') == (
        ProposedHeading(2, "A b", 3),)


# --- builds ---------------------------------------------------------------------------

def test_the_models_verified_headings_cut_the_pdf_into_nested_sections(induced):
    index, endpoint = induced
    [question] = toc_questions(endpoint)  # four short pages: one window
    assert shown_pages(question) == {1, 2, 3, 4} and question["model"] == "fake-model"
    found = sections(index)
    assert set(found) == {"Getting Started", "Unpacking the probe", "Calibration", "Cleaning and care",
                          "Alarms", "Alarm codes"}  # each as its page spells it
    assert found["Unpacking the probe"]["ancestor_titles"][-1] == "Getting Started"
    assert found["Cleaning and care"]["ancestor_titles"][-1] == "Calibration"
    assert found["Alarm codes"]["ancestor_titles"][-1] == "Alarms"
    assert found["Calibration"]["body"].startswith("[p. 2]\nCalibration")
    assert "[p. 3]" in found["Cleaning and care"]["body"] and "Quantum" not in json.dumps(found)
    counts = counts_of(index)
    assert counts["toc_induced_llm"] == counts["toc_llm_documents"] == 1 and counts.get("toc_induced_pages", 0) == 0
    assert (counts["toc_llm_headings_proposed"], counts["toc_llm_headings_verified"],
            counts["toc_llm_headings_dropped"]) == (7, 6, 1)
    assert counts["toc_llm_requests"] == counts["toc_llm_windows_asked"] == 1 and counts["toc_llm_failed"] == 0
    manifest = IndexLayout(str(index)).load_manifest()
    assert manifest.config["induce_toc"] == {"model": "fake-model", "prompt_version": "pdf-toc-v2", "min_pages": 3}
    report = forest_report(str(index))
    assert report["toc_induced"] == {"llm": 1} and "llm 1" in render_text(report)


@pytest.fixture(scope="module")
def long_manual_site(tmp_path_factory) -> Path:
    return pdf_site(tmp_path_factory, "llm_toc_long", long_manual_pdf)


def test_each_window_is_asked_after_the_headings_proposed_before_it(long_manual_site, tmp_path):
    with FakeEndpoint(model()) as endpoint:
        build_index(long_manual_site, tmp_path / "index", *toc_flags(endpoint, "--metadata_nodes", "off"))
    questions = [body["messages"][-1]["content"] for body in toc_questions(endpoint)]
    assert [shown_pages(body) for body in toc_questions(endpoint)] == [{1}, {2}, {3}, {4}]  # in page order
    assert questions[0].startswith("[p. 1]\n")  # nothing before the first window
    assert questions[1].startswith(f"{CONTEXT_HEADER}\n- level 1, p. 1: Getting Started\n"
                                   f"- level 2, p. 1: Unpacking the PROBE\n\n[p. 2]\n")  # as the model gave them
    assert "- level 2, p. 2: Quantum flux alignment\n" in questions[2]  # proposed, though verification drops it
    assert set(sections(tmp_path / "index")) == {"Getting Started", "Unpacking the probe", "Calibration",
                                                 "Cleaning and care", "Alarms", "Alarm codes"}
    with FakeEndpoint(model()) as again:  # each window's key names its context: the cache answers all four
        build_index(long_manual_site, tmp_path / "again", *toc_flags(
            again, "--metadata_nodes", "off", "--metadata_cache", str(tmp_path / "index" / "metadata_cache")))
    assert again.log == [] and counts_of(tmp_path / "again")["toc_llm_cache_hits"] == 4
    assert set(sections(tmp_path / "again")) == set(sections(tmp_path / "index"))


def test_a_failed_window_ends_its_documents_questions(long_manual_site, tmp_path):
    def script(body: dict, n: int) -> tuple:
        return ("status", 503, {}) if shown_pages(body) == {2} else model()(body, n)
    with FakeEndpoint(script) as endpoint:
        build_index(long_manual_site, tmp_path / "index", *toc_flags(endpoint, "--metadata_nodes", "off"))
    assert [shown_pages(body) for body in toc_questions(endpoint)] == [{1}, {2}]  # pages 3 and 4 never asked
    counts = counts_of(tmp_path / "index")
    assert counts["toc_llm_failed"] == counts["toc_llm_failed_http_503"] == 1 and counts["toc_llm_windows_asked"] == 2
    assert set(sections(tmp_path / "index")) == {f"Page {n}" for n in PAGES}


def test_a_rebuild_from_the_cache_asks_nothing_of_the_pdf(induced, manual_site, tmp_path):
    index, _ = induced
    with FakeEndpoint(model()) as endpoint:
        build_index(manual_site, tmp_path / "again", *toc_flags(endpoint, "--metadata_cache",
                                                                  str(index / "metadata_cache")))
    assert toc_questions(endpoint) == []
    counts = counts_of(tmp_path / "again")
    assert counts["toc_llm_cache_hits"] == 1 and counts["toc_induced_llm"] == 1
    assert set(sections(tmp_path / "again")) == set(sections(index))


def test_an_update_cuts_a_changed_pdf_as_the_build_does(induced, manual_site, tmp_path):
    built, _ = induced
    index = tmp_path / "index"
    shutil.copytree(built, index)  # the index and its cache
    snapshot = tmp_path / "snapshot"
    shutil.copytree(manual_site, snapshot)
    manual_pdf(snapshot / "manuals" / "probe.pdf", edition="Second edition. ")
    with FakeEndpoint(model()) as endpoint:  # the ToC settings (--induce_toc_min_pages 3) are the index's
        update.run(["--input", str(snapshot), "--index", str(index), "--metadata_endpoint", endpoint.url,
                    "--metadata_deadline_s", "5", "--metadata_max_attempts", "1"])
    [question] = toc_questions(endpoint)  # its text changed: asked again
    assert "Second edition." in question["messages"][-1]["content"]
    found = sections(index)
    assert set(found) == set(sections(built)) and found["Alarm codes"]["ancestor_titles"][-1] == "Alarms"
    assert "20 Second edition." in found["Unpacking the probe"]["body"]  # page 2 opens before its heading
    assert counts_of(index)["toc_induced_llm"] == 1
    recorded = IndexLayout(str(index)).load_manifest().config
    assert recorded["induce_toc"] == IndexLayout(str(built)).load_manifest().config["induce_toc"]
    assert recorded["induce_toc"]["min_pages"] == 3


@pytest.mark.parametrize("flags, refusal", [
    ((), "for a summary and keywords per node and the headings of PDFs of at least 3 pages without an outline "
         "(--induce_toc llm), and an update asks the same"),
    (("--metadata_endpoint", "http://127.0.0.1:9/v1", "--induce_toc_min_pages", "8"),
     "--induce_toc_min_pages 8 (the index has 3)"),
    (("--metadata_endpoint", "http://127.0.0.1:9/v1", "--induce_toc", "off"), "--induce_toc 'off' (the index has 'llm')"),
])
def test_an_update_that_would_cut_pdfs_unlike_the_build_is_refused(induced, manual_site, flags, refusal):
    index, _ = induced
    live = IndexLayout(str(index)).load_manifest().version
    with pytest.raises(JobOptionsError, match=re.escape(refusal)):
        update.run(["--input", str(manual_site), "--index", str(index), *flags])
    assert IndexLayout(str(index)).load_manifest().version == live


@pytest.mark.parametrize("action, reason", [(("ok", "Here is the table of contents: 1. Start"), "malformed"),
                                            (("status", 503, {}), "http_503")])
def test_a_failed_answer_keeps_the_parsed_sections_and_is_counted(manual_site, tmp_path, action, reason):
    with FakeEndpoint(model(action)) as endpoint:
        build_index(manual_site, tmp_path / "index", *toc_flags(endpoint))
    assert len(toc_questions(endpoint)) == 1
    assert set(sections(tmp_path / "index")) == {f"Page {n}" for n in PAGES}
    counts = counts_of(tmp_path / "index")
    assert counts["toc_llm_failed"] == counts[f"toc_llm_failed_{reason}"] == 1
    assert counts["toc_induced_pages"] == 1 and counts["toc_induced_llm"] == 0


def test_a_budget_too_small_for_the_pdf_keeps_its_sections(manual_site, tmp_path):
    with FakeEndpoint(model()) as endpoint:
        build_index(manual_site, tmp_path / "index", *toc_flags(endpoint, "--metadata_max_tokens", "100"))
    assert toc_questions(endpoint) == []
    counts = counts_of(tmp_path / "index")
    assert counts["toc_llm_not_asked"] == 1 and counts["toc_induced_pages"] == 1


def test_the_budget_is_the_jobs_what_the_toc_admits_the_metadata_may_not_spend(manual_site, tmp_path):
    [page] = parse(manual_site / "manuals" / "probe.pdf")
    toc_cost = DocumentQuestions(tuple(windows(page_texts(page)))).estimated_tokens()
    with FakeEndpoint(model()) as endpoint:
        build_index(manual_site, tmp_path / "index", *toc_flags(endpoint, "--metadata_max_tokens",
                                                                  str(toc_cost + 10)))
    assert len(toc_questions(endpoint)) == len(endpoint.log) == 1  # no node's question fits in 10 tokens
    counts = counts_of(tmp_path / "index")
    assert counts["toc_induced_llm"] == 1 and counts["metadata_asked"] == 0
    assert counts["metadata_not_asked"] == counts["metadata_nodes"] > 0


def test_with_metadata_nodes_off_the_endpoint_is_asked_for_the_toc_only(manual_site, tmp_path):
    with FakeEndpoint(model()) as endpoint:
        build_index(manual_site, tmp_path / "index", *toc_flags(endpoint, "--metadata_nodes", "off"))
    assert len(toc_questions(endpoint)) == len(endpoint.log) == 1
    counts = counts_of(tmp_path / "index")
    assert counts["toc_induced_llm"] == 1 and not any(name.startswith("metadata_") for name in counts)
    assert "metadata" not in IndexLayout(str(tmp_path / "index")).load_manifest().config


def test_without_the_flag_nothing_is_asked_and_the_pdf_is_cut_as_before(induced, manual_site, tmp_path):
    build_index(manual_site, tmp_path / "plain", "--embedding_model", "hashing:384", "--granularity", "section")
    assert set(sections(tmp_path / "plain")) == {f"Page {n}" for n in PAGES}
    counts = counts_of(tmp_path / "plain")
    assert counts["toc_induced_pages"] == 1 and not any(name.startswith("toc_llm") for name in counts)
    assert "induce_toc" not in IndexLayout(str(tmp_path / "plain")).load_manifest().config


def test_induce_toc_without_an_endpoint_is_refused(manual_site, tmp_path):
    with pytest.raises(JobOptionsError, match="--induce_toc llm needs --metadata_endpoint"):
        build_index(manual_site, tmp_path / "index", "--induce_toc", "llm")

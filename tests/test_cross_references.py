"""Cross-references as edges (issue #38 item 6): Sphinx's `:ref:` (a label of
another file) and `:doc:`, and Markdown's inline and reference links between
files, become the same link records as an HTML page's hrefs, so they resolve
to the nodes they name through the one resolver (transforms/edges.py) and
`ritrag inspect` counts them; a `:ref:` to no label is a link to nothing."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ritrag.transforms.pages import PageParser, parse_or_dead_letter, read_file
from ritrag.transforms.sources.rst_labels import document_outline

BASE = "http://localhost/"

SPHINX = {
    "conf.py": "project = 'tidepool'\n",
    "index.rst": """Tidepool
========

Readings are logged; see :ref:`where the logs go <log-files>`, :ref:`rotation`
and :ref:`Install <install>`. The whole guide is :doc:`guide/logging`; a
:ref:`broken reference <no-such-label>` names nothing, :doc:`/` no document
and :doc:`../../outside` none in the input.
""",
    "guide/logging.rst": """.. _install:

Logging
=======

Set the level first, as :doc:`/index` says, then read :ref:`log-files`.

.. _log-files:

Log files
---------

Readings go to ``/var/log/tidepool``.

.. _rotation:
.. _rotating:

Rotation
--------

Daily, fourteen files kept.

.. _python: https://www.python.org/
""",
}

MKDOCS = {
    "mkdocs.yml": "site_name: T\nnav:\n  - Home: index.md\n  - Guide: guide.md\n  - Logging: logging.md\n",
    "docs/index.md": "# Home\n\nSee the [guide](guide.md) and [the log files][logs].\n\n"
                     "[logs]: logging.md#log-files\n",
    "docs/guide.md": "# Guide\n\n## Setup\n\nLogs go where [Log files](logging.md#log-files) says; rotation "
                     "per [rotation][] and [a page not written](missing.md).\n\n[rotation]: ./logging.md#rotation\n",
    "docs/logging.md": "# Logging\n\n## Log files\n\nThey live in /var/log.\n\n## Rotation\n\nDaily.\n",
}


def write_site(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def parse(root: Path, name: str):
    parser = PageParser(str(root) + "/", BASE, 0, 1 << 24)
    path = str(root / name)
    [page] = parse_or_dead_letter(parser, path, lambda: read_file(path), "parse")
    return page


def built_edges(root: Path, out: Path, granularity: str) -> tuple[set[tuple[str, str, str]], dict]:
    """Build `root`; (source URL, target URL, anchor text) of every edge, and `ritrag inspect`'s report."""
    from ritrag.evaluation.forest_report import forest_report
    from ritrag.pipelines import build

    build.run(["--input", str(root), "--out", str(out), "--granularity", granularity, "--site_depth", "0",
               "--embedding_model", "hashing:384"])
    segment = next((out / "segments").iterdir())
    url = {r["node_id"]: r["url"] for r in pq.read_table(next(segment.glob("nodes-*.parquet"))).to_pylist()}
    edges = pa.concat_tables(pq.read_table(f) for f in segment.glob("edges-*.parquet")).to_pylist()
    return {(url[e["source_node_id"]], url[e["target_node_id"]], e["anchor_text"]) for e in edges}, forest_report(
        str(out))


def test_labels_name_the_section_they_stand_before_else_their_own_id():
    outline = document_outline(SPHINX["guide/logging.rst"] + """
.. _fig-1:

.. figure:: probe.png

.. _again:

Log files
---------

.. _`odd: name`:

=========
 Options
=========

.. _tail:
""")
    assert outline.title == "Logging"
    assert outline.labels == [("install", "logging", "Logging"), ("log-files", "log-files", "Log files"),
         ("rotation", "rotation", "Rotation"), ("rotating", "rotation", "Rotation"),
         ("fig-1", "fig-1", ""),
         ("again", "again", ""),  # a title repeated in its file: docutils gives it another id
         ("odd: name", "options", "Options"), ("tail", "tail", "")]


def test_sphinx_cross_references_become_links_to_the_places_they_name(tmp_path):
    root = write_site(tmp_path, SPHINX)
    index = parse(root, "index.rst")
    assert [(link.url, link.fragment, link.anchor_text) for link in index.links] == [
        (f"{BASE}guide/logging.html", "log-files", "where the logs go"),
        (f"{BASE}guide/logging.html", "rotation", "Rotation"),  # implicit: the section's title, as Sphinx shows it
        (f"{BASE}guide/logging.html", "logging", "Install"),  # the document's title: no section, so its page
        (f"{BASE}guide/logging.html", "", "Logging"),  # implicit: the document's title
        ("", "no-such-label", "broken reference"),  # a link to nothing, kept to be counted
    ]
    assert "see where the logs go, Rotation and Install." in index.sections[0].text
    guide = parse(root, "guide/logging.rst")  # a link to its own page is none (the page holds its sections)
    assert [(link.url, link.fragment) for link in guide.links] == [(BASE, "")]


@pytest.mark.slow
def test_a_sphinx_sites_cross_references_are_edges_to_section_nodes(tmp_path):
    root = write_site(tmp_path / "in", SPHINX)
    edges, report = built_edges(root, tmp_path / "idx", "section")
    page = f"{BASE}guide/logging.html"
    assert edges == {(BASE, f"{page}#log-files", "where the logs go"), (BASE, f"{page}#rotation", "Rotation"),
                     (BASE, page, "Install"), (BASE, page, "Logging"), (page, BASE, "Tidepool")}
    [site] = report["sites"].values()
    # inspect counts an edge per linking page and target node (two of the five name the page), and the broken :ref:
    assert (site["links"]["edges"], site["links"]["unresolved"]) == (4, 1)
    counters = report["link_counters"]
    assert (counters["edges"], counters["edges_to_sections"], counters["links_unresolved"]) == (5, 2, 1)


@pytest.mark.slow
def test_a_mkdocs_sites_inline_and_reference_links_are_edges_to_headings(tmp_path):
    root = write_site(tmp_path / "in", MKDOCS)
    edges, report = built_edges(root, tmp_path / "idx", "section")
    home, guide, logging = f"{BASE}docs", f"{BASE}docs/guide.html", f"{BASE}docs/logging.html"
    assert edges == {(home, guide, "guide"), (home, f"{logging}#log-files", "the log files"),
                     (guide, f"{logging}#log-files", "Log files"), (guide, f"{logging}#rotation", "rotation")}
    [site] = report["sites"].values()
    assert (site["links"]["edges"], site["links"]["unresolved"]) == (4, 1)  # missing.md


@pytest.mark.slow
def test_an_update_resolves_cross_references_as_a_fresh_build_does(tmp_path):
    """A changed document's `:ref:` to a label of an unchanged one, and to a
    document the update adds, give the edges a fresh build of the new input gives."""
    from ritrag.pipelines import build, update
    from ritrag.reader import IndexReader

    flags = ["--granularity", "section", "--site_depth", "0", "--embedding_model", "hashing:384"]
    a, b = write_site(tmp_path / "a", SPHINX), write_site(tmp_path / "b", SPHINX)
    (b / "index.rst").write_text(SPHINX["index.rst"].replace(":ref:`rotation`", ":ref:`rotating` (:ref:`alarms`)"))
    (b / "guide/alerts.rst").write_text("Alerts\n======\n\n.. _alarms:\n\nAlarms\n------\n\nA reading out of range.\n\n"
                                        "Silence\n-------\n\nPress the button.\n")
    updated, fresh = tmp_path / "updated", tmp_path / "fresh"
    build.run(["--input", str(a), "--out", str(updated), *flags])
    update.run(["--input", str(b), "--index", str(updated)])
    build.run(["--input", str(b), "--out", str(fresh), *flags])

    def edges(index: Path) -> set[tuple]:
        url = {r.node_id: r.url for r in IndexReader(str(index)).rows("nodes")}
        return {(url[e["source_node_id"]], e["position"], url[e["target_node_id"]], e["anchor_text"])
                for e in IndexReader(str(index)).rows("edges")}

    assert edges(updated) == edges(fresh)
    assert (BASE, 1, f"{BASE}guide/logging.html#rotation", "Rotation") in edges(fresh)
    assert (BASE, 2, f"{BASE}guide/alerts.html#alarms", "Alarms") in edges(fresh)

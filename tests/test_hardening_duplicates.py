"""Issue 37, duplicates: two inputs with one URL make a node of one of them
(item 7), two sites inferring one public base keep their pages apart (7), and
Discourse posts sharing a number are all kept (10)."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

from ritrag.evaluation.forest_report import forest_report, render_text
from ritrag.layout import DEAD_LETTERS_FILE, IndexLayout
from ritrag.pipelines import build
from ritrag.reader import IndexReader
from ritrag.schema import PageSkeleton, PageSource
from ritrag.storage import open_parquet
from ritrag.transforms.forest import build_site_forest
from ritrag.transforms.pages import PageParser, chosen_source, parse_or_dead_letter, read_file, reread_page

HASHING = ("--embedding_model", "hashing:384")


def page(title: str, text: str, canonical: str = "") -> str:
    link = f'<link rel="canonical" href="{canonical}">' if canonical else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>{link}</head>"
            f"<body><main><h1>{title}</h1><p>{text}</p></main></body></html>")


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def nodes(index: Path) -> list[dict]:
    return IndexReader(str(index)).table("nodes").to_pylist()


def dead_letters(index: Path) -> list[dict]:
    reader = IndexReader(str(index))
    return [row for f in reader.segment_files(DEAD_LETTERS_FILE) for row in open_parquet(f).read().to_pylist()]


def page_counts(index: Path) -> dict[str, int]:
    counts = IndexLayout(str(index)).load_manifest().stats["pages"]
    assert counts["pages_read"] == (counts["pages_indexed"] + counts["pages_dead_lettered"]
                                    + counts["pages_merged_duplicates"])
    return counts


# --- item 7: two inputs at one URL ----------------------------------------------

def test_the_forest_and_the_node_rows_pick_the_same_input_in_any_order():
    site = "https://dup.example/"
    url = site + "sub/"
    skeletons = [PageSkeleton(url, url, site, title, (), "url", source=source)
                 for title, source in (("Zed", "in/sub/a.htm"), ("Alpha", "in/sub/b.html"), ("Mid", "in/sub/c.md"))]
    sources = [PageSource(url, s.source, "raw", content) for s, content in zip(skeletons, ("0", "f", "8"))]
    for order in itertools.permutations(range(3)):
        placed = build_site_forest(site, [skeletons[i] for i in order]).placements
        winner, losers = chosen_source([sources[i] for i in order])
        assert [p.title for p in placed if p.url == url] == ["Zed"]  # the skeleton of the source chosen
        assert winner.source == "in/sub/a.htm" and [s.source for s in losers] == ["in/sub/b.html", "in/sub/c.md"]


def test_index_html_and_index_htm_make_one_node_of_one_file_and_dead_letter_the_other(tmp_path):
    # Texts chosen so that the old rules picked different files: the forest the least
    # title (Alpha), the node rows the least content hash (Beta's).
    src = write(tmp_path / "in", {"index.html": page("Home", "the home page"),
                                  "sub/index.html": page("Alpha", "alpha words 6"),
                                  "sub/index.htm": page("Beta", "beta words 6")})
    out = tmp_path / "idx"
    build.run(["--input", str(src), "--out", str(out), "--base_url", "https://dup.example/", *HASHING])
    [sub] = [n for n in nodes(out) if n["url"] == "https://dup.example/sub"]
    # The source that sorts first wins, for the whole record.
    assert (sub["title"], "beta words" in sub["body"], "alpha" in sub["body"]) == ("Beta", True, False)
    [pages_row] = [r for r in IndexReader(str(out)).rows("pages") if r["url"] == sub["url"]]
    assert pages_row["source"].endswith("sub/index.htm") and pages_row["title"] == "Beta"
    [letter] = dead_letters(out)
    assert letter["source"].endswith("sub/index.html") and letter["reason"] == "duplicate_url"
    assert str(src / "sub/index.htm") in letter["detail"]
    counts = page_counts(out)
    assert (counts["pages_read"], counts["pages_indexed"], counts["pages_merged_duplicates"]) == (3, 2, 1)


def mirrored_site(root: Path, folder: str, public: str, label: str) -> None:
    write(root, {f"{folder}/index.html": page(f"{label} home", f"{label} home words", f"{public}/index.html"),
                 f"{folder}/guide.html": page(f"{label} guide", f"{label} guide words", f"{public}/guide.html")})


def test_two_sites_inferring_one_base_keep_their_pages_apart_and_report_the_conflict(tmp_path):
    src = tmp_path / "in"
    mirrored_site(src, "a", "https://victim.example/docs", "Ant")
    mirrored_site(src, "b", "https://victim.example/docs", "Bee")
    mirrored_site(src, "c", "https://other.example/c", "Cat")  # a base of its own: still inferred
    out = tmp_path / "idx"
    build.run(["--input", str(src), "--out", str(out), "--site_depth", "1", *HASHING])

    bases = IndexLayout(str(out)).load_manifest().config["site_bases"]
    a, b, c = (bases[f"http://localhost/{name}"] for name in "abc")
    assert (a["status"], a["base"], a["shared_with"]) == ("conflict", None, ["http://localhost/b"])
    assert (b["status"], b["base"], b["shared_with"]) == ("conflict", None, ["http://localhost/a"])
    assert a["candidates"] == {"https://victim.example/docs": 2}
    assert (c["status"], c["base"]) == ("inferred", "https://other.example/c")

    pages = [n for n in nodes(out) if n["kind"] == "page"]
    assert len(pages) == 6
    for n in pages:  # each node is one input's: title, text and site agree
        label = n["title"].split()[0]
        assert f"{label} " in n["body"] and n["site"] == {"Ant": "http://localhost/a", "Bee": "http://localhost/b",
                                                          "Cat": "https://other.example/c"}[label]
    assert dead_letters(out) == []
    assert page_counts(out)["pages_merged_duplicates"] == 0

    report = render_text(forest_report(str(out)))
    assert ("base: kept http://localhost/a: its pages name https://victim.example/docs, "
            "which http://localhost/b infers too") in report


# --- item 10: Discourse posts sharing a number ------------------------------------

TOPIC = {"title": "Heater", "post_stream": {"posts": [
    {"post_number": 1, "username": "ann", "cooked": "<p>the question</p>"},
    {"post_number": 2, "username": "bob", "cooked": "<p>first two</p>"},
    {"post_number": 2, "username": "cy", "cooked": "<p>second two</p>", "reply_to_post_number": 2},
    {"post_number": 2, "username": "dee", "cooked": "<p>third two</p>"},
    {"post_number": 3, "username": "eve", "cooked": "<p>answers two</p>", "reply_to_post_number": 2},
]}}


def test_discourse_posts_sharing_a_number_are_all_kept_with_ids_of_their_own(tmp_path):
    path = tmp_path / "t" / "heater.json"
    path.parent.mkdir()
    path.write_text(json.dumps(TOPIC))
    parser = PageParser(str(tmp_path) + "/", "http://localhost/", 1, 1 << 24)
    pages = parse_or_dead_letter(parser, str(path), lambda: read_file(str(path)), "parse")
    topic = "http://localhost/t/heater"
    assert [(p.url, p.source.rpartition("#")[2], p.body) for p in pages[1:]] == [
        (f"{topic}/2", "post-2", "first two"), (f"{topic}/2-2", "post-2-2", "second two"),
        (f"{topic}/2-3", "post-2-3", "third two"), (f"{topic}/3", "post-3", "answers two")]
    # A reply names a number: the first post of that number.
    assert pages[2].trail[-1].url == f"{topic}/2" and pages[4].trail[-1].url == f"{topic}/2"
    assert parse_or_dead_letter(parser, str(path), lambda: read_file(str(path)), "parse") == pages
    for post in pages[1:]:  # an update reads each again by its record source
        assert reread_page(parser, PageSource.of(post)) == post

    out = tmp_path / "idx"
    build.run(["--input", str(path.parent), "--out", str(out), "--base_url", "http://localhost/t/", *HASHING])
    bodies = sorted(n["body"] for n in nodes(out) if n["kind"] == "page")
    assert bodies == sorted(p.body for p in pages)
    counts = page_counts(out)
    assert (counts["pages_read"], counts["pages_indexed"], counts["pages_merged_duplicates"]) == (5, 5, 0)

"""ritrag.transforms.site_base: a mirrored site, built without --base_url, is the forest
the build with the right --base_url gives; the rules that decide a site's base."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ritrag.pipelines import build
from ritrag.evaluation.forest_report import forest_report, render_text
from ritrag.layout import IndexLayout
from ritrag.transforms.parse import declared_page_urls
from ritrag.transforms.site_base import INFERRED, NONE, SEVERAL, base_candidate, choose_base

PUBLIC = "https://docs.example.com"
# path -> (title, [(crumb title, path)] root first, without the page)
PAGES = {
    "index.html": ("Example Docs", []),
    "guide/index.html": ("Guide", [("Docs", "index.html")]),
    "guide/install.html": ("Installation", [("Docs", "index.html"), ("Guide", "guide/index.html")]),
    "guide/install/linux.html": ("Linux", [("Docs", "index.html"), ("Guide", "guide/index.html"),
                                           ("Installation", "guide/install.html")]),
    "reference/api.html": ("API", [("Docs", "index.html")]),
    "reference/api/http.html": ("HTTP API", [("Docs", "index.html"), ("API", "reference/api.html")]),
}


def _relative(from_path: str, to_path: str) -> str:
    depth = from_path.count("/")
    return "../" * depth + to_path


def mirror_page(path: str, title: str, trail: list[tuple[str, str]]) -> str:
    """A page as a mirror keeps it: JSON-LD crumbs and canonical link absolute (the
    original host), the visible ARIA trail relative, no-break spaces in the text."""
    items = [{"@type": "ListItem", "position": i + 1, "name": t, "item": f"{PUBLIC}/{p}"}
             for i, (t, p) in enumerate(trail)]
    items.append({"@type": "ListItem", "position": len(items) + 1, "name": title, "item": f"{PUBLIC}/{path}"})
    jsonld = json.dumps({"@context": "https://schema.org", "@type": "BreadcrumbList", "itemListElement": items})
    nav = "".join(f'<li class="breadcrumb-item"><a href="{_relative(path, p)}">{t}</a></li>' for t, p in trail)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title} | Example</title>'
            f'<link rel="canonical" href="{PUBLIC}/{path}">'
            f'<script type="application/ld+json">{jsonld}</script></head><body>'
            f'<nav aria-label="breadcrumb"><ol class="breadcrumb">{nav}'
            f'<li class="breadcrumb-item active" aria-current="page">{title}</li></ol></nav>'
            f'<div class="wrapper"><main><h1>{title}</h1><p>About\u00a0{title.lower()}: '
            f"what it is and how to use it.</p></main></div></body></html>")


def write_mirror(directory: Path) -> Path:
    for path, (title, trail) in PAGES.items():
        file = directory / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(mirror_page(path, title, trail), encoding="utf-8")
    return directory


def node_table(index: Path) -> list[tuple]:
    layout = IndexLayout(str(index))
    manifest = layout.load_manifest()
    files = [layout.verified_path(seg, n) for seg in manifest.segments for n in layout.segment_files(seg, "nodes")]
    rows = pa.concat_tables([pq.read_table(f) for f in files]).to_pylist()
    return sorted((r["node_id"], r["parent_id"], r["site"], r["kind"], r["url"], r["title"], r["trail_method"],
                   r["depth"], r["body"]) for r in rows)


def test_a_mirror_built_without_base_url_is_the_forest_of_the_right_base_url(tmp_path):
    mirror = write_mirror(tmp_path / "mirror")
    common = ["--input", str(mirror), "--embedding_model", "hashing:384"]
    build.run([*common, "--out", str(tmp_path / "inferred")])
    build.run([*common, "--out", str(tmp_path / "given"), "--base_url", PUBLIC + "/"])
    inferred, given = node_table(tmp_path / "inferred"), node_table(tmp_path / "given")
    assert inferred == given
    by_url = {row[4]: row for row in inferred}
    linux = by_url[f"{PUBLIC}/guide/install/linux.html"]
    assert linux[6] == "jsonld" and linux[7] == 3  # placed under Installation, not flat under the root
    assert linux[1] == by_url[f"{PUBLIC}/guide/install.html"][0]
    assert "\u00a0" not in linux[8]

    manifest = IndexLayout(str(tmp_path / "inferred")).load_manifest()
    decided = manifest.config["site_bases"]["http://localhost/"]
    assert (decided["status"], decided["base"], decided["pages"]) == (INFERRED, PUBLIC + "/", len(PAGES))
    assert IndexLayout(str(tmp_path / "given")).load_manifest().config["site_bases"] == {}
    report = render_text(forest_report(str(tmp_path / "inferred")))
    assert f"base: inferred {PUBLIC}" in report


def test_without_self_named_urls_the_absolute_crumbs_pass_over_to_the_visible_trail(tmp_path):
    """The same mirror with its canonical links removed: no base is inferred, the
    JSON-LD crumbs (all off-site) are passed over and the ARIA trail places the pages."""
    mirror = write_mirror(tmp_path / "mirror")
    for file in mirror.rglob("*.html"):
        text = file.read_text(encoding="utf-8")
        file.write_text(text.replace('<link rel="canonical"', '<link rel="alternate"'), encoding="utf-8")
    # The JSON-LD list's last item still names the page: strip it too.
    for path, (title, trail) in PAGES.items():
        text = (mirror / path).read_text(encoding="utf-8")
        (mirror / path).write_text(text.replace(f'"item": "{PUBLIC}/{path}"', '"item": "#"'), encoding="utf-8")
    out = tmp_path / "idx"
    build.run(["--input", str(mirror), "--embedding_model", "hashing:384", "--out", str(out)])
    manifest = IndexLayout(str(out)).load_manifest()
    assert manifest.config["site_bases"]["http://localhost/"]["status"] == NONE
    rows = {r[4]: r for r in node_table(out)}
    linux = rows["http://localhost/guide/install/linux.html"]
    assert (linux[6], linux[7]) == ("breadcrumb", 3)
    counts = manifest.stats["pages"]
    assert counts["trail_passed_over_jsonld"] == len(PAGES)  # every list named only places off the site
    assert counts["trail_taken_breadcrumb"] == len(PAGES) - 1  # all but the home page's, which names itself
    report = render_text(forest_report(str(out)))
    assert "base: kept http://localhost/: no page names a public URL" in report
    assert "jsonld tried 6, taken 0, passed over 6" in report


def test_base_candidate_agrees_with_the_path_inside_the_site():
    site = "http://localhost/prod"
    page = "http://localhost/prod/guide/install.html"
    assert base_candidate(page, site, "https://docs.example.com/v2/guide/install.html") == "https://docs.example.com/v2"
    assert base_candidate(page, site, "https://docs.example.com/guide/install") == "https://docs.example.com/"
    assert base_candidate(page, site, "https://docs.example.com/") is None  # a home page, not this page
    assert base_candidate(page, site, "https://docs.example.com/other/install.html") is None
    assert base_candidate(page, site, "file:///usr/share/doc/guide/install.html") is None  # not a public URL
    assert base_candidate("http://localhost/prod/index.html", site, "https://docs.example.com/v2/") == \
        "https://docs.example.com/v2"


def test_a_self_named_url_that_is_not_a_url_is_passed_over():
    head = (b'<html><head><link rel="canonical" href="http://[broken/guide/install.html">'
            b'<meta property="og:url" content="http://docs.example.com:port/guide/install.html">'
            b'<script type="application/ld+json">{"url": "https://docs.example.com/v2/guide/install.html"}</script>'
            b'</head><body></body></html>')
    assert declared_page_urls(head) == ("https://docs.example.com/v2/guide/install.html",)


def test_a_site_naming_several_bases_or_none_keeps_its_input_urls():
    assert choose_base(Counter({"https://a.example": 3})).status == INFERRED
    several = choose_base(Counter({"https://a.example": 3, "https://b.example": 1}))
    assert (several.status, several.base, several.candidates) == (
        SEVERAL, None, {"https://a.example": 3, "https://b.example": 1})
    assert choose_base(Counter()).status == NONE


def test_an_update_of_an_inferred_index_keys_pages_by_their_public_urls(tmp_path):
    from ritrag.pipelines import update

    mirror = write_mirror(tmp_path / "mirror")
    out = tmp_path / "idx"
    build.run(["--input", str(mirror), "--embedding_model", "hashing:384", "--out", str(out)])
    before = node_table(out)
    # every page found unchanged at the URL the build keyed it by: nothing to publish
    assert update.run(["--input", str(mirror), "--index", str(out)]) == "v000001"
    assert node_table(out) == before

"""What tests share besides fixtures: the corpora's paths, a small documentation
site the tests write themselves, building an index, comparing GetToC answers.
Imported by bare name (pytest.ini puts tests/ on the path; tests import the
product only as `ritrag.*`)."""
from __future__ import annotations

import ast
import gc
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from ritrag.reader import ID_COLUMNS, IndexReader
from ritrag.schema import FILE_FIELD, ChunkRef, ChunkRow, NodeRow, NodeSkeleton

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample" / "pages"
# The dev corpus (shared/corpus/build_corpus.sh output), for the tests that run on it
# where present: $RITRAG_DEV_CORPUS, else a `corpus` folder next to the checkout.
DEV_CORPUS = Path(os.environ.get("RITRAG_DEV_CORPUS", ROOT.parent / "corpus"))
BASE = "https://docs.example.com"

# path -> (title, trail [(title, path)], sections [(heading, text)]); "" is the home page.
TINY_SITE = {
    "shop/index.html": ("Shop Server", [], [("Overview", "Shop Server sells widgets over HTTP.")]),
    "shop/v2/index.html": ("Version 2", [("Shop Server", "shop/")],
                           [("About", "Release two of the shop server.")]),
    "shop/v2/config.html": ("Configuring the server", [("Shop Server", "shop/"), ("Version 2", "shop/v2/")],
                            [("Ports", "Version 2 listens on port 8080 by default."),
                             ("TLS", "Version 2 reads certificates from /etc/shop/tls.")]),
    "shop/v3/index.html": ("Version 3", [("Shop Server", "shop/")],
                           [("About", "Release three of the shop server.")]),
    "shop/v3/config.html": ("Configuring the server", [("Shop Server", "shop/"), ("Version 3", "shop/v3/")],
                            [("Ports", "Version 3 listens on port 9443 with QUIC enabled."),
                             ("TLS", "Version 3 loads certificates from the vault service.")]),
    "shop/v3/logging.html": ("Logging", [("Shop Server", "shop/"), ("Version 3", "shop/v3/")],
                             [("Rotation", "Logs rotate daily; keep fourteen files."),
                              ("Levels", "Set the log level with SHOP_LOG=debug.")]),
    "shop/v3/guide/deploy.html": ("Deploying", [("Shop Server", "shop/"), ("Version 3", "shop/v3/"),
                                                ("Guides", "shop/v3/guide/")],
                                  [("Containers", "Run the shop image with two replicas behind a proxy.")]),
}


def tiny_page(title: str, trail: list[tuple[str, str]], sections: list[tuple[str, str]]) -> str:
    items = [{"@type": "ListItem", "position": i + 1, "name": t, "item": f"{BASE}/{p}"}
             for i, (t, p) in enumerate(trail)]
    items.append({"@type": "ListItem", "position": len(items) + 1, "name": title})
    ld = json.dumps({"@context": "https://schema.org", "@type": "BreadcrumbList", "itemListElement": items})
    body = "".join(f'<h2 id="s{i}">{h}</h2><p>{t}</p>' for i, (h, t) in enumerate(sections))
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title} | Shop Docs</title>'
            f'<script type="application/ld+json">{ld}</script></head><body>'
            f'<header><nav><a href="/">Home</a> Products Pricing</nav></header>'
            f'<main><h1>{title}</h1>{body}</main>'
            f'<footer>Copyright Shop Inc. All rights reserved.</footer></body></html>')


# The tiny site's files are dated long before any build reads them, as a site's
# files usually are: every page records its stamp (size, mtime), the same in every
# build whenever it runs. A file read within STAMP_SETTLE_S of its mtime records
# none, so files dated "now" would make a build's pages table depend on how long
# the machine took to reach it.
SETTLED_MTIME = 1_600_000_000.0


def write_tiny_site(directory: Path) -> Path:
    for path, (title, trail, sections) in TINY_SITE.items():
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(tiny_page(title, trail, sections), encoding="utf-8")
        os.utime(target, (SETTLED_MTIME, SETTLED_MTIME))
    return directory


def build_index(input_dir: Path, out: Path, *extra: str) -> str:
    from ritrag.pipelines import build

    return build.run(["--input", str(input_dir), "--out", str(out), "--base_url", BASE + "/",
                      "--site_depth", "1", *extra])


def assert_same_toc(actual: list[dict], expected: list[dict]) -> None:
    """Two GetToC answers hold the same entries (ids, titles, hits, shape, order)
    with scores equal to 1e-3: min-max fusion keeps score magnitudes, and the
    vectors of one text embedded in other batches or processes agree only to
    rounding (bfloat16 on CPUs with AMX), so indexes that must answer alike (an
    update and a fresh build, one worker and several) agree to that tolerance."""
    got, want = _entries(actual), _entries(expected)
    scores = lambda entries: [e.pop("score") for e in entries if "score" in e]  # noqa: E731
    got_scores, want_scores = scores(got), scores(want)
    assert got == want
    assert got_scores == pytest.approx(want_scores, abs=1e-3)


def _entries(trees: list[dict]) -> list[dict]:
    """Every entry of `trees`, depth first, without its children."""
    return [e for entry in trees
            for e in ({k: v for k, v in entry.items() if k != "children"}, *_entries(entry.get("children", [])))]

def live_table(index_dir: Path, kind: str) -> dict:
    key = ID_COLUMNS[kind]
    rows = {}
    for row in IndexReader(str(index_dir)).table(kind).to_pylist():
        if kind == "pages":  # where and when the input was, not what it holds
            row.pop("source")
            row.pop("source_stamp")
        assert row[key] not in rows, f"{kind} {row[key]} live twice"
        rows[row[key]] = row
    return rows


def benchmark_module(name: str):
    """benchmarks/<name>.py, loaded from its file: the benchmarks are scripts of
    the repository, not part of the installed product, and the repository root
    stays off sys.path so that tests import the installed `ritrag`."""
    qualified = f"benchmarks_{name}"
    if qualified not in sys.modules:
        spec = importlib.util.spec_from_file_location(qualified, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[qualified] = module  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
    return sys.modules[qualified]


def node_row(**fields) -> NodeRow:
    """A node row of a page node at a site's root, but for `fields`."""
    defaults = dict(node_id="n", parent_id=None, page_id=None, site="", kind="page", position=0, depth=0, title="",
                    url=None, ancestor_ids=[], ancestor_titles=[], body="", summary="", keywords=[],
                    source_summary="", source_keywords=[], metadata_key="", content_hash="", trail_method="",
                    source_kind="")
    return NodeRow(**{**defaults, **fields})


def node_skeleton(file: str = "f", **fields) -> NodeSkeleton:
    """A live node row as the update reads it back (no body), in `file`; `node_row`'s defaults."""
    return NodeSkeleton(**{name: value for name, value in node_row(**fields)._asdict().items() if name != "body"},
                        **{FILE_FIELD: file})


def chunk_ref(file: str = "f", **fields) -> ChunkRef:
    """A live chunk ref as the update reads it back, in `file`; `chunk_row`'s defaults."""
    return ChunkRef(**{name: getattr(chunk_row(**fields), name) for name in ChunkRef._fields if name != FILE_FIELD},
                    **{FILE_FIELD: file})


def chunk_row(**fields) -> ChunkRow:
    """A chunk row (ordinal 0 of node "n"), but for `fields`."""
    defaults = dict(chunk_id=1, node_id="n", page_id="n", ordinal=0, text="", text_hash="", n_tokens=0,
                    embedded_text="")
    return ChunkRow(**{**defaults, **fields})


def parsed_source(source: str) -> ast.Module:
    """`ast.parse` with the garbage collector held off. On CPython 3.11 a
    finalizer that the collector runs in the middle of building the tree (such as
    an object-store client's pending asyncio task that an earlier test left)
    fails the parse with "SystemError: AST constructor recursion depth mismatch"
    (python/cpython#106905). With the collector off, no finalizer runs inside it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if enabled:
            gc.enable()

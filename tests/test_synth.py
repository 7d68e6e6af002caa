"""The synthetic corpus generator: deterministic, streaming, well-formed, with
breadcrumb trails that match each page's real place in its site."""
from __future__ import annotations

import gc
import json
import re
import sys
import tracemalloc
from collections import Counter
from functools import lru_cache
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin

import lxml.html
import pytest

from ritrag.evaluation.synth import SynthConfig, generate_corpus, iter_pages

BASE = "https://synth.example"
SCHEMA_LIST_ITEM = "https://schema.org/ListItem"


@lru_cache(maxsize=None)
def corpus(config: SynthConfig) -> dict[str, bytes]:
    return dict(iter_pages(config))


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def is_section(path: str) -> bool:
    return path.endswith("/index.html")


def ancestors_of(path: str) -> list[str]:
    """Ancestor page paths implied by the layout, home first."""
    directories = path.split("/")[:-1]
    levels = len(directories) - 1 if is_section(path) else len(directories)
    return ["/".join(directories[:i]) + "/index.html" for i in range(1, levels + 1)]


def path_of_link(page_path: str, href: str) -> str:
    """Generated file a link points to (directory links mean the section's index)."""
    url = urljoin(f"{BASE}/{page_path}", href)
    assert url.startswith(BASE + "/"), url
    path = url[len(BASE) + 1:]
    return path + "index.html" if path.endswith("/") else path


def trails_of(page_path: str, tree) -> dict[str, tuple[list[str], list[str]]]:
    """Breadcrumb trails by family: (linked page paths, labels)."""
    trails = {}
    for script in tree.xpath('//script[@type="application/ld+json"]'):
        items = json.loads(script.text)["itemListElement"]
        assert [item["position"] for item in items] == list(range(1, len(items) + 1))
        trails["jsonld"] = ([path_of_link(page_path, item["item"]) for item in items],
                            [item["name"] for item in items])
    for crumbs in tree.xpath('//nav[@aria-label="breadcrumb"]/ol'):
        trails["aria"] = ([path_of_link(page_path, href) for href in crumbs.xpath("./li/a/@href")],
                          [li.text_content() for li in crumbs.xpath("./li")])
    for crumbs in tree.xpath('//*[@itemtype="https://schema.org/BreadcrumbList"]'):
        items = crumbs.xpath(f'./li[@itemtype="{SCHEMA_LIST_ITEM}"]')
        assert [i.xpath('string(./meta[@itemprop="position"]/@content)') for i in items] == \
            [str(n) for n in range(1, len(items) + 1)]
        trails["microdata"] = (
            [path_of_link(page_path, href)
             for href in crumbs.xpath('.//a[@itemprop="item"]/@href')],
            [i.xpath('string(.//*[@itemprop="name"])') for i in items])
    return trails


class TagBalance(HTMLParser):
    """Strict nesting check: every element closed, in order (lxml would repair)."""

    VOID = {"meta", "link", "input", "br", "hr", "img"}

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, (tag, self.open[-5:])
        self.open.pop()


def test_same_config_gives_identical_files(tmp_path):
    config = SynthConfig(pages=300, words=120, seed=7)
    first = generate_corpus(str(tmp_path / "a"), config)
    second = generate_corpus(str(tmp_path / "b"), config)
    assert first == second
    written = files_under(tmp_path / "a")
    assert written == files_under(tmp_path / "b")
    assert written == dict(iter_pages(config))
    assert written != dict(iter_pages(SynthConfig(pages=300, words=120, seed=8)))


def test_counts_and_layout(tmp_path):
    config = SynthConfig(pages=500, sites=3, depth=3, fanout=5, words=50)
    counts = generate_corpus(str(tmp_path), config)
    written = files_under(tmp_path)
    assert counts == {"pages": 500, "bytes": sum(map(len, written.values())), "sites": 3}
    assert len(written) == 500
    assert {path.split("/")[0] for path in written} == {"site-00", "site-01", "site-02"}
    for path in written:
        assert re.fullmatch(r"site-\d\d(/[a-z0-9-]+)*/[a-z0-9-]+\.html", path), path
        assert len(ancestors_of(path)) <= config.depth, path
        assert all(ancestor in written for ancestor in ancestors_of(path)), path
    sizes = sorted(Counter(path.split("/")[0] for path in written).values())
    assert sizes[0] < sizes[-1]  # uneven sites, as in real corpora


def test_small_and_invalid_configs():
    assert [path for path, _ in iter_pages(SynthConfig(pages=2, sites=4))] == \
        ["site-00/index.html", "site-01/index.html"]
    with pytest.raises(ValueError):
        SynthConfig(pages=0)
    with pytest.raises(ValueError):
        SynthConfig(pages=10, base_url="https://synth.example/")


def test_breadcrumb_trails_point_to_ancestors():
    pages = corpus(SynthConfig(pages=1200, words=40))
    families_seen: Counter[str] = Counter()
    without_trail = 0
    for path, data in pages.items():
        tree = lxml.html.fromstring(data)
        title = tree.xpath("string(//h1)")
        trails = trails_of(path, tree)
        if not trails:
            without_trail += 1
            assert ancestors_of(path), "home pages always carry their trail"
        for family, (linked, labels) in trails.items():
            families_seen[family] += 1
            expected = ancestors_of(path) + ([path] if family == "jsonld" else [])
            assert linked == expected, (family, path)
            assert all(page in pages for page in linked)
            assert len(labels) == len(ancestors_of(path)) + 1
            if ancestors_of(path):
                assert labels[-1] == title
    assert set(families_seen) == {"jsonld", "aria", "microdata"}
    assert 0 < without_trail < 0.1 * len(pages)


def test_pages_are_well_formed_documentation_pages():
    config = SynthConfig(pages=300, words=400)
    pages = corpus(config)
    body_words = []
    for path, data in pages.items():
        balance = TagBalance()
        balance.feed(data.decode("utf-8"))
        balance.close()
        assert balance.open == [], path

        tree = lxml.html.fromstring(data)
        assert tree.get("lang") == "en"
        title = tree.xpath("string(//h1)")
        site_name = tree.xpath("string(//header/a[@class='logo'])")
        page_title = tree.findtext(".//title")
        assert page_title == (title if not ancestors_of(path) else f"{title} — {site_name}")
        assert tree.xpath("string(//meta[@name='description']/@content)").strip()
        assert tree.xpath("string(//link[@rel='canonical']/@href)") == f"{BASE}/{path}"
        assert tree.xpath("//header//nav//a") and tree.xpath("//aside") and tree.xpath("//footer")
        main = tree.xpath("//main")[0]
        assert main.xpath(".//h2") and main.xpath(".//p") and main.xpath(".//pre/code")

        toc_links = main.xpath(".//div[@class='toctree-wrapper']//a/@href")
        children = [path_of_link(path, href) for href in toc_links]
        assert bool(children) == is_section(path), path
        assert all(child in pages and ancestors_of(child)[-1] == path for child in children)

        article = main.xpath(".//article")[0]
        for code in article.xpath(".//pre"):
            code.drop_tree()
        body_words.append(len(article.text_content().split()))
    mean_words = sum(body_words) / len(body_words)
    assert 0.75 * config.words < mean_words < 1.5 * config.words


def test_text_has_a_long_tail_vocabulary_and_shared_titles():
    pages = corpus(SynthConfig(pages=1200, words=40))
    terms: Counter[str] = Counter()
    titles_by_site: dict[str, set[str]] = {}
    for path, data in pages.items():
        tree = lxml.html.fromstring(data)
        terms.update(re.findall(r"[a-z]+", tree.xpath("string(//article)").lower()))
        titles_by_site.setdefault(path.split("/")[0], set()).add(tree.xpath("string(//h1)"))
    ranked = [count for _, count in terms.most_common()]
    assert len(ranked) > 1000
    assert sum(ranked[: len(ranked) // 100]) > 0.25 * sum(ranked)  # Zipf-like head
    assert sum(1 for count in ranked if count == 1) > 100  # and a long tail
    shared = Counter(title for titles in titles_by_site.values() for title in titles)
    assert any(count > 1 for count in shared.values())


def test_streaming_memory_does_not_grow_with_pages():
    """Live allocations while streaming 20k pages stay at a few hundred blocks (a
    page's worth), and one page's peak is small. Block counts rather than tracemalloc
    over all 20k pages: tracing would make this test four times slower."""
    gc.collect()
    before = sys.getallocatedblocks()
    growth = []
    for count, _ in enumerate(iter_pages(SynthConfig(pages=20_000, words=10)), 1):
        if count % 1_000 == 0:
            gc.collect()
            growth.append(sys.getallocatedblocks() - before)
    assert count == 20_000
    assert max(growth) < 2_000, growth  # holding one object per page would add 20k

    tracemalloc.start()
    try:
        for _ in iter_pages(SynthConfig(pages=300, words=400)):
            pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024, peak

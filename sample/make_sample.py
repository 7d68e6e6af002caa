"""Rebuild the committed sample corpus from a full build_corpus.sh output.

    python sample/make_sample.py CORPUS_DIR sample/pages

For each chosen product, pages are taken breadth-first from its home page by
following in-product links (so trails and parents connect), skipping pages over
MAX_PAGE_BYTES, until the product's byte budget is spent.
"""
from __future__ import annotations

import os
import posixpath
import shutil
import sys
from collections import deque

import lxml.html

PRODUCTS = {"flask": 1_000_000, "apache-httpd": 1_300_000, "postgresql": 1_300_000, "sphinx": 900_000}
MAX_PAGE_BYTES = 60_000


def links(path: str, rel: str) -> list[str]:
    try:
        doc = lxml.html.fromstring(open(path, "rb").read())
    except (ValueError, lxml.etree.ParserError):
        return []
    out = []
    for href in doc.xpath("//a/@href"):
        href = href.split("#", 1)[0].split("?", 1)[0]
        if not href or "://" in href or href.startswith(("mailto:", "/")):
            continue
        target = posixpath.normpath(posixpath.join(posixpath.dirname(rel), href))
        if target.endswith(".html") and not target.startswith(".."):
            out.append(target)
    return out


def select(product_dir: str, budget: int) -> list[str]:
    chosen, seen, used = [], {"index.html"}, 0
    queue = deque(["index.html"])
    while queue:
        rel = queue.popleft()
        path = os.path.join(product_dir, rel)
        if not os.path.isfile(path):
            continue
        size = os.path.getsize(path)
        if size > MAX_PAGE_BYTES and rel != "index.html":
            continue
        if used + size > budget:
            break
        chosen.append(rel)
        used += size
        for target in links(path, rel):
            if target not in seen:
                seen.add(target)
                queue.append(target)
    return chosen


def main(corpus: str, out: str) -> None:
    for product, budget in PRODUCTS.items():
        dest = os.path.join(out, product)
        shutil.rmtree(dest, ignore_errors=True)
        pages = select(os.path.join(corpus, product), budget)
        for rel in pages:
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copyfile(os.path.join(corpus, product, rel), os.path.join(dest, rel))
        print(f"{product}: {len(pages)} pages")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

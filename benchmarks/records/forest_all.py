"""Parse and place every page of a build_corpus.sh output without Beam, and dump
each page's ancestor chain (the input of the hand check in forest-handcheck.txt).

    python benchmarks/records/forest_all.py CORPUS_DIR OUT.json
"""
import json
import os
import sys
from collections import defaultdict

from ritrag.urls import site_of
from ritrag.schema import PageSkeleton
from ritrag.transforms.forest import build_site_forest
from ritrag.transforms.parse import UnparseablePage, parse_page


def main(corpus: str, out: str) -> None:
    skeletons, sources = defaultdict(list), {}
    for product in sorted(os.listdir(corpus)):
        for directory, _, files in os.walk(os.path.join(corpus, product)):
            for name in files:
                path = os.path.join(directory, name)
                url = "http://localhost/" + os.path.relpath(path, corpus)
                try:
                    page = parse_page(open(path, "rb").read(), url, site_of(url, 1))
                except UnparseablePage:
                    continue
                skeletons[page.site].append(PageSkeleton.of(page))
                sources[page.url] = path
    chains = {site: [{"url": p.url, "kind": p.kind, "depth": p.depth, "title": p.title,
                      "ancestors": list(p.ancestor_titles), "method": p.trail_method, "source": sources.get(p.url)}
                     for p in build_site_forest(site, pages).placements]
              for site, pages in skeletons.items()}
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(chains, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

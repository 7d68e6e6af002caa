"""Main-text quality: ritrag's page text against trafilatura's, and both against
the page's own main container, per product.

    python -m benchmarks.extract --corpus /work/corpus [--per_product 30] [--label after]

A seeded sample of pages per product. For each page: ritrag's text (what
the index stores of the page: its title, and each section's title and text),
trafilatura's (`trafilatura.extract`, tables and
links' text kept, comments off: the field's reference extractor, a
benchmark-only dependency, `pip install -e .[bench]`), and, where the page marks
one, the text of its own main container (the first ``<main>``, else
``[role=main]``, else a lone ``<article>``; scripts and styles dropped).

Scores are token-level: lower-cased word tokens as bags (a token counts as
often as it occurs), precision = shared tokens / the candidate's tokens,
recall = shared tokens / the reference's tokens, micro-averaged over the
pages of a product. ritrag against trafilatura is one pair (trafilatura
against ritrag is the same pair swapped); per product, the tokens each keeps
that the other does not show what differs. Pages where trafilatura agrees with
the marked container clearly better than ritrag (F1 ahead by > 0.2) are listed
with the tokens ritrag kept or missed most, to be turned into fixtures.

To measure an older parser, run this script with PYTHONPATH pointing at an
export of that revision (`git archive REV | tar -x -C DIR`).
"""
from __future__ import annotations

import argparse
import collections
import csv
import os
import random
import re
import sys

import lxml.html

from ritrag.urls import site_of
from ritrag.transforms.parse import UnparseablePage, parse_page

BASE = "http://localhost/"
_TOKEN = re.compile(r"\w+")
_CLEARLY_BETTER = 0.2
_LISTED_TOKENS = 10


def tokens(text: str) -> collections.Counter:
    return collections.Counter(_TOKEN.findall(text.lower()))


def overlap(candidate: collections.Counter, reference: collections.Counter) -> int:
    return sum((candidate & reference).values())


def marked_main_text(data: bytes) -> str | None:
    """The text of the page's own main container, or None where it marks none."""
    try:
        root = lxml.html.fromstring(data)
    except (ValueError, lxml.etree.ParserError):
        return None
    found = root.xpath("//main") or root.xpath("//*[@role='main']")
    if not found:
        articles = root.xpath("//article[not(ancestor::article)]")
        found = articles if len(articles) == 1 else []
    if not found:
        return None
    main = found[0]
    for junk in main.xpath(".//script|.//style|.//noscript|.//template"):
        junk.drop_tree()
    return main.text_content()


def trafilatura_text(data: bytes, url: str) -> str:
    import trafilatura

    return trafilatura.extract(data, url=url, include_comments=False, include_tables=True,
                               favor_precision=False, deduplicate=False) or ""


def sample(corpus: str, per_product: int, seed: int) -> list[tuple[str, str, bytes]]:
    with open(os.path.join(corpus, "manifest.tsv"), encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    by_product = collections.defaultdict(list)
    for row in rows:
        if row["relative_path"].lower().endswith((".html", ".htm")):
            by_product[row["product"]].append(row["relative_path"])
    rnd = random.Random(seed)
    out = []
    for product in sorted(by_product):
        for rel in rnd.sample(sorted(by_product[product]), min(per_product, len(by_product[product]))):
            with open(os.path.join(corpus, product, rel), "rb") as fh:
                out.append((product, f"{BASE}{product}/{rel}", fh.read()))
    return out


class Pair:
    """Micro-averaged precision and recall of a candidate against a reference."""

    def __init__(self) -> None:
        self.shared = self.candidate = self.reference = 0

    def add(self, candidate: collections.Counter, reference: collections.Counter) -> None:
        self.shared += overlap(candidate, reference)
        self.candidate += sum(candidate.values())
        self.reference += sum(reference.values())

    def cell(self) -> str:
        p = self.shared / self.candidate if self.candidate else 0.0
        r = self.shared / self.reference if self.reference else 0.0
        return f"{p:.2f} / {r:.2f}"


def f1(candidate: collections.Counter, reference: collections.Counter) -> float:
    shared = overlap(candidate, reference)
    total = sum(candidate.values()) + sum(reference.values())
    return 2 * shared / total if total else 1.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="/work/corpus")
    parser.add_argument("--per_product", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--label", default="", help="names the parser measured in the output")
    parser.add_argument("--examples", type=int, default=12)
    args = parser.parse_args(argv)

    pages = sample(args.corpus, args.per_product, args.seed)
    table: dict[str, dict] = collections.defaultdict(lambda: {
        "pages": 0, "marked": 0, "ours_vs_traf": Pair(), "ours_vs_main": Pair(), "traf_vs_main": Pair(),
        "ours_only": collections.Counter(), "traf_only": collections.Counter()})
    worse = []
    for product, url, data in pages:
        try:
            page = parse_page(data, url, site_of(url, 1))
            ours_text = "\n".join(f"{s.title}\n{s.text}" for s in page.sections)  # section 0: the page
        except UnparseablePage:
            ours_text = ""
        ours, traf = tokens(ours_text), tokens(trafilatura_text(data, url))
        row = table[product]
        row["pages"] += 1
        row["ours_vs_traf"].add(ours, traf)
        row["ours_only"] += ours - traf
        row["traf_only"] += traf - ours
        main_text = marked_main_text(data)
        if main_text is None:
            continue
        marked = tokens(main_text)
        row["marked"] += 1
        row["ours_vs_main"].add(ours, marked)
        row["traf_vs_main"].add(traf, marked)
        gap = f1(traf, marked) - f1(ours, marked)
        if gap > _CLEARLY_BETTER:
            kept = [t for t, _ in (ours - marked).most_common(6)]
            missed = [t for t, _ in (marked - ours).most_common(6)]
            worse.append((gap, url, kept, missed))

    lines = [f"Parser: {args.label or 'working tree'}. Command: `python -m benchmarks.extract "
             f"{' '.join(argv if argv is not None else sys.argv[1:])}`. {len(pages)} pages, "
             f"{args.per_product} per product (seed {args.seed}). Cells are token precision / recall "
             f"(micro-averaged); \"main\" is the page's own `<main>` / `[role=main]` / lone `<article>`.",
             "",
             "| product | pages | ritrag vs trafilatura | pages marking a main | ritrag vs main | trafilatura vs main |",
             "|---|---|---|---|---|---|"]
    for product, row in sorted(table.items()):
        marked = row["marked"]
        lines.append(f"| {product} | {row['pages']} | {row['ours_vs_traf'].cell()} | {marked} | "
                     f"{row['ours_vs_main'].cell() if marked else '-'} | "
                     f"{row['traf_vs_main'].cell() if marked else '-'} |")
    total = {key: Pair() for key in ("ours_vs_traf", "ours_vs_main", "traf_vs_main")}
    for row in table.values():
        for key, pair in total.items():
            for field in ("shared", "candidate", "reference"):
                setattr(pair, field, getattr(pair, field) + getattr(row[key], field))
    lines.append(f"| all | {len(pages)} | {total['ours_vs_traf'].cell()} | "
                 f"{sum(r['marked'] for r in table.values())} | {total['ours_vs_main'].cell()} | "
                 f"{total['traf_vs_main'].cell()} |")
    lines += ["", "Tokens one extractor keeps and the other does not, most frequent first (all pages):", "",
              "| product | ritrag only | trafilatura only |", "|---|---|---|"]
    for product, row in sorted(table.items()):
        lines.append(f"| {product} | {' '.join(t for t, _ in row['ours_only'].most_common(_LISTED_TOKENS))} | "
                     f"{' '.join(t for t, _ in row['traf_only'].most_common(_LISTED_TOKENS))} |")
    lines.append("")
    lines.append(f"Pages where trafilatura matches the marked main better than ritrag (F1 gap > {_CLEARLY_BETTER}): "
                 f"{len(worse)}.")
    for gap, url, kept, missed in sorted(worse, reverse=True)[:args.examples]:
        lines.append(f"- {url.removeprefix(BASE)}: gap {gap:.2f}; ritrag kept {' '.join(kept) or '-'}; "
                     f"missed {' '.join(missed) or '-'}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

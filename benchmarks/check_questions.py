"""Mechanical check of a question file against the corpus it was written for.

    python -m benchmarks.check_questions benchmarks/questions/dev.jsonl --corpus /work/corpus
        [--site_depth 1] [--format_only]

The file format is documented in benchmarks/questions/README.md. Two kinds of
check, both reported per question id:

- format (no corpus needed): required fields and types, unique ids, the tag
  vocabulary (one `product:`, one `half:`), 1-3 evidence strings of 5-20 words,
  halves balanced within each product, every look-alike's `twin` present and
  itself a look-alike;
- evidence (needs the corpus): every gold suffix is a file of the corpus; every
  evidence string occurs, after whitespace normalization, in the main text of a
  gold page as ritrag's parser extracts it (the text the index stores and Read
  returns), and every gold page holds at least one of them; the `deep` tag
  agrees with the gold pages' depth (see `page_depth`).

Prints a summary (questions per product, tag counts) and exits non-zero when
any check fails.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from dataclasses import dataclass
from typing import Iterable

from ritrag.urls import site_of
from ritrag.transforms.parse import UnparseablePage, parse_page

BASE = "http://localhost/"  # what the build gives pages when run without --base_url
REQUIRED = {"id": str, "question": str, "gold": list, "evidence": list, "tags": list}
OPTIONAL = {"answer": str, "twin": str}
PLAIN_TAGS = {"lookalike", "deep"}
HALVES = ("half:a", "half:b")
EVIDENCE_WORDS = (5, 20)
EVIDENCE_COUNT = (1, 3)
DEEP_DEPTH = 3


@dataclass(frozen=True)
class Problem:
    qid: str  # question id, or "line N" when the line has none
    message: str

    def __str__(self) -> str:
        return f"{self.qid}: {self.message}"


def normalize(text: str) -> str:
    return " ".join(text.split())


def load_questions(path: str) -> tuple[list[dict], list[Problem]]:
    """The questions of a JSONL file, and a problem per line that is not a JSON object."""
    questions, problems = [], []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(Problem(f"line {number}", f"not JSON: {exc}"))
                continue
            if not isinstance(record, dict):
                problems.append(Problem(f"line {number}", "not a JSON object"))
                continue
            questions.append(record)
    if not questions and not problems:
        problems.append(Problem(path, "no questions"))
    return questions, problems


def product_of(question: dict) -> str | None:
    products = [t.split(":", 1)[1] for t in question.get("tags", []) if isinstance(t, str)
                and t.startswith("product:")]
    return products[0] if len(products) == 1 else None


def check_format(questions: list[dict]) -> list[Problem]:
    """Problems of the questions as records, without reading the corpus."""
    problems: list[Problem] = []
    ids = collections.Counter(q.get("id") for q in questions)
    by_id = {q.get("id"): q for q in questions}
    halves: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for number, q in enumerate(questions, 1):
        qid = q.get("id") if isinstance(q.get("id"), str) else f"question {number}"
        bad = [f"{k} missing or not {t.__name__}" for k, t in REQUIRED.items() if not isinstance(q.get(k), t)]
        bad += [f"{k} not {t.__name__}" for k, t in OPTIONAL.items() if k in q and not isinstance(q[k], t)]
        bad += [f"unknown field {k!r}" for k in q if k not in REQUIRED and k not in OPTIONAL]
        problems += [Problem(qid, m) for m in bad]
        if bad:
            continue
        if ids[qid] > 1:
            problems.append(Problem(qid, "duplicate id"))
        if not q["question"].strip():
            problems.append(Problem(qid, "empty question"))
        if not q["gold"] or not all(isinstance(g, str) and g.strip("/") for g in q["gold"]):
            problems.append(Problem(qid, "gold must be a non-empty list of URL suffixes"))
        evidence = q["evidence"]
        if not EVIDENCE_COUNT[0] <= len(evidence) <= EVIDENCE_COUNT[1]:
            problems.append(Problem(qid, f"{len(evidence)} evidence strings, want {EVIDENCE_COUNT}"))
        for e in evidence:
            words = len(e.split()) if isinstance(e, str) else 0
            if not EVIDENCE_WORDS[0] <= words <= EVIDENCE_WORDS[1]:
                problems.append(Problem(qid, f"evidence of {words} words, want {EVIDENCE_WORDS}: {e!r}"))
        tags = q["tags"]
        unknown = [t for t in tags if not (t in PLAIN_TAGS or t in HALVES or
                                           (isinstance(t, str) and t.startswith("product:")))]
        if unknown:
            problems.append(Problem(qid, f"tags outside the vocabulary: {unknown}"))
        product = product_of(q)
        if product is None:
            problems.append(Problem(qid, "want exactly one product:<name> tag"))
        elif not all(g.strip("/").split("/", 1)[0] == product for g in q["gold"] if isinstance(g, str)):
            problems.append(Problem(qid, f"gold outside the product folder {product}/"))
        half = [t for t in tags if t in HALVES]
        if len(half) != 1:
            problems.append(Problem(qid, "want exactly one of half:a, half:b"))
        elif product:
            halves[product][half[0]] += 1
        if len(set(tags)) != len(tags):
            problems.append(Problem(qid, "repeated tag"))
        if "twin" in q:
            twin = by_id.get(q["twin"])
            if "lookalike" not in tags:
                problems.append(Problem(qid, "a twin is given but the question is not tagged lookalike"))
            if twin is None or twin is q or "lookalike" not in twin.get("tags", []):
                problems.append(Problem(qid, f"twin {q['twin']!r} is not another look-alike question"))
        elif "lookalike" in tags:
            problems.append(Problem(qid, "a look-alike question names its twin"))
    for product, count in sorted(halves.items()):
        if abs(count["half:a"] - count["half:b"]) > 1:
            problems.append(Problem(f"product:{product}",
                                    f"halves unbalanced: {count['half:a']} a, {count['half:b']} b"))
    return problems


def page_depth(relative_path: str, trail_length: int, site_depth: int) -> int:
    """Depth of a page below its site root: the larger of its breadcrumb depth
    (trail entries + the page) and its folder depth (path segments below the site)."""
    folder_depth = len([s for s in relative_path.split("/") if s]) - site_depth
    return max(trail_length + 1, folder_depth)


class CorpusPages:
    """Gold pages of a corpus folder, parsed once each, the way the build parses them."""

    def __init__(self, corpus: str, site_depth: int):
        self.corpus = corpus
        self.site_depth = site_depth
        self._parsed: dict[str, tuple[str, int] | str] = {}

    def get(self, suffix: str) -> tuple[str, int] | str:
        """(normalized main text, depth) of the page, or a message saying why there is none."""
        relative = suffix.strip("/")
        if relative not in self._parsed:
            self._parsed[relative] = self._parse(relative)
        return self._parsed[relative]

    def _parse(self, relative: str) -> tuple[str, int] | str:
        path = os.path.join(self.corpus, relative)
        if not os.path.isfile(path):
            return f"gold {relative!r} is not a file of the corpus"
        url = BASE + relative
        with open(path, "rb") as fh:
            data = fh.read()
        try:
            page = parse_page(data, url, site_of(url, self.site_depth))
        except UnparseablePage as exc:
            return f"gold {relative!r} does not parse: {exc.reason}"
        return normalize(page.body), page_depth(relative, len(page.trail), self.site_depth)


def check_evidence(questions: Iterable[dict], pages: CorpusPages) -> list[Problem]:
    """Problems of gold pages and evidence strings against the corpus."""
    problems: list[Problem] = []
    for q in questions:
        qid = q["id"]
        found = {g: pages.get(g) for g in q["gold"]}
        missing = [v for v in found.values() if isinstance(v, str)]
        problems += [Problem(qid, m) for m in missing]
        texts = {g: v for g, v in found.items() if not isinstance(v, str)}
        if missing or not texts:
            continue
        absent = [e for e in q["evidence"] if not any(normalize(e) in text for text, _ in texts.values())]
        problems += [Problem(qid, f"evidence not in any gold page: {e!r}") for e in absent]
        if not absent:  # every string is somewhere: is every gold page justified by one?
            for g, (text, _) in texts.items():
                if not any(normalize(e) in text for e in q["evidence"]):
                    problems.append(Problem(qid, f"gold {g!r} holds none of the evidence strings"))
        deep = min(depth for _, depth in texts.values()) >= DEEP_DEPTH
        if deep != ("deep" in q["tags"]):
            depths = {g: d for g, (_, d) in texts.items()}
            problems.append(Problem(qid, f"deep tag {'missing' if deep else 'wrong'}: gold depths {depths}"))
    return problems


def summary(questions: list[dict]) -> str:
    per_product = collections.Counter(product_of(q) for q in questions)
    tags = collections.Counter(t for q in questions for t in q.get("tags", [])
                               if isinstance(t, str) and not t.startswith("product:"))
    lines = [f"{len(questions)} questions"]
    for product, n in sorted(per_product.items(), key=lambda kv: str(kv[0])):
        sub = [q for q in questions if product_of(q) == product]
        extra = collections.Counter(t for q in sub for t in q.get("tags", []) if t in PLAIN_TAGS | set(HALVES))
        lines.append(f"  {str(product):18} {n:4}  " + "  ".join(f"{t} {extra[t]}" for t in
                                                           ("lookalike", "deep", *HALVES)))
    lines.append("tags: " + ", ".join(f"{t} {n}" for t, n in sorted(tags.items())))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("questions", help="JSONL question file")
    parser.add_argument("--corpus", help="folder the gold suffixes are relative to")
    parser.add_argument("--site_depth", type=int, default=1,
                        help="the build's --site_depth (the depth of the `deep` tag is counted below it)")
    parser.add_argument("--format_only", action="store_true", help="skip the checks that read the corpus")
    args = parser.parse_args(argv)
    if not args.format_only and not args.corpus:
        parser.error("--corpus is required unless --format_only")

    questions, problems = load_questions(args.questions)
    problems += check_format(questions)
    if not args.format_only:
        well_formed = [q for q in questions if all(isinstance(q.get(k), t) for k, t in REQUIRED.items())
                       and all(isinstance(v, str) for v in q["gold"] + q["evidence"])]
        problems += check_evidence(well_formed, CorpusPages(args.corpus, args.site_depth))
    print(summary(questions))
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    print(f"{len(problems)} problems" if problems else "all checks passed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

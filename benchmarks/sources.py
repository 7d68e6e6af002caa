"""Parse throughput per input kind (HTML, Markdown, reStructuredText, PDF,
Discourse, Stack Exchange, paper JSON), on files already on this machine.

    python -m benchmarks.sources [--max_files_per_kind 300] [--pdf FILE ...] [--repeats 3]

The corpus: `*.md`/`*.markdown` and `*.rst` under /usr/share/doc and the running
Python's site-packages, PDFs under /usr/share/doc plus `--pdf` files, a sample
of the dev corpus's HTML (`--corpus`: $RITRAG_DEV_CORPUS, else ../corpus), and
every file of sample/mixed (the only Discourse, Stack Exchange and paper files
here: a handful, so their rates are rough). Each file's kind is the one the
pages stage sniffs (`sniff_kind`); at most `--max_files_per_kind` per kind,
drawn with a fixed seed. Files are read into memory first; the timed part is
exactly what the pages stage runs per file, `parse_or_dead_letter` (which calls
`PageParser.parse`, so sniffing, the kind's parser, and a dead letter for a file
that fails), on one core, in CPU seconds (time.process_time: the machine is
shared), best of `--repeats` per kind.
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import random
import shlex
import sys
import sysconfig
import time

from benchmarks.results import cpu_description, write_section
from ritrag.index_config import DEFAULT_BASE_URL
from ritrag.schema import DeadLetter
from ritrag.transforms.pages import PageParser, parse_or_dead_letter
from ritrag.transforms.parse import UnparseablePage
from ritrag.transforms.sources import sniff_kind

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = "/usr/share/doc"
DEV_CORPUS = os.path.join(os.path.dirname(ROOT), "corpus")
TEXT_DOCUMENT_PATTERNS = ("**/*.md", "**/*.markdown", "**/*.rst")
MAX_PAGE_BYTES = 20 * 1024 * 1024  # the build's --max_page_bytes default


def _files(root: str, patterns: tuple[str, ...]) -> list[tuple[str, str]]:
    """(input root, path) of the regular files under `root` matching `patterns`."""
    paths = {p for pattern in patterns for p in glob.glob(os.path.join(root, pattern), recursive=True)}
    return [(root, p) for p in sorted(paths) if os.path.isfile(p) and not os.path.islink(p)]


def _html_sample(corpus: str, count: int, seed: int) -> list[tuple[str, str]]:
    manifest = os.path.join(corpus, "manifest.tsv")
    if not os.path.exists(manifest):
        return []
    with open(manifest, encoding="utf-8") as fh:
        header = fh.readline().rstrip("\n").split("\t")
        rows = [dict(zip(header, line.rstrip("\n").split("\t"))) for line in fh]
    paths = sorted(os.path.join(corpus, r["product"], r["relative_path"]) for r in rows)
    return [(corpus, p) for p in random.Random(seed).sample(paths, min(count, len(paths)))]


def assemble(args) -> dict[str, list[tuple[str, str, bytes]]]:
    """kind -> [(input root, path, bytes)], at most `max_files_per_kind` each (seeded)."""
    candidates = [*_files(DOCS, TEXT_DOCUMENT_PATTERNS + ("**/*.pdf",)),
                  *_files(sysconfig.get_paths()["purelib"], TEXT_DOCUMENT_PATTERNS),
                  *((os.path.dirname(p), p) for p in args.pdf),
                  *_html_sample(args.corpus, args.max_files_per_kind, args.seed),
                  *_files(os.path.join(ROOT, "sample", "mixed"), ("**/*.json", "**/*.xml", "**/*.pdf",
                                                                   "**/*.md", "**/*.rst"))]
    by_kind: dict[str, list[tuple[str, str, bytes]]] = collections.defaultdict(list)
    for root, path in candidates:
        with open(path, "rb") as fh:
            data = fh.read()
        try:
            kind = sniff_kind(path, data)
        except UnparseablePage:
            kind = "unknown_kind"
        by_kind[kind].append((root, path, data))
    rnd = random.Random(args.seed)
    return {kind: rnd.sample(files, min(args.max_files_per_kind, len(files)))
            for kind, files in sorted(by_kind.items())}


def parse_all(files: list[tuple[str, str, bytes]]) -> tuple[float, int, collections.Counter]:
    """(CPU seconds in parse_or_dead_letter, pages produced, dead letters by reason)."""
    parsers: dict[str, PageParser] = {}
    cpu, pages, dead = 0.0, 0, collections.Counter()
    for root, path, data in files:
        parser = parsers.setdefault(root, PageParser(root.rstrip("/") + "/", DEFAULT_BASE_URL, 1, MAX_PAGE_BYTES))
        start = time.process_time()
        result = parse_or_dead_letter(parser, path, lambda: data, "parse")
        cpu += time.process_time() - start
        if isinstance(result, DeadLetter):
            dead[result.reason] += 1
        else:
            pages += len(result)
    return cpu, pages, dead


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max_files_per_kind", type=int, default=300)
    parser.add_argument("--pdf", nargs="*", default=[], help="more PDF files to include")
    parser.add_argument("--corpus", default=os.environ.get("RITRAG_DEV_CORPUS", DEV_CORPUS),
                        help="a corpus folder with manifest.tsv, for the HTML sample")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--note", default="", help="what else ran on the machine meanwhile, for RESULTS.md")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    corpus = assemble(args)
    rows = []
    for kind, files in corpus.items():
        runs = [parse_all(files) for _ in range(args.repeats)]
        cpu = min(run[0] for run in runs)
        _, pages, dead = runs[0]
        megabytes = sum(len(data) for _, _, data in files) / 1e6
        reasons = ", ".join(f"{reason} {n}" for reason, n in dead.most_common()) or "none"
        rows.append(f"| {kind} | {len(files)} | {megabytes:.3f} | {cpu:.3f} | {len(files) / cpu:,.1f} | "
                    f"{megabytes / cpu:.2f} | {pages} | {reasons} |")
        print(rows[-1], flush=True)
    load_after = os.getloadavg()
    niceness = os.nice(0)
    command = shlex.join([*(["nice", "-n", str(niceness)] if niceness else []), "python", "-m", "benchmarks.sources",
                          *(argv if argv is not None else sys.argv[1:])])
    body = f"""## Parse throughput per input kind (benchmarks/sources.py)

Machine: {cpu_description()}. Command (niceness {niceness}):

```
{command}
```

{args.note}
Load average (1/5/15 min) before {'/'.join(f'{x:.2f}' for x in load_before)}, after
{'/'.join(f'{x:.2f}' for x in load_after)}. Files already on the machine: Markdown and reStructuredText from
{DOCS} and site-packages, PDFs from {DOCS} and `--pdf`, HTML sampled from the dev corpus, Discourse / Stack
Exchange / paper JSON from sample/mixed only (one file or two each: rough figures). Kind as sniffed; at most
{args.max_files_per_kind} files per kind (seed {args.seed}). Timed: `parse_or_dead_letter` (the pages stage's
per-file call: sniff, parse, dead letter) on one core, CPU seconds, best of {args.repeats}; reading excluded.

| kind | files | MB | CPU s | files/s per core | MB/s per core | pages | dead letters by reason |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}
"""
    print(body)
    write_section("benchmarks/sources.py", "parse throughput per kind", body)


if __name__ == "__main__":
    main()

"""What a GetToC answer costs the agent, in o200k_base tokens, per form.

    python -m benchmarks.toc_tokens INDEX [--questions benchmarks/questions/dev.jsonl] [--titles 200]
                                          [--n 50] [--label NAME]

For each query (the questions of a question file, and/or `--titles` node
titles drawn with a fixed seed) it runs GetToC once and counts the tokens of
the same sub-forest written as:

* pretty JSON: `json.dumps(trees, indent=2)`;
* compact JSON: `ritrag.serving.outline.toc_json_text(trees)`, what the server sends;
* the outline before handles (`outline_before`, the form served until this
  change: two-space indent, `[id]` after the title, ` *rank` after it);
* the outline with node ids (an answer outside an episode);
* the outline with handles (an answer within an episode: what an agent reads);

each of the whole sub-forest as served (with scores, and summaries and
keywords where the index has them), and compact JSON and the outline with
handles once more of the sub-forest cut to ids, titles, hit flags, tree
shape and order (no scores, summaries or keywords): the same information in
both forms, the outline's hit ranks standing for the order of the scores.

Medians and totals over the queries, and the ratio handles / compact JSON
(per query, then its median; and of the totals). The sizes depend on the
shape of the sub-forest (its nodes, titles and depth), not on how the
chunks were embedded, so an index built with the hashing stand-in is a fair
testbed. The section "toc tokens: NAME" of benchmarks/RESULTS.md is replaced.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

from benchmarks.results import write_section
from benchmarks.serving import sample_queries
from ritrag.serving.api import RitragIndex, one_thread_per_query
from ritrag.serving.outline import PARENT_MARK, count_tokens, hit_ranks, preorder, render_outline, toc_json_text


def outline_before(trees: list[dict[str, Any]]) -> str:
    """The outline as served before handles, for comparison only."""
    ranks = hit_ranks(trees)
    lines = []
    for node, depth in preorder(trees):
        line = f"{'  ' * depth}{' '.join(node['title'].split())} [{node['id']}]"
        if node["id"] in ranks:
            line += f" *{ranks[node['id']]}"
        if node.get("summary"):
            line += f" - {' '.join(node['summary'].split())}"
        if node.get("keywords"):
            line += f" ({', '.join(node['keywords'])})"
        lines.append(line)
    return "\n".join(lines)


def structure_only(trees: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trees with ids, titles, hit flags, shape and order only."""
    return [{key: (structure_only(value) if key == "children" else value) for key, value in tree.items()
             if key in ("id", "title", "hit", "children")} for tree in trees]


def with_handles(trees: list[dict[str, Any]]) -> str:
    return render_outline(trees, handle_letters="a")


FORMS: dict[str, Callable[[list[dict[str, Any]]], str]] = {
    "pretty JSON": lambda trees: json.dumps(trees, ensure_ascii=False, indent=2),
    "compact JSON": toc_json_text,
    "outline before": outline_before,
    "outline, node ids": render_outline,
    "outline, handles": with_handles,
    "ids, titles, hits only: compact JSON": lambda trees: toc_json_text(structure_only(trees)),
    "ids, titles, hits only: outline, handles": lambda trees: with_handles(structure_only(trees)),
}


def question_queries(path: str) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line)["question"] for line in fh if line.strip()]


def measure(index: RitragIndex, queries: list[str], n: int) -> dict[str, Any]:
    tokens: dict[str, list[int]] = {form: [] for form in FORMS}
    lines = trimmed = 0
    started = time.perf_counter()
    for done, query in enumerate(queries, start=1):
        trees = index.get_toc(query, n=n)["trees"]
        for form, render in FORMS.items():
            tokens[form].append(count_tokens(render(trees)))
        outline = render_outline(trees, handle_letters="a").split("\n")
        lines += len(outline)
        trimmed += sum(1 for line in outline if line.split(" ", 1)[1].lstrip().startswith(PARENT_MARK))
        if done % 50 == 0 or done == len(queries):
            rate = done / (time.perf_counter() - started)
            print(f"{done}/{len(queries)} queries, {rate:.1f}/s, ETA {(len(queries) - done) / rate:.0f} s",
                  flush=True)
    ratios = [h / c for h, c in zip(tokens["outline, handles"], tokens["compact JSON"])]
    same = [h / c for h, c in zip(tokens["ids, titles, hits only: outline, handles"],
                                  tokens["ids, titles, hits only: compact JSON"])]
    return {"queries": len(queries), "tokens": tokens, "ratio_median": statistics.median(ratios),
            "ratio_max": max(ratios), "same_median": statistics.median(same), "same_max": max(same),
            "lines": lines, "trimmed": trimmed}


def table(name: str, m: dict[str, Any]) -> str:
    rows = [f"**{name}** ({m['queries']} queries)", "",
            "| form | median tokens | total tokens | total / compact JSON of the same |", "|---|---|---|---|"]
    for form, counts in m["tokens"].items():
        compact = sum(m["tokens"]["ids, titles, hits only: compact JSON" if form.startswith("ids")
                                  else "compact JSON"])
        rows.append(f"| {form} | {statistics.median(counts):.0f} | {sum(counts):,} | {sum(counts) / compact:.3f} |")
    rows += ["", f"Outline with handles / compact JSON, per query: as served, median {m['ratio_median']:.3f}, "
                 f"max {m['ratio_max']:.3f}; ids, titles and hits only, median {m['same_median']:.3f}, "
                 f"max {m['same_max']:.3f}. Lines whose title was trimmed to `{PARENT_MARK}` + the rest: "
                 f"{m['trimmed']:,} of {m['lines']:,}."]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("index")
    p.add_argument("--questions", help="a question file (JSON lines with a `question` field)")
    p.add_argument("--titles", type=int, default=200, help="node titles drawn as queries (0: none)")
    p.add_argument("--n", type=int, default=50, help="nodes kept per GetToC")
    p.add_argument("--label", default="", help="section name in RESULTS.md (default: the index path)")
    args = p.parse_args(argv)
    one_thread_per_query()
    index = RitragIndex(args.index)
    sets = {}
    if args.questions:
        sets[f"questions of {args.questions}"] = question_queries(args.questions)
    if args.titles:
        sets[f"{args.titles} node titles (seed 0)"] = sample_queries(index, args.titles)
    parts = [f"## ToC size per form, o200k_base tokens: {args.label or args.index}", "",
             f"`python -m benchmarks.toc_tokens {args.index}"
             + (f" --questions {args.questions}" if args.questions else "")
             + f" --titles {args.titles} --n {args.n}`, index version {index.version}, GetToC k=200, n={args.n}. "
             "Every form holds the same sub-forest (see the module docstring); the outline with handles is what an "
             "agent reads within an episode. The sizes depend on the sub-forest's shape (nodes, titles, depth), not "
             "on how chunks were embedded, so an index built with the hashing stand-in is a fair testbed."]
    for name, queries in sets.items():
        parts += ["", table(name, measure(index, queries, args.n))]
    body = "\n".join(parts)
    print(body)
    write_section("toc tokens", args.label or args.index, body)


if __name__ == "__main__":
    main()

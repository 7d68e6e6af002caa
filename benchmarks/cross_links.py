"""What GetToC's cross-links cost and reach, per policy, on a question file.

    python -m benchmarks.cross_links --index INDEX --questions benchmarks/questions/dev.jsonl
                                     [--per_hit 1 2 3] [--n 50] [--wider 60 75 100]

For each question: one retrieval (the index's recorded parameters), the
sub-forest of its top n hits, and for each policy -- up to `per_hit` related
nodes per hit (ritrag.serving.links.see_also), those the query scored only
(GetToC's rule) or every link neighbour, the unscored ones ranked by their
in-links -- the outline's o200k_base tokens with those cross-links, how many
it lists, and whether gold the ToC missed is among them. Then the bound,
gold the ToC missed that any out- or in-link of a hit reaches, and the other
way to reach it: a ToC of more hits (`--wider`), without cross-links.
Prints a Markdown table (benchmarks/RESULTS.md, "The link graph").
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

from ritrag.evaluation.eval import GoldResolver, live_rows, load_questions, open_index
from ritrag.serving.api import DEFAULT_N, TOC_FIELDS, one_thread_per_query
from ritrag.serving.links import see_also
from ritrag.serving.outline import count_tokens, preorder, render_outline
from ritrag.serving.retrieval import build_subforest


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--per_hit", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--n", type=int, default=DEFAULT_N)
    ap.add_argument("--wider", type=int, nargs="*", default=[60, 75, 100], help="hits of the wider ToCs")
    args = ap.parse_args(argv)
    one_thread_per_query()
    index = open_index(args.index)
    idx = index.loaded
    resolver = GoldResolver(index, live_rows(index))
    policies = [(per_hit, unscored) for unscored in (False, True) for per_hit in args.per_hit]
    tokens: dict = {p: [] for p in policies}
    listed: dict = {p: [] for p in policies}
    reached = dict.fromkeys(policies, 0)
    plain, missed, linked = [], 0, 0
    wider: dict = {n: [] for n in args.wider}
    wider_found = dict.fromkeys(args.wider, 0)
    for q in load_questions(args.questions):
        targets = [rows for rows in map(resolver.resolve, q.gold) if rows]
        if not targets:
            continue
        gold = frozenset().union(*targets)
        retrieval = index.retrieve(q.question, n=max([args.n, *args.wider]))
        for n in args.wider:  # the hits are best first: a smaller n's are a prefix
            more = retrieval.hits[:n]
            wider[n].append(count_tokens(render_outline(build_subforest(more, idx.skeleton, TOC_FIELDS))))
            rows = np.array([row for row, _ in more], np.int64)
            wider_found[n] += not gold.isdisjoint(np.union1d(rows, idx.skeleton.ancestors(rows)).tolist())
        trees = build_subforest(retrieval.hits[:args.n], idx.skeleton, TOC_FIELDS)
        plain.append(count_tokens(render_outline(trees)))
        hits = [row for row, _ in retrieval.hits[:args.n]]
        shown = np.union1d(hits, idx.skeleton.ancestors(np.array(hits, np.int64)))
        toc_missed = not gold & set(shown.tolist())
        if toc_missed:
            missed += 1
            linked += bool(gold & {int(r) for hit in hits for r in idx.links.neighbours(hit)})
        entries = {node["id"]: node for node, _ in preorder(trees)}
        for policy in policies:
            related = see_also(hits, shown, idx.links, idx.skeleton, retrieval.scores, *policy)
            for node in entries.values():
                node.pop("see_also", None)
            for row, rows in related.items():
                entries[idx.nodes["node_id"][row]]["see_also"] = [
                    {"id": idx.nodes["node_id"][r], "title": idx.nodes["title"][r]} for r in rows]
            rows = {r for rows in related.values() for r in rows}
            tokens[policy].append(count_tokens(render_outline(trees)))
            listed[policy].append(len(rows))
            reached[policy] += toc_missed and bool(gold & rows)
    print(f"{len(plain)} questions; the ToC misses the gold of {missed}; outline tokens without cross-links: "
          f"mean {statistics.mean(plain):,.0f}\n")
    print("| cross-links | per ToC | outline tokens (mean) | vs none | missed gold among them |")
    print("|---|---|---|---|---|")
    for (per_hit, unscored), values in tokens.items():
        which = "every neighbour" if unscored else "scored by the query"
        print(f"| {per_hit} per hit, {which} | {statistics.mean(listed[per_hit, unscored]):.1f} | "
              f"{statistics.mean(values):,.0f} | +{statistics.mean(values) / statistics.mean(plain) - 1:.0%} | "
              f"{reached[per_hit, unscored]} of {missed} |")
    print(f"| (bound: any out- or in-link of a hit) | | | | {linked} of {missed} |")
    for n, values in wider.items():
        print(f"| none, n = {n} hits | - | {statistics.mean(values):,.0f} | "
              f"+{statistics.mean(values) / statistics.mean(plain) - 1:.0%} | "
              f"{wider_found[n] - (len(plain) - missed)} of {missed} |")


if __name__ == "__main__":
    main()

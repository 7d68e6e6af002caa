"""Sweep of GetToC's query-time retrieval parameters with `ritrag eval`.

    python benchmarks/retrieval_sweep.py --index INDEX --questions Q.jsonl --out OUT.json
        [--tune_tag half:a] [--gold_under DIR]

Every setting is one `ritrag.evaluation.eval.evaluate` run (EvalConfig.retrieval and k,
n); the score is the sub-forest's (GetToC's node ranking) MRR, then hit@1, on
the questions tagged `--tune_tag` only. Parameters are swept one at a time,
each starting from the best setting so far (coordinate ascent), in the order
of SWEEP; the chosen setting is then reported on every tag, the held-back
half included, beside the index's recorded defaults and the paper's rule
(node_score "max"); `--settings` evaluates given settings instead. `--gold_under
DIR` keeps the questions whose gold names a file under DIR (a subset corpus);
the others would be unresolvable anyway.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ritrag.evaluation.eval import EvalConfig, evaluate, load_questions, open_index  # noqa: E402

# (parameter, values) in sweep order; k and n are EvalConfig's, the rest RetrievalParams'.
SWEEP = (
    ("node_score", ["max", "max+doc"]),
    ("fusion", ["minmax", "rrf"]),
    ("rrf_k", [10, 30, 60, 120]),
    ("dense_weight", [0.5, 1.0, 1.5, 2.0]),
    ("path_weight", [0.0, 0.5, 1.0, 2.0]),
    ("node_doc_weight", [0.5, 1.0, 2.0]),
    ("k", [100, 200, 400]),
    ("n", [20, 50, 100]),
)
TAGS = ("lookalike", "half:a", "half:b")


def figures(report: dict) -> dict:
    """GetToC's (subforest) MRR and hit@1, and those of its BM25 and dense sides alone."""
    def pick(block: dict) -> dict:
        s = block.get("subforest", {})
        out = {"scored": block.get("scored"), "mrr": s.get("mrr"), "hit@1": s.get("hit@1")}
        for side in ("bm25", "dense"):
            out[side] = {m: block.get(side, {}).get(m) for m in ("mrr", "hit@1")}
        return out

    return {"overall": pick(report["overall"]), **{t: pick(report["by_tag"].get(t, {})) for t in TAGS}}


def run_setting(index, questions, setting: dict) -> dict:
    retrieval = {k: v for k, v in setting.items() if k not in ("k", "n")}
    config = EvalConfig(k=setting.get("k", 200), n=setting.get("n", 50), retrieval=retrieval)
    return figures(evaluate(index, questions, config))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tune_tag", default="half:a")
    ap.add_argument("--gold_under", default=None)
    ap.add_argument("--settings", default=None,
                    help='JSON list of settings to evaluate instead of sweeping, e.g. \'[{"dense_weight": 0}]\'')
    args = ap.parse_args(argv)
    index = open_index(args.index)
    questions = load_questions(args.questions)
    if args.gold_under:
        questions = [q for q in questions if any(os.path.isfile(os.path.join(args.gold_under, g)) for g in q.gold)]
    has_docs = "doc" in index.loaded.bm25.fields
    index.embed_query("warm up")
    started = time.time()
    rows = []

    def score(setting: dict) -> tuple:
        result = run_setting(index, questions, setting)
        rows.append({"setting": dict(setting), **result})
        tuned = result[args.tune_tag]
        print(json.dumps(rows[-1]), flush=True)
        return (tuned["mrr"] or 0.0, tuned["hit@1"] or 0.0)

    if args.settings:
        for setting in json.loads(args.settings):
            score(setting)
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"index": args.index, "questions": len(questions), "runs": rows}, fh, indent=1)
        return {"runs": rows}
    best: dict = {}
    best_score = score(best)  # the index's recorded defaults
    for name, values in SWEEP:
        if not has_docs and name in ("node_score", "path_weight", "node_doc_weight"):
            continue
        if name == "node_doc_weight" and best.get("node_score", index.params.node_score) != "max+doc":
            continue
        if name == "rrf_k" and best.get("fusion", index.params.fusion) != "rrf":
            continue
        for value in values:
            candidate = {**best, name: value}
            if candidate == best:
                continue
            s = score(candidate)
            if s > best_score:
                best, best_score = candidate, s
    report = {"index": args.index, "questions": len(questions), "tune_tag": args.tune_tag,
              "recorded": index.params.__dict__, "chosen": best, "chosen_figures": run_setting(index, questions, best),
              "paper_rule": (run_setting(index, questions, {**best, "node_score": "max"}) if has_docs else None),
              "seconds": round(time.time() - started, 1), "runs": rows}
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    print(json.dumps({k: report[k] for k in ("chosen", "chosen_figures", "paper_rule")}, indent=1))
    return report


if __name__ == "__main__":
    main()

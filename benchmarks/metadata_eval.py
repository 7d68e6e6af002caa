"""The metadata step measured end to end (issue #41 item 5) with the only
endpoint this machine can reach: a local, deterministic STAND-IN that speaks
the OpenAI chat-completions protocol and is NOT a language model.

    HF_HUB_OFFLINE=1 python -m benchmarks.metadata_eval --work DIR \
        [--input sample/pages] [--questions sample/questions.jsonl] [--label NAME] \
        [--endpoint URL --model NAME]

(`--endpoint`: a real OpenAI-compatible endpoint asked instead of the stand-in,
for the same figures with a model.)

Three builds of the same input (`--site_depth 1`, the default embedding model):

* `plain`: no metadata;
* `meta`: `--metadata_endpoint` the stand-in, so every node that holds text is
  asked for by the real stage (batches, requests in flight, cache, accounting);
* `toc_only`: as `meta` from its cache (no request repeated) with
  `--metadata_retrieval off`: the metadata is in the nodes table and the ToC
  only, so the ToC's effect is told apart from the ranking's (docs/METADATA.md).

Then `ritrag eval plain QUESTIONS --compare meta` and `... --compare toc_only`
set ranking, evidence recall and ToC tokens side by side, and the manifests'
accounting gives the tokens in and out per 1,000 described nodes.

The stand-in answers a node's question extractively: its summary is the node's
first sentences (at most STAND_IN_SUMMARY_WORDS words), its keywords the
node's most frequent content words, those of its title first. It counts its
`usage` in o200k_base (serving.outline.TOKENIZER), the prompt's messages and
its own answer, as an endpoint reports its tokenizer's count. So the figures
measure the plumbing and the prompt's cost, and what text of this shape in the
summary and keywords fields does to ranking and ToC size; they say nothing of
what a model's summaries would do. A ToC question (`--induce_toc llm`, not
asked here: the input has no long PDF without an outline) gets no headings.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import shlex
import shutil
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from benchmarks.results import cpu_description, write_section
from ritrag import cli
from ritrag.layout import IndexLayout
from ritrag.pipelines import build
from ritrag.serving.outline import TOKENIZER, count_tokens
from ritrag.transforms.metadata.base import MAX_KEYWORDS, PROMPT_VERSION
from ritrag.transforms.metadata.toc import TOC_SYSTEM_PROMPT

STAND_IN_MODEL = "extractive-stand-in-NOT-an-LLM"
STAND_IN_SUMMARY_WORDS = 40
STOPWORDS = frozenset("""a an and are as at be by can for from has have how if in into is it its may more must not of
on or that the their then there these this to use used using was what when which will with you your""".split())
SYSTEMS = ("subforest", "bm25", "dense", "chunks")
METRICS = ("hit@1", "mrr", "ndcg@10", "evidence_recall", "toc_tokens_json", "toc_tokens_outline")


def extractive_answer(user_message: str) -> dict:
    """The stand-in's metadata of one node (module docstring): no model, only
    the node's own words."""
    path, _, body = user_message.partition("\n\nText:\n")
    title = path.removeprefix("Title path: ").split(" > ")[-1]
    summary: list[str] = []
    for sentence in re.split(r"(?<=[.!?])\s+", " ".join(body.split())):
        words = sentence.split()
        if summary and len(summary) + len(words) > STAND_IN_SUMMARY_WORDS:
            break
        summary += words[:STAND_IN_SUMMARY_WORDS - len(summary)]
        if len(summary) >= STAND_IN_SUMMARY_WORDS:
            break
    words = [w for w in re.findall(r"[a-z][a-z0-9_-]{2,}", body.lower()) if w not in STOPWORDS]
    in_title = set(re.findall(r"[a-z][a-z0-9_-]{2,}", title.lower()))
    counts = collections.Counter(words)
    first = {w: i for i, w in reversed(list(enumerate(words)))}
    ranked = sorted(counts, key=lambda w: (w not in in_title, -counts[w], first[w]))
    return {"summary": " ".join(summary) or title or "untitled", "keywords": ranked[:MAX_KEYWORDS]}


class StandInEndpoint:
    """A threaded chat-completions server on 127.0.0.1 answering as the stand-in."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                messages = body["messages"]
                if messages[0]["content"] == TOC_SYSTEM_PROMPT:
                    content = json.dumps({"headings": []})
                else:
                    content = json.dumps(extractive_answer(messages[-1]["content"]))
                data = json.dumps({
                    "id": "stand-in", "object": "chat.completion", "model": body["model"],
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": sum(count_tokens(m["content"]) for m in messages),
                              "completion_tokens": count_tokens(content)}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "StandInEndpoint":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def timed_build(argv: list[str]) -> float:
    started = time.perf_counter()
    build.run(argv)
    return time.perf_counter() - started


def evaluate(base: str, other: str, questions: str, out: str) -> tuple[list[str], dict, float]:
    """`ritrag eval base questions --compare other --out out`: (its command, its report, seconds)."""
    argv = ["eval", base, questions, "--compare", other, "--out", out]
    started = time.perf_counter()
    if cli.main(argv) != 0:
        raise SystemExit(f"ritrag {shlex.join(argv)} failed")
    with open(os.path.join(out, "eval.json"), encoding="utf-8") as fh:
        return argv, json.load(fh), time.perf_counter() - started


def cell(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if metric.startswith("toc_tokens") else f"{value:.3f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, help="folder of the three indexes and the eval reports")
    parser.add_argument("--input", default="sample/pages")
    parser.add_argument("--questions", default="sample/questions.jsonl")
    parser.add_argument("--label", default="the bundled sample (296 pages)")
    parser.add_argument("--endpoint", help="an OpenAI-compatible endpoint to ask instead of the stand-in")
    parser.add_argument("--model", help="the model --endpoint serves")
    args = parser.parse_args(argv)
    if (args.endpoint is None) != (args.model is None):
        parser.error("--endpoint and --model go together")
    plain, meta, toc_only, cache = (os.path.join(args.work, name)
                                    for name in ("plain", "meta", "toc_only", "metadata_cache"))
    for path in (plain, meta, toc_only, cache):
        shutil.rmtree(path, ignore_errors=True)
    load_before = os.getloadavg()
    common = ["--input", args.input, "--site_depth", "1"]
    seconds = {"plain": timed_build([*common, "--out", plain])}
    with contextlib.ExitStack() as stack:
        url, model = args.endpoint, args.model
        if url is None:
            url, model = stack.enter_context(StandInEndpoint()).url, STAND_IN_MODEL
        asking = ["--metadata_endpoint", url, "--metadata_model", model, "--metadata_cache", cache]
        seconds["meta"] = timed_build([*common, "--out", meta, *asking])
        seconds["toc_only"] = timed_build([*common, "--out", toc_only, *asking, "--metadata_retrieval", "off"])
    evals = {name: evaluate(plain, index, args.questions, os.path.join(args.work, f"eval-{name}"))
             for name, index in (("meta", meta), ("toc_only", toc_only))}
    load_after = os.getloadavg()

    counts = {name: IndexLayout(index).load_manifest().stats["pages"] for name, index in
              (("plain", plain), ("meta", meta), ("toc_only", toc_only))}
    dtypes = sorted({name.removeprefix("chunks_embedded_") for stats in counts.values() for name in stats
                     if name.startswith("chunks_embedded_")})
    spent = counts["meta"]
    described = spent["metadata_nodes"]
    rows = []
    for system in SYSTEMS:
        for metric in METRICS:
            side_by_side = [evals[name][1]["comparison"]["overall"].get(system, {}).get(metric)
                            for name in ("toc_only", "meta")]
            if any(values is None for values in side_by_side):
                continue
            values = [side_by_side[1]["base"], *(values["other"] for values in side_by_side)]
            rows.append(f"| {system} | {metric} | " + " | ".join(cell(v, metric) for v in values) + " |")
    commands = "; ".join(f"`ritrag {shlex.join(evals[name][0])}` ({evals[name][2]:.0f} s)" for name in evals)
    if args.endpoint is None:
        title = "with a stand-in endpoint that is NOT an LLM"
        endpoint = f"""**The endpoint is a stand-in, not a model**: `{STAND_IN_MODEL}` answers every node's question
(prompt `{PROMPT_VERSION}`) with the node's first sentences (<= {STAND_IN_SUMMARY_WORDS} words) and its most
frequent content words, its title's first, and reports `usage` counted in {TOKENIZER}. These figures measure
the stage's plumbing and the prompt's cost, and what such extractive text does in the summary and keywords
fields; they are no measure of a model's summaries."""
    else:
        title = f"with `{model}`"
        endpoint = f"Endpoint: `{model}` at {url} (prompt `{PROMPT_VERSION}`); tokens as it reports them."
    body = f"""## Model metadata end to end, {title} (benchmarks/metadata_eval.py): {args.label}

Machine: {cpu_description()}; embedding with the bundled default model (`HF_HUB_OFFLINE=1`) in
{', '.join(dtypes)} (the manifests' chunks_embedded_<dtype>). Load average before / after: {load_before[0]:.1f} / {load_after[0]:.1f} (1 min).
Command: `python -m benchmarks.metadata_eval {shlex.join(argv or sys.argv[1:])}`; then {commands}.

{endpoint}

Builds (`--site_depth 1`, page granularity): plain {seconds['plain']:.0f} s; meta {seconds['meta']:.0f} s
({spent['metadata_requests']:,} requests); toc_only {seconds['toc_only']:.0f} s from meta's cache.

Accounting of `meta` (its manifest's stats.pages): {described:,} nodes that hold text, {spent['metadata_enriched']:,}
enriched, {spent['metadata_failed']:,} failed, {spent['metadata_not_asked']:,} not asked;
{spent['metadata_requests']:,} requests; tokens in {spent['metadata_tokens_in']:,}, out {spent['metadata_tokens_out']:,}:
**per 1,000 nodes {1000 * spent['metadata_tokens_in'] / max(described, 1):,.0f} in, {1000 * spent['metadata_tokens_out'] / max(described, 1):,.0f} out**
(a model's answers are bounded by `--metadata_max_answer_tokens`, 256 tokens each).
toc_only: {counts['toc_only'].get('metadata_cache_hits', 0):,} cache hits, {counts['toc_only'].get('metadata_requests', 0):,} requests.

Overall, {evals['meta'][1]['overall']['scored']} questions
(toc_tokens: mean tokens of the ToC an agent is shown, json and outline; `-`: not measured for that system):

| system | metric | plain | toc_only (ToC only) | meta (ToC and ranking) |
|---|---|---|---|---|
""" + "\n".join(rows) + "\n"
    print(body)
    write_section("benchmarks/metadata_eval.py", args.label, body)


if __name__ == "__main__":
    main()

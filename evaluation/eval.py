"""Evaluation of an index against a question file: the sub-forest and the
method's baselines over the same index and the same retriever.

    from ritrag.serving.api import RitragIndex
    from ritrag.evaluation.eval import EvalConfig, evaluate, load_questions
    report = evaluate(RitragIndex("index"), load_questions("questions.jsonl"), EvalConfig())

`ritrag eval INDEX QUESTIONS` is this, one-to-one (the rendering is in
`ritrag.evaluation.report`). Per question, one query embedding feeds every system:

- `subforest`: GetToC's hits (top-n nodes by fused score) and the ToC around
  them, read by a deterministic reader: GetToC once, then Read the best hit
  nodes in score order, `ids_per_read` nodes per Read, until `max_calls` tool
  calls (the GetToC included) are spent;
- `bm25`, `dense`: the same node ranking from one retriever alone, read by
  the same reader under the same budget;
- `chunks`: plain RAG, the fused chunk ranking itself; the top `chunks`
  chunks are what the model would read;
- `tree`: PageIndex-style, the whole tree (site) holding the top hit: its
  full table of contents, and whether the gold is in it at all;
- cross-links (measured on the sub-forest): the ToC's tokens without and with
  each hit's `see_also` (ritrag.serving.links), and whether gold the ToC
  missed is one hop away: among the cross-links shown, or among any node its
  hits link to or are linked from;
- `agent` (optional): `ritrag.evaluation.agent.run_agent` with a real model.

Gold: each entry of a question's `gold` is a target, resolved to the live
nodes it names: a node id (that node and its sections), a URL, or a
suffix matching the end of a node's URL, or of the input file its page was
read from (the pages table's `source`), at a path boundary (both compared
after `ritrag.urls.normalize_url`, scheme and fragment ignored, so a gold page
matches every section node of that page). An entry that names no node is
reported as unresolvable, never scored as a miss; a question none of whose
entries resolve is left out of every scored metric and listed.

Metrics over a ranking (nodes, or chunks as the nodes they belong to) are
ritrag.evaluation.metrics': rank of the first gold item, hit@k, MRR,
nDCG@10, evidence recall and the agent's evidence precision/recall/F1.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence
from urllib.parse import urlsplit

import numpy as np
import pyarrow.compute as pc

from ritrag.flags import option
from ritrag.evaluation.metrics import evidence_found, first_rank, gains, ndcg, node_prf, percentile
from ritrag.layout import IndexLayout, IndexLoadError
from ritrag.serving.api import DEFAULT_K, DEFAULT_MAX_CHARS, DEFAULT_N, RitragIndex
from ritrag.serving.outline import TOKENIZER, count_tokens, preorder, render_outline, toc_json_text
from ritrag.serving.budget import Budget
from ritrag.serving.retrieval import RetrievalParams, node_scores, reciprocal_rank_fusion, top_nodes
from ritrag.serving.tools import DEFAULT_TOC_FORMAT
from ritrag.serving_form import utf8_fixed_width
from ritrag.urls import normalize_url

SYSTEMS = {
    "subforest": "GetToC sub-forest (hybrid), read in score order",
    "bm25": "BM25 only: nodes by their best BM25 chunk, same reader",
    "dense": "dense only: nodes by their best dense chunk, same reader",
    "chunks": "plain RAG: fused chunk ranking, top chunks read",
    "focused1x": "the sub-forest's hits read with focused Reads (the question as query) within the tokens plain "
                 "RAG read for the question",
    "focused2x": "the same within twice the tokens plain RAG read",
    "tree": "PageIndex-style: the whole tree of the top hit",
}
# The focused readers' token budgets, as multiples of what plain RAG read for the same question.
FOCUS_BUDGETS = {"focused1x": 1.0, "focused2x": 2.0}
CHARS_PER_TOKEN = 4  # a Read asks for characters; its text is then counted in tokens
MAX_SHRINKS = 4  # Reads of one node, each shorter, before a focused reader stops at its budget
NODE_RANKINGS = ("subforest", "bm25", "dense")
# The sub-forest's cross-link measurements (`_cross_links`), averaged over questions.
CROSS_LINK_METRICS = ("see_also_nodes", "toc_tokens_json_see_also", "toc_tokens_outline_see_also", "found_see_also",
                      "one_hop", "one_hop_linked")
HIT_KS = (1, 5, 10)
FIELDS = {"id": str, "question": str, "gold": list, "evidence": list, "tags": list, "answer": str}


class EvalInputError(ValueError):
    """A question file or index that cannot be evaluated; the message says where and why."""


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    gold: tuple[str, ...]
    evidence: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    answer: str | None = None
    line: int = 0


def parse_question(obj: Any, line: int) -> Question:
    """One question from the JSON object on line `line` (1-based) of a question file."""
    where = f"line {line}"
    if not isinstance(obj, dict):
        raise EvalInputError(f"{where}: a question is a JSON object, not {type(obj).__name__}")
    for key, kind in FIELDS.items():
        if key in obj and obj[key] is not None and not isinstance(obj[key], kind):
            raise EvalInputError(f"{where}: '{key}' must be a {kind.__name__}, not {type(obj[key]).__name__}")
    for key in ("question", "gold"):
        if not obj.get(key):
            raise EvalInputError(f"{where}: '{key}' is missing or empty")
    for key in ("gold", "evidence", "tags"):
        bad = [v for v in obj.get(key) or () if not isinstance(v, str) or not v.strip()]
        if bad:
            raise EvalInputError(f"{where}: '{key}' must hold non-empty strings, got {bad[0]!r}")
    return Question(id=str(obj.get("id") or line), question=obj["question"], gold=tuple(obj["gold"]),
                    evidence=tuple(obj.get("evidence") or ()), tags=tuple(obj.get("tags") or ()),
                    answer=obj.get("answer") or None, line=line)


def parse_questions(lines: Iterable[str], name: str = "questions") -> list[Question]:
    """Questions from JSONL lines; blank lines are skipped. A malformed line,
    a repeated id or a file without questions raises `EvalInputError`."""
    questions: list[Question] = []
    seen: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EvalInputError(f"{name}: line {number}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        try:
            question = parse_question(obj, number)
        except EvalInputError as exc:
            raise EvalInputError(f"{name}: {exc}") from None
        if question.id in seen:
            raise EvalInputError(f"{name}: line {number}: id {question.id!r} already used on line {seen[question.id]}")
        seen[question.id] = number
        questions.append(question)
    if not questions:
        raise EvalInputError(f"{name}: no questions (the file is empty)")
    return questions


def load_questions(path: str) -> list[Question]:
    """The questions of a JSONL question file (format: benchmarks/questions/README.md)."""
    with open(path, encoding="utf-8") as fh:
        return parse_questions(fh, path)


def open_index(index_dir: str, version: str | None = None) -> RitragIndex:
    """The index version to evaluate; `EvalInputError` when there is none or
    it has no node table to resolve gold against."""
    layout = IndexLayout(index_dir)
    try:
        manifest = layout.load_manifest(version)
    except IndexLoadError as exc:
        raise EvalInputError(str(exc)) from None
    if not any(layout.segment_files(seg, "nodes") for seg in manifest.segments):
        raise EvalInputError(f"{index_dir}: version {manifest.version} has no node table (nodes-*.parquet): "
                             "evaluation resolves gold pages against it; rebuild the index")
    return RitragIndex(index_dir, manifest.version)


def _url_key(url: str) -> str:
    """Host, path and query of a normalized URL: what gold URLs and suffixes match against."""
    parts = urlsplit(normalize_url(url))
    return parts.netloc + parts.path + (f"?{parts.query}" if parts.query else "")


def _suffix_key(suffix: str) -> str:
    """A gold URL suffix normalized like a URL's path ("a/index.html#x" -> "a")."""
    parts = urlsplit(normalize_url("http://host/" + suffix.strip().lstrip("/")))
    return (parts.path.lstrip("/") + (f"?{parts.query}" if parts.query else "")).rstrip("/")


def live_rows(index: RitragIndex) -> np.ndarray:
    """The loaded version's row of each live node, in the order of the
    index reader's live node table (ascending: rows number the node files'
    rows in the same order)."""
    idx = index.loaded
    ids = idx.reader.table("nodes", ["node_id"])["node_id"]
    if not len(ids):
        raise EvalInputError(f"{idx.reader.layout.root}: the index has no nodes: nothing to evaluate against")
    return idx.node_row.rows(utf8_fixed_width(ids.combine_chunks()))


class GoldResolver:
    """Gold entries -> the live node rows they name (see the module docstring)."""

    def __init__(self, index: RitragIndex, rows: np.ndarray):
        """`rows`: the live node rows (`live_rows`), in the reader's order."""
        idx = index.loaded
        self._node_row = idx.node_row
        nodes = idx.reader.table("nodes", ["url", "page_id"])
        self._by_suffix: dict[str, set[int]] = defaultdict(set)
        self._by_page: dict[str, set[int]] = defaultdict(set)
        by_url: dict[str, set[int]] = defaultdict(set)
        for row, url, page_id in zip(rows.tolist(), nodes["url"].to_pylist(), nodes["page_id"].to_pylist(),
                                     strict=True):
            if page_id:
                self._by_page[page_id].add(row)
            if url:
                by_url[_url_key(url)].add(row)
        # A suffix names a page by its URL or by the input it was read from: a
        # site whose public base was inferred (or a WARC) has URLs that no
        # longer end with the corpus-relative path a question file gives.
        pages = idx.reader.table("pages", ["url", "source"])
        for url, source in zip(pages["url"].to_pylist(), pages["source"].to_pylist()):
            by_url[_suffix_key(source)] |= by_url.get(_url_key(url), set())
        for key, url_rows in by_url.items():
            segments = key.split("/")
            for i in range(len(segments)):
                self._by_suffix["/".join(segments[i:])] |= url_rows

    def resolve(self, gold: str) -> frozenset[int]:
        """Live node rows of one gold entry; empty when it names none."""
        gold = gold.strip()
        if gold in self._node_row:
            row = self._node_row[gold]
            return frozenset(self._by_page.get(gold, set()) | {row})
        key = _url_key(gold) if "://" in gold else _suffix_key(gold)
        return frozenset(self._by_suffix.get(key, ())) if key else frozenset()


# ---- running ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EvalConfig:
    # Each field but max_calls and retrieval is a flag of `ritrag eval` (its
    # --max_calls is AgentSettings', which bounds the agent loop too).
    k: int = option(DEFAULT_K, "chunks recalled per retriever")  # k'
    n: int = option(DEFAULT_N, "nodes kept (GetToC hits, BM25- and dense-only rankings)")
    # the reader's tool calls per question, its one GetToC included
    max_calls: int = field(default=10, metadata={"cli": False})
    # the reader reads (max_calls - 1) * ids_per_read nodes
    ids_per_read: int = option(1, "nodes the deterministic reader asks per Read")
    max_chars: int = option(DEFAULT_MAX_CHARS, "characters of a node one Read returns")  # from offset 0
    chunks: int = option(10, "chunks the plain-RAG baseline reads")
    # RetrievalParams fields overriding the index's recorded ones (sweeps)
    retrieval: dict | None = field(default=None, metadata={"cli": False})

    def retrieval_params(self, index: RitragIndex) -> RetrievalParams:
        return replace(index.params, **(self.retrieval or {}))  # the index's recorded ones, checked again


@dataclass(frozen=True)
class EvalRun:
    """`ritrag eval`'s own arguments: the index and questions it scores, where
    it writes, what it compares and whether a model answers too (how it
    scores is EvalConfig's, RetrievalParams' and AgentSettings' flags)."""

    index: str = option(help="index directory", positional=True)
    questions: str = option(help="JSONL question file", positional=True)
    out: str | None = option(None, "directory for eval.json and eval.html")
    compare: str | None = option(None, "also evaluate OTHER_INDEX (e.g. the same input embedded by an adapted model) "
                                       "on the same questions and set its metrics beside INDEX's, per system (the "
                                       "report's 'comparison')", metavar="OTHER_INDEX")
    agent: bool = option(False, "also run the agent loop on every question")
    # with --agent: AgentConfig's transcripts_dir and judge_model
    transcripts: str | None = option(None, "directory for one JSONL transcript per question (agent)")
    judge_model: str | None = option(None, "grade agent answers against questions' `answer` with this model")


@dataclass(frozen=True)
class AgentConfig:
    """`ritrag eval --agent`: a real model runs the method's loop on every question."""

    base_url: str
    model: str
    api_key: str | None = None
    max_calls: int = Budget.calls
    max_toc: int = Budget.toc_calls
    transcripts_dir: str | None = None  # one JSONL transcript per question, named by its id
    judge_model: str | None = None  # grade answers of questions with an `answer` (same endpoint)
    toc_format: str = DEFAULT_TOC_FORMAT  # what GetToC shows the model: json or outline
    temperature: float | None = None
    max_tokens: int | None = None


@dataclass
class _Run:
    """What one question's retrieval produced, before texts are read."""

    question: Question
    targets: list[frozenset[int]]
    unresolvable: list[str]
    resolved: dict[str, list[str]]
    latency_ms: float
    toc_rows: set[int]
    toc_tokens: dict[str, int]
    cross_links: dict[str, Any]  # `_cross_links`: the ToC with its see_also, and what they reach
    rankings: dict[str, list[int]]  # system -> ranked node rows (chunks: the node of each chunk)
    chunk_rows: list[int]
    top_root: int | None
    agent: dict[str, Any] = field(default_factory=dict)


def evaluate(index: RitragIndex, questions: Sequence[Question], config: EvalConfig = EvalConfig(),
             agent: AgentConfig | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every system on every question and return the report: config,
    counts, unresolvable gold, per-question results, aggregates overall and
    per tag, GetToC latency and the sub-forest's wins and losses."""
    if config.max_calls < 2 or config.ids_per_read < 1:
        raise ValueError("the reader needs max_calls >= 2 (one GetToC, one Read) and ids_per_read >= 1")
    live = live_rows(index)
    resolver = GoldResolver(index, live)
    roots = _tree_roots(index, live)
    index.embed_query("warm up")  # the query model loads on first use: not a GetToC's latency
    started = time.perf_counter()
    runs = []
    with _agent_session(index, agent) as session:
        for i, q in enumerate(questions, start=1):
            runs.append(_retrieve(index, resolver, roots, q, config))
            if session is not None and runs[-1].targets:
                runs[-1].agent = _run_agent(*session, q, runs[-1], agent)
            if progress and (i % 20 == 0 or i == len(questions)):
                rate = i / (time.perf_counter() - started)
                progress(f"eval: {i}/{len(questions)} questions, {rate:.1f}/s, ETA {(len(questions) - i) / rate:.0f} s")
    texts = _read_texts(index, runs, config)
    trees = _tree_tocs(index, roots[live], live, {r.top_root for r in runs if r.top_root is not None})
    results = [_score(index, run, texts, trees, config) for run in runs]
    latencies = [r["latency_ms"] for r in results]
    report = {
        "index": str(index.loaded.reader.layout.root), "version": index.version, "tokenizer": TOKENIZER,
        "embedder": index.loaded.manifest.settings.index.embedder.model,
        "config": asdict(config), "retrieval": asdict(config.retrieval_params(index)),
        "agent": _agent_config(agent), "systems": dict(SYSTEMS),
        "counts": {"questions": len(results), "scored": sum(r["scored"] for r in results),
                   "unresolvable_questions": sum(not r["scored"] for r in results),
                   "unresolvable_gold": sum(len(r["unresolvable_gold"]) for r in results)},
        "unresolvable": [{"id": r["id"], "line": r["line"], "gold": r["unresolvable_gold"], "scored": r["scored"]}
                         for r in results if r["unresolvable_gold"]],
        "latency_ms": {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99),
                       "mean": float(np.mean(latencies))},
        "overall": aggregate(results),
        "by_tag": {tag: aggregate([r for r in results if tag in r["tags"]])
                   for tag in sorted({t for r in results for t in r["tags"]})},
        "seconds": round(time.perf_counter() - started, 2),
        "questions": results,
    }
    report["verdicts"] = verdicts(report)
    return report


def _tree_roots(index: RitragIndex, live: np.ndarray) -> np.ndarray:
    """Row of the tree root of every node row: the first ancestor of a live
    row (`live`, as `live_rows` gives them); itself for a root, or a row no
    live node holds."""
    idx = index.loaded
    ancestors = idx.reader.table("nodes", ["ancestor_ids"])["ancestor_ids"].combine_chunks()
    roots = np.arange(idx.reader.positions("nodes").num_rows)
    has = pc.fill_null(pc.greater(pc.list_value_length(ancestors), 0), False).to_numpy(zero_copy_only=False)
    if has.any():
        found = idx.node_row.rows(utf8_fixed_width(pc.list_element(ancestors.filter(has), 0)))
        roots[live[has]] = np.where(found >= 0, found, live[has])
    return roots


def _retrieve(index: RitragIndex, resolver: GoldResolver, roots: np.ndarray, q: Question,
              config: EvalConfig) -> _Run:
    idx = index.loaded
    resolved = {g: resolver.resolve(g) for g in q.gold}
    targets = list(dict.fromkeys(rows for rows in resolved.values() if rows))  # the same nodes named twice: one target
    t0 = time.perf_counter()  # what one GetToC does: embed, retrieve, build the sub-forest
    vector = index.embed_query(q.question)
    retrieval = index.retrieve(q.question, config.k, config.n, vector, config.retrieval_params(index))
    linked = index.toc_of(q.question, retrieval.hits, retrieval.scores)
    latency_ms = (time.perf_counter() - t0) * 1000
    toc = {**linked, "trees": _without_see_also(linked["trees"])}
    sparse, dense = retrieval.rankings.chunks
    fused, hits = retrieval.fused, retrieval.hits
    toc_rows = {idx.node_row[entry["id"]] for entry, _ in preorder(toc["trees"])}
    rankings = {"subforest": [row for row, _ in hits]}
    for name, (ranked_rows, _) in (("bm25", sparse), ("dense", dense)):
        rankings[name] = [row for row, _ in top_nodes(node_scores(reciprocal_rank_fusion([ranked_rows]),
                                                                  idx.chunk_node), config.n)]
    chunk_rows = [row for row, _ in sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))]
    rankings["chunks"] = idx.chunk_node[chunk_rows].tolist() if chunk_rows else []
    return _Run(question=q, targets=targets, unresolvable=[g for g, rows in resolved.items() if not rows],
                resolved={g: sorted(idx.nodes["node_id"][r] for r in rows) for g, rows in resolved.items() if rows},
                latency_ms=latency_ms, toc_rows=toc_rows,
                toc_tokens={"json": count_tokens(toc_json_text(toc)), "outline": count_tokens(render_outline(toc["trees"]))},
                cross_links=_cross_links(index, linked, toc_rows, [row for row, _ in hits]),
                rankings=rankings, chunk_rows=chunk_rows,
                top_root=int(roots[hits[0][0]]) if hits else None)


def _without_see_also(trees: list[dict]) -> list[dict]:
    """The trees as GetToC answers them with cross-links off."""
    return [{**{key: value for key, value in node.items() if key not in ("see_also", "children")},
             **({"children": _without_see_also(node["children"])} if "children" in node else {})} for node in trees]


def _cross_links(index: RitragIndex, linked: dict, toc_rows: set[int], hits: Sequence[int]) -> dict[str, Any]:
    """The ToC `linked` (with its hits' see_also): its tokens, its cross-link
    rows, and every row one hop from a hit (out- or in-link) outside the ToC."""
    idx = index.loaded
    see_also = {idx.node_row[link["id"]] for node, _ in preorder(linked["trees"]) for link in node.get("see_also", ())}
    neighbours = {int(r) for hit in hits for r in idx.links.neighbours(hit)} - toc_rows
    return {"rows": see_also, "linked_rows": neighbours,
            "tokens": {"json": count_tokens(toc_json_text(linked)),
                       "outline": count_tokens(render_outline(linked["trees"]))}}


def _reads(config: EvalConfig) -> int:
    """Nodes the deterministic reader reads: one GetToC, then Reads of `ids_per_read` nodes."""
    return (config.max_calls - 1) * config.ids_per_read


def _read_texts(index: RitragIndex, runs: Sequence[_Run], config: EvalConfig) -> dict[str, dict[int, str]]:
    """Every text any reader reads, fetched in one pass: node bodies as Read
    returns them (first `max_chars`), and the plain-RAG baseline's chunks."""
    idx = index.loaded
    rows = {row for run in runs for name in NODE_RANKINGS for row in run.rankings[name][:_reads(config)]}
    ids = [idx.nodes["node_id"][row] for row in sorted(rows)]
    nodes = {idx.node_row[e["id"]]: e["text"] for e in index.read(ids, max_chars=config.max_chars)["nodes"]} if ids else {}
    chunk_rows = sorted({int(row) for run in runs for row in run.chunk_rows[:config.chunks]})
    chunk_ids = idx.chunk_ids[chunk_rows].tolist() if chunk_rows else []
    found = idx.reader.rows_by_id("chunks", chunk_ids, ["text"])  # point reads, by id
    return {"nodes": nodes, "chunks": {row: found[i]["text"] for row, i in zip(chunk_rows, chunk_ids)}}


def _tree_tocs(index: RitragIndex, roots: np.ndarray, rows: np.ndarray, wanted: set[int]) -> dict[int, dict]:
    """Per tree root in `wanted`: the whole tree's table of contents (GetToC's
    rendering with every node, no hit marks or scores), its size and its
    node rows. `roots[i]`: the root of live node row `rows[i]`."""
    out = {}
    for root in sorted(wanted):
        members = [int(r) for r in rows[roots == root]]
        toc = index.toc_of("", [(row, 0.0) for row in members])
        for entry, _ in preorder(toc["trees"]):
            entry.pop("hit", None)
            entry.pop("score", None)
        trees = toc["trees"]
        out[root] = {"id": index.loaded.nodes["node_id"][root], "rows": set(members), "nodes": len(members),
                     "tokens": {"json": count_tokens(toc_json_text({"trees": trees})),
                                "outline": count_tokens(render_outline(trees))}}
    return out


def _score(index: RitragIndex, run: _Run, texts: dict[str, dict[int, str]], trees: dict[int, dict],
           config: EvalConfig) -> dict[str, Any]:
    q, targets = run.question, run.targets
    every = frozenset().union(*targets) if targets else frozenset()
    systems: dict[str, dict[str, Any]] = {}
    for name in NODE_RANKINGS:
        ranked = run.rankings[name]
        read = ranked[:_reads(config)]
        text = "\n".join(texts["nodes"].get(row, "") for row in read)
        systems[name] = {**_rank_metrics(ranked, targets),
                         "found": bool((run.toc_rows if name == "subforest" else set(ranked)) & every),
                         "read": [index.loaded.nodes["node_id"][r] for r in read],
                         **_reading(q.evidence, text)}
    systems["subforest"]["toc_tokens_json"] = run.toc_tokens["json"]
    systems["subforest"]["toc_tokens_outline"] = run.toc_tokens["outline"]
    systems["subforest"]["toc_nodes"] = len(run.toc_rows)
    in_toc = bool(run.toc_rows & every)
    systems["subforest"].update({
        "see_also_nodes": len(run.cross_links["rows"]),
        "toc_tokens_json_see_also": run.cross_links["tokens"]["json"],
        "toc_tokens_outline_see_also": run.cross_links["tokens"]["outline"],
        "found_see_also": in_toc or bool(run.cross_links["rows"] & every),
        "one_hop": not in_toc and bool(run.cross_links["rows"] & every),
        "one_hop_linked": not in_toc and bool(run.cross_links["linked_rows"] & every)})
    top = run.chunk_rows[:config.chunks]
    systems["chunks"] = {**_rank_metrics(run.rankings["chunks"], targets),
                         "found": bool(set(run.rankings["chunks"][:config.chunks]) & every),
                         "read_chunks": len(top),
                         **_reading(q.evidence, "\n".join(texts["chunks"].get(r, "") for r in top))}
    for name, multiple in FOCUS_BUDGETS.items():
        read, text = _focused_reading(index, run.rankings["subforest"][:_reads(config)], q.question,
                                      systems["chunks"]["read_tokens"] * multiple)
        systems[name] = {**_rank_metrics(run.rankings["subforest"], targets), "found": systems["subforest"]["found"],
                         "read": read, **_reading(q.evidence, text)}
    tree = trees.get(run.top_root) if run.top_root is not None else None
    systems["tree"] = {"found": bool(tree and tree["rows"] & every), "tree": tree["id"] if tree else None,
                       "toc_nodes": tree["nodes"] if tree else 0,
                       "toc_tokens_json": tree["tokens"]["json"] if tree else 0,
                       "toc_tokens_outline": tree["tokens"]["outline"] if tree else 0}
    if run.agent:
        systems["agent"] = run.agent
    return {"id": q.id, "line": q.line, "question": q.question, "tags": list(q.tags), "gold": list(q.gold),
            "resolved": run.resolved, "unresolvable_gold": run.unresolvable, "scored": bool(targets),
            "targets": len(targets), "latency_ms": round(run.latency_ms, 3), "systems": systems}


def _focused_reading(index: RitragIndex, rows: Sequence[int], question: str, budget_tokens: float
                     ) -> tuple[list[str], str]:
    """A reader that spends a token budget like an agent would: the nodes in
    rank order, each Read with the question as query (its most relevant
    passages, serving/passages.py) and what is left of the budget as its
    size, until the budget is spent; never past it. (node ids read, text read)"""
    budget = int(budget_tokens)
    read: list[str] = []
    text, spent = "", 0
    for row in rows:
        left = budget - spent
        if left <= 0:
            break
        node_id = index.loaded.nodes["node_id"][row]
        max_chars = max(left * CHARS_PER_TOKEN, 1)
        # A Read asks for characters: text denser in tokens than CHARS_PER_TOKEN
        # is asked for again, shorter, so the budget is a bound, not a target.
        for _ in range(MAX_SHRINKS):
            piece = index.read([node_id], max_chars=max_chars, query=question)["nodes"][0]["text"]
            joined = f"{text}\n{piece}" if read else piece
            over = count_tokens(joined) - budget
            if over <= 0:
                break
            piece_tokens = max(count_tokens(piece), 1)
            max_chars = max(len(piece) * (piece_tokens - over) // piece_tokens - 1, 0)
            if max_chars == 0:
                break
        if over > 0:
            break
        read.append(node_id)
        text, spent = joined, budget + over
    return read, text


def _rank_metrics(ranked: Sequence[int], targets: Sequence[frozenset[int]]) -> dict[str, Any]:
    item_gains = gains(ranked, targets)
    return {"rank": first_rank(item_gains), "ndcg@10": ndcg(item_gains, len(targets))}


def _reading(evidence: Sequence[str], text: str) -> dict[str, Any]:
    found = evidence_found(evidence, text)
    return {"evidence_found": found, "evidence_recall": (sum(found) / len(found)) if found else None,
            "read_chars": len(text), "read_tokens": count_tokens(text)}


# ---- agent mode -------------------------------------------------------------------------------------------------

def _agent_config(agent: AgentConfig | None) -> dict[str, Any] | None:
    if agent is None:
        return None
    return {key: value for key, value in asdict(agent).items() if key != "api_key"}  # never write the key


@contextlib.contextmanager
def _agent_session(index: RitragIndex, agent: AgentConfig | None):
    """(tool service, HTTP client) the agent runs of one evaluation share (one
    connection pool to the endpoint); None without agent mode, so plain
    evaluation imports no HTTP client."""
    if agent is None:
        yield None
        return
    import httpx

    from ritrag.evaluation.agent import TIMEOUT_S
    from ritrag.serving.tools import ToolService

    with httpx.Client(timeout=TIMEOUT_S) as client:
        yield ToolService(index), client


def _run_agent(service, client, q: Question, run: _Run, agent: AgentConfig) -> dict[str, Any]:
    """One agent episode on question `q` (`ritrag.evaluation.agent.run_agent`), scored against its targets."""
    from ritrag.evaluation import agent as agent_module

    index: RitragIndex = service.index
    transcript = None
    if agent.transcripts_dir:
        os.makedirs(agent.transcripts_dir, exist_ok=True)
        transcript = os.path.join(agent.transcripts_dir, f"{_file_safe(q.id)}.jsonl")
    result = agent_module.run_agent(service, q.question, base_url=agent.base_url, model=agent.model,
                                    api_key=agent.api_key, max_calls=agent.max_calls, max_toc=agent.max_toc,
                                    transcript_path=transcript, toc_format=agent.toc_format,
                                    temperature=agent.temperature, max_tokens=agent.max_tokens, client=client)
    rows = [r for r in (index.loaded.node_row.get(i) for i in result.nodes_read) if r is not None]
    precision, recall, f1 = node_prf(rows, run.targets)
    out = {"answer": result.answer, "nodes_read": list(result.nodes_read), "precision": precision, "recall": recall,
           "f1": f1, "calls": result.calls, "toc_calls": result.toc_calls, "prompt_tokens": result.prompt_tokens,
           "completion_tokens": result.completion_tokens, "latency_s": result.latency_s, "error": result.error,
           "transcript": transcript}
    if agent.judge_model and q.answer:
        score = agent_module.judge_answer(q.question, q.answer, result.answer, base_url=agent.base_url,
                                          model=agent.judge_model, api_key=agent.api_key, client=client)
        out["judge"] = None if math.isnan(score) else score
    return out


def _file_safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:100] or "question"


# ---- aggregation ------------------------------------------------------------------------------------------------

def _mean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def aggregate(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Means per system over the scored questions among `results` (evidence
    recall over those with evidence strings; the agent's judge score over
    those it graded)."""
    scored = [r for r in results if r["scored"]]
    out: dict[str, Any] = {"questions": len(results), "scored": len(scored)}
    for name in [*SYSTEMS, "agent"]:
        rows = [r["systems"][name] for r in scored if name in r["systems"]]
        if not rows:
            continue
        metrics: dict[str, Any] = {}
        if name == "agent":
            for key in ("precision", "recall", "f1", "calls", "toc_calls", "prompt_tokens", "completion_tokens",
                        "latency_s", "judge"):
                metrics[key] = _mean(s.get(key) for s in rows)
            metrics["errors"] = sum(bool(s.get("error")) for s in rows)
            metrics["judged"] = sum(s.get("judge") is not None for s in rows)
            out[name] = metrics
            continue
        metrics["found"] = _mean(float(s["found"]) for s in rows)
        if "rank" in rows[0]:
            ranks = [s["rank"] for s in rows]
            for k in HIT_KS:
                metrics[f"hit@{k}"] = _mean(float(r is not None and r <= k) for r in ranks)
            metrics["mrr"] = _mean((1.0 / r) if r else 0.0 for r in ranks)
            metrics["ndcg@10"] = _mean(s["ndcg@10"] for s in rows)
            metrics["evidence_recall"] = _mean(s["evidence_recall"] for s in rows)
            metrics["read_chars"] = _mean(s["read_chars"] for s in rows)
            metrics["read_tokens"] = _mean(s["read_tokens"] for s in rows)
            recall, tokens = metrics["evidence_recall"], metrics["read_tokens"]
            metrics["evidence_per_1k_tokens"] = 1000 * recall / tokens if recall is not None and tokens else None
            metrics["rank_histogram"] = rank_histogram(ranks)
        for key in ("toc_tokens_json", "toc_tokens_outline", "toc_nodes", *CROSS_LINK_METRICS):
            if key in rows[0]:
                metrics[key] = _mean(float(s[key]) for s in rows)
        out[name] = metrics
    return out


RANK_BUCKETS = ((1, 1), (2, 2), (3, 3), (4, 5), (6, 10), (11, 20), (21, 50), (51, None))


def rank_histogram(ranks: Sequence[int | None]) -> dict[str, int]:
    """Questions per rank bucket of the first gold item ("miss": not ranked)."""
    out = {}
    for lo, hi in RANK_BUCKETS:
        label = str(lo) if lo == hi else (f"{lo}-{hi}" if hi else f">{lo - 1}")
        out[label] = sum(r is not None and r >= lo and (hi is None or r <= hi) for r in ranks)
    out["miss"] = sum(r is None for r in ranks)
    return out


# What the sub-forest is compared on against each baseline: (metric, higher is better).
COMPARISONS = {
    "bm25": (("mrr", True), ("evidence_recall", True)),
    "dense": (("mrr", True), ("evidence_recall", True)),
    "chunks": (("evidence_recall", True), ("read_tokens", False)),
    "tree": (("found", True), ("toc_tokens_json", False)),
}
TIE = {"read_tokens": 0.05, "toc_tokens_json": 0.05}  # relative; other metrics: absolute 0.01


def compare(ours: float | None, theirs: float | None, metric: str, higher_is_better: bool) -> str | None:
    """wins / loses / ties of the sub-forest on one metric (None when either is missing)."""
    if ours is None or theirs is None:
        return None
    tolerance = TIE[metric] * max(abs(ours), abs(theirs)) if metric in TIE else 0.01
    if abs(ours - theirs) <= tolerance:
        return "ties"
    return "wins" if (ours > theirs) == higher_is_better else "loses"


def verdicts(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Where the sub-forest wins and loses against each baseline, overall and per tag."""
    out = []
    scopes = [("overall", report["overall"])] + [(f"tag {t}", a) for t, a in report["by_tag"].items()]
    for scope, agg in scopes:
        if "subforest" not in agg:
            continue
        for baseline, metrics in COMPARISONS.items():
            if baseline not in agg:
                continue
            for metric, higher in metrics:
                ours = agg["subforest"].get(metric)
                theirs = agg[baseline].get(metric)
                outcome = compare(ours, theirs, metric, higher)
                if outcome:
                    out.append({"scope": scope, "questions": agg["scored"], "baseline": baseline, "metric": metric,
                                "subforest": ours, "baseline_value": theirs, "outcome": outcome})
    return out


# ---- two indexes on the same questions ------------------------------------------------------------------------

# What `compare_runs` sets side by side, per system: higher is better for each
# but the ToC's tokens (the sub-forest's and the whole tree's: what an agent is
# shown, which model metadata makes longer).
COMPARED_METRICS = ("hit@1", "hit@10", "mrr", "ndcg@10", "evidence_recall", "found", "toc_tokens_json",
                    "toc_tokens_outline")


def compare_runs(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Two reports of the same questions (e.g. an index and the same input
    embedded by an adapted model, `ritrag adapt`, or described by a model:
    docs/METADATA.md), set side by side: per system, each of
    COMPARED_METRICS in both and the change (other - base), overall and per
    tag. BM25 and the whole-tree baseline do not depend on the embedding
    model; the dense ranking, the fused ones and the sub-forest do."""
    def side_by_side(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"scored": [ours.get("scored"), theirs.get("scored")]}
        for name in SYSTEMS:
            if name not in ours or name not in theirs:
                continue
            out[name] = {metric: {"base": ours[name][metric], "other": theirs[name][metric],
                                  "change": theirs[name][metric] - ours[name][metric]
                                  if ours[name][metric] is not None and theirs[name][metric] is not None else None}
                         for metric in COMPARED_METRICS if metric in ours[name] and metric in theirs[name]}
        return out

    return {"base": {"index": base["index"], "version": base["version"], "embedder": base.get("embedder")},
            "other": {"index": other["index"], "version": other["version"], "embedder": other.get("embedder")},
            "overall": side_by_side(base["overall"], other["overall"]),
            "by_tag": {tag: side_by_side(agg, other["by_tag"][tag])
                       for tag, agg in base["by_tag"].items() if tag in other["by_tag"]}}

"""`ritrag eval` and serving.eval: metrics on hand-computed cases, gold
resolution, bad input, the reports, the CLI, and agent-mode aggregation
(with a fake agent: the real agent loop is tested in test_agent.py)."""
from __future__ import annotations

import json
import math
import re
import shutil
import time
from pathlib import Path

import pytest

from ritrag import cli
from ritrag.evaluation import eval as ev
from ritrag.evaluation.report import render_comparison, render_html, render_text, write_report
from support import BASE, SAMPLE, build_index
from serving_fixtures import loaded_index

ROOT = Path(__file__).resolve().parent.parent


# ---- metrics ----------------------------------------------------------------------------------------------------

def test_rank_metrics_on_hand_computed_rankings():
    a, b = frozenset({10, 11}), frozenset({20})
    # ranked rows: 5 (no), 11 (target a), 10 (a again: no credit), 20 (b)
    g = ev.gains([5, 11, 10, 20], [a, b])
    assert g == [0, 1, 0, 1]
    assert ev.first_rank(g) == 2
    dcg = 1 / math.log2(3) + 1 / math.log2(5)
    ideal = 1 + 1 / math.log2(3)
    assert ev.ndcg(g, 2) == pytest.approx(dcg / ideal)
    assert ev.ndcg([1], 1) == 1.0
    assert ev.ndcg([0] * 10 + [1], 1) == 0.0  # beyond @10
    assert ev.first_rank(ev.gains([1, 2, 3], [a])) is None


def test_aggregate_hit_at_k_and_mrr():
    def result(rank):
        s = {"rank": rank, "ndcg@10": 0.0, "found": rank is not None, "evidence_recall": None,
             "read_chars": 0, "read_tokens": 0}
        return {"scored": True, "tags": [], "systems": {"bm25": s}}

    agg = ev.aggregate([result(1), result(3), result(7), result(None)])["bm25"]
    assert agg["hit@1"] == 0.25 and agg["hit@5"] == 0.5 and agg["hit@10"] == 0.75
    assert agg["mrr"] == pytest.approx((1 + 1 / 3 + 1 / 7) / 4)
    assert agg["evidence_recall"] is None  # no question had evidence strings
    assert agg["rank_histogram"]["1"] == 1 and agg["rank_histogram"]["miss"] == 1


def test_evidence_and_node_prf():
    assert ev.evidence_found(["a  b\nc", "zzz"], "x a b c y") == [True, False]
    t1, t2 = frozenset({1, 2}), frozenset({3})
    p, r, f = ev.node_prf([1, 2, 9, 9], [t1, t2])  # 2 of 3 distinct read nodes correct, 1 of 2 targets
    assert (p, r) == (pytest.approx(2 / 3), 0.5)
    assert f == pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5))
    assert ev.node_prf([], [t1]) == (0.0, 0.0, 0.0)


def test_compare_directions_and_ties():
    assert ev.compare(0.5, 0.4, "mrr", True) == "wins"
    assert ev.compare(0.5, 0.505, "mrr", True) == "ties"
    assert ev.compare(1000, 2000, "read_tokens", False) == "wins"
    assert ev.compare(1000, 1020, "read_tokens", False) == "ties"
    assert ev.compare(None, 1.0, "mrr", True) is None


# ---- question files ---------------------------------------------------------------------------------------------

def test_two_runs_side_by_side_set_the_tocs_tokens_beside_the_ranking():
    """`--compare` of an index without and with model metadata (docs/METADATA.md):
    ranking, evidence recall and the ToC's tokens per system, and the change."""
    def report(index: str, mrr: float, tokens: float) -> dict:
        systems = {"scored": 2, "subforest": {"mrr": mrr, "evidence_recall": 1.0, "toc_tokens_json": tokens,
                                              "toc_tokens_outline": tokens / 2},
                   "bm25": {"mrr": mrr, "evidence_recall": 0.5}}
        return {"index": index, "version": "v000001", "embedder": "hashing:384", "overall": systems,
                "by_tag": {}}
    compared = ev.compare_runs(report("plain", 0.5, 1000.0), report("meta", 0.75, 3000.0))
    subforest = compared["overall"]["subforest"]
    assert subforest["toc_tokens_json"] == {"base": 1000.0, "other": 3000.0, "change": 2000.0}
    assert subforest["toc_tokens_outline"]["change"] == 1000.0 and subforest["mrr"]["change"] == 0.25
    assert "toc_tokens_json" not in compared["overall"]["bm25"] and compared["overall"]["scored"] == [2, 2]
    table = render_comparison(compared)
    assert re.search(r"subforest\s+toc_tokens_json\s+1,000\s+3,000\s+\+2,000", table), table


def test_questions_parse_with_defaults():
    qs = ev.parse_questions(['{"question": "q?", "gold": ["a.html"]}', "",
                             '{"id": "x", "question": "r?", "gold": ["b"], "evidence": ["e"], "tags": ["t"], '
                             '"answer": "A", "twin": "kept aside"}'])
    assert qs[0].id == "1" and qs[0].line == 1 and qs[0].evidence == ()
    assert (qs[1].id, qs[1].line, qs[1].tags, qs[1].answer) == ("x", 3, ("t",), "A")


@pytest.mark.parametrize("lines, message", [
    ([], "no questions"),
    (["", "  "], "no questions"),
    (['{"question": "q", "gold": ["a"]}', '{"question": "q", "gold": '], "line 2: not valid JSON"),
    (['{"gold": ["a"]}'], "line 1: 'question' is missing"),
    (['{"question": "q", "gold": "a.html"}'], "line 1: 'gold' must be a list"),
    (['{"question": "q", "gold": []}'], "line 1: 'gold' is missing or empty"),
    (['{"question": "q", "gold": ["a", 3]}'], "line 1: 'gold' must hold non-empty strings"),
    (['["q"]'], "line 1: a question is a JSON object"),
    (['{"id": "a", "question": "q", "gold": ["a"]}', '{"id": "a", "question": "r", "gold": ["b"]}'],
     "line 2: id 'a' already used on line 1"),
])
def test_bad_question_files_are_refused_with_the_line(lines, message):
    with pytest.raises(ev.EvalInputError, match=re.escape(message)):
        ev.parse_questions(lines, "q.jsonl")


def test_sample_questions_load():
    qs = ev.load_questions(str(ROOT / "sample" / "questions.jsonl"))
    assert len(qs) >= 15 and all(q.evidence for q in qs)


# ---- gold resolution and a whole run over the tiny index ----------------------------------------------------------

def test_gold_resolution_rules(tiny_hash_index, tiny_site):
    index = loaded_index(str(tiny_hash_index))
    resolver = ev.GoldResolver(index, ev.live_rows(index))
    v2 = resolver.resolve(f"{BASE}/shop/v2/config.html")
    assert len(v2) == 1
    assert resolver.resolve("http://DOCS.example.com/shop/v2/config.html#tls") == v2  # scheme, case, fragment
    assert resolver.resolve("shop/v2/config.html") == v2
    assert resolver.resolve("/v2/config.html") == v2
    assert len(resolver.resolve("config.html")) == 2  # v2 and v3: a suffix may name several pages
    assert resolver.resolve("2/config.html") == frozenset()  # only at a path boundary
    assert resolver.resolve("shop/v3/index.html") == resolver.resolve("shop/v3/")  # index file = folder
    node_id = index.loaded.nodes["node_id"][next(iter(v2))]
    assert resolver.resolve(node_id) == v2
    assert resolver.resolve("shop/v9/nowhere.html") == frozenset()
    # The input file's path names the page too (its URL ends elsewhere when a base was inferred).
    assert resolver.resolve(f"{tiny_site.name}/shop/v2/config.html") == v2


def _write(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


TINY_QUESTIONS = [
    {"id": "ports3", "question": "Which port does version 3 listen on?", "gold": ["shop/v3/config.html"],
     "evidence": ["listens on port 9443"], "tags": ["lookalike"], "answer": "9443"},
    {"id": "rotate", "question": "How often do logs rotate?", "gold": ["shop/v3/logging.html", "shop/v3/missing.html"],
     "evidence": ["Logs rotate daily", "not in the page at all"], "tags": ["deep"]},
    {"id": "ghost", "question": "Where is the manual?", "gold": ["https://elsewhere.example/manual.html"]},
]


def test_evaluate_tiny_index(tiny_hash_index, tmp_path):
    index = loaded_index(str(tiny_hash_index))
    qs = ev.load_questions(_write(tmp_path / "q.jsonl", TINY_QUESTIONS))
    report = ev.evaluate(index, qs, ev.EvalConfig(max_calls=3))
    assert report["counts"] == {"questions": 3, "scored": 2, "unresolvable_questions": 1, "unresolvable_gold": 2}
    assert {(u["id"], tuple(u["gold"]), u["scored"]) for u in report["unresolvable"]} == {
        ("rotate", ("shop/v3/missing.html",), True), ("ghost", ("https://elsewhere.example/manual.html",), False)}
    by_id = {q["id"]: q for q in report["questions"]}
    sub = by_id["ports3"]["systems"]["subforest"]
    assert len(sub["read"]) == 2  # max_calls 3 = one GetToC + two Reads of one node
    assert sub["found"] and sub["rank"] >= 1 and sub["toc_tokens_json"] > sub["toc_tokens_outline"] > 0
    rotate = by_id["rotate"]["systems"]
    for name in ("subforest", "bm25", "dense", "chunks"):
        # "Logs rotate daily" is found only when the logging page was read
        assert rotate[name]["evidence_found"][1] is False
    assert by_id["ghost"]["scored"] is False
    assert report["overall"]["scored"] == 2 and report["by_tag"]["deep"]["scored"] == 1
    tree = by_id["ports3"]["systems"]["tree"]
    assert tree["found"] and tree["toc_nodes"] == 8  # the whole shop tree: 7 pages and the virtual "Guides"
    assert report["latency_ms"]["p50"] > 0
    assert {v["baseline"] for v in report["verdicts"]} == {"bm25", "dense", "chunks", "tree"}
    for q in report["questions"]:  # the focused readers spend up to the budget plain RAG set them, never past it
        systems = q["systems"]
        for name, multiple in ev.FOCUS_BUDGETS.items():
            assert systems[name]["read_tokens"] <= multiple * systems["chunks"]["read_tokens"]
            assert systems[name]["read"] == systems["subforest"]["read"][:len(systems[name]["read"])]
    overall = report["overall"]
    assert overall["focused2x"]["read_tokens"] >= overall["focused1x"]["read_tokens"]
    assert overall["chunks"]["evidence_per_1k_tokens"] == pytest.approx(
        1000 * overall["chunks"]["evidence_recall"] / overall["chunks"]["read_tokens"])


def test_a_focused_reader_never_spends_past_its_budget_on_text_dense_in_tokens():
    from types import SimpleNamespace

    from ritrag.serving.outline import count_tokens

    class DenseReads:  # Reads whose text costs about a token per character, four times the reader's guess
        loaded = SimpleNamespace(nodes={"node_id": ["a", "b", "c"]})

        def read(self, ids, max_chars, query):
            return {"nodes": [{"text": "".join(chr(0x4E00 + i * 7919 % 20000) for i in range(max_chars))}]}

    read, text = ev._focused_reading(DenseReads(), [0, 1, 2], "a question", 100)
    assert read[:1] == ["a"]
    assert 50 < count_tokens(text) <= 100


def test_reports_written_and_self_contained(tiny_hash_index, tmp_path):
    index = loaded_index(str(tiny_hash_index))
    report = ev.evaluate(index, ev.load_questions(_write(tmp_path / "q.jsonl", TINY_QUESTIONS)))
    paths = write_report(report, str(tmp_path / "out"))
    data = json.loads(Path(paths["json"]).read_text(encoding="utf-8"))
    assert data["counts"]["questions"] == 3 and len(data["questions"]) == 3
    page = Path(paths["html"]).read_text(encoding="utf-8")
    assert page.count("<svg") >= 4
    assert not re.search(r"<script|<link|<img|src=|href=|@import|url\(", page, re.IGNORECASE)
    text = render_text(report)
    assert "subforest" in text and "unresolvable gold" in text and "ghost" in text
    assert "Where the sub-forest wins" in render_html(report)


def test_agent_mode_aggregates_a_fake_agent(tiny_hash_index, tmp_path, monkeypatch):
    from ritrag.evaluation import agent as agent_module

    index = loaded_index(str(tiny_hash_index))
    gold = ev.GoldResolver(index, ev.live_rows(index))  # ids of pages, to script what the fake agent read
    v3_config = index.loaded.nodes["node_id"][next(iter(gold.resolve("shop/v3/config.html")))]
    v2_config = index.loaded.nodes["node_id"][next(iter(gold.resolve("shop/v2/config.html")))]
    logging_page = index.loaded.nodes["node_id"][next(iter(gold.resolve("shop/v3/logging.html")))]
    reads = {"ports3": [v3_config, v2_config], "rotate": [logging_page]}
    seen = []

    def fake_run_agent(service, question, **kw):
        qid = next(q["id"] for q in TINY_QUESTIONS if q["question"] == question)
        seen.append((qid, kw["max_calls"], kw["max_toc"]))
        return agent_module.AgentResult(question=question, answer="9443", nodes_read=reads[qid], calls=3,
                                        toc_calls=1, prompt_tokens=100, completion_tokens=10, latency_s=0.5,
                                        error=None)

    monkeypatch.setattr(agent_module, "run_agent", fake_run_agent)
    monkeypatch.setattr(agent_module, "judge_answer", lambda q, ref, ans, **kw: 1.0 if ref == ans else 0.0)
    config = ev.AgentConfig(base_url="http://127.0.0.1:9/v1", model="m", api_key="secret", max_toc=2,
                            judge_model="judge")
    report = ev.evaluate(index, ev.load_questions(_write(tmp_path / "q.jsonl", TINY_QUESTIONS)), agent=config)
    assert sorted(seen) == [("ports3", 10, 2), ("rotate", 10, 2)]  # the unscored question is not run
    by_id = {q["id"]: q["systems"]["agent"] for q in report["questions"] if q["scored"]}
    assert (by_id["ports3"]["precision"], by_id["ports3"]["recall"]) == (0.5, 1.0)
    assert (by_id["rotate"]["precision"], by_id["rotate"]["recall"], by_id["rotate"]["f1"]) == (1.0, 1.0, 1.0)
    assert by_id["ports3"]["judge"] == 1.0 and "judge" not in by_id["rotate"]  # no reference answer
    agg = report["overall"]["agent"]
    assert agg["precision"] == 0.75 and agg["calls"] == 3 and agg["judged"] == 1 and agg["errors"] == 0
    assert "secret" not in json.dumps(report)


# ---- the index and the CLI --------------------------------------------------------------------------------------

def test_index_without_node_table_is_refused(tiny_hash_index, tmp_path):
    with pytest.raises(ev.EvalInputError, match="no published version"):
        ev.open_index(str(tmp_path))
    copy = tmp_path / "copy"
    shutil.copytree(tiny_hash_index, copy)
    version = (copy / "CURRENT").read_text().strip()
    manifest_path = copy / "versions" / f"{version}.json"
    manifest = json.loads(manifest_path.read_text())
    for seg in manifest["segments"]:
        seg["files"] = {name: f for name, f in seg["files"].items() if not name.startswith("nodes-")}
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ev.EvalInputError, match="no node table"):
        ev.open_index(str(copy))


def test_cli_eval(tiny_hash_index, tmp_path, capsys):
    qfile = _write(tmp_path / "q.jsonl", TINY_QUESTIONS)
    assert cli.main(["eval", str(tiny_hash_index), qfile, "--out", str(tmp_path / "out"), "--max_calls", "4"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^subforest\s", out, re.MULTILINE) and "GetToC latency" in out
    assert (tmp_path / "out" / "eval.html").exists()
    assert json.loads((tmp_path / "out" / "eval.json").read_text())["config"]["max_calls"] == 4
    assert cli.main(["eval", str(tiny_hash_index), qfile, "--out", str(tmp_path / "o2"),
                     "--node_score", "max", "--path_weight", "0.25"]) == 0
    assert json.loads((tmp_path / "o2" / "eval.json").read_text())["config"]["retrieval"] == {
        "node_score": "max", "path_weight": 0.25}
    capsys.readouterr()
    assert cli.main(["eval", str(tiny_hash_index), qfile, "--node_score", "best"]) == 2
    assert "node_score must be one of" in json.loads(capsys.readouterr().err)["error"]["message"]

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "gold": ["a"]}\n{oops\n', encoding="utf-8")
    assert cli.main(["eval", str(tiny_hash_index), str(bad)]) == 2
    error = json.loads(capsys.readouterr().err)["error"]  # a refusal: one JSON line, as every sub-command's
    assert error["reason"] == "invalid_arguments" and "bad.jsonl: line 2: not valid JSON" in error["message"]
    (tmp_path / "empty.jsonl").write_text("")
    assert cli.main(["eval", str(tiny_hash_index), str(tmp_path / "empty.jsonl")]) == 2
    assert "no questions" in capsys.readouterr().err
    assert cli.main(["eval", str(tiny_hash_index), qfile, "--agent"]) == 2
    assert "--agent needs --base_url and --model" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_eval_on_the_sample_in_seconds(tmp_path, capsys):
    index = tmp_path / "sample"
    build_index(SAMPLE, index, "--embedding_model", "hashing:384")
    started = time.perf_counter()
    assert cli.main(["eval", str(index), str(ROOT / "sample" / "questions.jsonl")]) == 0
    assert time.perf_counter() - started < 60
    out = capsys.readouterr().out
    assert "58 questions, 58 scored, 0 with no resolvable gold" in out


def test_long_texts_are_counted_in_pieces_exactly(monkeypatch):
    """A whole site's ToC can exceed what the tokenizer encodes at once."""
    import random

    from ritrag.serving import outline

    rng = random.Random(0)
    words = ["config", "Server", "  ", "ünïcode", "x=1,", "\n", "id", '{"a":', "3.14", "the"]
    text = " ".join(rng.choice(words) for _ in range(3000))
    whole = outline.count_tokens(text)
    monkeypatch.setattr(outline, "MAX_PIECE", 57)
    assert outline.count_tokens(text) == whole


def test_a_count_axis_is_labelled_with_whole_numbers():
    from ritrag.evaluation.report import grouped_bars

    svg = grouped_bars(["rank 1", "rank 2"], {"subforest": [16.0, 3.0]}, "questions by rank")
    assert 'font-size="10">16</text>' in svg and "16.000" not in svg and "3.000" not in svg


def test_eval_measures_cross_links_and_gold_one_link_away(tmp_path):
    from test_anchor_field import write_linked_site

    index_dir = tmp_path / "linked"
    build_index(write_linked_site(tmp_path / "site"), index_dir, "--embedding_model", "hashing:384")
    question = {"id": "relay", "question": "delivery failures are logged", "gold": ["shop/relay.html"]}
    qs = ev.load_questions(_write(tmp_path / "q.jsonl", [question]))
    # One hit: the logs page (and its ancestor); the relay page it links to is one link away.
    report = ev.evaluate(ev.open_index(str(index_dir)), qs, ev.EvalConfig(n=1, max_calls=2))
    sub = report["questions"][0]["systems"]["subforest"]
    assert not sub["found"] and sub["found_see_also"] and sub["one_hop"] and sub["one_hop_linked"]
    assert sub["see_also_nodes"] >= 1 and sub["toc_tokens_outline_see_also"] > sub["toc_tokens_outline"]
    assert report["overall"]["subforest"]["one_hop"] == 1.0
    assert "gold the ToC missed is among its cross-links for 1" in render_text(report)

"""The committed development question set is well formed, and the mechanical
check (benchmarks/check_questions.py) catches what it claims to: tested on the
tiny site of conftest, and run on the real dev corpus where one is present."""
from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from support import DEV_CORPUS, benchmark_module

_check = benchmark_module("check_questions")
CorpusPages, check_evidence, check_format = _check.CorpusPages, _check.check_evidence, _check.check_format
load_questions, main, product_of = _check.load_questions, _check.main, _check.product_of

ROOT = Path(__file__).resolve().parent.parent
DEV = ROOT / "benchmarks" / "questions" / "dev.jsonl"
PRODUCTS = {"apache-httpd", "debian-reference", "django", "flask", "linux", "openjdk", "pandas",
            "postgresql", "python", "sphinx"}


def question(qid: str, gold: str, evidence: list[str], *tags: str, **extra) -> dict:
    product = gold.split("/", 1)[0]
    return {"id": qid, "question": f"question {qid}?", "gold": [gold], "evidence": evidence,
            "tags": [f"product:{product}", *tags], **extra}


def messages(problems) -> list[str]:
    return [f"{p.qid}: {p.message}" for p in problems]


def test_dev_set_is_well_formed_and_covers_the_corpus():
    questions, problems = load_questions(str(DEV))
    assert problems == []
    assert messages(check_format(questions)) == []
    per_product = collections.Counter(product_of(q) for q in questions)
    assert set(per_product) == PRODUCTS
    assert min(per_product.values()) >= 8
    assert len(questions) >= 120
    tags = collections.Counter(t for q in questions for t in q["tags"])
    assert tags["lookalike"] >= 30 and tags["deep"] >= 30
    # twins are mutual or at least point at another product or another page
    by_id = {q["id"]: q for q in questions}
    for q in questions:
        if "twin" in q:
            assert by_id[q["twin"]]["gold"] != q["gold"], q["id"]


def test_format_check_reports_each_kind_of_problem():
    good = question("a-1", "shop/v2/config.html", ["Version 2 listens on port 8080 by default."], "half:a")
    assert check_format([good, question("a-2", "shop/index.html", ["Shop Server sells widgets over HTTP."],
                                        "half:b")]) == []
    bad = [
        good, dict(good),  # duplicate id
        question("b-1", "shop/index.html", ["too short"], "half:a"),
        question("b-2", "shop/index.html", ["Shop Server sells widgets over HTTP."], "half:a", "shiny"),
        question("b-3", "shop/index.html", ["Shop Server sells widgets over HTTP."], "half:a", "lookalike"),
        question("b-4", "shop/index.html", ["Shop Server sells widgets over HTTP."], "half:a", twin="nope"),
        {"id": "b-5", "question": "no gold?", "evidence": [], "tags": []},
        question("b-6", "shop/index.html", ["Shop Server sells widgets over HTTP."], "half:a", extra_field=1),
    ]
    found = "\n".join(messages(check_format(bad)))
    for expected in ("a-1: duplicate id", "b-1: evidence of 2 words", "b-2: tags outside the vocabulary",
                     "b-3: a look-alike question names its twin", "b-4: a twin is given but",
                     "b-4: twin 'nope' is not another look-alike", "b-5: gold missing",
                     "b-6: unknown field", "product:shop: halves unbalanced"):
        assert expected in found


def test_evidence_check_passes_good_questions_and_fails_bad_ones(tiny_site):
    pages = CorpusPages(str(tiny_site), site_depth=1)
    good = [question("ok-1", "shop/v2/config.html", ["Version 2 listens on port 8080 by default."]),
            question("ok-2", "/shop/v3/guide/deploy.html", ["Run the shop image with two replicas"], "deep")]
    assert messages(check_evidence(good, pages)) == []
    bad = [
        question("e-1", "shop/v2/config.html", ["Version 3 listens on port 9443 with QUIC enabled."]),
        question("e-2", "shop/v4/config.html", ["Version 2 listens on port 8080 by default."]),
        {**question("e-3", "shop/v2/config.html", ["Version 2 listens on port 8080 by default."]),
         "gold": ["shop/v2/config.html", "shop/v3/logging.html"]},
        question("e-4", "shop/v3/guide/deploy.html", ["Run the shop image with two replicas"]),
        question("e-5", "shop/v2/config.html", ["Version 2 listens on port 8080 by default."], "deep"),
    ]
    found = messages(check_evidence(bad, pages))
    assert [m.split(":")[0] for m in found] == ["e-1", "e-2", "e-3", "e-4", "e-5"]
    assert "evidence not in any gold page" in found[0]
    assert "not a file of the corpus" in found[1]
    assert "'shop/v3/logging.html' holds none of the evidence" in found[2]
    assert "deep tag missing" in found[3] and "deep tag wrong" in found[4]


def test_evidence_matches_after_whitespace_normalization(tiny_site):
    q = question("ws-1", "shop/v3/logging.html", ["Logs  rotate\n daily;   keep fourteen files."])
    assert check_evidence([q], CorpusPages(str(tiny_site), site_depth=1)) == []


def test_command_exits_non_zero_and_names_the_line(tmp_path, tiny_site, capsys):
    path = tmp_path / "q.jsonl"
    ok = question("c-1", "shop/index.html", ["Shop Server sells widgets over HTTP."], "half:a")
    path.write_text(json.dumps(ok) + "\n{not json\n", encoding="utf-8")
    assert main([str(path), "--corpus", str(tiny_site)]) == 1
    assert "line 2: not JSON" in capsys.readouterr().err
    path.write_text(json.dumps(ok) + "\n", encoding="utf-8")
    assert main([str(path), "--corpus", str(tiny_site)]) == 0
    path.write_text("", encoding="utf-8")
    assert main([str(path), "--format_only"]) == 1


@pytest.mark.skipif(not (DEV_CORPUS / "manifest.tsv").is_file(),
                    reason="the dev corpus is not here (set RITRAG_DEV_CORPUS)")
def test_dev_set_evidence_occurs_in_the_dev_corpus():
    questions, _ = load_questions(str(DEV))
    assert messages(check_evidence(questions, CorpusPages(str(DEV_CORPUS), site_depth=1))) == []

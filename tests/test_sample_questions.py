"""The bundled sample's questions (sample/questions.jsonl) pass the mechanical
check against the sample itself: every gold page is one of sample/pages, every
evidence string is in a gold page's main text, tags and twins are consistent.
The commands the README and `make run` show ask about pages the sample has."""
from __future__ import annotations

import collections
import re
from pathlib import Path

from support import benchmark_module

_check = benchmark_module("check_questions")

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_QUESTIONS = ROOT / "sample" / "questions.jsonl"
PAGES = ROOT / "sample" / "pages"


def test_sample_questions_pass_the_check_against_the_sample():
    questions, problems = _check.load_questions(str(SAMPLE_QUESTIONS))
    problems += _check.check_format(questions)
    problems += _check.check_evidence(questions, _check.CorpusPages(str(PAGES), site_depth=1))
    assert [str(p) for p in problems] == []
    tags = collections.Counter(t for q in questions for t in q["tags"])
    # what makes the systems differ: look-alikes across products, deep pages
    assert tags["lookalike"] >= 20 and tags["deep"] >= 5
    assert {_check.product_of(q) for q in questions} == {p.name for p in PAGES.iterdir()}


def test_make_runs_question_is_a_sample_question():
    """`make run`'s one GetToC asks a question of the sample file, so its gold page is checked above."""
    question = re.search(r'ritrag toc \$\(INDEX\) "([^"]+)"', (ROOT / "Makefile").read_text(encoding="utf-8"))
    questions, _ = _check.load_questions(str(SAMPLE_QUESTIONS))
    assert question and question.group(1) in {q["question"] for q in questions}


def test_the_readme_example_gold_is_in_the_sample():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    example = re.search(r'"gold": \["([^"]+)"\]', readme)
    assert example and (PAGES / example.group(1)).is_file()

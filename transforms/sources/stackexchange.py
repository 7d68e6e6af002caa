"""A Stack Exchange data dump's `Posts.xml` (`<posts>` of `<row>`s) -> one page
per question and per answer, read as a stream (lxml iterparse: each row is
cleared once read, so no tree of the dump is ever held).

* The file's own page is the forum's question list, at `<folder>/questions`
  (where Stack Exchange lists them, the folder's URL standing for the site's),
  without text; its summary counts what the file holds.
* A question (PostTypeId 1) is a page at `<folder>/questions/<Id>`, record
  `post-<Id>`, titled by its Title, under its first tag when it has tags (a
  virtual node at `<folder>/questions/tagged/<tag>`, where Stack Exchange lists
  a tag): trail method "tag", else "questions". All its tags are its keywords;
  its summary gives its score and, when one is accepted, the accepted answer.
* An answer (PostTypeId 2) is a page at `<folder>/a/<Id>` (Stack Exchange's
  answer link) under its question (`ParentId`, trail method "answer_to"),
  titled "Answer <Id>" or "Accepted answer <Id>"; its summary gives its score.
  Under a question, answers go the way Stack Exchange shows them: the accepted
  one first, then by score, then by id. An answer whose question the file does
  not hold sits under the question list ("answer_to_missing", counted by the
  build's trail_taken_* counters).
* Text: the post's rendered HTML (`Body`) reduced to plain text. Rows of other
  post types (tag wikis, moderator nominations, ...) and rows without a numeric
  Id are no questions or answers: they are counted in the question list's
  summary, not indexed.
"""
from __future__ import annotations

import io
import posixpath
import re

from lxml import etree

from ritrag.schema import Crumb, ParsedPage, Section
from ritrag.transforms.sources.common import SourceFile, UnparseablePage, document_page, html_text
from ritrag.transforms.sources.nav import document_trail

QUESTION, ANSWER = "1", "2"
_TAG = re.compile(r"<([^<>]+)>")


def _tags(value: str) -> tuple[str, ...]:
    """Tags as dumps write them: `<a><b>` (older) or `|a|b|` (newer)."""
    return tuple(_TAG.findall(value)) if "<" in value else tuple(t for t in value.split("|") if t)


def _score(row: dict) -> int:
    try:
        return int(row.get("Score") or 0)
    except ValueError:
        return 0


def read_posts(data: bytes) -> tuple[dict[str, dict], int]:
    """(questions and answers by Id, in file order; the number of other rows),
    streamed; UnparseablePage("invalid_xml") if the XML is broken."""
    posts: dict[str, dict] = {}
    others = 0
    try:
        for _, element in etree.iterparse(io.BytesIO(data), events=("end",), tag="row",
                                          resolve_entities=False, no_network=True, huge_tree=True):
            row = dict(element.attrib)
            element.clear(keep_tail=False)
            if row.get("PostTypeId") in (QUESTION, ANSWER) and row.get("Id", "").isdigit():
                posts[row["Id"]] = row
            else:
                others += 1
    except etree.XMLSyntaxError as exc:
        raise UnparseablePage("invalid_xml", str(exc)) from exc
    return posts, others


def _title(question: dict) -> str:
    return question.get("Title") or f"Question {question['Id']}"


def _answer_order(answers: list[dict], accepted: str | None) -> list[dict]:
    return sorted(answers, key=lambda a: (a["Id"] != accepted, -_score(a), int(a["Id"])))


def parse_stackexchange(file: SourceFile) -> list[tuple[str | None, ParsedPage]]:
    posts, others = read_posts(file.data)
    questions = {i: p for i, p in posts.items() if p["PostTypeId"] == QUESTION}
    answers = [p for p in posts.values() if p["PostTypeId"] == ANSWER]
    if not posts:
        raise UnparseablePage("no_content", f"a Stack Exchange Posts.xml without questions or answers "
                                            f"({others} rows of other types)")
    folder = posixpath.dirname(file.url)
    forum_url = f"{folder}/questions"
    trail, method, _, _ = document_trail(file)
    forum = Crumb("Questions", forum_url)
    answers_of: dict[str, list[dict]] = {}
    for answer in answers:
        answers_of.setdefault(answer.get("ParentId", ""), []).append(answer)

    def url_of(post: dict) -> str:
        return f"{forum_url}/{post['Id']}" if post["PostTypeId"] == QUESTION else f"{folder}/a/{post['Id']}"

    def question_trail(question: dict) -> tuple[Crumb, ...]:
        tags = _tags(question.get("Tags", ""))
        return (*trail, forum) + ((Crumb(tags[0], f"{forum_url}/tagged/{tags[0]}"),) if tags else ())

    summary = f"{_count(len(questions), 'question')}, {_count(len(answers), 'answer')}"
    out: list[tuple[str | None, ParsedPage]] = [(None, document_page(
        file, url=forum_url, title="Questions", trail=trail, trail_method=method,
        description=summary + (f"; rows of other post types, not indexed: {others}" if others else ""),
        sections=(Section("Questions", 0, "", ""),)))]
    for qid, question in questions.items():
        title = _title(question)
        tags = _tags(question.get("Tags", ""))
        accepted = question.get("AcceptedAnswerId")
        ordered = _answer_order(answers_of.get(qid, []), accepted)
        described = f"score {_score(question)}, {_count(len(ordered), 'answer')}" + (
            f", accepted answer {accepted}" if accepted and accepted in posts else "")
        out.append((f"post-{qid}", document_page(
            file, url=url_of(question), title=title, trail=question_trail(question),
            trail_method="tag" if tags else "questions",
            description=described, keywords=tags, nav_order=tuple(url_of(a) for a in ordered),
            sections=(Section(title, 0, "", html_text(question.get("Body", ""))),))))
    for answer in answers:
        question = questions.get(answer.get("ParentId", ""))
        is_accepted = question is not None and question.get("AcceptedAnswerId") == answer["Id"]
        title = f"{'Accepted answer' if is_accepted else 'Answer'} {answer['Id']}"
        if question is None:
            crumbs, answer_method = (*trail, forum), "answer_to_missing"
        else:
            crumbs = (*question_trail(question), Crumb(_title(question), url_of(question)))
            answer_method = "answer_to"
        out.append((f"post-{answer['Id']}", document_page(
            file, url=url_of(answer), title=title, trail=crumbs, trail_method=answer_method,
            description=("accepted answer, " if is_accepted else "") + f"score {_score(answer)}",
            sections=(Section(title, 0, "", html_text(answer.get("Body", ""))),))))
    return out


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"

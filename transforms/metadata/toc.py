"""The contract of a model-induced table of contents for a long PDF
(PageIndex's flow, `--induce_toc llm`): what the model is shown of a
document, what it must answer, and how its headings are checked before they
cut sections. docs/METADATA.md quotes the prompt.

* Windows: the PDF's page texts in order, each opened by its `[p. N]` marker
  (the parser's: transforms/sources/pdf.py), packed into windows of at most
  WINDOW_CHARS characters; a page longer than that fills a window alone, cut
  at WINDOW_CHARS (its tail is not shown, so no heading is proposed there). A
  document of more than MAX_WINDOWS windows is not asked: the stage's cost is
  bounded per document. Each window is one question, asked in page order: its
  user message is the window's text, after the window's first, preceded by
  the last headings the model proposed for the windows before it (at most
  CONTEXT_HEADINGS, within CONTEXT_CHARS characters), as PageIndex passes the
  ToC found so far, so that numbering and levels continue across windows. The
  cache key (model, TOC_PROMPT_VERSION, the user message) names everything the
  model saw.
* The answer (`parse_toc_answer`): one JSON object `{"headings": [{"title":
  str, "level": int, "page": int}, ...]}`, parsed as strictly as the node
  metadata's; more than MAX_HEADINGS_PER_WINDOW headings, a level outside 1 to
  MAX_LEVELS, a title past MAX_TITLE_CHARS: the window's answer is refused.
* Verification (`verified_headings`): a heading is kept only if its title
  occurs in the text of the page it names (whitespace collapsed, case
  folded), that page shown in its window, at or after the previous kept
  heading (pages non-decreasing, and within a page in text order); any other is
  dropped and counted; a kept heading takes the page's own spelling, and the
  section is cut where it matched. Not on a neighbouring page either: the model saw the
  markers, so a heading named on the wrong page is a misreading, and cutting
  there would misplace a section. Then as any outline: the first level is 1
  and a level deepens by at most one (a deeper one is raised to that), at most
  MAX_OUTLINE_ENTRIES_PER_PAGE per page of the document. Fewer than
  MIN_HEADINGS left: the PDF keeps the sections it had.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from ritrag.transforms.metadata.base import MetadataFailure, answer_json, question_key
from ritrag.transforms.sources.pdf import MAX_OUTLINE_ENTRIES_PER_PAGE, page_marker
from ritrag.transforms.sources.pdf_layout import MAX_LEVELS, MIN_HEADINGS

TOC_PROMPT_VERSION = "pdf-toc-v2"
WINDOW_CHARS = 12000  # about 3,000 tokens of English: a small model's context holds the window and the answer
MAX_WINDOWS = 64  # per document: at most 64 questions (768,000 characters shown, some 250 dense pages)
MAX_HEADINGS_PER_WINDOW = 100
MAX_TITLE_CHARS = 200
ANSWER_TOKENS = 2048  # max_tokens asked per window: 100 headings of about 20 tokens
# The headings so far shown with a window: the last few are what numbering and
# levels continue from; more would grow every question of a long document.
CONTEXT_HEADINGS = 8
CONTEXT_CHARS = 1000
CONTEXT_HEADER = "Headings so far, the last of those listed for the pages before these:"

TOC_SYSTEM_PROMPT = (
    "You read pages of a long document and list the headings printed in them, as its table of contents "
    "would. Every page opens with a marker line [p. N], N its page number. Answer with one JSON object and "
    'nothing else: {"headings": [{"title": "<the heading, copied exactly as printed>", "level": <1 for a '
    'part or chapter, 2 for a section in it, 3 for a subsection, ...>, "page": <N of the page it is printed '
    "on>}]}, in reading order. List only headings printed in the pages shown; not running headers or "
    f"footers, page numbers, captions or the entries of a printed table of contents. At most "
    f'{MAX_HEADINGS_PER_WINDOW} headings; {{"headings": []}} when the pages show none. When the pages follow '
    f'earlier ones, the last headings listed for those come first, after "{CONTEXT_HEADER}": continue their '
    "numbering and levels, and do not list them again.")


@dataclasses.dataclass(frozen=True)
class Window:
    """One question about a document: pages first..last (0-based indexes), as the model is shown them."""

    first: int
    last: int
    text: str

    def user_message(self, so_far: Sequence[ProposedHeading]) -> str:
        """The window's text after the last of the headings proposed `so_far` (module doc)."""
        context = context_lines(so_far)
        return f"{CONTEXT_HEADER}\n{context}\n\n{self.text}" if context else self.text

    def messages(self, so_far: Sequence[ProposedHeading]) -> list[dict[str, str]]:
        return [{"role": "system", "content": TOC_SYSTEM_PROMPT},
                {"role": "user", "content": self.user_message(so_far)}]

    def key(self, model: str, so_far: Sequence[ProposedHeading]) -> str:
        return question_key(model, TOC_PROMPT_VERSION, self.user_message(so_far))


@dataclasses.dataclass(frozen=True)
class ProposedHeading:
    level: int
    title: str
    page: int  # 1-based, as the markers number pages


def context_lines(so_far: Sequence[ProposedHeading]) -> str:
    """The last CONTEXT_HEADINGS of the headings proposed so far, one line each,
    fewer when their lines would pass CONTEXT_CHARS; "" when there are none."""
    lines: list[str] = []
    size = 0
    for heading in reversed(so_far[-CONTEXT_HEADINGS:]):
        line = f"- level {heading.level}, p. {heading.page}: {heading.title}"
        if size + len(line) + 1 > CONTEXT_CHARS:
            break
        lines.append(line)
        size += len(line) + 1
    return "\n".join(reversed(lines))


def windows(texts: list[str]) -> list[Window]:
    """A document's page texts as windows (module doc), in page order."""
    packed: list[Window] = []
    first, parts, size = 0, [], 0
    for index, text in enumerate(texts):
        page = f"{page_marker(index + 1)}\n{text}"[:WINDOW_CHARS]
        if parts and size + 2 + len(page) > WINDOW_CHARS:
            packed.append(Window(first, index - 1, "\n\n".join(parts)))
            first, parts, size = index, [], 0
        size += len(page) + (2 if parts else 0)
        parts.append(page)
    if parts:
        packed.append(Window(first, len(texts) - 1, "\n\n".join(parts)))
    return packed


def parse_toc_answer(content: str) -> tuple[ProposedHeading, ...]:
    """The headings in a model's message, checked (module doc); MetadataFailure
    when it is not exactly what was asked."""
    value = answer_json(content)
    if not isinstance(value, dict) or set(value) != {"headings"} or not isinstance(value["headings"], list):
        raise MetadataFailure("not an object of exactly a headings list")
    items = value["headings"]
    if len(items) > MAX_HEADINGS_PER_WINDOW:
        raise MetadataFailure(f"{len(items)} headings, more than {MAX_HEADINGS_PER_WINDOW}")
    headings = []
    for item in items:
        if not isinstance(item, dict) or set(item) != {"title", "level", "page"}:
            raise MetadataFailure("a heading that is not an object of exactly title, level and page")
        title, level, page = " ".join(str(item["title"]).split()), item["level"], item["page"]
        if not isinstance(item["title"], str) or not title or len(title) > MAX_TITLE_CHARS:
            raise MetadataFailure(f"a title that is not a string of 1 to {MAX_TITLE_CHARS} characters")
        if type(level) is not int or not 1 <= level <= MAX_LEVELS or type(page) is not int or page < 1:
            raise MetadataFailure(f"a level outside 1 to {MAX_LEVELS}, or a page that is not a page number")
        headings.append(ProposedHeading(level, title, page))
    return tuple(headings)


def toc_answer_fields(headings: tuple[ProposedHeading, ...]) -> dict[str, list[dict]]:
    """A checked answer as the model gave it (what the cache keeps and `parse_toc_answer` reads back)."""
    return {"headings": [dataclasses.asdict(h) for h in headings]}


def _folded(text: str) -> tuple[str, list[int]]:
    """`text` with whitespace runs collapsed to one space and case folded, and
    where each of its characters comes from in `text` (to give back the
    page's own spelling of what matched)."""
    chars: list[str] = []
    offsets: list[int] = []
    for match in re.finditer(r"\S+", text):
        if chars:
            chars.append(" ")
            offsets.append(match.start() - 1)
        for at in range(match.start(), match.end()):
            folded = text[at].casefold()  # may be longer than the character: "ß" -> "ss"
            chars.append(folded)
            offsets.extend([at] * len(folded))
    return "".join(chars), offsets


def verified_headings(proposed: list[tuple[int, int, tuple[ProposedHeading, ...]]],
                      texts: list[str]) -> tuple[list[tuple[int, str, int, str]], int]:
    """((level, title, page index, the page's text it matched) of the proposed
    headings that pass, in order, the title as the page spells it; how many
    were dropped) of each window's (first page index, last page index,
    headings), windows in page order (module doc)."""
    folded: dict[int, tuple[str, list[int]]] = {}  # page index -> its folded text, made once each
    kept: list[tuple[int, str, int, str]] = []
    dropped, at = 0, 0  # `at`: where in its page's folded text the last kept heading was found
    cap = MAX_OUTLINE_ENTRIES_PER_PAGE * len(texts)
    for first, last, headings in proposed:
        for heading in headings:
            index = heading.page - 1
            last_page = kept[-1][2] if kept else 0
            if not first <= index <= last or index < last_page or len(kept) >= cap:
                dropped += 1
                continue
            if index not in folded:
                folded[index] = _folded(texts[index])
            page, offsets = folded[index]
            title = heading.title.casefold()
            found = page.find(title, at if kept and index == last_page else 0)
            if found < 0:
                dropped += 1
                continue
            matched = texts[index][offsets[found]:offsets[found + len(title) - 1] + 1]
            level = min(heading.level, kept[-1][0] + 1 if kept else 1)
            kept.append((level, " ".join(matched.split()), index, matched))
            at = found + 1
    return kept, dropped


def enough_headings(headings: list[tuple[int, str, int, str]]) -> bool:
    """Whether verified headings make a table of contents: at least MIN_HEADINGS, as the layout's must."""
    return len(headings) >= MIN_HEADINGS

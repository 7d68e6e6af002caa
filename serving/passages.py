"""A focused Read: a node's text as passages, the most relevant to a query first.

Whole nodes are what the method reads, but a node can hold 20,000 characters
of which one paragraph answers (issue 27: the method read 15x the tokens of
plain RAG for the same evidence). With a query, Read returns the node's
passages in the order of their BM25 relevance to it (the index's own idf and
analyzer, `ritrag.bm25.text_scores`), as many as fit in `max_chars`, each with
its character offset in the node's text: the agent sees where each passage
sits and can Read on in order from any offset (a Read without a query).

Passages are cut at read time: a paragraph each (a short one joined to the
next, a long one cut at spaces), so that a passage is scored on its own words
and their offsets are exact whatever the index's chunking was.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
import numpy as np

from ritrag.analyzer import analyze
from ritrag.bm25 import Bm25, text_scores

PASSAGE_CHARS = 1_200  # a long paragraph is cut into pieces of at most this
# A shorter paragraph (a heading line, a one-line lead-in) joins the paragraph
# after it, so that a passage is never a bare heading.
MIN_PASSAGE_CHARS = 200
_BREAK = re.compile(r"\n\s*\n")
SKIP_MARK = "\n[…]\n"  # between passages that are not adjacent in the node's text


@dataclass(frozen=True)
class Focused:
    """The passages chosen, in the order shown: (offset, text) each."""

    passages: list[tuple[int, str]]
    skipped_chars: int  # of the node's text, not shown

    @property
    def text(self) -> str:
        return SKIP_MARK.join(text for _, text in self.passages)


def split_passages(text: str, max_chars: int = PASSAGE_CHARS) -> list[tuple[int, int]]:
    """(start, end) of consecutive passages covering `text`'s paragraphs: a
    paragraph each, one shorter than MIN_PASSAGE_CHARS joined to the next, one
    longer than `max_chars` cut at spaces."""
    paragraphs, start = [], 0
    for match in _BREAK.finditer(text):
        paragraphs.append((start, match.start()))
        start = match.end()
    paragraphs.append((start, len(text)))
    spans: list[tuple[int, int]] = []
    for lo, hi in paragraphs:
        while hi - lo > max_chars:  # a paragraph past the size: cut at the last space that fits
            cut = text.rfind(" ", lo + 1, lo + max_chars)
            cut = cut if cut > lo else lo + max_chars
            spans.append((lo, cut))
            lo = cut
        if hi <= lo:
            continue
        if spans and spans[-1][1] - spans[-1][0] < MIN_PASSAGE_CHARS and hi - spans[-1][0] <= max_chars:
            spans[-1] = (spans[-1][0], hi)
        else:
            spans.append((lo, hi))
    return spans


def focus(text: str, query: str, bm25: Bm25, max_chars: int) -> Focused:
    """The passages of `text` most relevant to `query`, best first (ties in
    text order), as many as fit in `max_chars` (at least one, cut to fit)."""
    spans = split_passages(text)
    if not spans:
        return Focused([], 0)
    scores = text_scores(bm25, analyze(query), [analyze(text[lo:hi]) for lo, hi in spans])
    order = np.lexsort((np.arange(len(spans)), -scores))  # score descending, then position
    chosen: list[tuple[int, str]] = []
    used = 0
    for i in order:
        lo, hi = spans[i]
        room = max_chars - used - len(SKIP_MARK) * bool(chosen)
        if room <= 0:
            break
        if hi - lo > room:
            if chosen:
                continue  # a smaller passage further down may still fit
            hi = lo + room
        chosen.append((lo, text[lo:hi]))
        used += hi - lo + len(SKIP_MARK) * (len(chosen) > 1)
    shown = sum(len(t) for _, t in chosen)
    return Focused(chosen, len(text) - shown)

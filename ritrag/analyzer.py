"""The BM25 text analyzer, identical at index and query time.

Unicode NFKC normalization, case folding, alphanumeric tokens (identifiers such
as `max_connections` or `os.path` split into their parts), English stop words
removed, Snowball (Porter2) stemming through PyStemmer.
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from functools import lru_cache

import Stemmer

_TOKEN_RE = re.compile(r"[^\W_]+", re.UNICODE)
MAX_TOKEN_CHARS = 40  # longer runs are hashes, base64 blobs or minified code

STOP_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been
    before being below between both but by can could did do does doing down during each
    few for from further had has have having he her here hers herself him himself his how
    i if in into is it its itself just me more most my myself no nor not now of off on
    once only or other our ours ourselves out over own same she should so some such than
    that the their theirs them themselves then there these they this those through to too
    under until up very was we were what when where which while who whom why will with
    would you your yours yourself yourselves""".split()
)


@lru_cache(maxsize=1)
def _stemmer() -> "Stemmer.Stemmer":
    stemmer = Stemmer.Stemmer("english")
    stemmer.maxCacheSize = 100_000
    return stemmer


def analyze(text: str) -> list[str]:
    """Terms of `text` in order, for BM25 (index and query alike)."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    tokens = [
        t for t in _TOKEN_RE.findall(folded) if len(t) <= MAX_TOKEN_CHARS and t not in STOP_WORDS
    ]
    return _stemmer().stemWords(tokens)


def term_frequencies(text: str) -> tuple[Counter, int]:
    """(term -> count, document length in terms) of one chunk."""
    terms = analyze(text)
    return Counter(terms), len(terms)

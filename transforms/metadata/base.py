"""The contract of the metadata stage: what a model is asked of a node, what it
must answer, and how an answer is checked.

A node is described from its own text and its title path (site root > ... >
node title): the model writes a summary of at most MAX_SUMMARY_WORDS words and
at most MAX_KEYWORDS keywords, as one JSON object `{"summary": str, "keywords":
[str, ...]}`. The prompt is versioned (PROMPT_VERSION): a change of its words
changes every cache key (transforms/metadata/cache.py), so answers to an old
prompt are never taken for answers to a new one. docs/METADATA.md quotes it.

Answers are parsed strictly (`parse_answer`): the message must be that JSON
object (a ```json fence around it is allowed, nothing else), with a non-empty
summary; a summary or keyword list past its limit is refused, not cut, because
a model that ignores the limit has likely ignored the rest of the instructions.
A refused answer is a counted failure (`MetadataFailure`), never an exception
out of the job.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Generic, Protocol, Sequence, TypeVar

from ritrag.schema import NodeRow

Answer = TypeVar("Answer")  # what a question's checked answer is: a node's NodeMetadata, a PDF window's headings
PROMPT_VERSION = "node-metadata-v1"
MAX_SUMMARY_WORDS = 60
MAX_KEYWORDS = 8
MAX_KEYWORD_CHARS = 64
# What of a node's body is sent: enough for a summary, bounded so that one
# huge node costs a bounded request (the rest is not read by the model).
MAX_BODY_CHARS = 6000

SYSTEM_PROMPT = (
    "You describe one section of a documentation site for a search index. "
    "You are given the section's title path (site > ... > section) and its text. "
    f"Answer with one JSON object and nothing else: "
    f'{{"summary": "<what the section covers, at most {MAX_SUMMARY_WORDS} words>", '
    f'"keywords": ["<at most {MAX_KEYWORDS} keywords or short phrases a reader would search for>"]}}. '
    "Use only what the text says; do not repeat the title path in the summary.")
USER_PROMPT = "Title path: {path}\n\nText:\n{body}"


@dataclasses.dataclass(frozen=True)
class NodeMetadata:
    """What the model says of one node."""

    summary: str
    keywords: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class MetadataRequest:
    """What is asked of one node: its cache key and the prompt's inputs."""

    key: str
    path: str
    body: str

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": USER_PROMPT.format(path=self.path, body=self.body)}]


@dataclasses.dataclass(frozen=True)
class ModelAnswer(Generic[Answer]):
    """One question's outcome: the checked answer (`value`: a node's metadata,
    a window's headings), or why there is none (`failure`), and what the asking
    cost (requests made, tokens in and out as the endpoint reported them)."""

    value: Answer | None
    failure: str | None = None  # a reason word: timeout, http_status, too_large, malformed, ...
    requests: int = 0
    tokens_in: int = 0
    tokens_out: int = 0


class MetadataFailure(Exception):
    """An answer that is not the metadata asked for."""

    def __init__(self, message: str, reason: str = "malformed"):
        super().__init__(message)
        self.reason = reason


class NodeMetadataModel(Protocol):
    """A backend: asks its model for the metadata of each request. It never
    raises for one node's failure: that node's answer says why."""

    def describe(self, requests: Sequence[MetadataRequest]) -> list[ModelAnswer[NodeMetadata]]:
        """One answer per request, in order."""
        ...

    def close(self) -> None:
        ...


def node_text(node: NodeRow) -> str:
    """A node's own text, what its cache key is taken of: its title and body
    (not its ancestors: a page moved without changing is not asked again)."""
    return f"{node.title.strip()}\n{node.body}"


def question_key(model: str, prompt_version: str, text: str) -> str:
    """The cache key of a question: BLAKE2b of the model, the prompt version and
    the text asked about (transforms/metadata/cache.py)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (model, prompt_version, text):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()


def metadata_key(model: str, node: NodeRow) -> str:
    """The cache key of a node's metadata: of the model, the prompt version and
    the node's own text."""
    return question_key(model, PROMPT_VERSION, node_text(node))


def answer_json(content: str) -> object:
    """The JSON value of a model's message (a ```json fence around it is
    allowed, nothing else); MetadataFailure when it is not one."""
    text = content.strip()
    if text.startswith("```"):
        first, _, rest = text.partition("\n")
        if first.strip() not in ("```", "```json") or not rest.rstrip().endswith("```"):
            raise MetadataFailure("a fenced answer that is not one JSON block")
        text = rest.rstrip()[:-3].strip()
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser goes
        raise MetadataFailure(f"not JSON: {type(exc).__name__}") from None


def parse_answer(content: str) -> NodeMetadata:
    """The metadata in a model's message, checked (module docstring);
    MetadataFailure when it is not exactly what was asked."""
    value = answer_json(content)
    if not isinstance(value, dict) or set(value) != {"summary", "keywords"}:
        raise MetadataFailure("not an object of exactly summary and keywords")
    summary, keywords = value["summary"], value["keywords"]
    if not isinstance(summary, str) or not summary.split():
        raise MetadataFailure("summary is not a non-empty string")
    if len(summary.split()) > MAX_SUMMARY_WORDS:
        raise MetadataFailure(f"summary of {len(summary.split())} words, more than {MAX_SUMMARY_WORDS}")
    if not isinstance(keywords, list) or not all(isinstance(k, str) for k in keywords):
        raise MetadataFailure("keywords is not a list of strings")
    keywords = [" ".join(k.split()) for k in keywords if k.split()]
    if len(keywords) > MAX_KEYWORDS or any(len(k) > MAX_KEYWORD_CHARS for k in keywords):
        raise MetadataFailure(f"more than {MAX_KEYWORDS} keywords, or one longer than {MAX_KEYWORD_CHARS} chars")
    return NodeMetadata(" ".join(summary.split()), tuple(dict.fromkeys(keywords)))

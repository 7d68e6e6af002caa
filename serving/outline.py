"""A compact text form of the query-induced sub-forest, and token counts.

METHOD.md names "a compressed string form of the sub-forest" as future work:
the JSON repeats every key name on every node, while an indented outline says
the same with one line per node:

    Shop Server [4p7spzvs7o5i] *3
      Version 3 [npy23mw5bpxq]
        Configuring the server [txj3lyipebls] *1

Two spaces per level, the id in brackets, `*r` on hits (r = rank by score, 1 =
best), summary and keywords after the title when the index has them. Token
counts use OpenAI's o200k_base encoding (bpe-openai ships it, so nothing is
downloaded); benchmarks/RESULTS.md compares both forms over many queries.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

TOKENIZER = "o200k_base"


def toc_json_text(toc: dict[str, Any]) -> str:
    """The JSON text an agent is sent for a ToC: compact, UTF-8 as is."""
    return json.dumps(toc, ensure_ascii=False, separators=(",", ":"))


def render_outline(trees: list[dict[str, Any]]) -> str:
    """The sub-forest `trees` (as `RitragIndex.get_toc` returns them) as an
    indented outline, one line per node, trees and children in their order."""
    hits: list[tuple[float, str]] = []
    stack = list(trees)
    while stack:
        node = stack.pop()
        if node.get("hit"):
            hits.append((-node.get("score", 0.0), node["id"]))
        stack.extend(node.get("children", ()))
    rank = {node_id: r for r, (_, node_id) in enumerate(sorted(hits), start=1)}

    lines: list[str] = []

    def emit(node: dict[str, Any], depth: int) -> None:
        line = f"{'  ' * depth}{' '.join(node['title'].split())} [{node['id']}]"
        if node["id"] in rank:
            line += f" *{rank[node['id']]}"
        if node.get("summary"):
            line += f" - {' '.join(node['summary'].split())}"
        if node.get("keywords"):
            line += f" ({', '.join(node['keywords'])})"
        lines.append(line)
        for child in node.get("children", ()):
            emit(child, depth + 1)

    for tree in trees:
        emit(tree, 0)
    return "\n".join(lines)


@lru_cache(maxsize=1)
def _encoding():
    import bpe_openai

    return bpe_openai.get_encoding(TOKENIZER)


def count_tokens(text: str) -> int:
    """Tokens of `text` in `TOKENIZER`."""
    return len(_encoding().encode(text, disallowed_special=()))  # "<|endoftext|>" in a page is text

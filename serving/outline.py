"""The outline: a compact text form of the query-induced sub-forest, its
parser, the per-answer handles it names nodes by, and token counts.

docs/METHOD.md names "a compressed string form of the sub-forest" as future work.
JSON repeats every key on every node and spells out 12-character ids and
float scores; the outline says the same with one short line per node:

    a1 Shop Server
     a2*2 Version 3
      a3*1✓ Configuring the server	summary: Ports and TLS	keywords: port, tls
       → see: a5 Logging	a6 Upgrading from version 2
      a4*3 … (advanced)

One line per node, trees and children in their order (pre-order), and under a
hit with cross-links (`see_also`: nodes elsewhere in the forest that its page
links to or is linked from, ritrag.serving.links) one `→ see:` line. A node
line is

    INDENT LABEL [*RANK] [✓] " " TITLE [TAB "summary: " SUMMARY] [TAB "keywords: " K1, K2, ...]

* INDENT: one space per level below the tree's root; a line's parent is the
  nearest line above it with one space less.
* LABEL: what Read accepts for the node. Within an episode a handle: the
  answer's letters (a = the episode's first outline answer, b = the second,
  ..., z, aa, ab, ...) and the node's number (1 = first line; the node lines
  first, then the cross-links in the order they appear, `outline_ids`), e.g.
  `b7`; a handle is at most 8 characters, so it is never a node id (always
  `ritrag.ids.NODE_ID_CHARS` = 12). Without an episode, the node id itself.
* `*RANK`: the node is a hit; RANK orders the hits by score (1 = best). Lines
  without it are ancestors of hits, there for the hierarchy.
* `✓`: the node was already returned by Read in this episode.
* TITLE: whitespace collapsed to single spaces. `…` at its start stands for
  the parent's title (a child titled "Getting started tutorials" under
  "Getting started" shows as `… tutorials`); a title that itself begins with
  `…` or a backslash is written with a backslash in front.
* Summary and keywords (when the index has them) follow after tabs, which
  titles never contain.
* `depth: D` (after a tab, last) marks a node shown higher than it sits: a
  tree is shown at most `ritrag.schema.MAX_TREE_DEPTH` levels deep (`cap_depth`).

A cross-link line follows its hit's line, one level deeper (before the hit's
children), and is

    INDENT "→ see: " LABEL " " TITLE [TAB LABEL " " TITLE] ...

with the related nodes' labels (as above) and whole titles, whitespace
collapsed. No node line starts with `→`: labels are ids or handles.

`parse_outline` reads this back into trees; the tests check that it recovers
the JSON's nodes, titles, hits, hit order, cross-links and tree shape. Token counts use
OpenAI's o200k_base encoding (bpe-openai ships it, so nothing is downloaded);
benchmarks/toc_tokens.py compares the forms over many queries.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, Collection, Iterator, Sequence

from ritrag.schema import MAX_TREE_DEPTH

TOKENIZER = "o200k_base"
INDENT = " "
READ_MARK = "✓"
PARENT_MARK = "…"
ESCAPE = "\\"
MIN_TRIMMED_CHARS = 6  # shorter parent titles are not worth a mark
HANDLE = re.compile(r"([a-z]{1,3})([1-9][0-9]{0,4})")  # letters (answer) + line number: at most 8 chars
SEE_MARK = "→ see:"
_LINE = re.compile(rf"({INDENT}*)([^\s*{READ_MARK}]+)(?:\*([1-9][0-9]*))?({READ_MARK})? (.*)")
_SEE_LINE = re.compile(rf"({INDENT}*){SEE_MARK} (.+)")


def toc_json_text(toc: dict[str, Any]) -> str:
    """The JSON text an agent is sent for a ToC: compact, UTF-8 as is."""
    return json.dumps(toc, ensure_ascii=False, separators=(",", ":"))


def preorder(trees: Sequence[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], int]]:
    """(node, depth) of every node, in outline order."""
    stack = [(tree, 0) for tree in reversed(trees)]
    while stack:
        node, depth = stack.pop()
        yield node, depth
        stack.extend((child, depth + 1) for child in reversed(node.get("children") or ()))


def cap_depth(trees: Sequence[dict[str, Any]], max_depth: int = MAX_TREE_DEPTH) -> None:
    """Show `trees` (in place) at most `max_depth` levels below their roots:
    the descendants of each node at depth `max_depth - 1` become its children,
    in pre-order, each deeper than `max_depth` marked with its true `depth`.

    The build places no node deeper (`MAX_TREE_DEPTH`), but the serving side
    does not rely on it: an index built before that policy may hold chains
    thousands of levels deep, and nested JSON that deep breaks serializers
    (pydantic refuses 254 levels of a model, the MCP SDK 126 levels of a
    tree, `json` about 490). The outline shows the same capped trees: lines
    stay short, and since pre-order is unchanged, handles and hit ranks are
    those of the full tree."""
    frontier = [node for node, depth in preorder(trees) if depth == max_depth - 1 and node.get("children")]
    for node in frontier:
        lifted = []
        stack = [(child, max_depth) for child in reversed(node["children"])]
        while stack:
            below, depth = stack.pop()
            children = below.pop("children", ())
            if depth > max_depth:
                below["depth"] = depth
            lifted.append(below)
            stack.extend((child, depth + 1) for child in reversed(children))
        node["children"] = lifted


def hit_ranks(trees: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Node id -> rank of each hit by score (1 = best; ties by id)."""
    hits = sorted((-node.get("score", 0.0), node["id"]) for node, _ in preorder(trees) if node.get("hit"))
    return {node_id: rank for rank, (_, node_id) in enumerate(hits, start=1)}


def answer_letters(ordinal: int) -> str:
    """The letters of an episode's `ordinal`-th (0-based) outline answer: a..z,
    aa..zz, aaa..zzz, then around again (handles of an answer that old are
    long forgotten; see `ritrag.serving.budget.EpisodeMemory`)."""
    ordinal %= 26 + 26 ** 2 + 26 ** 3
    width = 1
    while ordinal >= 26 ** width:
        ordinal -= 26 ** width
        width += 1
    letters = []
    for _ in range(width):
        ordinal, digit = divmod(ordinal, 26)
        letters.append(chr(ord("a") + digit))
    return "".join(reversed(letters))


def is_handle(label: str) -> bool:
    return HANDLE.fullmatch(label) is not None


def outline_ids(trees: Sequence[dict[str, Any]]) -> list[str]:
    """The node ids an outline of `trees` numbers, in order: every node line
    (pre-order), then each cross-link (`see_also`) in the order the lines
    show them. Node i's handle is the answer's letters and i."""
    lines = [node["id"] for node, _ in preorder(trees)]
    return lines + [link["id"] for node, _ in preorder(trees) for link in node.get("see_also", ())]


def render_outline(trees: Sequence[dict[str, Any]], *, handle_letters: str | None = None,
                   read: Collection[str] = ()) -> str:
    """The sub-forest `trees` (as `RitragIndex.get_toc` returns them) as an
    outline. `handle_letters`: label node i of `outline_ids(trees)` with that
    prefix and i (the caller keeps those ids to resolve them); none: label
    nodes with their ids. `read`: ids to mark as read."""
    ranks = hit_ranks(trees)
    see_number = sum(1 for _ in preorder(trees))  # cross-links are numbered after the last node line
    lines: list[str] = []
    parent_titles: list[str] = []  # by depth, along the current path
    for number, (node, depth) in enumerate(preorder(trees), start=1):
        title = " ".join(node["title"].split())
        del parent_titles[depth:]
        parent = parent_titles[-1] if parent_titles else ""
        parent_titles.append(title)
        label = f"{handle_letters}{number}" if handle_letters is not None else node["id"]
        rank = ranks.get(node["id"])
        line = (f"{INDENT * depth}{label}{f'*{rank}' if rank else ''}{READ_MARK if node['id'] in read else ''} "
                f"{_shown_title(title, parent)}")
        if node.get("summary"):
            line += f"\tsummary: {' '.join(node['summary'].split())}"
        if node.get("keywords"):
            line += f"\tkeywords: {', '.join(' '.join(k.split()) for k in node['keywords'])}"
        if node.get("depth"):
            line += f"\tdepth: {node['depth']}"
        lines.append(line)
        if node.get("see_also"):
            entries = []
            for link in node["see_also"]:
                see_number += 1
                entries.append(f"{handle_letters}{see_number} " if handle_letters is not None else f"{link['id']} ")
                entries[-1] += " ".join(link["title"].split())
            lines.append(f"{INDENT * (depth + 1)}{SEE_MARK} " + "\t".join(entries))
    return "\n".join(lines)


def _shown_title(title: str, parent: str) -> str:
    if len(parent) >= MIN_TRIMMED_CHARS and len(title) > len(parent) and title.startswith(parent):
        return PARENT_MARK + title[len(parent):]
    if title.startswith((PARENT_MARK, ESCAPE)):
        return ESCAPE + title
    return title


def parse_outline(text: str) -> list[dict[str, Any]]:
    """Trees from an outline: per node `label`, `title` (in full), `rank`
    (None unless a hit), `read`, `summary`, `keywords` and `depth` when shown,
    `see_also` ({label, title} of each cross-link) when it has any, and
    `children`. Raises ValueError on a line that is not outline."""
    roots: list[dict[str, Any]] = []
    path: list[dict[str, Any]] = []
    for number, line in enumerate(text.split("\n") if text else (), start=1):
        see = _SEE_LINE.fullmatch(line)
        if see is not None:
            if not path or len(see.group(1)) != len(path) or "see_also" in path[-1] or path[-1]["children"]:
                raise ValueError(f"line {number}: a {SEE_MARK} line must follow its node's line, one level deeper")
            links = [entry.partition(" ") for entry in see.group(2).split("\t")]
            path[-1]["see_also"] = [{"label": label, "title": title} for label, _, title in links]
            continue
        match = _LINE.fullmatch(line)
        if match is None or len(match.group(1)) > len(path):
            raise ValueError(f"line {number} is not an outline line: {line[:80]!r}")
        depth = len(match.group(1))
        del path[depth:]
        title, *fields = match.group(5).split("\t")
        if title.startswith(ESCAPE):
            title = title[1:]
        elif title.startswith(PARENT_MARK):
            if not path:
                raise ValueError(f"line {number}: {PARENT_MARK} on a root line, which has no parent")
            title = path[-1]["title"] + title[1:]
        node: dict[str, Any] = {"label": match.group(2), "title": title,
                                "rank": int(match.group(3)) if match.group(3) else None,
                                "read": bool(match.group(4)), "children": []}
        for field in fields:
            name, _, value = field.partition(": ")
            node[name] = value.split(", ") if name == "keywords" else int(value) if name == "depth" else value
        (path[-1]["children"] if path else roots).append(node)
        path.append(node)
    return roots


@lru_cache(maxsize=1)
def _encoding():
    import bpe_openai

    return bpe_openai.get_encoding(TOKENIZER)


MAX_PIECE = 100_000  # characters encoded at once: bpe-openai refuses 1M characters or 200k tokens in one call


def count_tokens(text: str) -> int:
    """Tokens of `text` in `TOKENIZER`. A longer text than `MAX_PIECE` (a
    whole site's table of contents) is counted in pieces cut before a single
    space between two non-spaces: the encoding's pre-tokenizer starts a new
    word there, so the pieces add up to the count of the whole."""
    encode = _encoding().encode
    total, start = 0, 0
    while len(text) - start > MAX_PIECE:
        end = start + MAX_PIECE
        cut = text.rfind(" ", start + 1, end)
        while cut > start and (text[cut - 1].isspace() or text[cut + 1].isspace()):
            cut = text.rfind(" ", start + 1, cut)
        cut = cut if cut > start else end  # no word boundary in the piece: cut anyway
        total += len(encode(text[start:cut], disallowed_special=()))
        start = cut
    return total + len(encode(text[start:], disallowed_special=()))  # "<|endoftext|>" in a page is text

"""GetToC and Read as served to agents: the one implementation behind the HTTP
and MCP faces.

`ToolService` checks a call against the server's `Limits`, charges the
episode's budget, runs the Python API (`RitragIndex`) and renders the result;
anything it refuses raises a `ToolError` with a reason. The faces only move
arguments in and results or errors out.

Within an episode it also remembers what the episode saw (`EpisodeMemory`):
an outline answer names its nodes, cross-links included, by short handles
(`ritrag.serving.outline`) that Read resolves for that episode only, and
GetToC marks the nodes Read returned
(`read: true`, `✓` in the outline) or, with `collapse_read`, leaves out every
node whose subtree holds no hit the episode has not read.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Literal, Mapping, Sequence

from pydantic import BaseModel, ValidationError

from ritrag.flags import option
from ritrag.serving.api import (DEFAULT_K, DEFAULT_MAX_CHARS, DEFAULT_N, RitragIndex, check_read_arguments,
                         check_toc_arguments)
from ritrag.serving.budget import GET_TOC, READ, EpisodeBudgets, EpisodeMemory
from ritrag.serving.errors import ToolError
from ritrag.serving.links import DEFAULT_CROSS_LINKS
from ritrag.serving.outline import (TOKENIZER, cap_depth, count_tokens, is_handle, outline_ids, preorder,
                                    render_outline, toc_json_text)
from ritrag.serving.tool_models import TOOLS

TocFormat = Literal["json", "outline", "both"]
DEFAULT_TOC_FORMAT: TocFormat = "json"  # what GetToC shows, the command line and a model, unless asked


@dataclass(frozen=True)
class TocCall:
    """One GetToC call as `ritrag toc` makes it: its query and flags, with
    GetToC's defaults."""

    query: str = option(help="what to look for", positional=True)
    k: int = option(DEFAULT_K, "chunks recalled per retriever (k')")
    n: int = option(DEFAULT_N, "nodes kept")
    format: TocFormat = option(DEFAULT_TOC_FORMAT, "json: the trees; outline: one line per node, labelled by node id (for "
                                       "ritrag read); both: JSON with the outline and the token counts of each")
    cross_links: bool = option(DEFAULT_CROSS_LINKS, "hits list related nodes elsewhere that their pages link to or "
                                                    "are linked from (see_also)", choices=("on", "off"))


@dataclass(frozen=True)
class ReadCall:
    """One Read call as `ritrag read` makes it: its node ids and flags, with
    Read's defaults."""

    node_ids: tuple[str, ...] = option(help="node ids from a GetToC answer", positional=True)
    max_chars: int = option(DEFAULT_MAX_CHARS, "characters of body text per node (a longer body carries next_offset)")
    offset: int = option(0, "where in each body to start (a next_offset)")
    query: str | None = option(None, "a body longer than --max_chars comes as its passages most relevant to this "
                                     "query, best first, with their offsets")


@dataclass(frozen=True)
class Limits:
    """What one call may ask for; a call over a limit is refused, not cut."""

    max_query_chars: int = 1_000
    max_ids_per_read: int = 20
    max_id_chars: int = 64
    max_chars_per_node: int = DEFAULT_MAX_CHARS  # also Read's default max_chars
    max_k: int = 1_000
    max_n: int = 200
    max_request_bytes: int = 64 * 1024  # HTTP bodies, MCP included


def invalid_arguments(errors: Sequence[Mapping[str, Any]]) -> ToolError:
    """Pydantic's errors (`loc`, `msg`) as `invalid_arguments`, without
    echoing the input, which may be huge."""
    fields = [{"field": "(body)" if e["type"] == "json_invalid"
               else ".".join(str(p) for p in e["loc"] if p != "body") or "(body)", "message": e["msg"]}
              for e in errors][:20]
    return ToolError("invalid_arguments", "; ".join(f"{e['field']}: {e['message']}" for e in fields),
                     errors=fields)


class ToolService:
    """GetToC and Read over one loaded index, with limits and episode budgets."""

    def __init__(self, index: RitragIndex, limits: Limits = Limits(), budgets: EpisodeBudgets | None = None,
                 k: int = DEFAULT_K, n: int = DEFAULT_N, toc_format: TocFormat = DEFAULT_TOC_FORMAT,
                 episodes: EpisodeMemory | None = None, cross_links: bool = DEFAULT_CROSS_LINKS):
        self.index = index
        self.limits = limits
        self.budgets = budgets if budgets is not None else EpisodeBudgets()
        self.episodes = episodes if episodes is not None else EpisodeMemory()
        self.k = k
        self.n = n
        self.toc_format = toc_format
        self.cross_links = cross_links

    def get_toc(self, query: str, *, k: int | None = None, n: int | None = None,
                format: TocFormat | None = None, episode_id: str | None = None,
                collapse_read: bool | None = None, cross_links: bool | None = None) -> dict[str, Any]:
        """GetToC with the server's defaults for what is not given; `format`
        json (trees), outline (text) or both (with token counts of each);
        `cross_links`: hits list related nodes elsewhere (`see_also`).
        In an episode, nodes it has read are marked, or left out with
        `collapse_read` (see `mark_read`); its outline labels nodes, the
        cross-links too, by handles."""
        lim = self.limits
        k, n = (self.k if k is None else k), (self.n if n is None else n)
        check_toc_arguments(query, k, n)  # the arguments' one check: what follows asks the index unchecked
        if not query.strip():
            raise ToolError("invalid_arguments", "query is empty", errors=[{"field": "query", "message": "empty"}])
        _check_limit("query", len(query), lim.max_query_chars, "characters")
        _check_limit("k", k, lim.max_k)
        _check_limit("n", n, lim.max_n)
        budget = self._charge(episode_id, GET_TOC)
        toc = self.index.answer_toc(query, k, n,
                                    cross_links=self.cross_links if cross_links is None else cross_links)
        cap_depth(toc["trees"])  # every face answers every tree, whatever depth the index holds
        read = self.episodes.read_ids(episode_id)
        if read or collapse_read:
            toc["trees"], left_out = mark_read(toc["trees"], read, collapse_read or False)
            if collapse_read:
                toc["hits"] -= left_out
                toc["collapsed"] = left_out
        fmt = format or self.toc_format
        if fmt != "json":
            letters = self.episodes.issue_handles(episode_id, outline_ids(toc["trees"])) if episode_id else None
            toc["outline"] = render_outline(toc["trees"], handle_letters=letters, read=read)
        if fmt == "both":
            toc["tokens"] = {"tokenizer": TOKENIZER, "outline": count_tokens(toc["outline"]),
                             "json": count_tokens(toc_json_text({key: v for key, v in toc.items()
                                                                 if key != "outline"}))}
        elif fmt == "outline":
            del toc["trees"]
        if budget:
            toc["budget"] = budget
        return toc

    def read(self, node_ids: Sequence[str], *, offset: int | None = None, max_chars: int | None = None,
             episode_id: str | None = None, query: str | None = None) -> dict[str, Any]:
        """Read; refused with `unknown_ids` when none of the ids exist (a mix
        of known and unknown ids answers the known ones and lists the rest),
        and with `unknown_handles` when a handle is not one the episode's
        outline answers issued (or still keeps)."""
        lim = self.limits
        if not node_ids:
            raise ToolError("invalid_arguments", "node_ids is empty",
                            errors=[{"field": "node_ids", "message": "empty"}])
        _check_limit("node_ids", len(node_ids), lim.max_ids_per_read, "ids")
        max_chars = lim.max_chars_per_node if max_chars is None else max_chars
        offset = 0 if offset is None else offset
        check_read_arguments(node_ids, max_chars, offset)
        too_long = [i for i in node_ids if len(i) > lim.max_id_chars]
        if too_long:
            raise ToolError("invalid_arguments", f"node ids are at most {lim.max_id_chars} characters",
                            errors=[{"field": "node_ids", "message": "id too long"}])
        _check_limit("max_chars", max_chars, lim.max_chars_per_node, "characters")
        handle_of = self._resolve_handles(node_ids, episode_id)
        budget = self._charge(episode_id, READ)
        if query is not None:
            _check_limit("query", len(query), lim.max_query_chars, "characters")
        result = self.index.read([handle_of.get(i, i) for i in node_ids], max_chars=max_chars, offset=offset or 0,
                                 query=query)
        if handle_of:
            id_handle: dict[str, str] = {}
            for handle, node_id in handle_of.items():
                id_handle.setdefault(node_id, handle)
            for node in result["nodes"]:
                if node["id"] in id_handle:
                    node["handle"] = id_handle[node["id"]]
        if episode_id and result["nodes"]:
            self.episodes.mark_read(episode_id, [node["id"] for node in result["nodes"]])
        if not result["nodes"]:
            raise ToolError("unknown_ids", "none of these node ids exist in the index; take ids from GetToC",
                            unknown_ids=result["unknown_ids"][:20], **({"budget": budget} if budget else {}))
        if budget:
            result["budget"] = budget
        return result

    def call(self, tool: str, arguments: Mapping[str, Any], episode_id: str | None = None) -> dict[str, Any]:
        """A tool call as an agent makes it: the tool's name and its arguments
        (validated against the tool's schema)."""
        if tool not in TOOLS:
            raise ToolError("unknown_tool", f"no tool {tool!r}; the tools are {', '.join(TOOLS)}")
        model: type[BaseModel] = TOOLS[tool][0]
        try:
            args = model.model_validate(arguments)
        except ValidationError as exc:
            raise invalid_arguments(exc.errors()) from None
        if tool == GET_TOC:
            return self.get_toc(args.query, episode_id=episode_id, collapse_read=args.collapse_read)
        return self.read(args.node_ids, offset=args.offset, episode_id=episode_id, query=args.query)

    @staticmethod
    def text_of(result: dict[str, Any]) -> str:
        """What a model reads of a result: the outline of a ToC when the result
        has one and no trees, else the JSON (a static method: the adapters
        render a remote server's results with it too)."""
        if "outline" in result and "trees" not in result:
            header = f"GetToC {result['version']}: {result['hits']} hits (*rank)"
            if result.get("collapsed"):
                header += f", {result['collapsed']} already read left out"
            if "budget" in result:
                header += f"; budget left: {result['budget']['calls_left']} calls, " \
                          f"{result['budget']['get_toc_left']} GetToC"
            return header + "\n" + result["outline"]
        return toc_json_text(result)

    def _charge(self, episode_id: str | None, tool: str) -> dict[str, Any] | None:
        return self.budgets.charge(episode_id, tool) if episode_id else None

    def _resolve_handles(self, node_ids: Sequence[str], episode_id: str | None) -> dict[str, str]:
        """Handle -> node id for the handles among `node_ids`; refused with
        `unknown_handles` (what to do instead) if any is not the episode's."""
        handles = [i for i in node_ids if is_handle(i)]
        if not handles:
            return {}
        resolved, unknown = self.episodes.resolve(episode_id, handles)
        if unknown:
            where = ("this call names no episode" if not episode_id else
                     f"episode {episode_id!r} has no outline answer that listed them (or no longer keeps it)")
            raise ToolError("unknown_handles", f"unknown handles {', '.join(unknown[:5])}: {where}. Handles such "
                            "as b7 hold only within the episode whose GetToC outline listed them: call GetToC "
                            "again in this episode and use its handles, or pass full node ids.",
                            unknown_handles=unknown[:20])
        return resolved


def mark_read(trees: list[dict[str, Any]], read: Collection[str], collapse: bool
              ) -> tuple[list[dict[str, Any]], int]:
    """Mark the nodes in `read` (`read: true`); with `collapse`, leave out
    every node whose subtree, itself included, holds no hit outside `read`
    (a read node above unread hits stays, marked). Returns the trees and
    how many hits were left out."""
    def walk(node: dict[str, Any]) -> bool:  # whether the subtree holds an unread hit
        if node["id"] in read:
            node["read"] = True
        children = node.get("children", [])
        holds = [walk(child) for child in children]
        if collapse and not all(holds):
            kept = [child for child, unread in zip(children, holds) if unread]
            if kept:
                node["children"] = kept
            else:
                del node["children"]
        return (node["hit"] and node["id"] not in read) or any(holds)

    hits_before = sum(node["hit"] for node, _ in preorder(trees))
    kept = [tree for tree in trees if walk(tree) or not collapse]
    return kept, hits_before - sum(node["hit"] for node, _ in preorder(kept))


def _check_limit(field: str, value: int, limit: int, unit: str = "") -> None:
    if value > limit:
        amount = f"{value} {unit}" if unit else str(value)
        raise ToolError("limit_exceeded", f"{field}: {amount}, over the limit of {limit}", field=field, limit=limit)

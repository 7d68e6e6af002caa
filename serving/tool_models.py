"""The tools' contract: argument and result models, and the tool definitions
every face publishes from them.

The argument models are what an agent fills in; `strict_schema` turns them into
JSON Schemas valid for OpenAI strict function calling (every property
required, optional ones nullable, no additional properties), which Anthropic's
tool use and MCP accept as they are. The HTTP request models extend the
argument models with what a program, not a model, sets (k, n, output format,
episode id), so the two cannot drift apart.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ritrag.flags import option
from ritrag.schema import MAX_TREE_DEPTH
from ritrag.serving.budget import GET_TOC, READ
from ritrag.serving.outline import PARENT_MARK, READ_MARK, SEE_MARK

EPISODE_META_KEY = "ritrag/episode_id"  # MCP: the request's _meta key naming the episode


class GetTocArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(description="What to look for: a question or keywords. Each call searches the whole "
                                   "corpus afresh, so rewrite the query to look somewhere else.")
    collapse_read: bool | None = Field(
        default=None, description="true: leave out what this episode has already read: every node whose subtree "
                                  "(itself included) holds no hit that Read has not returned yet. null or false: "
                                  "show everything, nodes already read marked.")


class ReadArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node_ids: list[str] = Field(description="The nodes to read, as GetToC listed them: node ids, or the outline's "
                                            "handles (such as b7) from this episode's GetToC answers.")
    offset: int | None = Field(default=None, ge=0, strict=True,
                               description="Character offset to start at: a node's next_offset from an "
                                           "earlier Read, to continue a cut text; null to read from the start.")
    query: str | None = Field(default=None, description=(
        "What you look for in these nodes: a text longer than the size limit then comes as its passages most "
        "relevant to the query, best first, each with its offset (Read again with that offset and no query "
        "to read on in order from there); null: the text in order."))


TOOLS: dict[str, tuple[type[BaseModel], str]] = {
    GET_TOC: (GetTocArgs, (
        "Find where the answer is. Returns a table of contents of the documentation: the sections that best "
        "match the query (the hits) inside their trees of ancestors (product, version, chapter), each with an id "
        "and a title. No text: choose the nodes worth reading and pass them to Read. Nodes already read in this "
        "episode are marked. It comes as JSON trees (id, title, hit, score, read, children) or as an outline, "
        "one line per node: one leading space per level below the root (a line's parent is the nearest line "
        "above with one space less); the node's id or a handle such as b7 (Read takes either; handles hold "
        f"within this episode); *R on hits, R = rank (1 = best); {READ_MARK} if already read; a space; the title. "
        f"A title starting with {PARENT_MARK} continues its parent's title ({PARENT_MARK} tutorials under "
        f"Getting started means Getting started tutorials). A hit may list related nodes elsewhere that its page "
        f"links to or is linked from (JSON see_also; in the outline a {SEE_MARK} line under the hit, handle and "
        "title of each, tab-separated); Read takes them like any node.")),
    READ: (ReadArgs, (
        "Read the text of nodes chosen from GetToC, by node id or by outline handle (this episode's only): for "
        "each its id, title, ancestor path, URL and text. A text cut at the size limit carries next_offset: "
        "call Read again with that id and offset to continue. Ids that do not exist are listed in unknown_ids; "
        "handles this episode did not issue are refused (call GetToC again, or pass full node ids).")),
}


class EpisodeField(BaseModel):
    episode_id: str | None = Field(default=None, min_length=1, max_length=128,
                                   description="Counts the call against this episode's budget; none: not counted.")


class TocRequest(GetTocArgs, EpisodeField):
    k: int | None = Field(default=None, ge=1, strict=True,
                          description="Chunks recalled per retriever (default: the server's).")
    n: int | None = Field(default=None, ge=1, strict=True, description="Nodes kept (default: the server's).")
    format: Literal["json", "outline", "both"] = Field(
        default="json", description="json: the sub-forest as trees; outline: an indented text outline; both: "
                                    "both, with their token counts.")
    cross_links: bool | None = Field(default=None, description="false: no related nodes (see_also) under the "
                                                               "hits; null: the server's --cross_links.")


class ReadRequest(ReadArgs, EpisodeField):
    max_chars: int | None = Field(default=None, ge=1, strict=True,
                                  description="Characters per node (default: the server's).")


class BudgetLeft(BaseModel):
    episode_id: str
    calls_left: int
    get_toc_left: int


class SeeAlso(BaseModel):
    id: str
    title: str


class TocNode(BaseModel):
    id: str
    title: str
    summary: str | None = None
    keywords: list[str] | None = None
    hit: bool
    score: float | None = None
    read: bool | None = None
    depth: int | None = Field(default=None, description=(
        f"Set on a node shown higher than it sits: trees are shown at most {MAX_TREE_DEPTH} levels deep, the "
        "nodes below listed in order under their ancestor at the last level shown, each with its true depth."))
    see_also: list[SeeAlso] | None = Field(default=None, description=(
        "On a hit: nodes outside the ToC that its page links to or is linked from, best first."))
    children: list[TocNode] | None = None


class TokenCounts(BaseModel):
    tokenizer: str
    json_: int = Field(alias="json")
    outline: int


class TocResult(BaseModel):
    query: str
    version: str
    hits: int
    collapsed: int | None = None
    trees: list[TocNode] | None = None
    outline: str | None = None
    tokens: TokenCounts | None = None
    budget: BudgetLeft | None = None


class PassageRef(BaseModel):
    offset: int
    chars: int


class ReadNode(BaseModel):
    id: str
    handle: str | None = None
    title: str
    path: list[str]
    url: str | None
    text: str
    total_chars: int
    next_offset: int | None = None
    passages: list[PassageRef] | None = None  # a focused Read: where each passage of `text` starts in the node
    skipped_chars: int | None = None  # a focused Read: characters of the node not shown


class ReadResult(BaseModel):
    version: str
    nodes: list[ReadNode]
    unknown_ids: list[str]
    budget: BudgetLeft | None = None


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")
    reason: str
    message: str


class ErrorResult(BaseModel):
    error: ErrorDetail


RESULTS: dict[str, type[BaseModel]] = {GET_TOC: TocResult, READ: ReadResult}


def strict_schema(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s JSON Schema in the form OpenAI strict mode requires: every
    object lists all its properties as required and allows no others; an
    optional property stays nullable instead; titles and defaults go."""
    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            if key in ("properties", "$defs"):  # maps of names, whatever the names are
                out[key] = {name: walk(sub) for name, sub in value.items()}
            elif key not in ("title", "default"):
                out[key] = walk(value)
        if out.get("type") == "object":
            out["required"] = list(out.get("properties", {}))
            out["additionalProperties"] = False
        return out

    return walk(model.model_json_schema())


ToolDialect = Literal["openai", "anthropic", "mcp"]


@dataclass(frozen=True)
class ToolListing:
    """The definitions `ritrag tools` prints: its flag."""

    format: ToolDialect = option("openai", "the schema dialect")


def tool_definitions(fmt: ToolDialect = "mcp") -> list[dict[str, Any]]:
    """GetToC and Read as `fmt` expects them: OpenAI chat-completions function
    tools with strict mode, Anthropic tools, or MCP tools (with output schemas)."""
    out = []
    for name, (args, description) in TOOLS.items():
        schema = strict_schema(args)
        if fmt == "openai":
            out.append({"type": "function", "function": {"name": name, "description": description,
                                                         "parameters": schema, "strict": True}})
        elif fmt == "anthropic":
            out.append({"name": name, "description": description, "input_schema": schema})
        elif fmt == "mcp":
            out.append({"name": name, "description": description, "inputSchema": schema,
                        "outputSchema": RESULTS[name].model_json_schema(by_alias=True)})
        else:
            raise ValueError(f"unknown tool format {fmt!r}: openai, anthropic or mcp")
    return out

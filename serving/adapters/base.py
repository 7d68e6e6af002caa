"""The contract every framework adapter builds on: a tools backend, and the
episode's calls over it.

A `ToolsBackend` answers `get_toc` and `read` as `ToolService` does, with
the same keyword arguments, results and `ToolError`s: the local
`ToolService` is one, `RemoteTools` (a client of `ritrag serve`'s /v1/toc and
/v1/read) the other. Limits and episode budgets are the backend's: the
adapters add none and lift none, so a call over the budget gets the refusal
every face gives.

`EpisodeTools` is what an agent framework's tools wrap: GetToC and Read by
their names in `ritrag.serving.tool_models.TOOLS` (whose argument models and
descriptions the adapters publish unchanged), arguments validated by those
models, every call charged to one episode id, each answer the text a model
reads (`ToolService.text_of`) or, refused, the error's JSON. `retrieve` is
what the retrievers return: GetToC's best hits, read.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import httpx
from pydantic import ValidationError

from ritrag.serving.api import RitragIndex
from ritrag.serving.budget import GET_TOC
from ritrag.serving.errors import STATUS, ToolError, checked_int
from ritrag.serving.outline import hit_ranks, preorder, toc_json_text
from ritrag.serving.tool_models import TOOLS
from ritrag.serving.tools import TocFormat, ToolService, invalid_arguments

DEFAULT_DOCUMENTS = 4  # a retriever's documents per query (LangChain's vector-store retrievers return 4)
TIMEOUT_S = 60.0  # one HTTP call to `ritrag serve`, embedding and retrieval included


@runtime_checkable
class ToolsBackend(Protocol):
    """GetToC and Read, as `ToolService` answers them."""

    def get_toc(self, query: str, *, format: TocFormat | None = None, episode_id: str | None = None,
                collapse_read: bool | None = None) -> dict[str, Any]: ...

    def read(self, node_ids: Sequence[str], *, offset: int | None = None, max_chars: int | None = None,
             episode_id: str | None = None, query: str | None = None) -> dict[str, Any]: ...


class RemoteTools:
    """The tools of a `ritrag serve` server at `base_url` (POST /v1/toc and
    /v1/read); its refusals raise as the `ToolError`s it sent, and a server
    that does not answer is `not_ready`. `api_key`: the server's
    RITRAG_API_KEY, when it requires one."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = TIMEOUT_S,
                 client: httpx.Client | None = None):
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.Client(timeout=timeout_s)

    def get_toc(self, query: str, *, k: int | None = None, n: int | None = None, format: TocFormat | None = None,
                episode_id: str | None = None, collapse_read: bool | None = None,
                cross_links: bool | None = None) -> dict[str, Any]:
        return self._post("/v1/toc", query=query, k=k, n=n, format=format, episode_id=episode_id,
                          collapse_read=collapse_read, cross_links=cross_links)

    def read(self, node_ids: Sequence[str], *, offset: int | None = None, max_chars: int | None = None,
             episode_id: str | None = None, query: str | None = None) -> dict[str, Any]:
        return self._post("/v1/read", node_ids=list(node_ids), offset=offset, max_chars=max_chars,
                          episode_id=episode_id, query=query)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteTools:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _post(self, path: str, **fields: Any) -> dict[str, Any]:
        url = self.base_url + path
        body = {key: value for key, value in fields.items() if value is not None}  # unset: the server's default
        try:
            response = self._client.post(url, json=body, headers=self._headers)
        except httpx.HTTPError as exc:
            raise ToolError("not_ready", f"ritrag serve at {self.base_url} did not answer: "
                                         f"{type(exc).__name__}: {exc}") from None
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if response.status_code == 200 and isinstance(payload, dict):
            return payload
        error = payload.get("error") if isinstance(payload, dict) else None
        if isinstance(error, dict) and error.get("reason") in STATUS:
            details = {key: value for key, value in error.items() if key not in ("reason", "message")}
            raise ToolError(error["reason"], str(error.get("message", "")), **details)
        raise ToolError("internal_error", f"{url} answered HTTP {response.status_code}, not a ritrag result")


def tools_backend(target: str | os.PathLike[str] | ToolsBackend, api_key: str | None = None) -> ToolsBackend:
    """A backend for `target`: a `ritrag serve` URL (http:// or https://) is
    its `RemoteTools`; an index directory is a `ToolService` loaded here, with
    the default limits and budgets; a backend is itself."""
    if isinstance(target, ToolsBackend):
        return target
    target = os.fspath(target)
    if target.startswith(("http://", "https://")):
        return RemoteTools(target, api_key=api_key)
    return ToolService(RitragIndex(target))


def error_text(error: ToolError) -> str:
    """A refusal as the model reads it: the error's JSON, as the MCP face
    and `ritrag agent` send it."""
    return toc_json_text(error.to_dict())


def validation_error_text(exc: ValidationError) -> str:
    """Arguments a tool's model refused, as the service's `invalid_arguments`."""
    return error_text(invalid_arguments(exc.errors()))


class EpisodeTools:
    """GetToC and Read for one episode over `backend`: each call validated by
    the tool's argument model and charged to `episode_id` (None: calls are
    not counted); `toc_format` json or outline (None: the backend's default,
    json over HTTP)."""

    def __init__(self, backend: ToolsBackend, episode_id: str | None = None, toc_format: TocFormat | None = None):
        self.backend = backend
        self.episode_id = episode_id
        self.toc_format = toc_format

    def call(self, tool: str, arguments: Mapping[str, Any] | str) -> dict[str, Any]:
        """The result of `tool` (a name in TOOLS) on `arguments`, a mapping or
        the JSON text a model wrote; refusals raise `ToolError`."""
        model = TOOLS[tool][0]
        try:
            args = model.model_validate_json(arguments) if isinstance(arguments, str) else \
                model.model_validate(arguments)
        except ValidationError as exc:
            raise invalid_arguments(exc.errors()) from None
        if tool == GET_TOC:
            return self.backend.get_toc(args.query, collapse_read=args.collapse_read, format=self.toc_format,
                                        episode_id=self.episode_id)
        return self.backend.read(args.node_ids, offset=args.offset, query=args.query, episode_id=self.episode_id)

    def answer(self, tool: str, arguments: Mapping[str, Any] | str) -> tuple[str, dict[str, Any]]:
        """(the text a model reads, the result) of a call; a refusal is
        (`error_text`, the error as a dict)."""
        try:
            result = self.call(tool, arguments)
        except ToolError as error:
            return error_text(error), error.to_dict()
        return ToolService.text_of(result), result


def retrieve(backend: ToolsBackend, query: str, *, documents: int = DEFAULT_DOCUMENTS,
             episode_id: str | None = None, max_chars: int | None = None) -> list[dict[str, Any]]:
    """GetToC's `documents` best hits, read (two calls of the episode): each
    Read node (id, title, path of ancestor titles root first, url, text,
    total_chars, next_offset when cut at `max_chars`) with its GetToC `score`
    and `rank` (1 = best), best first. `documents` is at most the backend's
    ids per Read (20 by default)."""
    checked_int("documents", documents, 1)
    toc = backend.get_toc(query, format="json", episode_id=episode_id)
    ranks = hit_ranks(toc["trees"])
    best = sorted(ranks, key=ranks.__getitem__)[:documents]
    if not best:
        return []
    scores = {node["id"]: node.get("score") for node, _ in preorder(toc["trees"]) if node.get("hit")}
    nodes = backend.read(best, max_chars=max_chars, episode_id=episode_id)["nodes"]
    return [{**node, "score": scores[node["id"]], "rank": ranks[node["id"]]} for node in nodes]


def metadata_of(node: dict[str, Any]) -> dict[str, Any]:
    """A retrieved node's fields but its text: a document's metadata."""
    return {key: value for key, value in node.items() if key != "text"}

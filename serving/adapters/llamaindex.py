"""GetToC and Read as a LlamaIndex tool spec, and a LlamaIndex retriever
(`pip install 'ritrag[llamaindex]'`).

`RitragToolSpec(backend, episode_id).to_tool_list()` gives the two
`FunctionTool`s of one episode, their names, descriptions and argument
schemas those of `ritrag.serving.tool_models.TOOLS`. A tool's output is what
a model reads (the ToC's JSON or outline, the Read JSON) and, refused
(budget spent, unknown ids, arguments the tool's model refuses), the
refusal's JSON, as every face sends it.

`RitragRetriever` returns GetToC's best hits, read, as `NodeWithScore`s:
`TextNode`s with the node's id and text, metadata holding its title,
ancestor path (titles, root first), url and rank.
"""
from __future__ import annotations

import os
from typing import Any

from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.core.tools.tool_spec.base import SPEC_FUNCTION_TYPE, BaseToolSpec
from llama_index.core.tools.types import ToolMetadata

from ritrag.serving.adapters.base import (DEFAULT_DOCUMENTS, EpisodeTools, ToolsBackend, metadata_of, retrieve,
                                          tools_backend)
from ritrag.serving.budget import GET_TOC, READ
from ritrag.serving.tool_models import TOOLS
from ritrag.serving.tools import TocFormat


class RitragToolSpec(BaseToolSpec):
    """GetToC and Read over `backend` (an index directory, a `ritrag serve`
    URL or a backend, `ritrag.serving.adapters.base.tools_backend`), their
    calls charged to `episode_id` (None: not counted)."""

    spec_functions: list[SPEC_FUNCTION_TYPE] = ["get_toc", "read"]
    TOOL_OF = {"get_toc": GET_TOC, "read": READ}

    def __init__(self, backend: str | os.PathLike[str] | ToolsBackend, episode_id: str | None = None,
                 toc_format: TocFormat | None = None):
        self.episode = EpisodeTools(tools_backend(backend), episode_id, toc_format)

    def get_toc(self, **arguments: Any) -> str:
        return self.episode.answer(GET_TOC, arguments)[0]

    def read(self, **arguments: Any) -> str:
        return self.episode.answer(READ, arguments)[0]

    def get_metadata_from_fn_name(self, fn_name: str, spec_functions: list[SPEC_FUNCTION_TYPE] | None = None
                                  ) -> ToolMetadata:
        """The tool's name, description and argument model from TOOLS, not
        from the method's signature and docstring."""
        name = self.TOOL_OF[fn_name]
        model, description = TOOLS[name]
        return ToolMetadata(name=name, description=description, fn_schema=model)


class RitragRetriever(BaseRetriever):
    """GetToC's `documents` best hits for a query, read (two calls of
    `episode_id`'s budget per query); `max_chars` per text (None: the
    backend's default)."""

    def __init__(self, backend: str | os.PathLike[str] | ToolsBackend, documents: int = DEFAULT_DOCUMENTS,
                 episode_id: str | None = None, max_chars: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.backend = tools_backend(backend)
        self.documents = documents
        self.episode_id = episode_id
        self.max_chars = max_chars

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        nodes = retrieve(self.backend, query_bundle.query_str, documents=self.documents,
                         episode_id=self.episode_id, max_chars=self.max_chars)
        return [NodeWithScore(node=TextNode(id_=node["id"], text=node["text"], metadata=metadata_of(node)),
                              score=node["score"]) for node in nodes]

"""GetToC and Read as LangChain tools, and a LangChain retriever
(`pip install 'ritrag[langchain]'`).

`ritrag_tools` gives the two `BaseTool`s of one episode, named, described
and validated as `ritrag.serving.tool_models.TOOLS` defines them. A tool's
content is what a model reads (the ToC's JSON or outline, the Read JSON),
its artifact the result as a dict; a refusal (budget spent, unknown ids,
arguments the tool's model refuses) is a tool message with status "error"
whose content is the refusal's JSON, as every face sends it.

`RitragRetriever` returns GetToC's best hits, read, as `Document`s whose
metadata holds the node's id, title, ancestor path (titles, root first),
url, score and rank.
"""
from __future__ import annotations

import os
from typing import Any, Literal

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.tools import BaseTool, ToolException
from pydantic import ConfigDict, field_validator

from ritrag.serving.adapters.base import (DEFAULT_DOCUMENTS, EpisodeTools, ToolsBackend, metadata_of, retrieve,
                                          tools_backend, validation_error_text)
from ritrag.serving.tool_models import TOOLS
from ritrag.serving.tools import TocFormat


class RitragTool(BaseTool):
    """One of the two tools (its `name` is the tool's) over `episode`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    episode: EpisodeTools
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    handle_tool_error: bool = True
    handle_validation_error: Any = validation_error_text

    def _run(self, **arguments: Any) -> tuple[str, dict[str, Any]]:
        text, result = self.episode.answer(self.name, arguments)
        if "error" in result:
            raise ToolException(text)  # handled: the tool message's content, with status "error"
        return text, result


def ritrag_tools(backend: str | os.PathLike[str] | ToolsBackend, episode_id: str | None = None,
                 toc_format: TocFormat | None = None) -> list[BaseTool]:
    """GetToC and Read over `backend` (an index directory, a `ritrag serve`
    URL or a backend, `ritrag.serving.adapters.base.tools_backend`), their
    calls charged to `episode_id` (None: not counted)."""
    episode = EpisodeTools(tools_backend(backend), episode_id, toc_format)
    return [RitragTool(name=name, description=description, args_schema=model, episode=episode)
            for name, (model, description) in TOOLS.items()]


class RitragRetriever(BaseRetriever):
    """GetToC's `documents` best hits for a query, read (two calls of
    `episode_id`'s budget per query), as Documents; `max_chars` per text
    (None: the backend's default)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    backend: ToolsBackend
    documents: int = DEFAULT_DOCUMENTS
    episode_id: str | None = None
    max_chars: int | None = None

    @field_validator("backend", mode="before")
    @classmethod
    def _backend(cls, target: Any) -> ToolsBackend:  # an index directory or a URL as well
        return tools_backend(target)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun
                                ) -> list[Document]:
        nodes = retrieve(self.backend, query, documents=self.documents, episode_id=self.episode_id,
                         max_chars=self.max_chars)
        return [Document(page_content=node["text"], id=node["id"], metadata=metadata_of(node)) for node in nodes]

"""GetToC and Read as OpenAI Agents SDK function tools
(`pip install 'ritrag[openai-agents]'`).

`ritrag_function_tools` gives the two `FunctionTool`s of one episode, with
the names, descriptions and strict JSON Schemas of
`ritrag.serving.tool_models` (the ones `ritrag tools --format openai`
prints). A tool's output is what a model reads (the ToC's JSON or outline,
the Read JSON) and, refused (budget spent, unknown ids, arguments the
tool's model refuses, JSON that does not parse), the refusal's JSON, as
every face sends it: the run goes on and the model sees why.
"""
from __future__ import annotations

import asyncio
import os
from typing import Any, Awaitable, Callable

from agents import FunctionTool
from agents.tool_context import ToolContext

from ritrag.serving.adapters.base import EpisodeTools, ToolsBackend, tools_backend
from ritrag.serving.tool_models import TOOLS, strict_schema
from ritrag.serving.tools import TocFormat


def ritrag_function_tools(backend: str | os.PathLike[str] | ToolsBackend, episode_id: str | None = None,
                          toc_format: TocFormat | None = None) -> list[FunctionTool]:
    """GetToC and Read over `backend` (an index directory, a `ritrag serve`
    URL or a backend, `ritrag.serving.adapters.base.tools_backend`), their
    calls charged to `episode_id` (None: not counted)."""
    episode = EpisodeTools(tools_backend(backend), episode_id, toc_format)
    return [FunctionTool(name=name, description=description, params_json_schema=strict_schema(model),
                         on_invoke_tool=_invoker(episode, name), strict_json_schema=True)
            for name, (model, description) in TOOLS.items()]


def _invoker(episode: EpisodeTools, tool: str) -> Callable[[ToolContext[Any], str], Awaitable[str]]:
    async def on_invoke_tool(context: ToolContext[Any], arguments: str) -> str:
        # Retrieval (or the HTTP call) blocks: off the event loop, so other tools and runs proceed.
        text, _ = await asyncio.to_thread(episode.answer, tool, arguments)
        return text

    return on_invoke_tool

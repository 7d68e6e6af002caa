"""The MCP face: GetToC and Read as MCP tools over one `ToolService`, served on
stdio or streamable HTTP (the `mcp` SDK's low-level server, so that the tools'
input schemas are exactly the strict ones of `ritrag.serving.tool_models`).

A call counts against an episode's budget when its request `_meta` carries
`"ritrag/episode_id"`. A refused call is a tool result with isError and the
`ToolError` as JSON, so the model sees the reason and what budget is left.
"""
from __future__ import annotations

import logging
from typing import Callable

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings

from ritrag.serving.auth import ApiKeyGuard
from ritrag.serving.errors import ToolError
from ritrag.serving.http import BodyGuard, ServerLimits
from ritrag.serving.outline import toc_json_text
from ritrag.serving.tool_models import EPISODE_META_KEY, tool_definitions
from ritrag.serving.tools import ToolService

LOG = logging.getLogger("ritrag.serving.mcp")
INSTRUCTIONS = (
    "Answer questions from the documentation in two steps: GetToC(query) shows where matching sections sit in "
    "the documentation's hierarchy, without their text; Read(node_ids) returns the text of the nodes you pick. "
    "Look, pick, read; rewrite the query and call GetToC again to look elsewhere.")


def create_server(service: ToolService) -> Server:
    """A low-level MCP server whose two tools call `service.call`."""
    tools = [types.Tool.model_validate({**definition,
                                        "annotations": {"readOnlyHint": True, "openWorldHint": False}})
             for definition in tool_definitions("mcp")]

    async def list_tools(ctx: ServerRequestContext,
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
        episode = (ctx.meta or {}).get(EPISODE_META_KEY)
        try:
            if episode is not None and not (isinstance(episode, str) and 0 < len(episode) <= 128):
                raise ToolError("invalid_arguments", f"_meta {EPISODE_META_KEY} must be a string of 1-128 chars")
            # Retrieval is CPU-bound: off the event loop, so other sessions' calls proceed.
            result = await anyio.to_thread.run_sync(service.call, params.name, params.arguments or {}, episode)
        except ToolError as error:
            return _error_result(error)
        except Exception:
            LOG.exception("internal error in %s", params.name)
            return _error_result(ToolError("internal_error", "internal error; see the server log"))
        return types.CallToolResult(content=[types.TextContent(text=service.text_of(result))],
                                    structured_content=result)

    return Server("ritrag", version=service.index.version, instructions=INSTRUCTIONS,
                  on_list_tools=list_tools, on_call_tool=call_tool)


def _error_result(error: ToolError) -> types.CallToolResult:
    body = error.to_dict()
    return types.CallToolResult(content=[types.TextContent(text=toc_json_text(body))], structured_content=body,
                                is_error=True)


async def run_stdio(service: ToolService) -> None:
    server = create_server(service)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def streamable_http_app(service: ToolService, host: str = "127.0.0.1", api_key: str | None = None,
                        allowed_hosts: tuple[str, ...] = (), limits: ServerLimits = ServerLimits()) -> Callable:
    """The server as an ASGI app at /mcp, behind the API key when one is
    given, each request body read whole within `limits` and the service's
    size limit before the SDK sees it. The SDK guards a loopback `host`
    against DNS rebinding; another host must list the Host headers it
    answers to in `allowed_hosts`."""
    security = None
    if allowed_hosts:
        security = TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=list(allowed_hosts))
    app = create_server(service).streamable_http_app(
        host=host, max_request_body_size=service.limits.max_request_bytes, transport_security=security)
    app = BodyGuard(app, service.limits.max_request_bytes, limits.body_timeout_s)
    return ApiKeyGuard(app, api_key) if api_key else app

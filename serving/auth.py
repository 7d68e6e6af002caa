"""Optional API-key auth for the HTTP services (the REST app and MCP over
streamable HTTP): the key comes as "Authorization: Bearer <key>" or as
"X-API-Key: <key>", and is compared in constant time."""
from __future__ import annotations

import hmac
import json
from typing import Any, Callable, Mapping

from ritrag.serving.errors import ToolError

UNAUTHORIZED = ToolError("unauthorized", "missing or wrong API key")


def key_matches(headers: Mapping[str, str], api_key: str) -> bool:
    """`headers` with lower-case names, decoded as Latin-1 (`header_map`), so
    that encoding them again gives the bytes the client sent; those are
    compared with the key's UTF-8 bytes, so a non-ASCII key matches."""
    given = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
    # strip() would also take bytes such as 0xa0 that end a UTF-8 character
    return hmac.compare_digest(given.strip(" \t").encode("latin-1"), api_key.encode("utf-8"))


def header_map(scope: dict[str, Any]) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


async def send_error(send: Callable, error: ToolError) -> None:
    data = json.dumps(error.to_dict()).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


class ApiKeyGuard:
    """ASGI middleware refusing every HTTP request without the key."""

    def __init__(self, app: Callable, api_key: str):
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and not key_matches(header_map(scope), self.api_key):
            return await send_error(send, UNAUTHORIZED)
        await self.app(scope, receive, send)

"""One client of OpenAI-compatible chat-completions endpoints (vLLM, llama.cpp's
server, Ollama, hosted APIs): what `ritrag agent`'s loop and judge and the
build's metadata stage (transforms/metadata/) post their requests with.

`chat_completion` posts one request and returns the parsed reply, or raises
`EndpointError` saying what went wrong, with the HTTP status (None when no
answer came), the seconds a Retry-After header asked for, and a short `reason`
word a caller can count. The answer is read as a stream and refused once it
passes `max_bytes`, so an endless or huge answer costs the cap, never the
caller's memory; `deadline_s` bounds the whole exchange, because httpx's
timeouts bound each read, and a server that trickles a byte at a time would
otherwise hold a caller as long as it likes.
"""
from __future__ import annotations

import json
import time
from typing import Any

import httpx

DEFAULT_MAX_ANSWER_BYTES = 4 << 20  # far above any chat answer; an agent's replies are small


class EndpointError(Exception):
    """The chat-completions endpoint did not give a usable reply."""

    def __init__(self, message: str, reason: str, status: int | None = None, retry_after_s: float | None = None):
        super().__init__(message)
        self.reason = reason  # timeout | connection | http_status | too_large | not_a_completion
        self.status = status
        self.retry_after_s = retry_after_s


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header's delay in seconds (delta-seconds form; an HTTP date
    or anything else reads as None: the caller's own backoff applies)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < float("inf") else None


def chat_completion(client: httpx.Client, base_url: str, body: dict[str, Any], api_key: str | None, *,
                    max_bytes: int = DEFAULT_MAX_ANSWER_BYTES, deadline_s: float | None = None) -> dict[str, Any]:
    """POST `body` to `{base_url}/chat/completions` and return the parsed reply
    (its first choice's message a dict); raise `EndpointError` with what went wrong."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base_url.rstrip("/") + "/chat/completions"
    started = time.monotonic()
    try:
        with client.stream("POST", url, json=body, headers=headers) as response:
            raw = _read_capped(response, max_bytes, started, deadline_s, url)
    except httpx.TimeoutException as exc:
        raise EndpointError(f"timeout after {client.timeout.read}s: {type(exc).__name__} from {url}",
                            "timeout") from None
    except httpx.HTTPError as exc:
        raise EndpointError(f"request failed: {type(exc).__name__}: {exc} ({url})", "connection") from None
    text = raw.decode("utf-8", "replace")
    if response.status_code != 200:
        raise EndpointError(f"HTTP {response.status_code} from {url}: {text[:500]}", "http_status",
                            response.status_code, retry_after_seconds(response.headers.get("retry-after")))
    try:
        reply = json.loads(text)
        message = reply["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):  # RecursionError: absurdly deep JSON
        raise EndpointError(f"not a chat completion from {url}: {text[:500]}", "not_a_completion") from None
    if not isinstance(message, dict):
        raise EndpointError(f"not a chat completion from {url}: message is {type(message).__name__}",
                            "not_a_completion")
    return reply


def _read_capped(response: httpx.Response, max_bytes: int, started: float, deadline_s: float | None,
                 url: str) -> bytes:
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise EndpointError(f"answer of {declared} bytes from {url}: more than {max_bytes}", "too_large",
                            response.status_code)
    parts, size = [], 0
    for part in response.iter_bytes():
        size += len(part)
        if size > max_bytes:
            raise EndpointError(f"answer from {url} passed {max_bytes} bytes: cut", "too_large",
                                response.status_code)
        if deadline_s is not None and time.monotonic() - started > deadline_s:
            raise EndpointError(f"answer from {url} still coming after the {deadline_s:g} s deadline", "timeout",
                                response.status_code)
        parts.append(part)
    return b"".join(parts)

"""One HTTP GET as a crawler does it: conditional headers, no automatic redirects
(the crawl records each hop and schedules its target), retries with backoff on
429 / 5xx / timeouts / connection errors honouring Retry-After, a cap on the
decoded body (which is also the decompression-bomb guard: bytes are counted after
Content-Encoding is undone) and a deadline for the whole response.

Pure of Beam: `fetch` takes an httpx.Client (connection pooling, HTTP/1.1
keep-alive) and returns a `FetchResult` whose `outcome` is one of OUTCOMES. The
stored body is the decoded payload; `response_headers` drop Content-Encoding and
Transfer-Encoding and carry the decoded Content-Length, so the WARC record built
from them is self-consistent.
"""
from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Callable

import httpx

# fetched: HTML kept; kept_other: PDF kept aside (in the WARC) for a later stage;
# skipped_type: another type, body not kept; not_modified: 304 to a conditional GET.
OUTCOMES = ("fetched", "kept_other", "skipped_type", "not_modified", "redirect", "gone",
            "http_error", "fetch_error", "too_large")
REDIRECT_CODES = (301, 302, 303, 307, 308)
RETRY_CODES = (429, 500, 502, 503, 504)
HTML_TYPES = ("text/html", "application/xhtml+xml")
KEPT_OTHER_TYPES = ("application/pdf",)
DROPPED_HEADERS = ("content-encoding", "transfer-encoding", "content-length")


@dataclass(frozen=True)
class FetchPolicy:
    user_agent: str
    timeout_s: float = 20.0
    max_bytes: int = 20 * 1024 * 1024
    retries: int = 2
    backoff_s: float = 1.0  # first retry delay; doubled per retry
    max_retry_after_s: float = 120.0  # a longer Retry-After ends the retries


@dataclass(frozen=True)
class FetchResult:
    url: str
    outcome: str
    http_status: int | None = None
    content_type: str = ""
    etag: str = ""
    last_modified: str = ""
    location: str = ""  # absolute redirect target
    body: bytes = b""  # kept for fetched / kept_other only
    error: str = ""
    attempts: int = 1
    fetched_at: str = ""  # ISO 8601 UTC, second precision (WARC-Date)
    request_headers: tuple[tuple[str, str], ...] = ()
    response_headers: tuple[tuple[str, str], ...] = ()
    http_version: str = "HTTP/1.1"

    @property
    def kept(self) -> bool:
        return self.outcome in ("fetched", "kept_other")


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def classify_content(content_type: str, body: bytes) -> str:
    """"html", "pdf" or "other", from the declared type, sniffing the body when the
    type is missing or generic."""
    declared = content_type.split(";", 1)[0].strip().lower()
    if declared in HTML_TYPES:
        return "html"
    if declared in KEPT_OTHER_TYPES:
        return "pdf"
    if declared in ("", "application/octet-stream", "text/plain"):
        head = body[:512].lstrip().lower()
        if head.startswith(b"%pdf-"):
            return "pdf"
        if head.startswith((b"<!doctype html", b"<html")):
            return "html"
    return "other"


def retry_after_s(value: str | None, now: float) -> float | None:
    """Seconds a Retry-After header asks for (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def retry_delay(attempt: int, policy: FetchPolicy, retry_after: float | None) -> float | None:
    """Delay before retry number `attempt` (1-based), or None: give up."""
    if attempt > policy.retries:
        return None
    if retry_after is not None:
        return retry_after if retry_after <= policy.max_retry_after_s else None
    return policy.backoff_s * 2 ** (attempt - 1)


def stored_headers(headers: httpx.Headers, body_length: int) -> tuple[tuple[str, str], ...]:
    kept = [(k, v) for k, v in headers.multi_items() if k.lower() not in DROPPED_HEADERS]
    return (*kept, ("Content-Length", str(body_length)))


class _TooLarge(Exception):
    pass


@dataclass
class _Attempt:
    result: FetchResult | None = None
    retry_after: float | None = None
    retryable: bool = False


def _read_body(response: httpx.Response, policy: FetchPolicy, deadline: float) -> bytes:
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > policy.max_bytes:
            raise _TooLarge(f"more than {policy.max_bytes} bytes (decoded)")
        if time.monotonic() > deadline:
            raise httpx.ReadTimeout(f"response not complete within {policy.timeout_s} s")
        chunks.append(chunk)
    return b"".join(chunks)


def _attempt(client: httpx.Client, url: str, headers: dict, policy: FetchPolicy, accept_any: bool) -> _Attempt:
    fetched_at = utc_now()
    deadline = time.monotonic() + policy.timeout_s
    try:
        with client.stream("GET", url, headers=headers, timeout=policy.timeout_s) as response:
            status = response.status_code
            common = dict(url=url, http_status=status, fetched_at=fetched_at,
                          content_type=response.headers.get("content-type", ""),
                          etag=response.headers.get("etag", ""),
                          last_modified=response.headers.get("last-modified", ""),
                          request_headers=tuple(response.request.headers.multi_items()),
                          http_version=response.http_version)
            if status in REDIRECT_CODES and response.headers.get("location"):
                target = str(response.url.join(response.headers["location"]))
                return _Attempt(FetchResult(outcome="redirect", location=target, **common))
            if status == 304:
                return _Attempt(FetchResult(outcome="not_modified", **common))
            if status in RETRY_CODES:
                wait = retry_after_s(response.headers.get("retry-after"), time.time())
                return _Attempt(FetchResult(outcome="http_error", error=f"HTTP {status}", **common),
                                retry_after=wait, retryable=True)
            if status in (404, 410):
                return _Attempt(FetchResult(outcome="gone", **common))
            if not 200 <= status < 300:
                return _Attempt(FetchResult(outcome="http_error", error=f"HTTP {status}", **common))
            try:
                body = _read_body(response, policy, deadline)
            except _TooLarge as exc:
                return _Attempt(FetchResult(outcome="too_large", error=str(exc), **common))
            kind = "html" if accept_any else classify_content(common["content_type"], body)
            if kind == "other":
                return _Attempt(FetchResult(outcome="skipped_type", **common))
            return _Attempt(FetchResult(outcome="fetched" if kind == "html" else "kept_other", body=body,
                                        response_headers=stored_headers(response.headers, len(body)),
                                        **common))
    except httpx.TimeoutException as exc:
        error = f"timeout: {type(exc).__name__} {exc}".strip()
    except (httpx.TransportError, httpx.DecodingError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    except httpx.InvalidURL as exc:
        return _Attempt(FetchResult(url=url, outcome="fetch_error", error=f"invalid URL: {exc}",
                                    fetched_at=fetched_at))
    return _Attempt(FetchResult(url=url, outcome="fetch_error", error=error, fetched_at=fetched_at),
                    retryable=True)


def fetch(client: httpx.Client, url: str, policy: FetchPolicy, *, etag: str = "", last_modified: str = "",
          accept_any: bool = False, before_request: Callable[[], None] = lambda: None,
          sleep: Callable[[float], None] = time.sleep) -> FetchResult:
    """GET `url` (conditionally, when `etag` / `last_modified` are known).
    `before_request` runs before every attempt: the host's politeness gate;
    `accept_any` keeps a body of any type (robots.txt, sitemaps)."""
    headers = {"User-Agent": policy.user_agent,
               "Accept": "text/html,application/xhtml+xml;q=0.9,*/*;q=0.5"}
    if etag:
        headers["If-None-Match"] = etag
    if last_modified:
        headers["If-Modified-Since"] = last_modified
    attempt = 0
    while True:
        attempt += 1
        before_request()
        outcome = _attempt(client, url, headers, policy, accept_any)
        result = outcome.result
        if not outcome.retryable:
            return replace(result, attempts=attempt)
        delay = retry_delay(attempt, policy, outcome.retry_after)
        if delay is None:
            if outcome.retry_after is not None and outcome.retry_after > policy.max_retry_after_s:
                result = replace(result, error=f"{result.error}; Retry-After {outcome.retry_after:.0f} s "
                                               f"exceeds {policy.max_retry_after_s:.0f} s")
            return replace(result, attempts=attempt)
        sleep(delay)


"""One HTTP GET as a crawler does it: conditional headers, no automatic redirects
(the crawl records each hop and schedules its target), retries with backoff on
429 / 5xx / timeouts / connection errors honouring Retry-After, a cap on the
decoded body and a deadline for the whole response.

What a hostile server meets (docs/CRAWL.md, "Limits a hostile site meets"):

* The deadline (`timeout_s`) covers the whole response: connecting, TLS, the
  status line and headers, the body, and decoding it. httpx's own timeouts are
  per socket operation (a server sending one header line a second never trips
  them), so `crawl_client` gives httpcore a network backend whose every socket
  operation waits at most until the deadline of the fetch running in its thread.
* Content-Encoding: one `gzip` (the only coding asked for in Accept-Encoding) or
  none. The body is read raw and inflated here in pieces of at most
  DECODE_CHUNK bytes, pulled only while the decoded size is under the cap, so no
  body costs more than `max_bytes` + DECODE_CHUNK whatever its compression
  ratio. Stacked (`gzip, gzip`) or other codings (zstd, br, deflate) are refused
  with a `fetch_error` naming them.
* Retry-After is read strictly (ASCII delta-seconds or an HTTP date); anything
  else counts as absent. A Location that is not an http(s) URL (`javascript:`, a broken
  host) is an `http_error`.
* No cookie is kept or sent (`crawl_client`'s jar refuses them all).

Pure of Beam: `fetch` takes an httpx.Client (connection pooling, HTTP/1.1
keep-alive; `crawl_client` for the limits above) and returns a `FetchResult`
whose `outcome` is one of OUTCOMES. The stored body is the decoded payload;
`response_headers` drop Content-Encoding and Transfer-Encoding and carry the
decoded Content-Length, so the WARC record built from them is self-consistent.
"""
from __future__ import annotations

import email.utils
import time
import zlib
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Callable, Iterator

import httpcore
import httpx

from ritrag.flags import option
from ritrag.transforms.sources.sniff import web_kind
from ritrag.urls import is_web_url, resolve

# fetched: HTML kept; kept_other: PDF kept aside (in the WARC) for a later stage;
# skipped_type: another type, body not kept; not_modified: 304 to a conditional GET.
OUTCOMES = ("fetched", "kept_other", "skipped_type", "not_modified", "redirect", "gone",
            "http_error", "fetch_error", "too_large")
REDIRECT_CODES = (301, 302, 303, 307, 308)
RETRY_CODES = (429, 500, 502, 503, 504)
DROPPED_HEADERS = ("content-encoding", "transfer-encoding", "content-length")
ACCEPT_ENCODING = "gzip"  # the one content coding decoded (with a cap on its output)
GZIP_CODINGS = ("gzip", "x-gzip")  # x-gzip: an alias of gzip (RFC 9110 8.4.1.3)
DECODE_CHUNK = 64 * 1024  # most bytes one inflate step produces
GZIP_MAGIC = b"\x1f\x8b"
GZIP_WBITS = 16 + zlib.MAX_WBITS  # zlib's window bits for a gzip wrapper
MAX_KEEPALIVE_CONNECTIONS = 64


DEFAULT_USER_AGENT = "ritrag-crawl/0.1 (documentation indexer; set --crawl_user_agent to name yourself)"


@dataclass(frozen=True)
class FetchPolicy:
    """How one URL is fetched (the crawl's flags of these values come from these fields)."""

    user_agent: str = option(DEFAULT_USER_AGENT, "User-Agent sent and matched against robots.txt groups",
                             flag="crawl_user_agent")
    timeout_s: float = option(20.0, "for a whole response, headers and body")
    max_bytes: int = option(20 * 1024 * 1024, "a larger body (decoded) is not kept", flag="max_response_bytes")
    retries: int = option(2, "on 429, 5xx, timeouts, connection errors")
    backoff_s: float = option(1.0, "first retry delay, doubled per retry", flag="retry_backoff_s")
    max_retry_after_s: float = option(120.0, "a longer Retry-After ends the retries")


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


def retry_after_s(value: str | None, now: float) -> float | None:
    """Seconds a Retry-After header asks for: delta-seconds (ASCII digits only:
    str.isdigit() also takes "²") or an HTTP date (RFC 9110 10.2.3); None for
    anything else. Never raises; a huge value is bounded by `retry_delay`."""
    value = (value or "").strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - now)
    except (TypeError, ValueError, OverflowError, IndexError):
        return None


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


# The monotonic time by which the fetch running in this thread must be complete.
_DEADLINE: ContextVar[float | None] = ContextVar("fetch_deadline", default=None)


def _until_deadline(timeout: float | None, expired: type[Exception]) -> float | None:
    """A socket operation's timeout, shortened to what is left of the deadline."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise expired("the whole-response deadline has passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream):
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _until_deadline(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _until_deadline(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname,
                                                      _until_deadline(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str):
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's sync backend whose streams honour `_DEADLINE`."""

    def __init__(self):
        self._backend = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options=None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._backend.connect_tcp(
            host, port, _until_deadline(timeout, httpcore.ConnectTimeout), local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options=None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._backend.connect_unix_socket(
            path, _until_deadline(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class _DeadlineTransport(httpx.HTTPTransport):
    def __init__(self, limits: httpx.Limits):
        super().__init__(limits=limits)
        # httpx.HTTPTransport takes no network backend: its connection pool is the one place to give it.
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(), max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry, network_backend=_DeadlineBackend())


def crawl_client() -> httpx.Client:
    """The client `fetch` is meant for: pooled keep-alive connections bounded by
    each fetch's whole-response deadline, no redirect followed, no cookie kept or
    sent, no proxy taken from the environment (connections go where the URL says)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=MAX_KEEPALIVE_CONNECTIONS)
    return httpx.Client(transport=_DeadlineTransport(limits), follow_redirects=False,
                        cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])))


class _TooLarge(Exception):
    pass


class _Undecodable(Exception):
    """A body in a content coding we do not decode, or a broken gzip stream."""


def content_codings(headers: httpx.Headers) -> list[str]:
    """The Content-Encoding codings applied to a body, in order (identity left out)."""
    codings = (c.strip().lower() for c in headers.get_list("content-encoding", split_commas=True))
    return [c for c in codings if c not in ("", "identity")]


def gunzip_chunks(raw: Iterator[bytes]) -> Iterator[bytes]:
    """Inflate a gzip stream in pieces of at most DECODE_CHUNK bytes, pulling
    `raw` only when the pending output is drained. Several members may follow
    each other (RFC 1952); bytes after a member that do not start another
    (padding, junk) end the body, as zlib and browsers read it."""
    inflate = zlib.decompressobj(GZIP_WBITS)
    try:
        for data in raw:
            while True:
                if inflate.eof:
                    if not data:
                        break
                    if not GZIP_MAGIC.startswith(data[:2]):
                        return
                    inflate = zlib.decompressobj(GZIP_WBITS)
                out = inflate.decompress(data, DECODE_CHUNK)
                if out:
                    yield out
                data = inflate.unused_data if inflate.eof else inflate.unconsumed_tail
                if not data and not inflate.eof and len(out) < DECODE_CHUNK:
                    break  # all input taken, nothing pending: the next network chunk
    except zlib.error as exc:
        raise _Undecodable(f"bad gzip body: {exc}") from None


def decoded_chunks(response: httpx.Response) -> Iterator[bytes]:
    """The body with its content coding undone, in bounded pieces; raises
    _Undecodable (before reading) for a coding other than one gzip."""
    codings = content_codings(response.headers)
    if not codings:
        return response.iter_raw()
    if len(codings) == 1 and codings[0] in GZIP_CODINGS:
        return gunzip_chunks(response.iter_raw())
    raise _Undecodable(f"unsupported Content-Encoding {', '.join(codings)!r} (accepted: {ACCEPT_ENCODING})")


@dataclass
class _Attempt:
    result: FetchResult | None = None
    retry_after: float | None = None
    retryable: bool = False


def _read_body(response: httpx.Response, policy: FetchPolicy, truncate_at: int | None) -> bytes:
    """The decoded body: at most `policy.max_bytes` (more raises _TooLarge), or
    its first `truncate_at` bytes when that is given."""
    limit = policy.max_bytes if truncate_at is None else truncate_at
    chunks, size = [], 0
    for chunk in decoded_chunks(response):
        if time.monotonic() > _DEADLINE.get():  # inflating takes time too, without socket reads
            raise httpx.ReadTimeout(f"response not complete within {policy.timeout_s} s")
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            if truncate_at is None:
                raise _TooLarge(f"more than {policy.max_bytes} bytes (decoded)")
            break
    return b"".join(chunks)[:limit]


def _parses(url: str) -> bool:
    try:
        httpx.URL(url)
    except httpx.InvalidURL:
        return False
    return True


def _attempt(client: httpx.Client, url: str, headers: dict, policy: FetchPolicy, accept_any: bool,
             truncate_at: int | None) -> _Attempt:
    fetched_at = utc_now()
    deadline_token = _DEADLINE.set(time.monotonic() + policy.timeout_s)
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
                location = response.headers["location"]
                target = resolve(str(response.url), location)
                if target is None or not is_web_url(target):  # javascript:, mailto:, a broken host: the server's error
                    return _Attempt(FetchResult(outcome="http_error", error=f"HTTP {status} with a Location "
                                                f"that is not an http(s) URL ({location[:200]!r})", **common))
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
                body = _read_body(response, policy, truncate_at)
            except _TooLarge as exc:
                return _Attempt(FetchResult(outcome="too_large", error=str(exc), **common))
            except _Undecodable as exc:
                return _Attempt(FetchResult(outcome="fetch_error", error=str(exc), **common))
            kind = "html" if accept_any else web_kind(body, common["content_type"]) or "other"
            if kind == "other":
                return _Attempt(FetchResult(outcome="skipped_type", **common))
            return _Attempt(FetchResult(outcome="fetched" if kind == "html" else "kept_other", body=body,
                                        response_headers=stored_headers(response.headers, len(body)),
                                        **common))
    except httpx.TimeoutException as exc:
        error = f"timeout: {type(exc).__name__} {exc}".strip()
    except httpx.TransportError as exc:
        error = f"{type(exc).__name__}: {exc}"
    except httpx.InvalidURL as exc:
        if _parses(url):  # httpx builds a redirect's next request even when not following it: the Location's fault
            return _Attempt(FetchResult(url=url, outcome="http_error", fetched_at=fetched_at,
                                        error=f"a redirect with a Location that is not an http(s) URL ({exc})"))
        return _Attempt(FetchResult(url=url, outcome="fetch_error", error=f"invalid URL: {exc}",
                                    fetched_at=fetched_at))
    finally:
        _DEADLINE.reset(deadline_token)
    return _Attempt(FetchResult(url=url, outcome="fetch_error", error=error, fetched_at=fetched_at),
                    retryable=True)


def fetch(client: httpx.Client, url: str, policy: FetchPolicy, *, etag: str = "", last_modified: str = "",
          accept_any: bool = False, truncate_at: int | None = None,
          before_request: Callable[[], None] = lambda: None,
          sleep: Callable[[float], None] = time.sleep) -> FetchResult:
    """GET `url` (conditionally, when `etag` / `last_modified` are known).
    `before_request` runs before every attempt: the host's politeness gate;
    `accept_any` keeps a body of any type (robots.txt, sitemaps); `truncate_at`
    keeps the first bytes of a longer body instead of refusing it (robots.txt)."""
    headers = {"User-Agent": policy.user_agent, "Accept-Encoding": ACCEPT_ENCODING,
               "Accept": "text/html,application/xhtml+xml;q=0.9,*/*;q=0.5"}
    if etag:
        headers["If-None-Match"] = etag
    if last_modified:
        headers["If-Modified-Since"] = last_modified
    attempt = 0
    while True:
        attempt += 1
        before_request()
        outcome = _attempt(client, url, headers, policy, accept_any, truncate_at)
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


"""The HTTP face: a FastAPI app over one `ToolService`.

    POST /v1/toc        GetToC (TocRequest -> TocResult)
    POST /v1/read       Read (ReadRequest -> ReadResult)
    GET  /v1/tools      the tool definitions (?format=openai|anthropic|mcp)
    GET  /healthz       liveness: the process serves (500 once loading failed)
    GET  /readyz        readiness: the index is loaded and the query model warm; which
                        index (name, live version, nodes, chunks); with a version
                        watcher, its failures to load a newer version
    GET  /metrics       Prometheus
    GET  /docs, /redoc, /openapi.json   Swagger UI and ReDoc over the OpenAPI document; their
                        scripts and styles are served from /docs-assets (the package
                        fastapi-offline bundles them), so both work without the network
    GET  /              a page to try queries, browse the sub-forest and read nodes

Every error is a JSON body {"error": {"reason", "message", ...}} with the status
`ritrag.serving.errors.STATUS` gives its reason; nothing else reaches the client.
/healthz and /readyz answer without the API key, but show why loading failed
(messages that name files) only with it.
The index loads in a background thread so that liveness answers at once.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from importlib.resources import files
from collections.abc import Sized
from typing import Any, Callable

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi_offline import FastAPIOffline
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from ritrag.layout import IndexLoadError
from ritrag.serving.api import RitragIndex
from ritrag.serving.auth import UNAUTHORIZED, header_map, key_matches, send_error
from ritrag.serving.errors import ToolError
from ritrag.serving.reload import VersionWatcher
from ritrag.serving.remote import IndexMirror, mirrors
from ritrag.serving.tool_models import (ErrorResult, ReadRequest, ReadResult, TocRequest, TocResult, ToolDialect,
                                        ToolListing, tool_definitions)
from ritrag.serving.tools import ToolService, invalid_arguments

LOG = logging.getLogger("ritrag.serving.http")
DOCS_ASSETS = "/docs-assets"  # Swagger UI's and ReDoc's scripts and styles, from the fastapi-offline package
OPEN_PATHS = ("/healthz", "/readyz", "/", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")  # no data
ROUTES = ("/v1/toc", "/v1/read", "/v1/tools", "/healthz", "/readyz", "/metrics", "/")
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResult} for status in (401, 404, 408, 413, 422, 429, 503)}
BODILESS = ("GET", "HEAD", "OPTIONS")  # methods whose requests carry no body to read


@dataclass(frozen=True)
class ServerLimits:
    """How long and how much a client may hold of an HTTP server (the REST app
    and MCP over streamable HTTP alike; docs/OPERATING.md). `uvicorn_options`
    are the keyword arguments of `uvicorn.run`; the body deadline is kept by
    the app (`BodyGuard`), since uvicorn has none."""

    head_timeout_s: float = 10.0  # request line and headers, from connecting or from the previous response
    body_timeout_s: float = 30.0  # the whole body, from its headers; then 408
    keep_alive_s: int = 5  # an idle connection between requests is closed (uvicorn's timeout_keep_alive)
    max_head_bytes: int = 16 * 1024  # request line and headers together; past it, 400
    max_connections: int = 1024  # connections and requests at once; past it, 503 (uvicorn's limit_concurrency)

    def uvicorn_options(self) -> dict[str, Any]:
        return {"http": functools.partial(HeadDeadlineProtocol, head_timeout_s=self.head_timeout_s),
                "timeout_keep_alive": self.keep_alive_s, "h11_max_incomplete_event_size": self.max_head_bytes,
                "limit_concurrency": self.max_connections}


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's head. uvicorn
    times only an idle connection (timeout_keep_alive, after a response) and
    stops the clock at the first byte of the next request, so a client that
    connects and sends nothing, or sends its headers a line a minute, would
    hold a connection forever. Here the head must be whole within
    `head_timeout_s` of the connection's start or of the previous response,
    else the connection is closed (there is no request to answer yet)."""

    def __init__(self, *args: Any, head_timeout_s: float, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.head_timeout_s = head_timeout_s
        self._head_timer: asyncio.TimerHandle | None = None
        self._previous_cycle: Any = None  # the request before the awaited one

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def on_response_complete(self) -> None:
        self._await_head()  # before uvicorn starts a pipelined request already received
        super().on_response_complete()

    def handle_events(self) -> None:
        super().handle_events()
        if self._head_timer is not None and self.cycle is not self._previous_cycle:  # a new request's head came
            self._stop_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        self._stop_head_timer()
        self._previous_cycle = self.cycle
        self._head_timer = self.loop.call_later(self.head_timeout_s, self.timeout_keep_alive_handler)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None


@dataclass(frozen=True)
class HttpSettings:
    api_key: str | None = None  # when set, /v1 and /metrics need "Authorization: Bearer <key>" or X-API-Key
    cors_origins: tuple[str, ...] = ()  # none: no CORS headers, browsers allow same-origin only
    max_request_bytes: int = 64 * 1024
    limits: ServerLimits = field(default_factory=ServerLimits)
    # An index with no published version yet (a first build still running) or a
    # damaged one is tried again this often, so the server becomes ready by itself.
    load_retry_s: float = 10.0


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # RSS, CPU, open files
        self.requests = Counter("ritrag_http_requests_total", "HTTP requests", ["route", "status"],
                                registry=self.registry)
        self.latency = Histogram("ritrag_http_request_seconds", "HTTP request latency", ["route"],
                                 buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10), registry=self.registry)
        self.tool_errors = Counter("ritrag_tool_errors_total", "Refused or failed calls", ["reason"],
                                   registry=self.registry)
        self.ready = Gauge("ritrag_ready", "1 once the index is loaded", registry=self.registry)
        self.episodes = Gauge("ritrag_episodes", "Episodes with a budget in memory", registry=self.registry)
        self.watcher: VersionWatcher | None = None
        self.service: ToolService | None = None
        self.registry.register(self)  # collect(): the watcher's, cache's and store's counts, read when scraped

    def collect(self):
        yield CounterMetricFamily("ritrag_reload_failures", "Checks or loads of a newly published version that "
                                  "failed (the previous version kept serving)",
                                  value=self.watcher.failures if self.watcher else 0)
        yield CounterMetricFamily("ritrag_reload_swaps", "Newly published versions swapped in",
                                  value=self.watcher.swaps if self.watcher else 0)
        if self.service is not None:
            version = GaugeMetricFamily("ritrag_index_version", "Number of the index version served (v000042: 42)",
                                        labels=["version"])
            version.add_metric([self.service.index.version], int(self.service.index.version[1:]))
            yield version
            store = getattr(self.service.budgets, "store", None)
            if store is not None:
                yield from store.collect()
        yield from _cache_metrics(mirrors())


def _cache_metrics(found: list[IndexMirror]):
    """Per object-store mirror: fill progress of the version being cached,
    and counts since start."""
    gauges = {name: GaugeMetricFamily(f"ritrag_cache_{name}", f"Cache fill of the version being cached: {name}",
                                      labels=["index", "version"])
              for name in ("files_done", "files_total", "bytes_done", "bytes_total")}
    counters = {name: CounterMetricFamily(f"ritrag_cache_{name}", help_text, labels=["index"]) for name, help_text in (
        ("bytes_copied", "Bytes copied from the object store"),
        ("files_refused", "Copies refused: size or sha256 differs from the manifest"),
        ("evicted_versions", "Cached versions evicted"))}
    for found_mirror in found:
        progress = found_mirror.progress
        with progress.lock:
            for name, family in gauges.items():
                family.add_metric([found_mirror.uri, progress.version or ""], getattr(progress, name))
            for name, family in counters.items():
                family.add_metric([found_mirror.uri], getattr(progress, name))
    if found:
        yield from gauges.values()
        yield from counters.values()


def index_info(index: RitragIndex) -> dict[str, Any]:
    """Which index is served, for /readyz and the web page: its name (the last
    part of its path or URL; the rest of a path says nothing to a client, and
    /readyz answers without the key) and what its live version holds."""
    loaded = index.loaded
    where = (loaded.mirror.uri if loaded.mirror is not None else loaded.reader.layout.root).rstrip("/")
    return {"name": os.path.basename(where) or where, "nodes": len(loaded.node_row),
            "chunks": int(loaded.chunks.live.sum())}


def _count_episodes(metrics: _Metrics, budgets: Any) -> None:
    if isinstance(budgets, Sized):  # kept in this process; a shared store (Redis) has no per-process count
        metrics.episodes.set(len(budgets))


async def read_body(scope: dict, receive: Callable, max_bytes: int, timeout_s: float) -> bytes | None:
    """A request's body, read whole (ours are small JSON documents); None when
    the client went away. Refused (ToolError) past `max_bytes`, or when the
    body has not arrived whole within `timeout_s`: uvicorn bounds the wait for
    a request's head (`ServerLimits`) but not for its body."""
    too_large = ToolError("request_too_large", f"request body over {max_bytes} bytes", limit=max_bytes)
    if int(header_map(scope).get("content-length") or 0) > max_bytes:  # h11 let only digits through
        raise too_large
    body = bytearray()
    with anyio.move_on_after(timeout_s):
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            body += message.get("body", b"")
            if len(body) > max_bytes:
                raise too_large
            if not message.get("more_body", False):
                return bytes(body)
    raise ToolError("request_timeout", f"the request body did not arrive whole within {timeout_s:g} s",
                    timeout_s=timeout_s)


class BodyGuard:
    """ASGI middleware: a request's body is read whole (`read_body`) before the
    app sees it, then replayed; a refusal is answered here, and passed to
    `refused` (for metrics) when given."""

    def __init__(self, app: Callable, max_bytes: int, timeout_s: float,
                 refused: Callable[[ToolError], None] | None = None):
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.refused = refused

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] in BODILESS:
            return await self.app(scope, receive, send)
        try:
            body = await read_body(scope, receive, self.max_bytes, self.timeout_s)
        except ToolError as error:
            if self.refused is not None:
                self.refused(error)
            return await send_error(send, error)
        if body is None:
            return  # the client went away
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _is_open(path: str) -> bool:
    """Whether `path` answers without the API key: pages with no data behind them."""
    return path in OPEN_PATHS or path.startswith(DOCS_ASSETS + "/")


class _Guard:
    """The ASGI layer in front of the app (inside CORS only): metrics for
    every request, the API key, and the body's size and time limits
    (`BodyGuard`)."""

    def __init__(self, app: Callable, settings: HttpSettings, metrics: _Metrics):
        self.app = app
        self.settings = settings
        self.metrics = metrics
        self.body = BodyGuard(app, settings.max_request_bytes, settings.limits.body_timeout_s, refused=self._count)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = scope["path"] if scope["path"] in ROUTES else "other"
        status = {"code": 500}

        async def send_recording(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        start = time.perf_counter()
        try:
            await self._guarded(scope, receive, send_recording)
        finally:
            self.metrics.requests.labels(route, str(status["code"])).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - start)

    async def _guarded(self, scope: dict, receive: Callable, send: Callable) -> None:
        if self.settings.api_key and not _is_open(scope["path"]) and scope["method"] != "OPTIONS":
            if not key_matches(header_map(scope), self.settings.api_key):
                self._count(UNAUTHORIZED)
                return await send_error(send, UNAUTHORIZED)
        await self.body(scope, receive, send)

    def _count(self, error: ToolError) -> None:
        self.metrics.tool_errors.labels(error.reason).inc()


def create_app(load: Callable[[], ToolService], settings: HttpSettings = HttpSettings(),
               watch: Callable[[ToolService], VersionWatcher] | None = None) -> FastAPI:
    """The app; `load` builds the service (loads the index) in a background
    thread started with the app, after which the query model is warmed and
    `watch` (if given) makes the watcher that follows newly published
    versions, which the app starts and reports on."""
    metrics = _Metrics()
    # failed: the load raised a bug (the process stays up, unready); waiting: the index refused to load
    # (no published version yet, a damaged one) and is tried again every settings.load_retry_s.
    state: dict[str, Any] = {"service": None, "failed": None, "waiting": None, "stopping": False}
    watcher_lock = threading.Lock()  # a load that ends after shutdown must not start a watcher
    stopped = threading.Event()  # ends the retries of a load when the app shuts down

    def load_until_loaded() -> ToolService | None:
        """`load()`, tried again while the index refuses to load (no published
        version yet, a damaged one); None when the app stops first."""
        while True:
            try:
                return load()
            except IndexLoadError as exc:  # a refusal, not a bug: said in one line, then tried again
                state["waiting"] = f"{type(exc).__name__}: {exc}"
                LOG.error("loading the index failed (trying again in %.0f s): %s", settings.load_retry_s, exc)
                if stopped.wait(settings.load_retry_s):
                    return None

    def load_in_background() -> None:
        started = time.monotonic()
        try:
            service = load_until_loaded()
            if service is None:
                return
            state["waiting"] = None
            service.index.embed_query("warm up")
            with watcher_lock:
                if watch is not None and not state["stopping"]:
                    metrics.watcher = watch(service).start()
            metrics.service = state["service"] = service  # ready only once its watcher reports in /readyz
            metrics.ready.set(1)
            LOG.info("ready in %.1f s: %s", time.monotonic() - started, service.index.summary())
        except Exception as exc:  # reported by /healthz and /readyz; the trace goes to the log only
            LOG.exception("loading the index failed")
            state["failed"] = f"{type(exc).__name__}: {exc}"

    async def lifespan(_: FastAPI):
        threading.Thread(target=load_in_background, name="ritrag-load", daemon=True).start()
        yield
        stopped.set()
        with watcher_lock:
            state["stopping"] = True
            if metrics.watcher is not None:
                metrics.watcher.stop()

    # FastAPI's /docs and /redoc load their scripts from a CDN (a blank page offline);
    # FastAPIOffline is FastAPI with those pages pointing at the files the package ships.
    app = FastAPIOffline(static_url=DOCS_ASSETS, title="ritrag", version="1", lifespan=lifespan, description=(
        "GetToC and Read over a breadcrumb-forest index (the RIT-RAG tools). Pass an `episode_id` to count "
        "calls against that episode's budget."))

    def service() -> ToolService:
        if state["service"] is None:
            raise ToolError("not_ready", "loading the index failed" if state["failed"] else
                            "the index cannot be loaded yet (no published version, or a damaged one); "
                            "trying again" if state["waiting"] else "the index is still loading; retry shortly")
        return state["service"]

    def has_key(request: Request) -> bool:
        return not settings.api_key or key_matches(header_map(request.scope), settings.api_key)

    @app.exception_handler(ToolError)
    async def tool_error(_: Request, exc: ToolError) -> JSONResponse:
        metrics.tool_errors.labels(exc.reason).inc()
        return JSONResponse(exc.to_dict(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return await tool_error(request, invalid_arguments(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_arguments")
        return await tool_error(request, ToolError(reason, str(exc.detail)))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        LOG.exception("internal error on %s", request.url.path)
        return await tool_error(request, ToolError("internal_error", "internal error; see the server log"))

    @app.post("/v1/toc", response_model=TocResult, response_model_exclude_none=True, responses=ERROR_RESPONSES,
              summary="GetToC: the query-induced sub-forest, no body text")
    def get_toc(request: TocRequest) -> dict[str, Any]:
        result = service().get_toc(request.query, k=request.k, n=request.n, format=request.format,
                                   episode_id=request.episode_id, collapse_read=request.collapse_read,
                                   cross_links=request.cross_links)
        _count_episodes(metrics, service().budgets)
        return result

    @app.post("/v1/read", response_model=ReadResult, response_model_exclude_none=True, responses=ERROR_RESPONSES,
              summary="Read: node bodies, with a continuation offset")
    def read(request: ReadRequest) -> dict[str, Any]:
        result = service().read(request.node_ids, offset=request.offset, max_chars=request.max_chars,
                                episode_id=request.episode_id, query=request.query)
        _count_episodes(metrics, service().budgets)
        return result

    @app.get("/v1/tools", summary="The tool definitions, for wiring an agent")
    def tools(format: ToolDialect = ToolListing.format) -> list[dict[str, Any]]:
        return tool_definitions(format)

    @app.get("/healthz", include_in_schema=False)
    def healthz(request: Request) -> JSONResponse:
        if state["failed"]:
            details = {"error": state["failed"]} if has_key(request) else {}
            return JSONResponse({"status": "failed", **details}, status_code=500)
        if state["waiting"]:  # alive, and trying the index again: not a reason to restart the process
            return JSONResponse({"status": "waiting", **({"error": state["waiting"]} if has_key(request) else {})})
        return JSONResponse({"status": "ok"})

    @app.get("/readyz", include_in_schema=False)
    def readyz(request: Request) -> dict[str, Any]:
        if (state["failed"] or state["waiting"]) and has_key(request):
            raise ToolError("not_ready", state["failed"] or state["waiting"])
        ready = service()
        body = {"status": "ready", "version": ready.index.version, "index": index_info(ready.index),
                "limits": asdict(ready.limits),
                "budget": asdict(ready.budgets.budget)}
        if metrics.watcher is not None:
            body["reload"] = metrics.watcher.status()
            if body["reload"]["last_error"] and not has_key(request):
                body["reload"]["last_error"] = {"version": body["reload"]["last_error"]["version"]}
        return body

    @app.get("/metrics", include_in_schema=False)
    def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    page = (files("ritrag.serving") / "web" / "index.html").read_text(encoding="utf-8")

    @app.get("/", include_in_schema=False)
    def index_page() -> HTMLResponse:
        return HTMLResponse(page)

    app.add_middleware(_Guard, settings=settings, metrics=metrics)
    if settings.cors_origins:  # outside the guard: preflights and refusals carry CORS headers too
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "X-API-Key", "Content-Type"])
    return app

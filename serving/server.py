"""The server's wiring: one typed `ServerConfig` (what `ritrag serve` and
`ritrag mcp` take: the CLI's flags, their help and defaults come from its
fields), the tool service it loads, the apps, and running them under uvicorn.

`ritrag serve --workers N` runs N processes behind one port (uvicorn's
supervisor, each process loading the index itself): every worker maps the
same serving files of the index's segments (ritrag.serving.segments), so
the page cache holds one copy, and episode budgets must live in Redis, since a process's
own store would give each worker a budget of its own; the in-process store is
refused with more than one worker.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from ritrag.flags import add_arguments, option
from ritrag.storage import is_remote
from ritrag.serving.api import DEFAULT_K, DEFAULT_MAX_CHARS, DEFAULT_N, RitragIndex, one_thread_per_query
from ritrag.serving.budget import Budget, EpisodeBudgets, EpisodeMemory
from ritrag.serving.errors import ToolError
from ritrag.serving.links import DEFAULT_CROSS_LINKS
from ritrag.serving.tools import DEFAULT_TOC_FORMAT, Limits, ToolService

LOG = logging.getLogger("ritrag.serving")

API_KEY_ENV = "RITRAG_API_KEY"  # when set, the server requires that key
CONFIG_ENV = "RITRAG_SERVER_CONFIG"  # how `--workers` hands the config to the worker processes


@dataclass(frozen=True)
class ServerConfig:
    """Everything a serving process is started with (the CLI flags of `ritrag
    serve` and `ritrag mcp`, one field each)."""

    index: str = option(help="index directory, or an object-store URL (gs://, s3://, any fsspec URL)", positional=True)
    cache_dir: str | None = option(None, "stamp the index files hashed at the first start here, so that "
                                         "later starts and other workers trust them without hashing again. "
                                         "An object-store index is copied here too "
                                         "(default with an object-store index or --workers > 1: ~/.cache/ritrag)")
    cache_keep_versions: int = option(2, "object-store index: cached versions kept (never evicting the one served)")
    cache_max_gib: float = option(0.0, "object-store index: evict cached versions past this size, oldest first "
                                       "(0: no size limit)")
    copy_workers: int = option(8, "object-store index: files copied at once")
    budget_store: str = option("memory", "where episode budgets and handles live: memory (this process) or "
                                         "redis://HOST:PORT/DB (shared by workers and replicas)")
    budget_store_failure: Literal["closed", "open"] = option(
        "closed", "when Redis does not answer: refuse counted calls with a 503 (closed) or serve them uncounted "
                  "(open)")
    watch_s: float = option(10.0, "check CURRENT this often and swap to a newly published version (0: never)")
    host: str = option("127.0.0.1", "address to listen on (0.0.0.0: every interface)")
    port: int = option(8000, "port to listen on")
    workers: int = option(1, "server processes behind the port (HTTP only; more than one needs a redis:// "
                             "--budget_store)")
    access_log: bool = option(False, "log one line per HTTP request")
    k: int = option(DEFAULT_K, "chunks recalled per retriever (k')")
    n: int = option(DEFAULT_N, "nodes kept in a GetToC answer")
    max_calls: int = option(Budget.calls, "tool calls per episode")
    max_toc_calls: int = option(Budget.toc_calls, "GetToC calls per episode")
    max_query_chars: int = option(Limits.max_query_chars, "a longer GetToC query is refused")
    max_ids_per_read: int = option(Limits.max_ids_per_read, "node ids one Read may ask for")
    max_chars: int = option(DEFAULT_MAX_CHARS, "characters of body text per node and Read (longer bodies "
                                               "continue at next_offset)")
    max_request_bytes: int = option(Limits.max_request_bytes, "a larger HTTP request body is refused (413)")
    toc_format: Literal["json", "outline"] = option(
        DEFAULT_TOC_FORMAT, "what GetToC results show a model by default: the JSON trees or the compact outline")
    cross_links: Literal["on", "off"] = option(
        "on" if DEFAULT_CROSS_LINKS else "off", "GetToC hits list related nodes elsewhere that their pages link "
        "to or are linked from (see_also; an HTTP request may turn them off)")
    cors_origin: tuple[str, ...] = option((), "an origin allowed to call from a browser (repeatable)")
    allowed_host: tuple[str, ...] = option((), "MCP: a Host header to accept when --host is not loopback "
                                               "(DNS rebinding protection; repeatable)")
    transport: Literal["stdio", "streamable-http"] = option(
        "stdio", "stdio (a client starts this process) or streamable-http (a long-running server)")
    verbose: bool = field(default=False, metadata={"cli": False})

    @property
    def api_key(self) -> str | None:
        return os.environ.get(API_KEY_ENV) or None

    @property
    def limits(self) -> Limits:
        return Limits(max_query_chars=self.max_query_chars, max_ids_per_read=self.max_ids_per_read,
                      max_chars_per_node=self.max_chars, max_request_bytes=self.max_request_bytes)

    def checked(self) -> "ServerConfig":
        """This config, refused (ToolError invalid_arguments) where it cannot
        serve; with more than one worker, the shared cache directory filled in."""
        if self.workers < 1:
            raise ToolError("invalid_arguments", "--workers must be at least 1")
        if self.workers > 1 and self.budget_store == "memory":
            raise ToolError("invalid_arguments", f"--workers {self.workers} with --budget_store memory would give "
                            f"each worker its own episode budgets; share them: --budget_store redis://HOST:PORT/DB")
        if self.workers > 1 and self.cache_dir is None:
            from ritrag.serving.remote import default_cache_dir

            return dataclasses.replace(self, cache_dir=default_cache_dir())
        return self


# The flags only some commands take; every other field is a flag of both.
PER_COMMAND_FLAGS = ("workers", "cors_origin", "toc_format", "allowed_host", "transport")


def add_server_arguments(parser: Any, only: tuple[str, ...] = (), **defaults: Any) -> None:
    """ServerConfig's fields as `parser`'s flags (the index positional): the
    common ones and, of PER_COMMAND_FLAGS, those in `only`; `defaults`: another
    default for a command (mcp listens on 8001)."""
    add_arguments(parser, ServerConfig, skip=set(PER_COMMAND_FLAGS) - set(only), defaults=defaults)


def episode_state(config: ServerConfig) -> tuple:
    """(budgets, episode memory): this process's, or shared in Redis."""
    budget = Budget(calls=config.max_calls, toc_calls=config.max_toc_calls)
    if config.budget_store == "memory":
        return EpisodeBudgets(budget), EpisodeMemory()
    from ritrag.serving.budget_store import redis_episode_state

    return redis_episode_state(config.budget_store, budget, fail_open=config.budget_store_failure == "open")


def prepare_object_store_cache(config: ServerConfig) -> None:
    """For an index in an object store, its cache's limits (and, at once, a
    clear refusal when the store's package is missing)."""
    if is_remote(config.index):
        from ritrag.serving.remote import mirror

        mirror(config.index, config.cache_dir, keep_versions=config.cache_keep_versions,
               workers=config.copy_workers,
               max_bytes=int(config.cache_max_gib * 2**30) if config.cache_max_gib else None)


def tool_service(config: ServerConfig, state: tuple | None = None) -> ToolService:
    """The loaded index behind the tools, with the config's limits and budgets."""
    budgets, episodes = state or episode_state(config)
    prepare_object_store_cache(config)
    one_thread_per_query()
    return ToolService(RitragIndex(config.index, cache_dir=config.cache_dir), config.limits, budgets, k=config.k,
                       n=config.n, toc_format=config.toc_format, episodes=episodes,
                       cross_links=config.cross_links == "on")


def watcher(config: ServerConfig, service: ToolService):
    from ritrag.serving.reload import VersionWatcher

    return VersionWatcher(service, config.index, config.watch_s, config.cache_dir)


def http_app(config: ServerConfig):
    """The REST app of `ritrag serve`; the index loads in the background (/readyz)."""
    from ritrag.serving.http import HttpSettings, create_app

    settings = HttpSettings(api_key=config.api_key, cors_origins=config.cors_origin,
                            max_request_bytes=config.max_request_bytes)
    # A missing store package or a bad --budget_store is refused here, not in the background load.
    prepare_object_store_cache(config)
    state = episode_state(config)
    return create_app(lambda: tool_service(config, state), settings,
                      watch=(lambda service: watcher(config, service)) if config.watch_s > 0 else None)


def http_app_from_environment():
    """The app of one worker process of `ritrag serve --workers N` (uvicorn's
    factory): the config the parent process put in CONFIG_ENV."""
    return http_app(ServerConfig(**{k: tuple(v) if isinstance(v, list) else v
                                    for k, v in json.loads(os.environ[CONFIG_ENV]).items()}))


def run_http(config: ServerConfig) -> None:
    """`ritrag serve`: the REST app under uvicorn, in `workers` processes."""
    config = config.checked()
    _say_listening("ritrag serve", config, "/ (web page), /docs (OpenAPI), POST /v1/toc, POST /v1/read")
    if config.workers == 1:
        _run_uvicorn(http_app(config), config)
        return
    prepare_object_store_cache(config)
    episode_state(config)  # a bad --budget_store is refused here, once, not by every worker
    os.environ[CONFIG_ENV] = json.dumps(dataclasses.asdict(config))
    _run_uvicorn(f"{__name__}:http_app_from_environment", config, factory=True, workers=config.workers)


def run_mcp(config: ServerConfig) -> None:
    """`ritrag mcp`: the MCP server over stdio or streamable HTTP (`config.transport`)."""
    import anyio

    from ritrag.serving import mcp_server

    started = time.monotonic()
    service = tool_service(config)
    service.index.embed_query("warm up")
    LOG.info("ready in %.1f s: %s", time.monotonic() - started, service.index.summary())
    if config.watch_s > 0:
        watcher(config, service).start()
    if config.transport == "stdio":
        anyio.run(mcp_server.run_stdio, service)
        return
    app = mcp_server.streamable_http_app(service, host=config.host, api_key=config.api_key,
                                         allowed_hosts=config.allowed_host)
    _say_listening("ritrag mcp", config, "/mcp (streamable HTTP)")
    _run_uvicorn(app, config)


def _say_listening(who: str, config: ServerConfig, what: str) -> None:
    """One line on stderr: where the server listens (the index loads in the
    background; /readyz answers 200 once it has)."""
    host = f"[{config.host}]" if ":" in config.host else config.host
    workers = f" ({config.workers} workers)" if config.workers > 1 else ""
    print(f"{who}: {config.index} on http://{host}:{config.port}{workers}: {what}", file=sys.stderr, flush=True)


def _run_uvicorn(app: Any, config: ServerConfig, **options: Any) -> None:
    import uvicorn

    from ritrag.serving.http import ServerLimits

    # uvicorn's access log needs its loggers at INFO; its startup lines come along.
    uvicorn.run(app, host=config.host, port=config.port, access_log=config.access_log,
                log_level="info" if config.verbose or config.access_log else "warning",
                **ServerLimits().uvicorn_options(), **options)  # the limits both apps keep by default

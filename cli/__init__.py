"""`ritrag` command line: one sub-command per Python API entry point.

    ritrag build INPUT --out INDEX [build options] [Beam runner options]
    ritrag toc INDEX "query" [--k 200] [--n 50]         -> JSON on stdout
    ritrag read INDEX NODE_ID... [--max_chars N] [--offset N]
    ritrag update INPUT --index INDEX [Beam runner options]
    ritrag crawl SEED_URL... --out CRAWL_DIR [--seeds FILE] [crawl options]   then build/update CRAWL_DIR
    ritrag refresh SEED_URL... --crawl_dir CRAWL_DIR --index INDEX   crawl -> update (or build) -> publish
    ritrag compact INDEX | ritrag versions INDEX | ritrag rollback INDEX VERSION
    ritrag prune INDEX [--keep 5]
    ritrag inspect INDEX [--html REPORT.html]
    ritrag synth --pages N --out DIR [--sites 4 --depth 4 --fanout 8 --words 400 --seed 0]
    ritrag serve INDEX|URL [--host 127.0.0.1 --port 8000]  HTTP: /v1/toc, /v1/read, /docs, a web page
    ritrag mcp INDEX [--transport stdio|streamable-http]  MCP server with the GetToC and Read tools
    ritrag tools [--format openai|anthropic|mcp]        the tool definitions, as JSON
    ritrag agent INDEX "question" --base_url URL --model NAME [--api_key_env VAR] [--transcript FILE]
    ritrag eval INDEX QUESTIONS.jsonl [--k 200 --n 50 --max_calls 10 --chunks 10] [--out DIR] [--agent ...]

The CLI is the top of the dependency graph: it imports the jobs lazily, so the
serving commands never load Beam.
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from typing import Callable

API_KEY_ENV = "RITRAG_API_KEY"
# Query-time retrieval parameters `ritrag eval` can override (serving.retrieval.RetrievalParams).
RETRIEVAL_FLAGS: dict[str, tuple[Callable[[str], object], str]] = {
    "node_score": (str, "node score: max (the paper's rule: best chunk) or max+doc (+ the node's own match)"),
    "path_weight": (float, "BM25 weight of the node path field in a chunk's score"),
    "fusion": (str, "how BM25 and dense are fused: minmax (normalized scores, the default) or rrf (ranks)"),
    "sparse_weight": (float, "weight of the BM25 ranking in the fusion"),
    "dense_weight": (float, "weight of the dense ranking in the fusion"),
    "rrf_k": (float, "reciprocal rank fusion constant (fusion rrf)"),
    "node_doc_weight": (float, "weight of the node's own match under max+doc"),
}


def _job(name: str, flags: Callable[[argparse.Namespace], list[str]], index: Callable[[argparse.Namespace], str]):
    """A sub-command that runs the Beam job `pipelines.<name>` (unknown options go
    to it) and prints the version it published."""
    def run(args: argparse.Namespace, extra: list[str]) -> int:
        job = importlib.import_module(f"ritrag.pipelines.{name}")
        version = job.run([*flags(args), *extra])
        print(json.dumps({"index": index(args), "version": version}))
        return 0

    return run


def _seed_flags(args: argparse.Namespace) -> list[str]:
    return ([f for url in args.seeds for f in ("--seed", url)]
            + (["--seeds", args.seeds_file] if args.seeds_file else []))


def _crawl(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.pipelines import crawl

    counts = crawl.run([*_seed_flags(args), "--out", args.out, *extra])
    print(json.dumps({"crawl_dir": args.out, "rows": counts}))
    return 0


def _refresh(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.pipelines import refresh

    print(json.dumps(refresh.run([*_seed_flags(args), "--crawl_dir", args.crawl_dir, "--index", args.index, *extra])))
    return 0


def _toc(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.serving.api import RitragIndex

    result = RitragIndex(args.index).get_toc(args.query, k=args.k, n=args.n)
    json.dump(result, sys.stdout, ensure_ascii=False, indent=1)
    print()
    return 0


def _read(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.serving.api import RitragIndex

    result = RitragIndex(args.index).read(args.node_ids, max_chars=args.max_chars, offset=args.offset)
    json.dump(result, sys.stdout, ensure_ascii=False, indent=1)
    print()
    return 0 if not result["unknown_ids"] else 3


def _versions(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.layout import IndexLayout

    layout = IndexLayout(args.index)
    current = layout.current_version()
    for version in layout.versions():
        m = layout.load_manifest(version)
        pages = m.stats.get("pages", {})
        print(f"{'*' if version == current else ' '} {version}  parent={m.parent or '-'}  "
              f"segments={len(m.segments)}  chunks={m.stats.get('bm25', {}).get('n_chunks', '?')}  "
              f"pages_read={pages.get('pages_read', '?')}  created={time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(m.created))}Z")
    return 0


def _rollback(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.layout import IndexLayout, IndexLease, rollback

    layout = IndexLayout(args.index)
    with IndexLease(layout, "rollback", args.break_lock):
        rollback(layout, args.version)
    print(json.dumps({"index": args.index, "current": args.version}))
    return 0


def _prune(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.layout import IndexLayout, IndexLease, prune_versions
    from ritrag.serving.errors import checked_int

    keep = checked_int("keep", args.keep, 1)
    layout = IndexLayout(args.index)
    with IndexLease(layout, "prune", args.break_lock):
        print(json.dumps({"deleted": prune_versions(layout, keep)}))
    return 0


def _synth(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.cli.synth import SynthConfig, generate_corpus

    config = SynthConfig(pages=args.pages, sites=args.sites, depth=args.depth, fanout=args.fanout,
                         words=args.words, seed=args.seed, base_url=args.base_url)
    print(json.dumps(generate_corpus(args.out, config)))
    return 0


def _inspect(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.forest_report import forest_report, render_html, render_text

    report = forest_report(args.index)
    print(render_text(report))
    html_path = args.html or os.path.join(args.index, f"report-{report['version']}.html")
    with open(html_path, "w", encoding="utf-8") as fh:
        fh.write(render_html(report))
    print(f"\nHTML report: {html_path}")
    return 0


def _watcher(args: argparse.Namespace, service):
    from ritrag.serving.reload import VersionWatcher

    return VersionWatcher(service, args.index, args.watch_s, args.cache_dir)


def _episode_state(args: argparse.Namespace) -> tuple:
    """(budgets, episode memory): this process's, or shared in Redis."""
    from ritrag.serving.budget import Budget, EpisodeBudgets, EpisodeMemory

    budget = Budget(calls=args.max_calls, toc_calls=args.max_toc_calls)
    if args.budget_store == "memory":
        return EpisodeBudgets(budget), EpisodeMemory()
    from ritrag.serving.budget_store import redis_episode_state

    return redis_episode_state(args.budget_store, budget, fail_open=args.budget_store_failure == "open")


def _tool_service(args: argparse.Namespace, watch: bool = True, episode_state: tuple | None = None):
    from ritrag.serving.api import RitragIndex, one_thread_per_query
    from ritrag.serving.tools import Limits, ToolService

    limits = Limits(max_query_chars=args.max_query_chars, max_ids_per_read=args.max_ids_per_read,
                    max_chars_per_node=args.max_chars, max_request_bytes=args.max_request_bytes)
    budgets, episodes = episode_state or _episode_state(args)
    _object_store_cache(args)
    one_thread_per_query()
    service = ToolService(RitragIndex(args.index, cache_dir=args.cache_dir), limits, budgets, k=args.k, n=args.n,
                          toc_format=getattr(args, "toc_format", "json"), episodes=episodes)
    if watch and args.watch_s > 0:
        _watcher(args, service).start()
    return service


def _object_store_cache(args: argparse.Namespace) -> None:
    """For an index in an object store, its cache's limits (and, at once, a
    clear refusal when the store's package is missing)."""
    from ritrag.layout import is_remote

    if is_remote(args.index):
        from ritrag.serving.remote import mirror

        mirror(args.index, args.cache_dir, keep_versions=args.cache_keep_versions, workers=args.copy_workers,
               max_bytes=int(args.cache_max_gib * 2**30) if args.cache_max_gib else None)


def _serve(args: argparse.Namespace, extra: list[str]) -> int:
    import uvicorn

    from ritrag.serving.http import HttpSettings, create_app

    settings = HttpSettings(api_key=os.environ.get(API_KEY_ENV) or None, cors_origins=tuple(args.cors_origin),
                            max_request_bytes=args.max_request_bytes)
    # A missing store package or a bad --budget_store is refused here, not in the background load.
    _object_store_cache(args)
    episode_state = _episode_state(args)
    app = create_app(lambda: _tool_service(args, watch=False, episode_state=episode_state), settings,
                     watch=(lambda service: _watcher(args, service)) if args.watch_s > 0 else None)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning")
    return 0


def _mcp(args: argparse.Namespace, extra: list[str]) -> int:
    import anyio

    from ritrag.serving import mcp_server

    service = _tool_service(args)
    if args.transport == "stdio":
        anyio.run(mcp_server.run_stdio, service)
        return 0
    import uvicorn

    app = mcp_server.streamable_http_app(service, host=args.host, api_key=os.environ.get(API_KEY_ENV) or None,
                                         allowed_hosts=tuple(args.allowed_host))
    uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning")
    return 0


def _tools(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.serving.tool_models import tool_definitions

    json.dump(tool_definitions(args.format), sys.stdout, indent=1)
    print()
    return 0


def _api_key(args: argparse.Namespace) -> str | None:
    """The endpoint's API key from the variable `--api_key_env` names (agent, eval --agent)."""
    if not args.api_key_env:
        return None
    api_key = os.environ.get(args.api_key_env)
    if not api_key:
        from ritrag.serving.errors import ToolError

        raise ToolError("invalid_arguments", f"--api_key_env: the environment variable {args.api_key_env} is not set")
    return api_key


def _agent(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.serving.agent import run_agent

    api_key = _api_key(args)
    result = run_agent(args.index, args.question, base_url=args.base_url, model=args.model, api_key=api_key,
                       max_calls=args.max_calls, max_toc=args.max_toc, transcript_path=args.transcript,
                       toc_format=args.toc_format, timeout_s=args.timeout_s, temperature=args.temperature,
                       max_tokens=args.max_tokens)
    print(result.answer)
    print(json.dumps(result.summary(), ensure_ascii=False))
    return 0 if result.error is None else 1


def _eval(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.serving.api import one_thread_per_query
    from ritrag.serving.eval import AgentConfig, EvalConfig, EvalInputError, evaluate, load_questions, open_index
    from ritrag.serving.eval_report import render_text, write_report
    from ritrag.serving.errors import ToolError
    from ritrag.serving.retrieval import RetrievalParams

    one_thread_per_query()  # questions run one after another; see one_thread_per_query

    agent = None
    if args.agent:
        if not (args.base_url and args.model):
            raise ToolError("invalid_arguments", "--agent needs --base_url and --model")
        agent = AgentConfig(base_url=args.base_url, model=args.model, api_key=_api_key(args), max_calls=args.max_calls,
                            max_toc=args.max_toc, transcripts_dir=args.transcripts, judge_model=args.judge_model,
                            toc_format=args.toc_format, temperature=args.temperature, max_tokens=args.max_tokens)
    retrieval = {name: getattr(args, name) for name in RETRIEVAL_FLAGS if getattr(args, name) is not None}
    try:
        RetrievalParams(**retrieval)  # checks the values before any work
    except ValueError as exc:
        raise ToolError("invalid_arguments", str(exc)) from None
    config = EvalConfig(k=args.k, n=args.n, max_calls=args.max_calls, ids_per_read=args.ids_per_read,
                        max_chars=args.max_chars, chunks=args.chunks, retrieval=retrieval or None)
    try:
        questions = load_questions(args.questions)
        report = evaluate(open_index(args.index), questions, config, agent,
                          progress=lambda line: print(line, file=sys.stderr))
    except EvalInputError as exc:  # a clean refusal, printed by main as one JSON line
        raise ToolError("invalid_arguments", str(exc)) from None
    print(render_text(report))
    if args.out:
        paths = write_report(report, args.out)
        print(f"\nreport: {paths['json']}, {paths['html']}")
    return 0


def _service_arguments(p: argparse.ArgumentParser, port: int) -> None:
    from ritrag.serving.api import DEFAULT_K, DEFAULT_MAX_CHARS, DEFAULT_N
    from ritrag.serving.budget import Budget
    from ritrag.serving.tools import Limits

    p.add_argument("index", help="index directory, or an object-store URL (gs://, s3://, any fsspec URL)")
    p.add_argument("--cache_dir", help="keep the postings built at the first start here; later starts map them. "
                                       "An object-store index is copied here too (default ~/.cache/ritrag)")
    p.add_argument("--cache_keep_versions", type=int, default=2,
                   help="object-store index: cached versions kept (never evicting the one served)")
    p.add_argument("--cache_max_gib", type=float, default=0, help="object-store index: evict cached versions "
                   "past this size, oldest first (0: no size limit)")
    p.add_argument("--copy_workers", type=int, default=8, help="object-store index: files copied at once")
    p.add_argument("--budget_store", default="memory",
                   help="where episode budgets and handles live: memory (this process) or redis://HOST:PORT/DB "
                        "(shared by replicas)")
    p.add_argument("--budget_store_failure", choices=("closed", "open"), default="closed",
                   help="when Redis does not answer: refuse counted calls with a 503 (closed) or serve them "
                        "uncounted (open)")
    p.add_argument("--watch_s", type=float, default=10.0,
                   help="check CURRENT this often and swap to a newly published version (0: never)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=port)
    p.add_argument("--k", type=int, default=DEFAULT_K, help="chunks recalled per retriever")
    p.add_argument("--n", type=int, default=DEFAULT_N, help="nodes kept")
    p.add_argument("--max_calls", type=int, default=Budget.calls, help="tool calls per episode")
    p.add_argument("--max_toc_calls", type=int, default=Budget.toc_calls, help="GetToC calls per episode")
    p.add_argument("--max_query_chars", type=int, default=Limits.max_query_chars)
    p.add_argument("--max_ids_per_read", type=int, default=Limits.max_ids_per_read)
    p.add_argument("--max_chars", type=int, default=DEFAULT_MAX_CHARS, help="characters per node and Read")
    p.add_argument("--max_request_bytes", type=int, default=Limits.max_request_bytes)


def main(argv: list[str] | None = None) -> int:
    from ritrag.serving.api import DEFAULT_K, DEFAULT_MAX_CHARS, DEFAULT_N
    from ritrag.serving.budget import Budget

    top = argparse.ArgumentParser(prog="ritrag", description=__doc__.split("\n\n")[0])
    top.add_argument("-v", "--verbose", action="store_true")
    sub = top.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="full build of an index version (a Beam job)",
                       description="Unknown options go to the Beam job (see pipelines/build.py).")
    p.add_argument("input", help="directory or glob of HTML files")
    p.add_argument("--out", required=True, help="index directory")
    p.set_defaults(func=_job("build", lambda a: ["--input", a.input, "--out", a.out], lambda a: a.out))

    p = sub.add_parser("toc", help="GetToC: the query-induced sub-forest as JSON")
    p.add_argument("index")
    p.add_argument("query")
    p.add_argument("--k", type=int, default=DEFAULT_K, help="chunks recalled per retriever")
    p.add_argument("--n", type=int, default=DEFAULT_N, help="nodes kept")
    p.set_defaults(func=_toc)

    p = sub.add_parser("read", help="Read: node bodies as JSON")
    p.add_argument("index")
    p.add_argument("node_ids", nargs="+")
    p.add_argument("--max_chars", type=int, default=DEFAULT_MAX_CHARS)
    p.add_argument("--offset", type=int, default=0)
    p.set_defaults(func=_read)

    p = sub.add_parser("update", help="incremental re-index from a new snapshot (a Beam job)",
                       description="Unknown options go to the Beam job (see pipelines/update.py).")
    p.add_argument("input", help="directory or glob of the new snapshot's HTML files")
    p.add_argument("--index", required=True, help="index directory with a published version")
    p.set_defaults(func=_job("update", lambda a: ["--input", a.input, "--index", a.index], lambda a: a.index))

    p = sub.add_parser("crawl", help="crawl seed URLs and sitemaps into WARC files + a CrawlDB (Beam jobs)",
                       description="Unknown options go to the crawl job (see pipelines/crawl.py). A re-crawl "
                                   "into the same --out sends conditional GETs. Build or update from CRAWL_DIR.")
    p.add_argument("seeds", nargs="*", help="seed URLs")
    p.add_argument("--out", required=True, help="crawl directory (crawldb.parquet, warc/)")
    p.add_argument("--seeds", dest="seeds_file", default=None, help="file of seed URLs, one per line")
    p.set_defaults(func=_crawl)

    p = sub.add_parser("refresh", help="the scheduled loop: crawl -> update (or first build) -> publish",
                       description="Unknown options go to the crawl and build/update jobs (see pipelines/refresh.py).")
    p.add_argument("seeds", nargs="*", help="seed URLs (a re-crawl may omit them: the CrawlDB's are used)")
    p.add_argument("--crawl_dir", required=True, help="crawl directory, re-crawled with conditional GETs")
    p.add_argument("--index", required=True, help="index directory: updated, or built if it has no version")
    p.add_argument("--seeds", dest="seeds_file", default=None, help="file of seed URLs, one per line")
    p.set_defaults(func=_refresh)

    p = sub.add_parser("compact", help="merge a version's segments into one, dropping dead rows (a Beam job)")
    p.add_argument("index")
    p.set_defaults(func=_job("compact", lambda a: ["--index", a.index], lambda a: a.index))

    p = sub.add_parser("versions", help="list published versions (* = live)")
    p.add_argument("index")
    p.set_defaults(func=_versions)

    p = sub.add_parser("rollback", help="make an earlier version live again")
    p.add_argument("index")
    p.add_argument("version")
    p.add_argument("--break_lock", action="store_true", help="take the index's lease from a job known to be gone")
    p.set_defaults(func=_rollback)

    p = sub.add_parser("prune", help="delete all but the newest versions and unreferenced segments")
    p.add_argument("index")
    p.add_argument("--keep", type=int, default=5)
    p.add_argument("--break_lock", action="store_true", help="take the index's lease from a job known to be gone")
    p.set_defaults(func=_prune)

    p = sub.add_parser("inspect", help="forest quality per site, as text and an HTML report")
    p.add_argument("index")
    p.add_argument("--html", help="where to write the HTML report (default: INDEX/report-VERSION.html)")
    p.set_defaults(func=_inspect)

    p = sub.add_parser("synth", help="write a deterministic synthetic corpus of documentation sites")
    p.add_argument("--pages", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--sites", type=int, default=4)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--fanout", type=int, default=8)
    p.add_argument("--words", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--base_url", default="https://synth.example")
    p.set_defaults(func=_synth)

    p = sub.add_parser("serve", help="HTTP service: GetToC and Read, OpenAPI, metrics, a web page",
                       description=f"Auth: set {API_KEY_ENV} to require that key. CORS is off unless --cors_origin.")
    _service_arguments(p, port=8000)
    p.add_argument("--cors_origin", action="append", default=[], help="an origin allowed to call from a browser")
    p.set_defaults(func=_serve)

    p = sub.add_parser("mcp", help="MCP server with the GetToC and Read tools (stdio or streamable HTTP)",
                       description=f"Streamable HTTP serves /mcp; set {API_KEY_ENV} to require that key.")
    _service_arguments(p, port=8001)
    p.add_argument("--transport", choices=("stdio", "streamable-http"), default="stdio")
    p.add_argument("--toc_format", choices=("json", "outline"), default="json",
                   help="what GetToC results show the model: the JSON trees or the compact outline")
    p.add_argument("--allowed_host", action="append", default=[],
                   help="a Host header to accept when --host is not loopback (DNS rebinding protection)")
    p.set_defaults(func=_mcp)

    p = sub.add_parser("tools", help="the GetToC and Read tool definitions, for wiring an agent")
    p.add_argument("--format", choices=("openai", "anthropic", "mcp"), default="openai")
    p.set_defaults(func=_tools)

    p = sub.add_parser("agent", help="the method's agent loop against an OpenAI-compatible chat-completions endpoint",
                       description="Prints the answer, then a JSON summary (nodes read, calls, tokens, latency, "
                                   "error). Exit status 1 when the endpoint failed.")
    p.add_argument("index")
    p.add_argument("question")
    p.add_argument("--base_url", required=True, help="the endpoint's base URL, e.g. http://127.0.0.1:8080/v1")
    p.add_argument("--model", required=True)
    p.add_argument("--api_key_env", help="the environment variable holding the endpoint's API key")
    p.add_argument("--transcript", help="write every model and tool call here, as JSONL")
    p.add_argument("--max_calls", type=int, default=Budget.calls, help="tool calls per question")
    p.add_argument("--max_toc", type=int, default=Budget.toc_calls, help="of which GetToC")
    p.add_argument("--toc_format", choices=("json", "outline"), default="json",
                   help="what GetToC results show the model: the JSON trees or the compact outline")
    p.add_argument("--timeout_s", type=float, default=120.0, help="per model call")
    p.add_argument("--temperature", type=float, help="sampling temperature (default: the endpoint's)")
    p.add_argument("--max_tokens", type=int, help="completion tokens per model call (default: the endpoint's)")
    p.set_defaults(func=_agent)

    p = sub.add_parser("eval", help="score an index on a question file: the sub-forest beside the method's baselines",
                       description="Question file format: benchmarks/questions/README.md. Prints the table; --out "
                                   "writes eval.json and a self-contained eval.html. Real agent numbers need a "
                                   "real model behind --base_url.")
    p.add_argument("index")
    p.add_argument("questions", help="JSONL question file")
    p.add_argument("--k", type=int, default=DEFAULT_K, help="chunks recalled per retriever")
    p.add_argument("--n", type=int, default=DEFAULT_N, help="nodes kept (GetToC hits, BM25- and dense-only rankings)")
    p.add_argument("--max_calls", type=int, default=Budget.calls,
                   help="tool calls per question, the one GetToC included (reader and agent)")
    p.add_argument("--ids_per_read", type=int, default=1, help="nodes the deterministic reader asks per Read")
    p.add_argument("--max_chars", type=int, default=DEFAULT_MAX_CHARS, help="characters of a node one Read returns")
    p.add_argument("--chunks", type=int, default=10, help="chunks the plain-RAG baseline reads")
    for name, (kind, help_text) in RETRIEVAL_FLAGS.items():
        p.add_argument(f"--{name}", type=kind, help=f"{help_text} (default: the index's recorded value)")
    p.add_argument("--out", help="directory for eval.json and eval.html")
    p.add_argument("--agent", action="store_true", help="also run the agent loop on every question")
    p.add_argument("--base_url", help="OpenAI-compatible endpoint (with --agent)")
    p.add_argument("--model", help="model name (with --agent)")
    p.add_argument("--api_key_env", help="the environment variable holding the endpoint's API key")
    p.add_argument("--max_toc", type=int, default=Budget.toc_calls, help="GetToC calls per question (agent)")
    p.add_argument("--toc_format", choices=("json", "outline"), default="json", help="what GetToC shows the agent")
    p.add_argument("--temperature", type=float, help="the agent's sampling temperature (default: the endpoint's)")
    p.add_argument("--max_tokens", type=int, help="completion tokens per model call (default: the endpoint's)")
    p.add_argument("--transcripts", help="directory for one JSONL transcript per question (agent)")
    p.add_argument("--judge_model", help="grade agent answers against questions' `answer` with this model")
    p.set_defaults(func=_eval)

    args, extra = top.parse_known_args(argv)
    jobs = ("build", "update", "compact", "crawl", "refresh")  # Beam jobs: runner flags pass through; progress is logged
    if extra and args.command not in jobs:
        top.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.INFO if args.verbose or args.command in jobs else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.verbose:  # keep a build's log to ritrag's own progress lines
        for noisy in ("apache_beam", "sentence_transformers", "transformers", "httpx"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return args.func(args, extra)
    except Exception as exc:
        refusal = _refusal(exc)
        if refusal is None:
            raise
        print(json.dumps(refusal.to_dict(), ensure_ascii=False), file=sys.stderr)
        return 2 if refusal.reason == "invalid_arguments" else 1


def _refusal(exc: Exception):
    """The ToolError a clean refusal stands for (printed as one JSON line on
    stderr, as serving/errors.py promises); None for a bug, whose trace shows."""
    from ritrag.layout import IndexLoadError, IndexLockedError, IndexNameError
    from ritrag.serving.errors import ToolError

    if isinstance(exc, ToolError):
        return exc
    if isinstance(exc, IndexNameError):
        return ToolError("invalid_arguments", str(exc))
    if isinstance(exc, IndexLoadError):
        return ToolError("index_unavailable", str(exc))
    if isinstance(exc, IndexLockedError):
        return ToolError("index_locked", str(exc))
    return None


"""`ritrag` command line: one sub-command per Python API entry point.

    ritrag build INPUT --out INDEX [build options] [Beam runner options]
    ritrag toc INDEX "query" [--k 200] [--n 50] [--cross_links on|off]   -> JSON on stdout
    ritrag read INDEX NODE_ID... [--max_chars N] [--offset N]
    ritrag update INPUT --index INDEX [Beam runner options]
    ritrag crawl SEED_URL... --out CRAWL_DIR [--seeds FILE] [crawl options]   then build/update CRAWL_DIR
    ritrag refresh SEED_URL... --crawl_dir CRAWL_DIR --index INDEX   crawl -> update (or build) -> publish
    ritrag compact INDEX | ritrag versions INDEX | ritrag rollback INDEX VERSION
    ritrag prune INDEX [--keep 5]
    ritrag inspect INDEX [--html REPORT.html]
    ritrag adapt INDEX --out MODEL_DIR [--steps 200 --max_minutes 60 --batch_size 32 --seed 0 --lr 2e-5]
    ritrag synth --pages N --out DIR [--sites 4 --depth 4 --fanout 8 --words 400 --seed 0]
    ritrag serve INDEX|URL [--host 127.0.0.1 --port 8000]  HTTP: /v1/toc, /v1/read, /docs, a web page
    ritrag mcp INDEX [--transport stdio|streamable-http]  MCP server with the GetToC and Read tools
    ritrag tools [--format openai|anthropic|mcp]        the tool definitions, as JSON
    ritrag agent INDEX "question" --base_url URL --model NAME [--api_key_env VAR] [--transcript FILE]
    ritrag eval INDEX QUESTIONS.jsonl [--k 200 --n 50 --max_calls 10 --chunks 10] [--out DIR] [--compare IDX] ...

The CLI is the top of the dependency graph: it imports the jobs lazily, so the
serving commands never load Beam.
"""
from __future__ import annotations

import argparse
import difflib
import errno
import importlib
import importlib.metadata
import json
import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ritrag.flags import add_arguments, flag_values, from_arguments, option
from ritrag.serving.errors import ToolError

if TYPE_CHECKING:  # imported by the commands that use it: the agent loop loads the serving stack
    from ritrag.evaluation.agent import AgentSettings

# The Beam jobs, each a module of ritrag.pipelines: (one-line help, the job flag
# the CLI takes as its positional argument, a field of JobArguments).
JOBS: dict[str, tuple[str, str]] = {
    "build": ("full build of an index version (a Beam job)", "input"),
    "update": ("incremental re-index from a new snapshot (a Beam job)", "input"),
    "compact": ("merge a version's segments into one, dropping dead rows (a Beam job)", "index"),
    "crawl": ("crawl seed URLs and sitemaps into WARC files + a CrawlDB (Beam jobs)", "seed"),
    "refresh": ("the scheduled loop: crawl -> update (or first build) -> publish", "seed"),
}
JOB_DESCRIPTIONS = {
    # {kinds}: the registry's (transforms/sources/kinds.py), filled in once the job is imported
    "build": "INPUT may mix kinds, each file sniffed by content: {kinds}, WARC "
             "files and crawl directories (ritrag crawl's output); a directory, a glob, or an object-store "
             "URL (any Beam file system).",
    "update": "INPUT: the new snapshot, of the same kinds as a build's. What shaped the index (base URL, "
              "site depth, granularity, model, shards, representation) is the live version's: flags that "
              "ask for other values are refused.",
    "compact": "Merges the live version's segments into one segment, dropping tombstoned rows; nothing "
               "is re-embedded.",
    "crawl": "A re-crawl into the same --out sends conditional GETs. Build or update from CRAWL_DIR.",
    "refresh": "Crawl -> update the index from the crawl directory (or build it, when it has no version "
               "yet) -> publish. One command line feeds the three jobs; each takes its own flags.",
}


@dataclass(frozen=True)
class CommandLine:
    """The flags of `ritrag` itself, before the sub-command."""

    verbose: bool = option(False, "log everything (Beam, model loading, requests)", short="v")


@dataclass(frozen=True)
class JobArguments:
    """What a job's sub-command takes besides the job's flags: the positional
    argument that stands for one job flag (JOBS), and the crawl's --out."""

    input: str = option(help="directory, glob or object-store URL of the input files (see above)", positional=True)
    index: str = option(help="index directory or object-store prefix with a published version", positional=True)
    seed: tuple[str, ...] = option((), "seed URLs", positional=True, flag="seed_urls", metavar="SEED_URL")
    # the crawl's --out: the job's --out (BuildOptions'), whose help names an index, not a crawl directory
    crawl_dir: str | None = option(None, "crawl directory (crawldb.parquet, warc/)", flag="out")


@dataclass(frozen=True)
class IndexArgument:
    """INDEX, the positional argument of the commands that manage or query a
    published index (agent's and eval's are AgentQuestion's and EvalRun's),
    in each family's words; every field is the argument `index`."""

    managed: str = option(help="index directory or object-store prefix", positional=True, flag="index")
    queried: str = option(help="index directory or object-store URL", positional=True, flag="index")


def _job_module(name: str):
    try:
        return importlib.import_module(f"ritrag.pipelines.{name}")
    except ImportError as exc:
        if exc.name and exc.name.split(".")[0] in ("apache_beam", "zarr", "warcio", "protego", "httpx"):
            raise ToolError("invalid_arguments", f"ritrag {name} needs the pipeline extra "
                            f"(pip install 'ritrag[pipeline,crawl]'): {exc}") from None
        raise


def _add_job_parser(sub, name: str):
    """The sub-command of job `name`: its positional argument, then every ritrag
    flag of the job from the job's own definition (ritrag.pipelines.options)."""
    from ritrag.pipelines.options import BEAM_OPTIONS_HELP, add_job_arguments

    summary, positional = JOBS[name]
    job = _job_module(name)
    from ritrag.transforms.sources.kinds import described_kinds  # loaded with the job, which reads input
    description = JOB_DESCRIPTIONS[name].format(kinds=described_kinds())
    p = sub.add_parser(name, help=summary, description=f"{summary}. {description}",
                       epilog=BEAM_OPTIONS_HELP)
    add_arguments(p, JobArguments, only=(positional,),
                  help_notes={"seed": " (a re-crawl may omit them: the CrawlDB's are used)"} if name == "refresh"
                  else None)
    if name == "crawl":
        add_arguments(p, JobArguments, only=("crawl_dir",), required=("crawl_dir",))
    actions = add_job_arguments(p, job.FLAGS, skip=(positional, *(("out",) if name == "crawl" else ())))
    for action in actions:
        if action.dest in ("out", "index", "crawl_dir"):
            action.required = True
    p.set_defaults(func=_run_job(name, actions))


def _run_job(name: str, actions: list):
    def run(args: argparse.Namespace, extra: list[str]) -> int:
        from ritrag.pipelines.options import job_flags

        _, positional = JOBS[name]
        if positional == "seed":
            given = [f for url in args.seed_urls for f in ("--seed", url)]
        else:
            given = [f"--{positional}", getattr(args, positional)]
        if name == "crawl":
            given += ["--out", args.out]
        result = _job_module(name).run([*given, *job_flags(args, actions), *extra])
        if name == "crawl":
            print(json.dumps({"crawl_dir": args.out, "rows": result}))
        elif name == "refresh":
            print(json.dumps(result))
        else:
            print(json.dumps({"index": getattr(args, "out", None) or args.index, "version": result}))
        return 0

    return run


def _toc(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.serving.api import RitragIndex
    from ritrag.serving.tools import TocCall, ToolService

    call = from_arguments(TocCall, args)
    result = ToolService(RitragIndex(args.index)).get_toc(call.query, k=call.k, n=call.n, format=call.format,
                                                          cross_links=call.cross_links)
    if call.format == "outline":  # the text itself, labelled by node ids (for `ritrag read`)
        print(result["outline"])
        return 0
    json.dump(result, sys.stdout, ensure_ascii=False, indent=1)
    print()
    return 0


def _read(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.serving.api import RitragIndex
    from ritrag.serving.tools import ReadCall

    call = from_arguments(ReadCall, args)
    result = RitragIndex(args.index).read(call.node_ids, max_chars=call.max_chars, offset=call.offset,
                                          query=call.query)
    json.dump(result, sys.stdout, ensure_ascii=False, indent=1)
    print()
    return 0 if not result["unknown_ids"] else 3


def _add_store_arguments(p: argparse.ArgumentParser) -> None:
    """Beam's object-store options (S3Options, GoogleCloudOptions' --project),
    from Beam's own definition, for the index commands that run no Beam job:
    the jobs take them with every Beam option. Without Beam installed, these
    commands read local indexes only."""
    try:
        from apache_beam.options.pipeline_options import GoogleCloudOptions, S3Options
    except ImportError:
        return
    from ritrag.pipelines.options import add_job_arguments

    p.set_defaults(store_actions=add_job_arguments(p, {S3Options: None, GoogleCloudOptions: ("project",)}))


def _use_store_options(args: argparse.Namespace) -> None:
    """Configure the object stores the index lives in from the options given (ritrag.storage.use_pipeline_options)."""
    if getattr(args, "store_actions", None):
        from apache_beam.options.pipeline_options import PipelineOptions

        from ritrag.storage import use_pipeline_options
        from ritrag.pipelines.options import job_flags

        use_pipeline_options(PipelineOptions(job_flags(args, args.store_actions)))


def _published_versions(layout) -> list[str]:
    """The versions `layout` holds; MissingIndexError (index_unavailable) where
    it holds none: a mistyped path is an error, not an empty list."""
    from ritrag.layout import MissingIndexError

    versions = layout.versions()
    if not versions:
        raise MissingIndexError(f"{layout.root}: no published version")
    return versions


def _versions(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.layout import IndexLayout

    _use_store_options(args)
    layout = IndexLayout(args.index)
    current = layout.current_version()
    for version in _published_versions(layout):
        m = layout.load_manifest(version)
        pages = m.stats.get("pages", {})
        print(f"{'*' if version == current else ' '} {version}  parent={m.parent or '-'}  "
              f"segments={len(m.segments)}  chunks={m.stats.get('bm25', {}).get('n_chunks', '?')}  "
              f"pages_read={pages.get('pages_read', '?')}  created={time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(m.created))}Z")
    return 0


def _rollback(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.layout import IndexLayout, RollbackTarget, rollback
    from ritrag.lease import IndexLease

    version = from_arguments(RollbackTarget, args).version
    _use_store_options(args)
    layout = IndexLayout(args.index)
    with IndexLease(layout, "rollback", args.break_lock):
        rollback(layout, version)
    print(json.dumps({"index": args.index, "current": version}))
    return 0


def _prune(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.layout import IndexLayout, PruneRetention, prune_versions, retained_versions
    from ritrag.lease import IndexLease
    from ritrag.serving.errors import checked_int

    keep = checked_int("keep", from_arguments(PruneRetention, args).keep, 1)
    _use_store_options(args)
    layout = IndexLayout(args.index)
    _published_versions(layout)  # before the lease, which would make a mistyped path's folder
    with IndexLease(layout, "prune", args.break_lock):
        deleted = prune_versions(layout, keep)
        kept = retained_versions(layout, keep)  # what prune kept, and why (after a rollback, maybe all)
    print(json.dumps({"deleted": deleted, "kept": list(kept), "reason": kept}))
    return 0


def _synth(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.evaluation.synth import SynthConfig, SynthOutput, generate_corpus

    print(json.dumps(generate_corpus(from_arguments(SynthOutput, args).out, from_arguments(SynthConfig, args))))
    return 0


def _inspect(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.evaluation.forest_report import ReportFile, forest_report, render_html, render_text

    _use_store_options(args)
    report = forest_report(args.index)
    print(render_text(report))
    html_path = from_arguments(ReportFile, args).path(args.index, report["version"])
    with open(html_path, "w", encoding="utf-8") as fh:
        fh.write(render_html(report))
    print(f"\nHTML report: {html_path}")
    return 0


def _adapt(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.adaptation import AdaptConfig, AdaptError, adapt
    from ritrag.adaptation.train import AdaptOutput

    try:
        record = adapt(args.index, from_arguments(AdaptOutput, args).out, from_arguments(AdaptConfig, args),
                       progress=lambda line: print(line, file=sys.stderr))
    except AdaptError as exc:  # a clean refusal, printed by main as one JSON line
        raise ToolError("invalid_arguments", str(exc)) from None
    print(json.dumps(record, ensure_ascii=False))
    return 0


def _serve(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.serving.server import ServerConfig, run_http

    run_http(from_arguments(ServerConfig, args, verbose=args.verbose))
    return 0


def _mcp(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.serving.server import ServerConfig, run_mcp

    run_mcp(from_arguments(ServerConfig, args, verbose=args.verbose))
    return 0


def _tools(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.serving.tool_models import ToolListing, tool_definitions

    json.dump(tool_definitions(from_arguments(ToolListing, args).format), sys.stdout, indent=1)
    print()
    return 0


def _api_key(settings: AgentSettings) -> str | None:
    """The endpoint's API key from the variable `--api_key_env` names (agent, eval --agent)."""
    if not settings.api_key_env:
        return None
    api_key = os.environ.get(settings.api_key_env)
    if not api_key:
        raise ToolError("invalid_arguments",
                        f"--api_key_env: the environment variable {settings.api_key_env} is not set")
    return api_key


def _agent(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.evaluation.agent import AgentQuestion, AgentSettings, run_agent

    settings, asked = from_arguments(AgentSettings, args), from_arguments(AgentQuestion, args)
    api_key = _api_key(settings)
    result = run_agent(asked.index, asked.question, base_url=settings.base_url, model=settings.model, api_key=api_key,
                       max_calls=settings.max_calls, max_toc=settings.max_toc, transcript_path=asked.transcript_path,
                       toc_format=settings.toc_format, timeout_s=asked.timeout_s, temperature=settings.temperature,
                       max_tokens=settings.max_tokens)
    print(result.answer)
    print(json.dumps(result.summary(), ensure_ascii=False))
    return 0 if result.error is None else 1


def _eval(args: argparse.Namespace, extra: list[str]) -> int:
    from ritrag.serving.api import one_thread_per_query
    from ritrag.evaluation.agent import AgentSettings
    from ritrag.evaluation.eval import (AgentConfig, EvalConfig, EvalInputError, EvalRun, compare_runs, evaluate,
                                        load_questions, open_index)
    from ritrag.evaluation.report import render_comparison, render_text, write_report
    from ritrag.serving.retrieval import RetrievalParams

    one_thread_per_query()  # questions run one after another; see one_thread_per_query

    run, settings = from_arguments(EvalRun, args), from_arguments(AgentSettings, args)
    agent = None
    if run.agent:
        if not (settings.base_url and settings.model):
            raise ToolError("invalid_arguments", "--agent needs --base_url and --model")
        agent = AgentConfig(base_url=settings.base_url, model=settings.model, api_key=_api_key(settings),
                            max_calls=settings.max_calls, max_toc=settings.max_toc, transcripts_dir=run.transcripts,
                            judge_model=run.judge_model, toc_format=settings.toc_format,
                            temperature=settings.temperature, max_tokens=settings.max_tokens)
    retrieval = flag_values(RetrievalParams, args)  # the flags given
    try:
        RetrievalParams(**retrieval)  # checks the values before any work
    except ValueError as exc:
        raise ToolError("invalid_arguments", str(exc)) from None
    config = from_arguments(EvalConfig, args, max_calls=settings.max_calls, retrieval=retrieval or None)
    try:
        questions = load_questions(run.questions)
        # One index loaded at a time: the first is let go before the second loads.
        reports = [evaluate(open_index(path), questions, config, agent,
                            progress=lambda line: print(line, file=sys.stderr))
                   for path in (run.index, *([run.compare] if run.compare else []))]
    except EvalInputError as exc:  # a clean refusal, printed by main as one JSON line
        raise ToolError("invalid_arguments", str(exc)) from None
    report = reports[0]
    print(render_text(report))
    if run.compare:
        report["comparison"] = compare_runs(report, reports[1])
        print("\n" + render_comparison(report["comparison"]))
    if run.out:
        paths = write_report(report, run.out)
        print(f"\nreport: {paths['json']}, {paths['html']}")
    return 0


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help line ends with its default, where it has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        default, text = action.default, action.help or ""
        if default is None or default is False or default == [] or default == argparse.SUPPRESS \
                or "%(default)" in text:
            return text
        return f"{text} (default: {default!r})" if default == "" else super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse, strict (no abbreviations: `--site_dept` is not `--site_depth`), with
    every option's default in --help and a "did you mean" for a mistyped option."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Help)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        if message.startswith("unrecognized arguments: "):
            flag = next((a for a in message.split(": ", 1)[1].split() if a.startswith("--")), None)
            known = [s for a in self._actions for s in a.option_strings]
            close = difflib.get_close_matches(flag.split("=")[0], known, n=1, cutoff=0.75) if flag else []
            if close:
                message += f"; did you mean {close[0]}?"
        super().error(message)


def _command_of(argv: list[str]) -> str | None:
    """The sub-command named in `argv` (the first word that is not an option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `ritrag` parser. A job's sub-command gets its flags (which imports
    Beam) only when it is the `command` being run or asked for help, so that
    the serving commands never load Beam. Every argument is a dataclass
    field's flag (ritrag.flags), argparse's --help and --version aside."""
    from ritrag.layout import Publishing, PruneRetention, RollbackTarget
    from ritrag.serving.server import API_KEY_ENV, add_server_arguments
    from ritrag.serving.tool_models import ToolListing

    top = _Parser(prog="ritrag", description=__doc__.split("\n\n")[0])
    add_arguments(top, CommandLine)
    # argparse's own action, which prints and exits: no value, so no field
    top.add_argument("--version", action="version", version=f"ritrag {importlib.metadata.version('ritrag')}")
    sub = top.add_subparsers(dest="command", required=True, parser_class=_Parser)

    for name, (summary, _) in JOBS.items():
        if name == command:
            _add_job_parser(sub, name)
        else:
            sub.add_parser(name, help=summary, add_help=False)
        if name == "build":  # the commands in the order of the README
            _add_query_parsers(sub)

    p = sub.add_parser("versions", help="list published versions (* = live)")
    add_arguments(p, IndexArgument, only=("managed",))
    p.set_defaults(func=_versions)
    store_commands = [p]

    p = sub.add_parser("rollback", help="make an earlier version live again")
    add_arguments(p, IndexArgument, only=("managed",))
    add_arguments(p, RollbackTarget)
    add_arguments(p, Publishing, only=("break_lock",))  # the jobs' --break_lock
    p.set_defaults(func=_rollback)
    store_commands.append(p)

    p = sub.add_parser("prune", help="delete all but the newest versions and unreferenced segments")
    add_arguments(p, IndexArgument, only=("managed",))
    add_arguments(p, PruneRetention)
    add_arguments(p, Publishing, only=("break_lock",))
    p.set_defaults(func=_prune)
    store_commands.append(p)

    p = sub.add_parser("inspect", help="forest quality per site, as text and an HTML report")
    add_arguments(p, IndexArgument, only=("managed",))
    if command == "inspect":  # the report's module imports nothing heavy, but only the command run needs it
        from ritrag.evaluation.forest_report import ReportFile

        add_arguments(p, ReportFile)
    p.set_defaults(func=_inspect)
    store_commands.append(p)
    for p in store_commands if command in ("versions", "rollback", "prune", "inspect") else ():
        _add_store_arguments(p)  # only for the command run (imports Beam)

    p = sub.add_parser("adapt", help="fine-tune the index's embedder on pairs from its own forest",
                       description="Fine-tunes the index's embedding model (or --base_model) on (node path -> "
                                   "chunk) and (link text -> target) pairs with in-batch and look-alike "
                                   "negatives, and saves it to --out as a sentence-transformers folder with its "
                                   "training record and checksum. Re-embed with: ritrag build INPUT --out "
                                   "NEW_INDEX --embedding_model OUT (docs/OPERATING.md, 'Adapting the embedder').")
    add_arguments(p, IndexArgument, only=("managed",))
    if command == "adapt":  # the options' home imports nothing heavy, but only the command run needs it
        from ritrag.adaptation.train import AdaptConfig, AdaptOutput

        add_arguments(p, AdaptOutput, required=("out",))
        add_arguments(p, AdaptConfig)
    p.set_defaults(func=_adapt)

    p = sub.add_parser("synth", help="write a deterministic synthetic corpus of documentation sites")
    if command == "synth":
        from ritrag.evaluation.synth import SynthConfig, SynthOutput

        add_arguments(p, SynthOutput, required=("out",))
        add_arguments(p, SynthConfig, required=("pages",))
    p.set_defaults(func=_synth)

    p = sub.add_parser("serve", help="HTTP service: GetToC and Read, OpenAPI, metrics, a web page",
                       description=f"HTTP: POST /v1/toc {{\"query\": ...}}, POST /v1/read {{\"node_ids\": [...]}}, "
                                   f"GET /docs (OpenAPI), /metrics, /readyz, and a web page at /. Auth: set "
                                   f"{API_KEY_ENV} to require that key. CORS is off unless --cors_origin.")
    add_server_arguments(p, only=("workers", "cors_origin"))
    p.set_defaults(func=_serve)

    p = sub.add_parser("mcp", help="MCP server with the GetToC and Read tools (stdio or streamable HTTP)",
                       description=f"Streamable HTTP serves /mcp; set {API_KEY_ENV} to require that key.")
    add_server_arguments(p, only=("toc_format", "allowed_host", "transport"), port=8001)
    p.set_defaults(func=_mcp)

    p = sub.add_parser("tools", help="the GetToC and Read tool definitions, for wiring an agent")
    add_arguments(p, ToolListing)
    p.set_defaults(func=_tools)

    p = sub.add_parser("agent", help="the method's agent loop against an OpenAI-compatible chat-completions endpoint",
                       description="Prints the answer, then a JSON summary (nodes read, calls, tokens, latency, "
                                   "error). Exit status 1 when the endpoint failed.")
    if command == "agent":  # the agent loop's module loads the serving stack: only for the command run
        from ritrag.evaluation.agent import AgentQuestion

        positionals = ("index", "question")  # first: an error names the missing arguments in the order added
        add_arguments(p, AgentQuestion, only=positionals)
        _add_agent_flags(p, required=True)
        add_arguments(p, AgentQuestion, skip=positionals)
    p.set_defaults(func=_agent)

    p = sub.add_parser("eval", help="score an index on a question file: the sub-forest beside the method's baselines",
                       description="Question file format: benchmarks/questions/README.md. Prints the table; --out "
                                   "writes eval.json and a self-contained eval.html. Real agent numbers need a "
                                   "real model behind --base_url.")
    if command == "eval":  # the evaluation's flags, the retrieval parameters it may override, the run's own
        from ritrag.evaluation.eval import EvalConfig, EvalRun
        from ritrag.serving.retrieval import RetrievalParams

        positionals, agent_flags = ("index", "questions"), ("transcripts", "judge_model")  # as agent's, first
        add_arguments(p, EvalRun, only=positionals)
        add_arguments(p, EvalConfig)
        add_arguments(p, RetrievalParams)
        add_arguments(p, EvalRun, skip=(*positionals, *agent_flags))
        _add_agent_flags(p, required=False)
        add_arguments(p, EvalRun, only=agent_flags)  # in --help after the agent loop's settings
    p.set_defaults(func=_eval)
    return top


def _add_agent_flags(p: argparse.ArgumentParser, required: bool) -> None:
    """The agent loop's flags (ritrag.evaluation.agent.AgentSettings) for `agent`
    (the endpoint required) and `eval` (used with --agent)."""
    from ritrag.evaluation.agent import AgentSettings

    endpoint = ("base_url", "model")
    if required:
        add_arguments(p, AgentSettings, required=endpoint)
    else:
        add_arguments(p, AgentSettings, help_notes={name: " (with --agent)" for name in endpoint})


def _add_query_parsers(sub) -> None:
    from ritrag.serving.tools import ReadCall, TocCall

    p = sub.add_parser("toc", help="GetToC: the query-induced sub-forest (JSON, or an outline)")
    add_arguments(p, IndexArgument, only=("queried",))
    add_arguments(p, TocCall)
    p.set_defaults(func=_toc)

    p = sub.add_parser("read", help="Read: node bodies as JSON (exit 3 when an id is unknown)")
    add_arguments(p, IndexArgument, only=("queried",))
    add_arguments(p, ReadCall)
    p.set_defaults(func=_read)


JOB_COMMANDS = tuple(JOBS)


def _quiet_libraries() -> None:
    """Keep a command's output to ritrag's own lines (-v shows everything):
    no model-loading progress bars, no Beam import notices about GCP clients."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # Beam logs this on the root logger when importing its BigQuery client stubs,
    # for every job, although no job uses BigQuery.
    logging.getLogger().addFilter(lambda record: "apitools not found" not in str(record.msg))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    verbose = "-v" in argv or "--verbose" in argv
    if not verbose:
        _quiet_libraries()
    command = _command_of(argv)
    try:
        top = build_parser(command)
    except ToolError as exc:  # a job whose extra is not installed
        print(json.dumps(exc.to_dict(), ensure_ascii=False), file=sys.stderr)
        return 2
    args, extra = top.parse_known_args(argv)
    sub = top._subparsers._group_actions[0].choices[args.command]
    if extra and args.command not in JOB_COMMANDS:
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    # force: importing Beam (a job's flags) has already given the root logger a handler
    logging.basicConfig(level=logging.INFO if verbose or args.command in JOB_COMMANDS else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s", force=True)
    if not verbose:  # keep a build's log to ritrag's own progress lines
        for noisy in ("apache_beam", "sentence_transformers", "transformers", "httpx"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        # Beam logs a worker's error with its traceback before the job fails; a
        # full disk is then the one JSON line `_refusal` prints, and nothing more.
        for handler in logging.getLogger().handlers:
            handler.addFilter(_not_beams_no_space)
    try:
        return args.func(args, extra)
    except BrokenPipeError:
        # The reader went away (`ritrag toc ... | head`): what was asked for was
        # read. Python's own recipe: stdout to devnull, so its flush at exit is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        if args.command in JOB_COMMANDS:
            from ritrag.pipelines.options import JobOptionsError

            if isinstance(exc, JobOptionsError):
                sub.error(str(exc))  # exit 2 with the usage, like argparse's own errors
        refusal = _refusal(exc, args.command)
        if refusal is None:
            raise
        line, status = refusal
        print(json.dumps(line, ensure_ascii=False), file=sys.stderr)
        return status


# How an ENOSPC reads in an error's text: Python's "[Errno 28] No space left on
# device", Arrow's "[errno 28] ...", or strerror alone. A Beam runner re-raises a
# worker's error as a new exception carrying only the original's traceback text.
_NO_SPACE = re.compile(rf"[^\n]*(?:\[errno {errno.ENOSPC}\]|{re.escape(os.strerror(errno.ENOSPC))})[^\n]*",
                       re.IGNORECASE)


def _no_space(exc: BaseException) -> str | None:
    """What the full disk that `exc` is or carries (chained, or in the text of an
    error a runner re-raised) said, None if it carries none."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return str(exc)
        quoted = _NO_SPACE.search(str(exc))
        if quoted:
            return quoted[0].strip()
        exc = exc.__cause__ or exc.__context__
    return None


def _not_beams_no_space(record: logging.LogRecord) -> bool:
    return not (record.name.startswith("apache_beam") and _NO_SPACE.search(record.getMessage()))


def _refusal(exc: Exception, command: str) -> tuple[dict, int] | None:
    """(the one JSON line printed on stderr, exit status) of a clean refusal,
    as serving/errors.py promises; None for a bug, whose trace shows. A full disk
    is no bug: the job failed where it wrote, and publishes nothing."""
    from ritrag.layout import IndexLoadError, IndexNameError, UnknownVersionError
    from ritrag.lease import IndexLockedError
    from ritrag.storage import StoreUnavailableError

    no_space = _no_space(exc)
    if no_space is not None:
        return {"error": {"reason": "no_space", "message": f"disk full: {no_space}"}}, 1

    if command in JOB_COMMANDS:
        from ritrag.pipelines.launcher import NothingToPublishError

        if isinstance(exc, NothingToPublishError):
            return {"error": {"reason": "nothing_to_publish", "message": str(exc)}}, 1
    if isinstance(exc, IndexNameError):
        exc = ToolError("invalid_arguments", str(exc))
    elif isinstance(exc, UnknownVersionError):
        exc = ToolError("unknown_version", str(exc))
    elif isinstance(exc, (IndexLoadError, StoreUnavailableError)):
        exc = ToolError("index_unavailable", str(exc))
    elif isinstance(exc, IndexLockedError):
        exc = ToolError("index_locked", str(exc))
    if isinstance(exc, ToolError):
        return exc.to_dict(), 2 if exc.reason == "invalid_arguments" else 1
    return None

"""The method's agent loop against any OpenAI-compatible chat-completions
endpoint (vLLM, llama.cpp server, Ollama, hosted APIs), and an LLM judge.

`run_agent` gives the model GetToC and Read exactly as `ritrag tools --format
openai` defines them and executes its tool calls through a `ToolService` in one
episode, so the budgets (10 calls, 3 GetToC by default), the limits and the
rendering are the served ones: a refused call goes back to the model as the
service's structured error. Arguments the service cannot take (bad JSON, an
unknown tool, wrong types) are answered with an `invalid_arguments` or
`unknown_tool` error naming the field, and the loop goes on. The episode ends
on an assistant message without tool calls; when the budget is spent (or the
model keeps calling past `max_turns`) the model is asked once, without tools,
for its final answer. An endpoint that fails (HTTP error, timeout, a reply
that is not a chat completion) ends the episode with `error` set.

Every model call and tool call is a row of the transcript (JSONL when a path is
given). Numbers from a scripted endpoint measure the loop, not a model: answer
quality and evidence figures need a real model behind `base_url`.
"""
from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Literal

import httpx

from ritrag.chat import EndpointError, chat_completion
from ritrag.flags import option
from ritrag.serving.budget import GET_TOC, READ, Budget, EpisodeBudgets
from ritrag.serving.errors import ToolError
from ritrag.serving.outline import count_tokens, toc_json_text
from ritrag.serving.tool_models import TOOLS, tool_definitions
from ritrag.serving.tools import DEFAULT_TOC_FORMAT, ToolService, TocFormat

LOG = logging.getLogger("ritrag.evaluation.agent")

SYSTEM_PROMPT = """\
You answer questions about a documentation corpus that you can see only through two tools.

GetToC(query) searches the whole corpus and returns a table of contents: the sections that best match the \
query (hit, with a score; best first) inside their trees of ancestors (product, version, chapter), each with \
an id and a title. It returns no text. Every call searches afresh: to look somewhere else, rewrite the query.
Read(node_ids) returns the text of the nodes you choose, by the ids GetToC listed.

Work like this: call GetToC to see the map. Use the ancestors to tell look-alike sections apart (the same \
title under another product or version). Read only the nodes most likely to hold the answer. If they do not, \
Read other nodes from the map, or call GetToC with a rewritten query.

Budget: at most {max_calls} tool calls in all, of which at most {max_toc} GetToC. A call over the budget is \
refused. Answer from what you have read, briefly and exactly; if you did not find the answer, say so."""

FINAL_ANSWER_PROMPT = ("The tool budget is spent ({reason}). Answer the question now from what you have read; "
                       "if you did not find the answer, say so.")

JUDGE_PROMPT = """\
You grade an answer to a question against a reference answer.

Question: {question}

Reference answer: {reference}

Answer to grade: {answer}

Score 1 if the answer states what the reference states (other words are fine; extra correct detail is fine), \
0.5 if it is partly right or incomplete, 0 if it is wrong, contradicts the reference, or does not answer.
Reply with one JSON object and nothing else: {{"score": <0, 0.5 or 1>, "reason": "<one sentence>"}}"""


@dataclass
class AgentResult:
    """One episode: the final answer, what was read, what it cost."""

    question: str
    answer: str
    nodes_read: list[str]  # ids of the nodes Read returned text of, first read first, each once
    calls: int  # tool calls charged to the budget (GetToC and Read)
    toc_calls: int  # of which GetToC
    prompt_tokens: int  # summed over model calls, as the endpoint reported them
    completion_tokens: int
    latency_s: float  # the whole episode, wall clock
    error: str | None  # the endpoint failed: the episode ended without an answer
    model_calls: int = 0
    stop: str = ""  # answered | budget_spent | turn_limit | error
    episode_id: str = ""
    transcript: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Everything but the transcript, as JSON-ready values."""
        out = asdict(self)
        del out["transcript"]
        return out


TIMEOUT_S = 120.0  # seconds one model call may take (connect, read, write)


@dataclass(frozen=True)
class AgentSettings:
    """The agent loop's endpoint, budget and sampling: the flags of `ritrag
    agent` (the endpoint required) and `ritrag eval` (with --agent; --max_calls
    bounds its deterministic reader too), defined once here."""

    base_url: str | None = option(None, "the OpenAI-compatible endpoint's base URL, e.g. http://127.0.0.1:8080/v1")
    model: str | None = option(None, "model name the endpoint serves")
    api_key_env: str | None = option(None, "the environment variable holding the endpoint's API key")
    max_calls: int = option(Budget.calls, "tool calls per question, the one GetToC included")
    max_toc: int = option(Budget.toc_calls, "of which GetToC")
    toc_format: Literal["json", "outline"] = option(
        DEFAULT_TOC_FORMAT, "what GetToC results show the model: the JSON trees or the compact outline")
    temperature: float | None = option(None, "sampling temperature (default: the endpoint's)")
    max_tokens: int | None = option(None, "completion tokens per model call (default: the endpoint's)")


@dataclass(frozen=True)
class AgentQuestion:
    """One question put to the loop by `ritrag agent`: the arguments of
    `run_agent` that AgentSettings does not hold."""

    index: str = option(help="index directory", positional=True)
    question: str = option(help="the question to answer", positional=True)
    transcript_path: str | None = option(None, "write every model and tool call here, as JSONL", flag="transcript")
    timeout_s: float = option(TIMEOUT_S, "per model call")


def run_agent(index: str | ToolService, question: str, *, base_url: str, model: str, api_key: str | None = None,
              max_calls: int = Budget.calls, max_toc: int = Budget.toc_calls, transcript_path: str | None = None,
              toc_format: TocFormat | None = None, max_turns: int | None = None, timeout_s: float = TIMEOUT_S,
              temperature: float | None = None, max_tokens: int | None = None,
              client: httpx.Client | None = None) -> AgentResult:
    """Answer `question` with the model at `base_url` using GetToC and Read
    over `index` (an index directory, or a loaded `ToolService` whose index,
    limits, k, n and ToC format are used) within a budget of `max_calls` tool
    calls, at most `max_toc` of them GetToC.

    `max_turns` bounds the model calls that may use tools (default
    2 * max_calls: calls the service refuses or cannot parse are not charged
    to the budget, so the budget alone does not end a model that keeps
    making them). `toc_format` json or outline: what GetToC shows the model
    (default: the service's, json for a path). `client` reuses connections
    across episodes; its own timeout then applies instead of `timeout_s`."""
    service = _episode_service(index, Budget(calls=max_calls, toc_calls=max_toc), toc_format)
    episode = f"agent-{uuid.uuid4().hex[:12]}"
    max_turns = 2 * max_calls if max_turns is None else max_turns
    result = AgentResult(question=question, answer="", nodes_read=[], calls=0, toc_calls=0, prompt_tokens=0,
                         completion_tokens=0, latency_s=0.0, error=None, episode_id=episode)
    transcript = open(transcript_path, "w", encoding="utf-8") if transcript_path else None
    owned = client is None
    client = client or httpx.Client(timeout=timeout_s)
    started = time.perf_counter()
    try:
        loop = _Episode(service, episode, base_url, model, api_key, client, result, transcript,
                        temperature, max_tokens)
        loop.log({"event": "start", "question": question, "model": model, "base_url": base_url,
                  "budget": {"calls": max_calls, "get_toc": max_toc}, "max_turns": max_turns,
                  "index_version": service.index.version, "toc_format": service.toc_format})
        loop.run(max_calls, max_toc, max_turns)
    finally:
        result.latency_s = round(time.perf_counter() - started, 3)
        end = {"event": "end", **result.summary()}
        result.transcript.append(end)
        if transcript:
            transcript.write(json.dumps(end, ensure_ascii=False) + "\n")
            transcript.close()
        if owned:
            client.close()
    return result


def _episode_service(index: str | ToolService, budget: Budget, toc_format: TocFormat | None) -> ToolService:
    """A service charging this episode's `budget`: over the given service's
    loaded index, settings and episode memory (outline handles, read marks;
    the episode id is new, so nothing is shared), or over the index
    directory loaded here."""
    budgets = EpisodeBudgets(budget)
    if isinstance(index, ToolService):
        return ToolService(index.index, index.limits, budgets, k=index.k, n=index.n,
                           toc_format=toc_format or index.toc_format, episodes=index.episodes)
    from ritrag.serving.api import RitragIndex

    return ToolService(RitragIndex(index), budgets=budgets, toc_format=toc_format or DEFAULT_TOC_FORMAT)


class _Episode:
    """The state of one run: the conversation, the counters, the transcript."""

    def __init__(self, service: ToolService, episode: str, base_url: str, model: str,
                 api_key: str | None, client: httpx.Client, result: AgentResult, transcript: IO[str] | None,
                 temperature: float | None, max_tokens: int | None):
        self.service, self.episode, self.base_url, self.model = service, episode, base_url, model
        self.api_key, self.client, self.result, self.transcript = api_key, client, result, transcript
        self.options = {key: value for key, value in (("temperature", temperature), ("max_tokens", max_tokens))
                        if value is not None}
        self.messages: list[dict[str, Any]] = []
        self.calls_left: int | None = None  # as the service last reported it

    def log(self, row: dict[str, Any]) -> None:
        self.result.transcript.append(row)
        if self.transcript:
            self.transcript.write(json.dumps(row, ensure_ascii=False) + "\n")
            self.transcript.flush()

    def run(self, max_calls: int, max_toc: int, max_turns: int) -> None:
        self.messages = [{"role": "system", "content": SYSTEM_PROMPT.format(max_calls=max_calls, max_toc=max_toc)},
                         {"role": "user", "content": self.result.question}]
        tools = tool_definitions("openai")
        for _ in range(max_turns):
            message = self.ask(tools)
            if message is None:
                return
            tool_calls = message.get("tool_calls") or []
            if not tool_calls:
                self.finish(message, "answered")
                return
            for call in tool_calls:
                self.execute(call)
            if self.calls_left == 0:
                self.final_answer("budget_spent", f"all {max_calls} tool calls used")
                return
        self.final_answer("turn_limit", f"{max_turns} model turns with tool calls")

    def final_answer(self, stop: str, reason: str) -> None:
        self.messages.append({"role": "user", "content": FINAL_ANSWER_PROMPT.format(reason=reason)})
        message = self.ask(None)
        if message is not None:
            self.finish(message, stop)

    def finish(self, message: dict[str, Any], stop: str) -> None:
        self.result.answer = message.get("content") or ""
        self.result.stop = stop

    def ask(self, tools: list[dict[str, Any]] | None) -> dict[str, Any] | None:
        """One model call; None (and `error` set) when the endpoint failed."""
        body: dict[str, Any] = {"model": self.model, "messages": self.messages, **self.options}
        if tools:
            body["tools"] = tools
        turn = self.result.model_calls
        self.result.model_calls += 1
        started = time.perf_counter()
        try:
            reply = chat_completion(self.client, self.base_url, body, self.api_key)
        except EndpointError as exc:
            self.result.error, self.result.stop = str(exc), "error"
            self.log({"event": "model", "turn": turn, "tools_offered": bool(tools), "messages": len(self.messages),
                      "latency_s": round(time.perf_counter() - started, 3), "error": str(exc)})
            return None
        message = reply["choices"][0]["message"]
        usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
        self.result.prompt_tokens += _int(usage.get("prompt_tokens"))
        self.result.completion_tokens += _int(usage.get("completion_tokens"))
        tool_calls = [_as_tool_call(call, turn, i) for i, call in enumerate(message.get("tool_calls") or [])]
        # Only what the API defines goes back into the conversation (servers add their own fields).
        echoed: dict[str, Any] = {"role": "assistant", "content": _text(message.get("content"))}
        if tool_calls and tools:
            echoed["tool_calls"] = tool_calls
        self.messages.append(echoed)
        self.log({"event": "model", "turn": turn, "tools_offered": bool(tools), "messages": len(self.messages) - 1,
                  "latency_s": round(time.perf_counter() - started, 3), "usage": usage or None,
                  "finish_reason": reply["choices"][0].get("finish_reason"), "content": echoed["content"],
                  "tool_calls": [{"id": c["id"], "name": c["function"]["name"],
                                  "arguments": c["function"]["arguments"]} for c in tool_calls]})
        return echoed

    def execute(self, call: dict[str, Any]) -> None:
        """Run one tool call through the service and answer it with a tool
        message: the rendered result, or the error as JSON."""
        name, raw = call["function"]["name"], call["function"]["arguments"]
        started = time.perf_counter()
        row: dict[str, Any] = {"event": "tool", "call_id": call["id"], "tool": name,
                               "arguments": raw if len(raw) <= 2_000 else raw[:2_000] + "..."}
        charged = False
        try:
            result = self.service.call(name, _parse_arguments(name, raw), episode_id=self.episode)
            charged = True
            text = self.service.text_of(result)
            if name == READ:
                row["node_ids"] = [node["id"] for node in result["nodes"]]
                row["unknown_ids"] = result["unknown_ids"]
                self.result.nodes_read.extend(i for i in row["node_ids"] if i not in self.result.nodes_read)
            else:
                row["hits"] = result["hits"]
            budget = result.get("budget")
        except ToolError as error:
            # unknown_ids is refused after the call was charged; the budget it reports says so.
            charged = error.reason == "unknown_ids"
            text = toc_json_text(error.to_dict())
            row["error"] = {"reason": error.reason, "message": error.message}
            budget = error.details.get("budget")
        except Exception:  # a fault of the index, not of the model: reported to it as the servers do
            LOG.exception("internal error in %s", name)
            text = toc_json_text(ToolError("internal_error", "internal error; see the log").to_dict())
            row["error"] = {"reason": "internal_error", "message": "internal error"}
            budget = None
        if charged:
            self.result.calls += 1
            self.result.toc_calls += name == GET_TOC
        if budget:
            self.calls_left = budget["calls_left"]
        self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
        self.log({**row, "charged": charged, "budget": budget, "result_chars": len(text),
                  "result_tokens": count_tokens(text), "latency_s": round(time.perf_counter() - started, 3)})


def _as_tool_call(call: Any, turn: int, i: int) -> dict[str, Any]:
    """A tool call in the API's shape whatever the server sent: a call
    without an id gets one (the tool message must name it), arguments as a
    string (some servers send an object)."""
    call = call if isinstance(call, dict) else {}
    function = call.get("function") if isinstance(call.get("function"), dict) else {}
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": str(call.get("id") or f"call_{turn}_{i}"), "type": "function",
            "function": {"name": str(function.get("name") or ""), "arguments": arguments}}


def _parse_arguments(tool: str, raw: str) -> dict[str, Any]:
    """The arguments a model sent, as a JSON object, or an
    `invalid_arguments` error that shows the model what to send instead."""
    if tool not in TOOLS:
        return {}  # the service answers unknown_tool, the more useful error
    hint = f"; send one JSON object with {tool}'s fields: {', '.join(TOOLS[tool][0].model_fields)}"
    try:
        arguments = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise ToolError("invalid_arguments", f"arguments are not valid JSON ({exc.msg} at character {exc.pos})"
                        + hint, errors=[{"field": "(body)", "message": "invalid JSON"}]) from None
    if not isinstance(arguments, dict):
        raise ToolError("invalid_arguments", f"arguments must be a JSON object, not {type(arguments).__name__}"
                        + hint, errors=[{"field": "(body)", "message": "not an object"}])
    return arguments


def _text(content: Any) -> str | None:
    """A message's content as text: a string, or the text parts of a list of
    content parts (some servers send those)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content if isinstance(content, str) else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def parse_judge_reply(text: str) -> float | None:
    """The score in a judge's reply: the `score` of the first JSON object in
    it (code fences and prose around it allowed), else a `score: X` in the
    text; None when there is none or it is outside [0, 1]."""
    score: Any = None
    for match in re.finditer(r"\{[^{}]*\}", text):
        try:
            obj = json.loads(match.group())
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "score" in obj:
            score = obj["score"]
            break
    if score is None:
        match = re.search(r'"?score"?\s*[:=]\s*"?([0-9]*\.?[0-9]+)', text, re.IGNORECASE)
        score = match.group(1) if match else None
    try:
        value = float(score)
    except (TypeError, ValueError):
        return None
    return value if 0.0 <= value <= 1.0 else None


def judge_answer(question: str, reference: str, answer: str, *, base_url: str, model: str,
                 api_key: str | None = None, timeout_s: float = TIMEOUT_S, client: httpx.Client | None = None) -> float:
    """An LLM judge's score in [0, 1] of `answer` against `reference`
    (`JUDGE_PROMPT`, temperature 0): 1 correct, 0.5 partly, 0 wrong. NaN when
    there is no score: the endpoint failed or its reply held no score in
    [0, 1] (logged with the reply); aggregates should count those apart."""
    body = {"model": model, "temperature": 0,
            "messages": [{"role": "user", "content": JUDGE_PROMPT.format(question=question, reference=reference,
                                                                        answer=answer or "(no answer)")}]}
    owned = client is None
    client = client or httpx.Client(timeout=timeout_s)
    try:
        reply = chat_completion(client, base_url, body, api_key)
    except EndpointError as exc:
        LOG.warning("judge: %s", exc)
        return math.nan
    finally:
        if owned:
            client.close()
    content = _text(reply["choices"][0]["message"].get("content")) or ""
    score = parse_judge_reply(content)
    if score is None:
        LOG.warning("judge: no score in [0, 1] in the reply %r", content[:300])
        return math.nan
    return score

"""The metadata backend of any OpenAI-compatible chat-completions endpoint
(vLLM, llama.cpp's server, Ollama, hosted APIs), over the one chat client
(`ritrag.chat.chat_completion`).

Per batch, at most `in_flight` requests are open at once (a thread pool per
worker's DoFn instance). Each request has a deadline (`deadline_s`: every read
and the whole answer); an answer past `max_answer_bytes` is cut off and
refused. A 429 or a 5xx is tried again, up to `max_attempts` in all, after the
Retry-After the endpoint asked for (capped at `max_retry_after_s`) or an
exponential backoff; a timeout, a refused connection that persists, another
4xx or a malformed answer fails the node at once, counted by its reason.
"""
from __future__ import annotations

import dataclasses
from dataclasses import field
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import httpx

from ritrag.chat import EndpointError, chat_completion
from ritrag.flags import option
from ritrag.transforms.counts import CountingDoFn
from ritrag.transforms.metadata.base import (Answer, MetadataFailure, MetadataRequest, ModelAnswer, NodeMetadata,
                                             parse_answer)

RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
Messages = list[dict[str, str]]


@dataclasses.dataclass(frozen=True)
class EndpointConfig:
    """How to reach the model and how patient to be with it."""

    # The jobs' --metadata_* flags are these fields' (transforms/metadata/enrich.py MetadataOptions).
    # The base URL: `{endpoint}/chat/completions` is posted to.
    endpoint: str = option(help="base URL of an OpenAI-compatible chat-completions endpoint (its /chat/completions "
                                "is posted to, e.g. http://127.0.0.1:8080/v1); left out: no model metadata (an "
                                "update of an index built with a model needs it)", flag="metadata_endpoint")
    model: str = field(metadata={"cli": False})  # the index's (ModelSteps: --metadata_model)
    # the environment variable holding the key, read where the requests are made
    api_key_env: str | None = option(None, "environment variable holding the endpoint's API key (read on the "
                                           "workers; the key itself is never a flag)", flag="metadata_api_key_env")
    in_flight: int = option(4, "metadata requests open at once per worker", flag="metadata_in_flight")
    deadline_s: float = option(60.0, "seconds one metadata request may take, its whole answer included",
                               flag="metadata_deadline_s")
    max_attempts: int = option(3, "tries of one request that got 429 or 5xx, the first included",
                               flag="metadata_max_attempts")
    # the first retry's wait without Retry-After; doubled per attempt
    backoff_s: float = field(default=1.0, metadata={"cli": False})
    max_retry_after_s: float = field(default=30.0, metadata={"cli": False})
    max_answer_tokens: int = option(256, "max_tokens asked of the model per answer", flag="metadata_max_answer_tokens")
    max_answer_bytes: int = field(default=64 << 10, metadata={"cli": False})

    def __post_init__(self):
        if not self.endpoint or not self.model:
            raise ValueError("a metadata endpoint needs both --metadata_endpoint and --metadata_model")
        if self.in_flight < 1 or self.max_attempts < 1 or self.deadline_s <= 0 or self.max_answer_bytes < 1:
            raise ValueError("metadata requests in flight, attempts, deadline and answer size must be positive")


class OpenAICompatibleModel:
    """`NodeMetadataModel` over an OpenAI-compatible endpoint; `ask` puts any checked question to it."""

    def __init__(self, config: EndpointConfig):
        self.config = config
        self._api_key = os.environ.get(config.api_key_env) if config.api_key_env else None
        timeout = httpx.Timeout(config.deadline_s)
        self._client = httpx.Client(timeout=timeout, limits=httpx.Limits(max_connections=config.in_flight))
        self._pool = ThreadPoolExecutor(max_workers=config.in_flight, thread_name_prefix="ritrag-metadata")

    def describe(self, requests: Sequence[MetadataRequest]) -> list[ModelAnswer[NodeMetadata]]:
        return self.ask([request.messages() for request in requests], parse_answer)

    def ask(self, questions: Sequence[Messages], parse: Callable[[str], Answer]) -> list[ModelAnswer[Answer]]:
        """One answer per question (its chat messages), in order, each checked
        by `parse` (which raises MetadataFailure for an answer it refuses)."""
        return list(self._pool.map(lambda messages: self._ask_one(messages, parse), questions))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()

    def _ask_one(self, messages: Messages, parse: Callable[[str], Answer]) -> ModelAnswer[Answer]:
        config = self.config
        body = {"model": config.model, "messages": messages, "temperature": 0,
                "max_tokens": config.max_answer_tokens}
        attempts = tokens_in = tokens_out = 0
        while True:
            attempts += 1
            try:
                reply = chat_completion(self._client, config.endpoint, body, self._api_key,
                                        max_bytes=config.max_answer_bytes, deadline_s=config.deadline_s)
            except EndpointError as exc:
                retried = exc.status in RETRIED_STATUSES or exc.reason == "connection"
                if not retried or attempts >= config.max_attempts:
                    reason = f"http_{exc.status}" if exc.reason == "http_status" else exc.reason
                    return ModelAnswer(None, reason, attempts, tokens_in, tokens_out)
                time.sleep(self._wait_s(exc, attempts))
                continue
            usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
            tokens_in += _tokens(usage.get("prompt_tokens"))
            tokens_out += _tokens(usage.get("completion_tokens"))
            try:
                content = reply["choices"][0]["message"].get("content")
                if not isinstance(content, str):
                    raise MetadataFailure("no text content in the message")
                return ModelAnswer(parse(content), None, attempts, tokens_in, tokens_out)
            except MetadataFailure as exc:
                return ModelAnswer(None, exc.reason, attempts, tokens_in, tokens_out)

    def _wait_s(self, error: EndpointError, attempts: int) -> float:
        if error.retry_after_s is not None:
            return min(error.retry_after_s, self.config.max_retry_after_s)
        return min(self.config.backoff_s * 2 ** (attempts - 1), self.config.max_retry_after_s)


def _tokens(value: object) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


class AskingDoFn(CountingDoFn):
    """A DoFn that asks the model: one client (its thread pool and connections)
    per DoFn instance, from setup to teardown."""

    def __init__(self, namespace: str, endpoint: EndpointConfig):
        super().__init__(namespace)
        self._endpoint = endpoint

    def setup(self):
        self._model = OpenAICompatibleModel(self._endpoint)

    def teardown(self):
        self._model.close()

    def count_cost(self, prefix: str, answer: ModelAnswer) -> None:
        """<prefix>_requests, _tokens_in and _tokens_out: what one answer cost."""
        self.count(f"{prefix}_requests", answer.requests)
        self.count(f"{prefix}_tokens_in", answer.tokens_in)
        self.count(f"{prefix}_tokens_out", answer.tokens_out)

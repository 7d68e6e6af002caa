"""The stage `EnrichNodeMetadata`: node rows -> the same rows, those the model
described carrying its summary and keywords (docs/METADATA.md).

    nodes --key--> (metadata_key, node) --join--> cache hit: the cached metadata
                                  |                cache miss --budget--> batches --model--> metadata | counted failure
    ReadMetadataCache ------------+                                   \--> new cache records (WriteMetadataCache)

Only nodes that hold text (a page or section with a body) are asked; one
question per distinct node text (`metadata_key`), however many nodes share it.
A failed or refused node keeps the metadata it came with (its source's own
description and tags) and is counted; the job goes on. Every node the stage
may describe ends in exactly one of metadata_enriched (the model's, asked now
or cached), metadata_failed, metadata_not_asked (past the token budget); the
counts go to the segment's counts.json and the manifest with metadata_requests,
metadata_tokens_in and metadata_tokens_out (what the endpoint reported) and
metadata_cache_hits.

The budget (`max_tokens`) is planned before any request, for what an earlier
stage of the job left of it (`spent_before`: --induce_toc llm's): the distinct texts not
in the cache are taken in key order (deterministic, and unrelated to where a
node sits), each costed at its prompt's characters / CHARS_PER_TOKEN plus the
answer's token cap, and admitted while the sum stays within the budget; the
first that does not fit ends the admission, and every text after it is not
asked (counted). One combiner decides this for the whole job, so the budget is
global across workers, and the estimate errs high, so the tokens an endpoint
reports stay under the budget for text in languages BPE tokenizers treat well.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from ritrag.flags import add_arguments, from_arguments, option
from ritrag.index_config import ModelSteps
from ritrag.representation import PATH_SEPARATOR
from ritrag.schema import NodeRow
from ritrag.transforms import records  # noqa: F401  (the records' RowCoder)
from ritrag.transforms.counts import COUNTS, CountingDoFn, record_counts
from ritrag.transforms.metadata.base import (MAX_BODY_CHARS, SYSTEM_PROMPT, USER_PROMPT,
                                             MetadataRequest, NodeMetadata, metadata_key)
from ritrag.transforms.metadata.cache import (MISSES, ReadMetadataCache, SplitByCacheFn, WriteMetadataCache,
                                              cache_record, default_cache_dir)
from ritrag.transforms.metadata.openai_compatible import AskingDoFn, EndpointConfig

NAMESPACE = "ritrag.metadata"
CHARS_PER_TOKEN = 3  # the budget's estimate; English text runs about 4 characters a token
METADATA_COUNTERS = ("metadata_nodes", "metadata_cache_hits", "metadata_asked", "metadata_requests",
                     "metadata_tokens_in", "metadata_tokens_out", "metadata_enriched", "metadata_failed",
                     "metadata_not_asked")
RECORDS = "records"


class MetadataOptions(PipelineOptions):
    """Model metadata: where the chat model is served and how patiently it is asked (docs/METADATA.md).

    Which model, and what it is asked, shape the index: they are its config's
    (ritrag/index_config.py ModelSteps: --metadata_model, --metadata_nodes,
    --induce_toc, --induce_toc_min_pages), which an update keeps."""

    @classmethod
    def _add_argparse_args(cls, parser):
        for config in (EndpointConfig, MetadataPlan):  # the flags are these fields'
            add_arguments(parser, config)


@dataclasses.dataclass(frozen=True)
class MetadataPlan:
    """What the stage does in one job: whom to ask, where the cache lives, the budget."""

    endpoint: EndpointConfig = dataclasses.field(metadata={"cli": False})  # its flags: EndpointConfig's fields
    cache_dir: str = option(help="folder or bucket prefix of the metadata cache (default: INDEX/metadata_cache)",
                            flag="metadata_cache")
    max_tokens: int | None = option(None, "token budget of the job's metadata requests, planned before any request "
                                          "(docs/METADATA.md); default: no budget", flag="metadata_max_tokens")
    batch_size: int = option(16, "most nodes a worker takes into one batch of requests", flag="metadata_batch_size")

    @classmethod
    def for_nodes(cls, options: PipelineOptions, index_dir: str, steps: ModelSteps) -> "MetadataPlan | None":
        """The plan of the node metadata `steps` (the index's config) ask for; None when they ask none."""
        plan = cls.from_options(options, index_dir, steps)
        return plan if steps.describes_nodes else None

    @classmethod
    def from_options(cls, options: PipelineOptions, index_dir: str, steps: ModelSteps) -> "MetadataPlan | None":
        """The endpoint, cache and budget a job's flags give the model of `steps`
        (the index's config); None when no model is asked. ValueError when the
        flags and the steps do not make a plan (a model without an endpoint, ...)."""
        opts = options.view_as(MetadataOptions)
        if steps.model is None and opts.metadata_endpoint is None:
            return None
        if opts.metadata_endpoint is None:
            raise ValueError("--metadata_model needs --metadata_endpoint")
        if opts.metadata_max_tokens is not None and opts.metadata_max_tokens < 0:
            raise ValueError(f"--metadata_max_tokens must be at least 0, not {opts.metadata_max_tokens}")
        if opts.metadata_batch_size < 1:
            raise ValueError(f"--metadata_batch_size must be at least 1, not {opts.metadata_batch_size}")
        return from_arguments(cls, opts, endpoint=from_arguments(EndpointConfig, opts, model=steps.model or ""),
                              cache_dir=opts.metadata_cache or default_cache_dir(index_dir))


def describable(node: NodeRow) -> bool:
    """A node the model is asked about: one that holds text."""
    return node.kind not in ("site", "virtual") and bool(node.body.strip())


def metadata_request(key: str, node: NodeRow) -> MetadataRequest:
    path = PATH_SEPARATOR.join(t.strip() for t in (*node.ancestor_titles, node.title) if t.strip())
    return MetadataRequest(key, path, node.body[:MAX_BODY_CHARS])


def estimated_tokens(request: MetadataRequest, max_answer_tokens: int) -> int:
    """The budget's cost of one request (module docstring): high rather than low."""
    chars = len(SYSTEM_PROMPT) + len(USER_PROMPT.format(path=request.path, body=request.body))
    return math.ceil(chars / CHARS_PER_TOKEN) + max_answer_tokens


def with_model_metadata(node: NodeRow, key: str, metadata: NodeMetadata) -> NodeRow:
    """The node row with the model's summary and keywords (its source's stay in source_*)."""
    return node._replace(summary=metadata.summary, keywords=list(metadata.keywords), metadata_key=key)


class JoinCacheFn(SplitByCacheFn):
    """(key, {"asked": nodes, "cached"}) -> enriched nodes (cache hits), or (key, nodes) on MISSES."""

    def __init__(self):
        super().__init__(NAMESPACE)

    def asking(self, nodes: list[dict]) -> None:
        self.count("metadata_nodes", len(nodes))

    def hits(self, key: str, nodes: list[dict], cached: NodeMetadata) -> Iterable[dict]:
        self.count("metadata_cache_hits", len(nodes))
        self.count("metadata_enriched", len(nodes))
        for node in nodes:
            yield with_model_metadata(node, key, cached)


class AdmitWithinBudget(beam.CombineFn):
    """(key, estimated tokens) -> those admitted in key order within the
    budget, in key order (`within` then admits a prefix of them within what an
    earlier stage left of the budget), keeping at most what the budget can admit."""

    def __init__(self, budget: int):
        self._budget = budget

    def create_accumulator(self) -> list[tuple[str, int]]:
        return []

    def add_input(self, accumulator, element):
        accumulator.append(element)
        return self._trimmed(accumulator) if len(accumulator) > 4096 else accumulator

    def merge_accumulators(self, accumulators):
        return self._trimmed([e for acc in accumulators for e in acc])

    def extract_output(self, accumulator) -> list[tuple[str, int]]:
        return self._trimmed(accumulator)

    def _trimmed(self, elements: list[tuple[str, int]]) -> list[tuple[str, int]]:
        # A text not admitted among some of the texts is not admitted among all:
        # more texts can only come before it, so trimming early is exact.
        kept, spent = [], 0
        for key, cost in sorted(elements):
            if spent + cost > self._budget:
                break
            kept.append((key, cost))
            spent += cost
        return kept


def within(admitted: list[tuple[str, int]], budget_left: int) -> tuple[str, int]:
    """(the last key of `admitted`, in key order, whose running sum of costs
    stays within `budget_left`, "" when none does; that sum)."""
    last, spent = "", 0
    for key, cost in admitted:
        if spent + cost > budget_left:
            break
        last, spent = key, spent + cost
    return last, spent


class SplitByBudgetFn(CountingDoFn):
    """(key, nodes) -> itself when admitted (main), else its nodes unchanged on "not_asked", counted."""

    def __init__(self):
        super().__init__(NAMESPACE)

    def process(self, miss: tuple[str, list[dict]], last_admitted: str):
        key, nodes = miss
        if last_admitted and key <= last_admitted:
            yield miss
            return
        self.count("metadata_not_asked", len(nodes))
        for node in nodes:
            yield beam.pvalue.TaggedOutput("not_asked", node)


class AskModelFn(AskingDoFn):
    """Batches of (key, nodes) -> their nodes, described by the model or as
    they came (counted failures); the new cache lines on RECORDS."""

    def __init__(self, endpoint: EndpointConfig):
        super().__init__(NAMESPACE, endpoint)

    def process(self, batch: list[tuple[str, list[dict]]]) -> Iterable:
        requests = [metadata_request(key, nodes[0]) for key, nodes in batch]
        for (key, nodes), answer in zip(batch, self._model.describe(requests)):
            self.count("metadata_asked")
            self.count_cost("metadata", answer)
            if answer.value is None:
                self.count("metadata_failed", len(nodes))
                self.count(f"metadata_failed_{answer.failure}", len(nodes))
                yield from nodes
                continue
            self.count("metadata_enriched", len(nodes))
            yield beam.pvalue.TaggedOutput(RECORDS, cache_record(key, self._endpoint.model, answer.value,
                                                                 answer.tokens_in, answer.tokens_out))
            for node in nodes:
                yield with_model_metadata(node, key, answer.value)


class EnrichNodeMetadata(beam.PTransform):
    """Node rows -> node rows with model metadata (module docstring); the
    stage reads the cache in `plan.cache_dir` and adds this `job`'s answers to it.
    `spent_before`: the tokens of the budget an earlier stage of the job
    admitted (one int; --induce_toc llm's), so that the job's budget is one."""

    def __init__(self, plan: MetadataPlan, job: str, spent_before: beam.PCollection | None = None):
        super().__init__()
        self._plan, self._job, self._spent_before = plan, job, spent_before
        self.with_input_types(NodeRow)

    def expand(self, nodes):
        plan = self._plan
        model = plan.endpoint.model
        split = nodes | "Describable" >> beam.Partition(lambda node, _: 0 if describable(node) else 1, 2)
        keyed = split[0] | "Key" >> beam.Map(lambda node: (metadata_key(model, node), node))
        cached = nodes.pipeline | "ReadCache" >> ReadMetadataCache(plan.cache_dir)
        joined = record_counts({"asked": keyed, "cached": cached}
                               | "JoinCache" >> beam.CoGroupByKey()
                               | "Hits" >> beam.ParDo(JoinCacheFn()).with_outputs(MISSES, COUNTS, main="hits"))
        misses, parts = joined[MISSES], [split[1], joined.hits]
        if plan.max_tokens is not None:
            max_answer = plan.endpoint.max_answer_tokens
            budget = plan.max_tokens
            admitted = (misses
                        | "Cost" >> beam.Map(lambda miss: (miss[0], estimated_tokens(
                            metadata_request(miss[0], miss[1][0]), max_answer)))
                        | "Admit" >> beam.CombineGlobally(AdmitWithinBudget(budget)))
            if self._spent_before is None:
                last_admitted = admitted | "Within" >> beam.Map(lambda a: within(a, budget)[0])
            else:
                last_admitted = admitted | "Within" >> beam.Map(lambda a, spent: within(a, budget - spent)[0],
                                                                beam.pvalue.AsSingleton(self._spent_before))
            budgeted = record_counts(misses | "Budget" >> beam.ParDo(
                SplitByBudgetFn(), beam.pvalue.AsSingleton(last_admitted)).with_outputs(
                    "not_asked", COUNTS, main="asked"))
            misses = budgeted.asked
            parts.append(budgeted.not_asked)
        asked = record_counts(misses
                              | "Batch" >> beam.BatchElements(min_batch_size=1, max_batch_size=plan.batch_size)
                              | "Ask" >> beam.ParDo(AskModelFn(plan.endpoint)).with_outputs(
                                  RECORDS, COUNTS, main="nodes"))
        asked[RECORDS] | "WriteCache" >> WriteMetadataCache(plan.cache_dir, self._job)
        parts.append(asked.nodes)
        return tuple(parts) | "AllNodes" >> beam.Flatten().with_output_types(NodeRow)

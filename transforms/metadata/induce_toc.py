"""The stage `InduceTocFromModel` (`--induce_toc llm`): parsed pages -> the
same pages, a long PDF without a usable outline cut at the headings a chat
model reads in its pages (docs/METADATA.md; the contract: toc.py).

    pages --candidate?--> windows (key, AskedWindow) --join--> cache hit: its headings
      |                                  |         cache miss --budget--> batches --model--> headings | failure
      |          ReadMetadataCache -------+                                  \\--> new cache records
      +--> (url, page) ------------ join by URL with every window's outcome --> cut again | as it was

A candidate is a PDF whose ToC the parser induced ("layout" or "pages": no
usable outline of its own) of at least `min_pages` pages. Parsing stays pure:
the model is asked here, with the metadata stage's endpoint, client (requests
in flight, retries, deadline, answer cap), cache folder and token budget. A
PDF is cut again only when every window was answered and at least MIN_HEADINGS
headings pass verification (toc.py); otherwise it keeps the sections its parse
gave it, counted by why: toc_llm_failed (+ toc_llm_failed_<reason>),
toc_llm_not_asked (the budget), toc_llm_too_long (past MAX_WINDOWS),
toc_llm_too_few_headings. Always toc_llm_documents = toc_induced_llm + those.
A PDF cut again moves from toc_induced_<layout|pages> to toc_induced_llm, so
the toc_induced_* counts still count each document once.

The budget (`--metadata_max_tokens`) is planned before any request, per
document: the windows not in the cache are costed as the metadata stage costs
a request (characters / CHARS_PER_TOKEN plus the answer's token cap), summed
per document, and documents are admitted in URL order while the sum stays
within the budget (`AdmitWithinBudget`); a document that does not fit is not
asked at all, and neither is any after it. The budget is the job's: what this
stage admits (SPENT) is what the metadata stage's nodes may not. The candidates' parsed pages are
shuffled once (the join with their windows' outcomes); other pages pass
through untouched.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from ritrag.index_config import ModelSteps
from ritrag.schema import TOC_INDUCED_COUNTER_PREFIX, ParsedPage
from ritrag.transforms.counts import COUNTS, CountingDoFn, record_counts
from ritrag.transforms.metadata.cache import (MISSES, ReadMetadataCache, SplitByCacheFn, WriteMetadataCache,
                                              answer_record)
from ritrag.transforms.metadata.base import PROMPT_VERSION
from ritrag.transforms.metadata.enrich import CHARS_PER_TOKEN, AdmitWithinBudget, MetadataPlan, within
from ritrag.transforms.metadata.openai_compatible import AskingDoFn, EndpointConfig
from ritrag.transforms.metadata.toc import (ANSWER_TOKENS, MAX_WINDOWS, TOC_PROMPT_VERSION, TOC_SYSTEM_PROMPT,
                                            ProposedHeading, Window, enough_headings, parse_toc_answer,
                                            toc_answer_fields, verified_headings, windows)
from ritrag.transforms.sources.kinds import PDF
from ritrag.transforms.sources.pdf import page_texts, with_headings

NAMESPACE = "ritrag.toc"
LLM = "llm"  # ParsedPage.toc_induced of a PDF cut at the model's headings
CANDIDATE_HOWS = ("layout", "pages")  # the parser's toc_induced of a PDF without a usable outline
TOC_COUNTERS = ("toc_llm_documents", f"{TOC_INDUCED_COUNTER_PREFIX}{LLM}", "toc_llm_failed", "toc_llm_not_asked",
                "toc_llm_too_long", "toc_llm_too_few_headings", "toc_llm_cache_hits", "toc_llm_windows_asked",
                "toc_llm_requests", "toc_llm_tokens_in", "toc_llm_tokens_out", "toc_llm_headings_proposed",
                "toc_llm_headings_verified", "toc_llm_headings_dropped")
DOCUMENTS, WINDOWS, RECORDS = "documents", "windows", "records"
PAGES, SPENT = "pages", "spent"  # the stage's outputs
NOT_ASKED = "not_asked"  # the failure of a window the budget left out


@dataclasses.dataclass(frozen=True)
class TocPlan:
    """What the stage does in one job: the metadata stage's endpoint, cache and
    budget (`asking`), and the fewest pages of a PDF it asks about."""

    asking: MetadataPlan
    min_pages: int

    @classmethod
    def from_options(cls, options: PipelineOptions, index_dir: str, steps: ModelSteps) -> "TocPlan | None":
        """The plan of the ToCs `steps` (the index's config) ask for, with the
        endpoint a job's flags give; None when they ask none."""
        if not steps.induce_toc:
            return None
        asking = MetadataPlan.from_options(options, index_dir, steps)
        if asking is None:
            raise ValueError("--induce_toc llm needs --metadata_endpoint and --metadata_model")
        if steps.induce_toc_min_pages < 1:
            raise ValueError(f"--induce_toc_min_pages must be at least 1, not {steps.induce_toc_min_pages}")
        return cls(asking, steps.induce_toc_min_pages)

    @property
    def endpoint(self) -> EndpointConfig:
        return dataclasses.replace(self.asking.endpoint, max_answer_tokens=ANSWER_TOKENS)


def asked_steps(steps: ModelSteps) -> ModelSteps:
    """`steps` as this ritrag asks them, with its prompts' versions: what a job's manifest records."""
    return dataclasses.replace(steps, metadata_prompt=PROMPT_VERSION if steps.describes_nodes else None,
                               toc_prompt=TOC_PROMPT_VERSION if steps.induces_toc else None)


@dataclasses.dataclass(frozen=True)
class AskedWindow:
    """A window of the document at `url`: the `position`-th of its `of`."""

    url: str
    position: int
    of: int
    window: Window


@dataclasses.dataclass(frozen=True)
class WindowOutcome:
    """What came of one window: its headings, or why there are none."""

    position: int
    of: int
    first: int
    last: int
    headings: tuple[ProposedHeading, ...] | None
    failure: str | None = None

    @classmethod
    def of_window(cls, asked: AskedWindow, headings: tuple[ProposedHeading, ...] | None,
                  failure: str | None = None) -> "WindowOutcome":
        return cls(asked.position, asked.of, asked.window.first, asked.window.last, headings, failure)


def estimated_tokens(window: Window) -> int:
    """The budget's cost of one window's question: high rather than low, as the metadata stage's."""
    return math.ceil((len(TOC_SYSTEM_PROMPT) + len(window.text)) / CHARS_PER_TOKEN) + ANSWER_TOKENS


class WindowCandidatesFn(CountingDoFn):
    """A parsed page -> itself (main) unless it is a candidate; a candidate ->
    (url, page) on DOCUMENTS and (key, AskedWindow) of each window on WINDOWS;
    one past MAX_WINDOWS stays as it is, counted."""

    def __init__(self, model: str, min_pages: int):
        super().__init__(NAMESPACE)
        self._model, self._min_pages = model, min_pages

    def process(self, page: ParsedPage):
        if page.source_kind != PDF.name or page.toc_induced not in CANDIDATE_HOWS:
            yield page
            return
        texts = page_texts(page)
        if len(texts) < self._min_pages:
            yield page
            return
        self.count("toc_llm_documents")
        asked = windows(texts)
        if len(asked) > MAX_WINDOWS:
            self.count("toc_llm_too_long")
            yield page
            return
        yield beam.pvalue.TaggedOutput(DOCUMENTS, (page.url, page))
        for position, window in enumerate(asked):
            yield beam.pvalue.TaggedOutput(WINDOWS, (window.key(self._model),
                                                     AskedWindow(page.url, position, len(asked), window)))


class JoinTocCacheFn(SplitByCacheFn):
    """(key, {"asked": windows, "cached"}) -> (url, WindowOutcome) of cache hits, or (key, windows) on MISSES."""

    def __init__(self):
        super().__init__(NAMESPACE)

    def hits(self, key: str, asked: list[AskedWindow], cached: tuple[ProposedHeading, ...]) -> Iterable:
        self.count("toc_llm_cache_hits", len(asked))
        for window in asked:
            yield window.url, WindowOutcome.of_window(window, cached)


def admitted(miss: tuple[str, list[AskedWindow]], last_admitted: str) -> bool:
    """Whether the budget admitted a document this window is of."""
    return any(last_admitted and window.url <= last_admitted for window in miss[1])


def not_asked(miss: tuple[str, list[AskedWindow]]) -> Iterable[tuple[str, WindowOutcome]]:
    for window in miss[1]:
        yield window.url, WindowOutcome.of_window(window, None, NOT_ASKED)


class AskTocFn(AskingDoFn):
    """Batches of (key, windows) -> (url, WindowOutcome) of each window, the
    model's headings or its failure; the new cache lines on RECORDS."""

    def __init__(self, endpoint: EndpointConfig):
        super().__init__(NAMESPACE, endpoint)

    def process(self, batch: list[tuple[str, list[AskedWindow]]]) -> Iterable:
        questions = [asked[0].window.messages() for _, asked in batch]
        for (key, asked), answer in zip(batch, self._model.ask(questions, parse_toc_answer)):
            self.count("toc_llm_windows_asked")
            self.count_cost("toc_llm", answer)
            if answer.value is not None:
                yield beam.pvalue.TaggedOutput(RECORDS, answer_record(
                    key, self._endpoint.model, TOC_PROMPT_VERSION, toc_answer_fields(answer.value),
                    answer.tokens_in, answer.tokens_out))
            for window in asked:
                yield window.url, WindowOutcome.of_window(window, answer.value, answer.failure)


class CutAtHeadingsFn(CountingDoFn):
    """(url, {"page", "outcomes"}) -> the page cut at its verified headings, or as it was (counted why)."""

    def __init__(self):
        super().__init__(NAMESPACE)

    def process(self, joined: tuple[str, dict]) -> Iterable[ParsedPage]:
        _, group = joined
        outcomes = sorted(group["outcomes"], key=lambda outcome: outcome.position)
        for page in group["page"]:  # one; two only for inputs at one URL, which the forest merges
            yield self._cut(page, outcomes)

    def _cut(self, page: ParsedPage, outcomes: list[WindowOutcome]) -> ParsedPage:
        failure = next((o.failure for o in outcomes if o.failure), None)
        if failure == NOT_ASKED:
            self.count("toc_llm_not_asked")
            return page
        if failure or not outcomes or len(outcomes) != outcomes[0].of:
            self.count("toc_llm_failed")
            self.count(f"toc_llm_failed_{failure or 'incomplete'}")
            return page
        headings, dropped = verified_headings([(o.first, o.last, o.headings) for o in outcomes], page_texts(page))
        self.count("toc_llm_headings_proposed", len(headings) + dropped)
        self.count("toc_llm_headings_verified", len(headings))
        self.count("toc_llm_headings_dropped", dropped)
        if not enough_headings(headings):
            self.count("toc_llm_too_few_headings")
            return page
        self.count(f"{TOC_INDUCED_COUNTER_PREFIX}{LLM}")
        self.count(f"{TOC_INDUCED_COUNTER_PREFIX}{page.toc_induced}", -1)  # counted by the parse
        return with_headings(page, headings, LLM)


class InduceTocFromModel(beam.PTransform):
    """Parsed pages -> {PAGES: the parsed pages, long PDFs without an outline
    cut at the model's verified headings (module docstring); with a budget,
    SPENT: the tokens of it admitted (one int, for the metadata stage)}. The
    stage reads the cache in the plan's cache folder and adds this `job`'s answers to it."""

    def __init__(self, plan: TocPlan, job: str):
        super().__init__()
        self._plan, self._job = plan, job

    def expand(self, pages):
        plan, cache_dir = self._plan, self._plan.asking.cache_dir
        split = record_counts(pages | "Candidates" >> beam.ParDo(WindowCandidatesFn(
            plan.endpoint.model, plan.min_pages)).with_outputs(DOCUMENTS, WINDOWS, COUNTS, main="others"))
        cached = pages.pipeline | "ReadCache" >> ReadMetadataCache(cache_dir, TOC_PROMPT_VERSION, parse_toc_answer)
        joined = record_counts({"asked": split[WINDOWS], "cached": cached}
                               | "JoinCache" >> beam.CoGroupByKey()
                               | "Hits" >> beam.ParDo(JoinTocCacheFn()).with_outputs(MISSES, COUNTS, main="hits"))
        misses, outcomes, stages = joined[MISSES], [joined.hits], {}
        if plan.asking.max_tokens is not None:
            budget = plan.asking.max_tokens
            admission = (misses
                         | "Cost" >> beam.FlatMap(lambda miss: [(w.url, estimated_tokens(w.window)) for w in miss[1]])
                         | "CostPerDocument" >> beam.CombinePerKey(sum)
                         | "Admit" >> beam.CombineGlobally(AdmitWithinBudget(budget))
                         | "Within" >> beam.Map(within, budget))
            stages[SPENT] = admission | "Spent" >> beam.Map(lambda last_and_spent: last_and_spent[1])
            last_admitted = beam.pvalue.AsSingleton(admission | "LastAdmitted" >> beam.Map(
                lambda last_and_spent: last_and_spent[0]))
            outcomes.append(misses
                            | "NotAdmitted" >> beam.Filter(lambda miss, last: not admitted(miss, last), last_admitted)
                            | "NotAsked" >> beam.FlatMap(not_asked))
            misses = misses | "Admitted" >> beam.Filter(admitted, last_admitted)
        asked = record_counts(misses
                              | "Batch" >> beam.BatchElements(min_batch_size=1,
                                                              max_batch_size=plan.asking.batch_size)
                              | "Ask" >> beam.ParDo(AskTocFn(plan.endpoint)).with_outputs(
                                  RECORDS, COUNTS, main="outcomes"))
        asked[RECORDS] | "WriteCache" >> WriteMetadataCache(cache_dir, f"{self._job}-toc")
        outcomes.append(asked.outcomes)
        cut = record_counts({"page": split[DOCUMENTS],
                             "outcomes": tuple(outcomes) | "AllOutcomes" >> beam.Flatten()}
                            | "JoinByDocument" >> beam.CoGroupByKey()
                            | "Cut" >> beam.ParDo(CutAtHeadingsFn()).with_outputs(COUNTS, main="pages"))
        stages[PAGES] = (split.others, cut.pages) | "AllPages" >> beam.Flatten()
        return stages

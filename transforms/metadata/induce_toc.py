"""The stage `InduceTocFromModel` (`--induce_toc llm`): parsed pages -> the
same pages, a long PDF without a usable outline cut at the headings a chat
model reads in its pages (docs/METADATA.md; the contract: toc.py).

    pages --candidate?--> (url, windows) --follow the cache, window by window--> hits: their headings
      |            ReadMetadataCache (a side input) --^         | from the first miss
      |                                     --budget--> batches --model, window after window--> headings | failure
      |                                                                            \\--> new cache records
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

A document's windows are asked in page order, each shown the last headings
proposed for the windows before it (toc.py), so a window's question, and its
cache key, depend on the answers before it: the cache is followed window by
window from the first (`FollowCacheFn`, the cache's ToC records a side input),
and a document's questions left from its first miss are asked by one
`AskTocFn`, a window after the answer before it; the documents of a batch step
together, so requests stay in flight across documents.

The budget (`--metadata_max_tokens`) is planned before any request, per
document: the windows not answered by the cache are costed as the metadata
stage costs a request (characters / CHARS_PER_TOKEN plus the answer's token
cap, a window after the first with the most context it may be shown), summed
per document, and documents are admitted in URL order while the sum stays
within the budget (`AdmitWithinBudget`); a document that does not fit is not
asked at all, and neither is any after it. The budget is the job's: what this
stage admits (SPENT) is what the metadata stage's nodes may not. The
candidates' parsed pages are shuffled once (the join with their windows'
outcomes); other pages pass through untouched.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from ritrag.index_config import ModelSteps
from ritrag.schema import TOC_INDUCED_COUNTER_PREFIX, ParsedPage
from ritrag.transforms.counts import COUNTS, CountingDoFn, record_counts
from ritrag.transforms.metadata.cache import MISSES, ReadMetadataCache, WriteMetadataCache, answer_record
from ritrag.transforms.metadata.base import PROMPT_VERSION
from ritrag.transforms.metadata.enrich import CHARS_PER_TOKEN, AdmitWithinBudget, MetadataPlan, within
from ritrag.transforms.metadata.openai_compatible import AskingDoFn, EndpointConfig
from ritrag.transforms.metadata.toc import (ANSWER_TOKENS, CONTEXT_CHARS, CONTEXT_HEADER, MAX_WINDOWS,
                                            TOC_PROMPT_VERSION, TOC_SYSTEM_PROMPT, ProposedHeading, Window,
                                            enough_headings, parse_toc_answer, toc_answer_fields, verified_headings,
                                            windows)
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
class WindowOutcome:
    """What came of one window: its headings, or why there are none."""

    position: int
    of: int
    first: int
    last: int
    headings: tuple[ProposedHeading, ...] | None
    failure: str | None = None


@dataclasses.dataclass(frozen=True)
class DocumentQuestions:
    """A document's windows in page order, those from `position` on still to
    ask, after the headings the model proposed for the windows before it
    (`so_far`, the cache's answers)."""

    windows: tuple[Window, ...]
    position: int = 0
    so_far: tuple[ProposedHeading, ...] = ()

    def outcome(self, headings: tuple[ProposedHeading, ...] | None, failure: str | None = None) -> WindowOutcome:
        """What came of the window at `position`."""
        window = self.windows[self.position]
        return WindowOutcome(self.position, len(self.windows), window.first, window.last, headings, failure)

    def answered(self, headings: tuple[ProposedHeading, ...]) -> "DocumentQuestions | None":
        """The questions left once the window at `position` is answered with `headings`; None when none are."""
        if self.position + 1 == len(self.windows):
            return None
        return DocumentQuestions(self.windows, self.position + 1, (*self.so_far, *headings))

    def key(self, model: str) -> str:
        return self.windows[self.position].key(model, self.so_far)

    def messages(self) -> list[dict[str, str]]:
        return self.windows[self.position].messages(self.so_far)

    def estimated_tokens(self) -> int:
        """The budget's cost of the windows left: each as the metadata stage
        costs a request (high rather than low), a window after the first with
        the most context it can be shown."""
        return sum(estimated_tokens(window, position > 0)
                   for position, window in enumerate(self.windows) if position >= self.position)


def estimated_tokens(window: Window, with_context: bool) -> int:
    """The budget's cost of one window's question: high rather than low, as the metadata stage's."""
    context = len(CONTEXT_HEADER) + CONTEXT_CHARS + 2 if with_context else 0
    return math.ceil((len(TOC_SYSTEM_PROMPT) + context + len(window.text)) / CHARS_PER_TOKEN) + ANSWER_TOKENS


class WindowCandidatesFn(CountingDoFn):
    """A parsed page -> itself (main) unless it is a candidate; a candidate ->
    (url, page) on DOCUMENTS and (url, DocumentQuestions) on WINDOWS; one past
    MAX_WINDOWS stays as it is, counted."""

    def __init__(self, min_pages: int):
        super().__init__(NAMESPACE)
        self._min_pages = min_pages

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
        yield beam.pvalue.TaggedOutput(WINDOWS, (page.url, DocumentQuestions(tuple(asked))))


class FollowCacheFn(CountingDoFn):
    """(url, DocumentQuestions) -> (url, WindowOutcome) of each window the
    cache answers, in page order (each window's key depends on the answers
    before it), up to the first it does not; from that window on, (url,
    DocumentQuestions) on MISSES."""

    def __init__(self, model: str):
        super().__init__(NAMESPACE)
        self._model = model

    def process(self, document: tuple[str, DocumentQuestions], cached: dict[str, tuple[ProposedHeading, ...]]):
        url, questions = document
        while questions is not None:
            headings = cached.get(questions.key(self._model))
            if headings is None:
                yield beam.pvalue.TaggedOutput(MISSES, (url, questions))
                return
            self.count("toc_llm_cache_hits")
            yield url, questions.outcome(headings)
            questions = questions.answered(headings)


def admitted(miss: tuple[str, DocumentQuestions], last_admitted: str) -> bool:
    """Whether the budget admitted the document."""
    return bool(last_admitted) and miss[0] <= last_admitted


def not_asked(miss: tuple[str, DocumentQuestions]) -> Iterable[tuple[str, WindowOutcome]]:
    url, questions = miss
    yield url, questions.outcome(None, NOT_ASKED)


class AskTocFn(AskingDoFn):
    """Batches of (url, DocumentQuestions) -> (url, WindowOutcome) of each
    window asked, the model's headings or its failure, the new cache lines on
    RECORDS. A document's windows are asked in page order, each after the
    answer before it (its context); the batch's documents step together, so
    that up to one request per document is in flight. A failed window ends its
    document's questions (its PDF is not cut: every window must be answered)."""

    def __init__(self, endpoint: EndpointConfig):
        super().__init__(NAMESPACE, endpoint)

    def process(self, batch: list[tuple[str, DocumentQuestions]]) -> Iterable:
        model = self._endpoint.model
        while batch:
            answers = self._model.ask([questions.messages() for _, questions in batch], parse_toc_answer)
            left = []
            for (url, questions), answer in zip(batch, answers):
                self.count("toc_llm_windows_asked")
                self.count_cost("toc_llm", answer)
                yield url, questions.outcome(answer.value, answer.failure)
                if answer.value is None:
                    continue
                yield beam.pvalue.TaggedOutput(RECORDS, answer_record(
                    questions.key(model), model, TOC_PROMPT_VERSION, toc_answer_fields(answer.value),
                    answer.tokens_in, answer.tokens_out))
                following = questions.answered(answer.value)
                if following is not None:
                    left.append((url, following))
            batch = left


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
        split = record_counts(pages | "Candidates" >> beam.ParDo(WindowCandidatesFn(plan.min_pages)).with_outputs(
            DOCUMENTS, WINDOWS, COUNTS, main="others"))
        cached = beam.pvalue.AsDict(
            pages.pipeline | "ReadCache" >> ReadMetadataCache(cache_dir, TOC_PROMPT_VERSION, parse_toc_answer))
        followed = record_counts(split[WINDOWS] | "FollowCache" >> beam.ParDo(
            FollowCacheFn(plan.endpoint.model), cached).with_outputs(MISSES, COUNTS, main="hits"))
        misses, outcomes, stages = followed[MISSES], [followed.hits], {}
        if plan.asking.max_tokens is not None:
            budget = plan.asking.max_tokens
            admission = (misses
                         | "Cost" >> beam.Map(lambda miss: (miss[0], miss[1].estimated_tokens()))
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

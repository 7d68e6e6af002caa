"""What shapes an index, typed once: `IndexConfig`.

A build is made with an IndexConfig and records it in the manifest's config
(`to_manifest`); an update reads the live index's back (`from_manifest`) and
refuses a command line that asks for another (`changes_asked`): one index is
made one way. The jobs' flags of these values are `INDEX_FLAGS`, one per
value, so a flag's default, help and choices are the config's own and a flag
cannot drift from what it sets. No Beam here: the server reads configs too.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from ritrag.bm25 import BM25_PARAMETERS
from ritrag.embedder import EmbedderSpec
from ritrag.representation import Representation, retrieval_defaults

# What the input directory stands for when neither --base_url nor a site's pages name a public URL.
DEFAULT_BASE_URL = "http://localhost/"
GRANULARITIES = ("page", "section")
ON_OFF = ("on", "off")


@dataclasses.dataclass(frozen=True)
class ModelSteps:
    """What a chat model is asked of an index's pages (docs/METADATA.md): a
    summary and keywords per node that holds text, and the headings of long
    PDFs without an outline (`--induce_toc llm`). A build records it; an
    update asks the same of its new and changed pages (its flags may repeat
    these values, not change them). Where the model is served (the endpoint,
    its key, budget and patience) is a job's flags, not the index's."""

    model: str | None = None  # None: no model is asked
    metadata_nodes: bool = True
    induce_toc: bool = False
    induce_toc_min_pages: int = 8
    # The prompts' versions the answers were asked with: set by the job that
    # asks (transforms/metadata/ defines them), read back from a manifest.
    metadata_prompt: str | None = None
    toc_prompt: str | None = None

    @property
    def describes_nodes(self) -> bool:
        return self.model is not None and self.metadata_nodes

    @property
    def induces_toc(self) -> bool:
        return self.model is not None and self.induce_toc

    def to_manifest(self) -> dict[str, Any]:
        """The manifest config's entries of the steps asked: "metadata" and
        "induce_toc", each only when its step runs."""
        out: dict[str, Any] = {}
        if self.describes_nodes:
            out["metadata"] = {"model": self.model, "prompt_version": self.metadata_prompt}
        if self.induces_toc:
            out["induce_toc"] = {"model": self.model, "prompt_version": self.toc_prompt,
                                 "min_pages": self.induce_toc_min_pages}
        return out

    @classmethod
    def from_manifest(cls, config: Mapping[str, Any]) -> "ModelSteps":
        """The steps a manifest's config records (none: an index built without a model)."""
        metadata, toc = config.get("metadata"), config.get("induce_toc")
        if not metadata and not toc:
            return cls()
        return cls(model=(metadata or toc)["model"], metadata_nodes=bool(metadata), induce_toc=bool(toc),
                   induce_toc_min_pages=toc["min_pages"] if toc else cls.induce_toc_min_pages,
                   metadata_prompt=metadata["prompt_version"] if metadata else None,
                   toc_prompt=toc["prompt_version"] if toc else None)


MODEL_STEP_ENTRIES = tuple(ModelSteps(model="-", induce_toc=True).to_manifest())  # the config entries it writes


@dataclasses.dataclass(frozen=True)
class IndexConfig:
    """What an index is made of: a build's choices, which an update keeps."""

    base_url: str | None = None  # None: each site's public URL where its pages name it, else DEFAULT_BASE_URL
    site_depth: int = 0
    granularity: str = "page"  # one of GRANULARITIES
    num_shards: int = 1
    embedder: EmbedderSpec = EmbedderSpec()
    representation: Representation = Representation()
    # None: chosen by corpus size (transforms/dense.py choose_params); an index read
    # back has the values its dense index was trained with.
    dense_factory: str | None = None
    dense_nprobe: int | None = None
    dense_rerank: int | None = None
    model_steps: ModelSteps = ModelSteps()

    def __post_init__(self):
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}, not {self.granularity!r}")
        if self.site_depth < 0 or self.num_shards < 1:
            raise ValueError(f"site depth must be at least 0 and shards at least 1, not {self.site_depth} and "
                             f"{self.num_shards}")

    @property
    def page_base_url(self) -> str:
        """The URL the input directory stands for, where no site names its own."""
        return self.base_url or DEFAULT_BASE_URL

    def to_manifest(self, dense_info: Mapping[str, Any], site_bases: Mapping[str, dict]) -> dict[str, Any]:
        """The manifest's config of an index built with this config, whose dense
        index the build described as `dense_info` and whose sites' public bases
        it decided as `site_bases` (per site as the input names it: the base its
        pages named, or why none; empty when --base_url was given)."""
        return {
            "embedder": {**self.embedder.to_dict(), "dimension": dense_info["dim"]},
            "dense": dict(dense_info),
            "bm25": dict(BM25_PARAMETERS),
            "representation": self.representation.to_dict(),
            "retrieval": retrieval_defaults(self.representation),
            "granularity": self.granularity,
            "num_shards": self.num_shards,
            "base_url": self.page_base_url,
            "base_url_given": self.base_url is not None,
            "site_bases": dict(site_bases),
            "site_depth": self.site_depth,
            **self.model_steps.to_manifest(),
        }

    @classmethod
    def from_manifest(cls, config: Mapping[str, Any]) -> "IndexConfig":
        """What an index was built with, from its manifest's config. A value a
        manifest predates reads as what the builds of its time did: the base URL
        as given (before sites' bases were inferred), the LEGACY representation,
        the defaults of EmbedderSpec's newer fields."""
        defaults = cls()
        dense = config.get("dense", {})
        return cls(base_url=config.get("base_url") if config.get("base_url_given", True) else None,
                   site_depth=config.get("site_depth", defaults.site_depth),
                   granularity=config.get("granularity", defaults.granularity),
                   num_shards=config.get("num_shards", defaults.num_shards),
                   embedder=EmbedderSpec.from_dict(config.get("embedder", {})),
                   representation=Representation.from_config(config),
                   dense_factory=dense.get("factory"), dense_nprobe=dense.get("nprobe"),
                   dense_rerank=dense.get("rerank"), model_steps=ModelSteps.from_manifest(config))

    def with_flags(self, flags: Mapping[str, Any]) -> "IndexConfig":
        """This config with the values of `flags` (flag name -> parsed value) that
        are INDEX_FLAGS; other names, and None (a flag left out), are passed over."""
        config = self
        for flag in INDEX_FLAGS:
            if flags.get(flag.name) is not None:
                config = flag.applied(config, flags[flag.name])
        if config.embedder.model != self.embedder.model:
            # Another model: a folder's checksum is taken now, before any vector
            # is made with it (and the previous model's is not kept).
            config = dataclasses.replace(
                config, embedder=dataclasses.replace(config.embedder, model_sha256=None).pinned())
        return config

    def changes_asked(self, flags: Mapping[str, Any]) -> list[str]:
        """Each of `flags` that asks for another value than this config has, as
        "--name value (the index has value)"."""
        asked = self.with_flags(flags)
        return [f"--{flag.name} {flag.value(asked)!r} (the index has {flag.value(self)!r})"
                for flag in INDEX_FLAGS if flag.value(asked) != flag.value(self)]


def _same(value: Any) -> Any:
    return value


@dataclasses.dataclass(frozen=True)
class ConfigFlag:
    """The command-line flag of one IndexConfig value."""

    name: str
    path: tuple[str, ...]  # the value's place: a field of IndexConfig, or a field of one of its fields
    help: str
    type: Callable[[str], Any] | None = None  # None: the flag's value is the string given
    choices: tuple[str, ...] | None = None
    to_config: Callable[[Any], Any] = _same  # the flag's value -> the config's
    to_flag: Callable[[Any], Any] = _same  # the config's value -> the flag's
    # The help states the default in the value's own words, and the flag's
    # default is None: left out, the config's default applies.
    default_in_help: bool = False

    def value(self, config: IndexConfig) -> Any:
        """`config`'s value, as this flag gives it."""
        value: Any = config
        for name in self.path:
            value = getattr(value, name)
        return self.to_flag(value)

    def applied(self, config: IndexConfig, flag_value: Any) -> IndexConfig:
        """`config` with this flag's value `flag_value` in its place."""
        return _replaced(config, self.path, self.to_config(flag_value))

    def add_to(self, parser) -> None:
        """Add the flag to an argparse parser (or anything with its add_argument)."""
        kwargs = {k: v for k, v in {"type": self.type, "choices": self.choices}.items() if v is not None}
        parser.add_argument(f"--{self.name}", default=None if self.default_in_help else self.value(IndexConfig()),
                            help=self.help, **kwargs)


def _replaced(target: Any, path: tuple[str, ...], value: Any) -> Any:
    inner = value if len(path) == 1 else _replaced(getattr(target, path[0]), path[1:], value)
    return dataclasses.replace(target, **{path[0]: inner})


def _on_off(value: bool) -> str:
    return ON_OFF[0] if value else ON_OFF[1]


INDEX_FLAGS: tuple[ConfigFlag, ...] = (
    ConfigFlag("base_url", ("base_url",),
               f"URL that the input directory stands for (default: each site's public URL where its pages name it, "
               f"else {DEFAULT_BASE_URL}; transforms/site_base.py)"),
    ConfigFlag("site_depth", ("site_depth",),
               "URL path segments that name a site (1: one forest per <host>/<product>/)", type=int),
    ConfigFlag("granularity", ("granularity",),
               "a node per page, or also a node per heading section inside pages", choices=GRANULARITIES),
    ConfigFlag("num_shards", ("num_shards",),
               "files per table, BM25 postings and dense index (parallel writers and loaders)", type=int),
    ConfigFlag("embedding_model", ("embedder", "model"),
               "sentence-transformers model name or local folder (recorded with its checksum, e.g. ritrag adapt's "
               "output), or hashing:DIM (a model-free stand-in for tests)"),
    ConfigFlag("query_prefix", ("embedder", "query_prefix"),
               "text the model expects before a query (e.g. 'query: ' for E5 models)"),
    ConfigFlag("document_prefix", ("embedder", "document_prefix"),
               "text the model expects before a document (e.g. 'passage: ')"),
    ConfigFlag("dense_factory", ("dense_factory",), "FAISS index factory string (default: chosen by corpus size)"),
    ConfigFlag("dense_nprobe", ("dense_nprobe",),
               "IVF lists the server probes per query (default: chosen by corpus size)", type=int),
    ConfigFlag("dense_rerank", ("dense_rerank",),
               "the server re-ranks N x k' index candidates exactly; 1: off (default: chosen by corpus size)",
               type=int),
    # The representation (ritrag/representation.py). A command line writes a
    # newline of the template as \n.
    ConfigFlag("chunk_template", ("representation", "template"),
               f"what the model embeds of a chunk: {{path}}, {{title}}, {{body}} (default {Representation.template!r}; "
               f"'{{title}}\\n{{body}}' is the representation of indexes built before templates)",
               to_config=lambda text: text.replace("\\n", "\n"), to_flag=lambda text: text.replace("\n", "\\n"),
               default_in_help=True),
    ConfigFlag("path_levels", ("representation", "path_levels"),
               f"most levels of the node path in the representation: the root and the last ones "
               f"(default {Representation.path_levels})", type=int, default_in_help=True),
    ConfigFlag("node_docs", ("representation", "node_docs"),
               f"index a per-node document (path, summary, keywords) in BM25 (and dense with --node_doc_vectors on), "
               f"and keep the path out of chunk postings (default {_on_off(Representation.node_docs)})",
               choices=ON_OFF, to_config=lambda value: value == ON_OFF[0], to_flag=_on_off, default_in_help=True),
    ConfigFlag("node_doc_vectors", ("representation", "node_doc_vectors"),
               f"embed node documents too, for --node_score max+doc's dense side (the default node score never "
               f"uses them; off: max+doc fuses their BM25 ranking alone) "
               f"(default {_on_off(Representation.node_doc_vectors)})",
               choices=ON_OFF, to_config=lambda value: value == ON_OFF[0], to_flag=_on_off, default_in_help=True),
    ConfigFlag("anchor_docs", ("representation", "anchor_docs"),
               f"index the anchor texts other pages link a node with as its anchor document, a third BM25 field, "
               f"never embedded (default {_on_off(Representation.anchor_docs)})",
               choices=ON_OFF, to_config=lambda value: value == ON_OFF[0], to_flag=_on_off, default_in_help=True),
    # What a chat model is asked (ModelSteps; docs/METADATA.md). The endpoint
    # that serves it is a job's flag (transforms/metadata/enrich.py).
    ConfigFlag("metadata_model", ("model_steps", "model"),
               "the model the metadata endpoint serves (part of every cache key); an update asks the index's"),
    ConfigFlag("metadata_nodes", ("model_steps", "metadata_nodes"),
               "off: no summary and keywords per node; the endpoint serves --induce_toc llm only",
               choices=ON_OFF, to_config=lambda value: value == ON_OFF[0], to_flag=_on_off),
    ConfigFlag("induce_toc", ("model_steps", "induce_toc"),
               "llm: a PDF without a usable outline (its ToC induced from its layout or one section per page) of "
               "at least --induce_toc_min_pages pages is cut at the headings the model reads in its pages, each "
               "verified against the page it names (docs/METADATA.md); needs --metadata_endpoint and "
               "--metadata_model", choices=("llm", "off"), to_config=lambda value: value == "llm",
               to_flag=lambda on: "llm" if on else "off"),
    ConfigFlag("induce_toc_min_pages", ("model_steps", "induce_toc_min_pages"),
               "the fewest pages of a PDF whose ToC --induce_toc llm asks the model for", type=int),
    ConfigFlag("metadata_retrieval", ("representation", "metadata_retrieval"),
               f"put model metadata (--metadata_endpoint) into node documents, BM25 and dense; off: show it in the "
               f"ToC only (default {_on_off(Representation.metadata_retrieval)})",
               choices=ON_OFF, to_config=lambda value: value == ON_OFF[0], to_flag=_on_off, default_in_help=True),
)

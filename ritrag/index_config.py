"""What shapes an index, typed once: `IndexConfig`; a manifest's config, typed
once: `ManifestConfig`.

A build is made with an IndexConfig and records it in the manifest's config
(`to_manifest`); an update reads the live index's back (the manifest's
`settings.index`) and refuses a command line that asks for another
(`changes_asked`): one index is made one way. Every reader of a manifest's
config reads its `ManifestConfig` (`Manifest.settings`, parsed as the manifest
is read): the IndexConfig, and what the build found and recorded beside it
(the dense index, BM25's parameters, the query-time defaults, the sites'
bases), where a manifest older than an entry reads the default of its time.

The jobs' flags of these values are `INDEX_FLAGS`, one per value, made
(ritrag.flags) from the metadata of the fields of IndexConfig and of its
nested EmbedderSpec, Representation and ModelSteps, so a flag's default, help
and choices are the config's own and a flag cannot drift from what it sets.
No Beam here: the server reads configs too.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from ritrag.bm25 import BM25_PARAMETERS
from ritrag.embedder import EmbedderSpec
from ritrag.flags import Flag, flags_of, option
from ritrag.representation import DEFAULT_RETRIEVAL, Representation, retrieval_defaults

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

    # None: no model is asked
    model: str | None = option(None, "the model the metadata endpoint serves (part of every cache key); an update "
                                     "asks the index's", flag="metadata_model")
    metadata_nodes: bool = option(True, "off: no summary and keywords per node; the endpoint serves --induce_toc "
                                        "llm only", choices=ON_OFF)
    induce_toc: bool = option(False, "llm: a PDF without a usable outline (its ToC induced from its layout or one "
                                     "section per page) of at least --induce_toc_min_pages pages is cut at the "
                                     "headings the model reads in its pages, each verified against the page it "
                                     "names (docs/METADATA.md); needs --metadata_endpoint and --metadata_model",
                              choices=("llm", "off"))
    induce_toc_min_pages: int = option(8, "the fewest pages of a PDF whose ToC --induce_toc llm asks the model for")
    # The prompts' versions the answers were asked with: set by the job that
    # asks (transforms/metadata/ defines them), read back from a manifest.
    metadata_prompt: str | None = dataclasses.field(default=None, metadata={"cli": False})
    toc_prompt: str | None = dataclasses.field(default=None, metadata={"cli": False})

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

    # Each field is a build flag (INDEX_FLAGS), or a dataclass whose fields are.
    # None: each site's public URL where its pages name it, else DEFAULT_BASE_URL
    base_url: str | None = option(None, f"URL that the input directory stands for (default: each site's public URL "
                                        f"where its pages name it, else {DEFAULT_BASE_URL}; transforms/site_base.py)")
    site_depth: int = option(0, "URL path segments that name a site (1: one forest per <host>/<product>/)")
    granularity: str = option("page", "a node per page, or also a node per heading section inside pages",
                              choices=GRANULARITIES)
    num_shards: int = option(1, "files per table, BM25 postings and dense index (parallel writers and loaders)")
    embedder: EmbedderSpec = dataclasses.field(default=EmbedderSpec(), metadata={"cli": False})
    representation: Representation = dataclasses.field(default=Representation(), metadata={"cli": False})
    # None: chosen by corpus size (transforms/dense.py choose_params); an index read
    # back has the values its dense index was trained with.
    dense_factory: str | None = option(None, "FAISS index factory string (default: chosen by corpus size)")
    dense_nprobe: int | None = option(None, "IVF lists the server probes per query (default: chosen by corpus size)")
    dense_rerank: int | None = option(None, "the server re-ranks N x k' index candidates exactly; 1: off (default: "
                                            "chosen by corpus size)")
    model_steps: ModelSteps = dataclasses.field(default=ModelSteps(), metadata={"cli": False})

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
        """The manifest's config of an index built with this config (read back
        typed by ManifestConfig.from_manifest), whose dense
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


@dataclasses.dataclass(frozen=True)
class DenseSettings:
    """The dense index a manifest records (config "dense", its build's
    dense.json, transforms/dense.py dense_info): what it was trained with and
    from, and how the server searches it."""

    factory: str | None = None  # None: a manifest that predates it
    # A manifest that predates them is searched as the server did then: 64
    # lists probed, no re-ranking.
    nprobe: int = 64
    rerank: int = 1
    dim: int | None = None  # the vectors' width (the embedder's "dimension")
    n_vectors: int | None = None
    train_sample: int | None = None


@dataclasses.dataclass(frozen=True)
class Bm25Parameters:
    """BM25's saturation and length normalization (config "bm25"): every index
    records ritrag/bm25.py's; the server scores with the recorded ones."""

    k1: float = BM25_PARAMETERS["k1"]
    b: float = BM25_PARAMETERS["b"]


@dataclasses.dataclass(frozen=True)
class ManifestConfig:
    """A manifest's config, typed: parsed once, where the manifest is read
    (`Manifest.settings`, ritrag/layout.py), every default of a manifest that
    predates an entry applied here, in its section's class. What is written
    stays `IndexConfig.to_manifest`'s dict (`Manifest.config`, the raw record)."""

    index: IndexConfig  # what shaped the index: the build's choices, which an update keeps
    dense: DenseSettings
    bm25: Bm25Parameters
    # The query-time defaults the build recorded (serving.retrieval.RetrievalParams
    # fields, which that class checks), those of the representation where none
    # are recorded, DEFAULT_RETRIEVAL's where one is missing.
    retrieval: dict[str, Any]
    # Each site's inferred public base as the input names it (`to_manifest`);
    # None: a manifest from before bases were inferred.
    site_bases: dict[str, dict] | None

    @classmethod
    def from_manifest(cls, config: Mapping[str, Any]) -> "ManifestConfig":
        """The typed `config` (a manifest's). A value a manifest predates reads
        as what the builds of its time did: the base URL as given (before
        sites' bases were inferred), the LEGACY representation (and, before
        node_doc_vectors was recorded, node documents embedded), the defaults
        of EmbedderSpec's newer fields and of the dense and BM25 sections.
        ValueError naming the section of a value of the wrong type or out of
        its range."""
        defaults = IndexConfig()
        dense = _parsed("config.dense", lambda: DenseSettings(**_known(DenseSettings, config.get("dense", {}))))
        representation = _parsed("config.representation", lambda: Representation.from_config(config))
        embedder = _parsed("config.embedder", lambda: EmbedderSpec.from_dict(config.get("embedder", {})))
        steps = _parsed("config.metadata or induce_toc", lambda: ModelSteps.from_manifest(config))
        index = _parsed("config", lambda: IndexConfig(
            base_url=config.get("base_url") if config.get("base_url_given", True) else None,
            site_depth=config.get("site_depth", defaults.site_depth),
            granularity=config.get("granularity", defaults.granularity),
            num_shards=config.get("num_shards", defaults.num_shards), embedder=embedder,
            representation=representation, dense_factory=dense.factory, dense_nprobe=dense.nprobe,
            dense_rerank=dense.rerank, model_steps=steps))
        bm25 = _parsed("config.bm25", lambda: Bm25Parameters(**_known(Bm25Parameters, config.get("bm25", {}))))
        recorded = config.get("retrieval") or retrieval_defaults(representation)
        return cls(index=index, dense=dense, bm25=bm25,
                   retrieval={name: recorded.get(name, default) for name, default in DEFAULT_RETRIEVAL.items()},
                   site_bases=config.get("site_bases"))


def _known(cls: type, recorded: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `recorded` that are fields of dataclass `cls` (a section
    also records what no reader types, e.g. the dense index's metric)."""
    return {f.name: recorded[f.name] for f in dataclasses.fields(cls) if f.name in recorded}


def _parsed(where: str, parse: Callable[[], Any]) -> Any:
    """`parse()`; a value it refuses (of the wrong type or range) or an entry it
    misses as a ValueError that names `where`, the config's section."""
    try:
        return parse()
    except KeyError as exc:
        raise ValueError(f"{where}: no entry {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


@dataclasses.dataclass(frozen=True)
class ConfigFlag:
    """The command-line flag of one IndexConfig value: the flag of the field at
    `path` (ritrag.flags, from the field's metadata)."""

    path: tuple[str, ...]  # the value's place: a field of IndexConfig, or a field of one of its fields
    flag: Flag

    @property
    def name(self) -> str:
        return self.flag.name

    @property
    def default_in_help(self) -> bool:
        """The help states the default in the value's own words, and the flag's
        default is None: left out, the config's default applies."""
        return self.flag.default_in_help

    def value(self, config: IndexConfig) -> Any:
        """`config`'s value, as this flag gives it."""
        value: Any = config
        for name in self.path:
            value = getattr(value, name)
        return self.flag.to_flag(value)

    def applied(self, config: IndexConfig, flag_value: Any) -> IndexConfig:
        """`config` with this flag's value `flag_value` in its place."""
        return _replaced(config, self.path, self.flag.field_value(flag_value))

    def add_to(self, parser) -> None:
        """Add the flag to an argparse parser (or anything with its add_argument)."""
        self.flag.add_to(parser, default=None if self.default_in_help else self.value(IndexConfig()))


def _replaced(target: Any, path: tuple[str, ...], value: Any) -> Any:
    inner = value if len(path) == 1 else _replaced(getattr(target, path[0]), path[1:], value)
    return dataclasses.replace(target, **{path[0]: inner})


def _config_flags(cls: type, path: tuple[str, ...] = ()) -> tuple[ConfigFlag, ...]:
    """The flags of `cls`'s fields, in field order, and in the place of a field
    whose default is a dataclass (not itself a flag) the flags of its fields."""
    flags = flags_of(cls)
    out: list[ConfigFlag] = []
    for f in dataclasses.fields(cls):
        if f.name in flags:
            out.append(ConfigFlag((*path, f.name), flags[f.name]))
        elif dataclasses.is_dataclass(f.default):
            out += _config_flags(type(f.default), (*path, f.name))
    return tuple(out)


INDEX_FLAGS: tuple[ConfigFlag, ...] = _config_flags(IndexConfig)

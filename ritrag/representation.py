"""What the index sees of a node and its chunks: the representation.

A chunk's stored text (the chunks table) stays the page's own text: the node's
title line, then a run of its paragraphs. What BM25 indexes and what the model
embeds also say where the chunk lives, through the node's *path*: the title of
the site root, its ancestors and the node itself, joined by " > "
("Django > Topics > Databases > Configuring SSL"). Very deep paths keep the root
and the last `path_levels - 1` levels, since the nearest ancestors and the site
name disambiguate most.

- Dense: each chunk's embedded text is `template` with `{path}` (the path, whose
  last level is the title), `{title}` and `{body}` (the chunk's paragraphs, its
  title line left out, so the title is stated once) filled in, stripped. The
  chunker reserves the tokens of the template without its body, so the embedded
  text fits the model's limit.
- Sparse (BM25F-style, two fields): a chunk's own postings hold its body only;
  the path is indexed once per node, in the node's *document*. At query time a
  chunk scores body BM25 + `path_weight` x its node document's BM25, each field
  with its own statistics and saturation (serving/retrieval.py), so a long body
  does not drown the title and the title does not swamp the body.
- Node documents (`node_docs`): one extra row per node that holds text, in the
  chunks table with ordinal -1 (NODE_DOC_ORDINAL): the path, then the node's
  summary and keywords when it has any (the model's, from the metadata stage,
  unless `metadata_retrieval` is off: then its source's). It is indexed in BM25
  like a chunk, so it flows through builds, updates and compaction as chunks
  do; the server ranks node documents apart from chunks and combines a node's
  own match with its best chunk (`node_score` "max+doc"). It is embedded only
  with `node_doc_vectors`: the default node score ("max") never fuses the node
  documents' dense ranking, yet their vectors were a tenth to a fifth of the
  embedded rows (the build's costliest stage) and doubled every query's dense
  search depth (benchmarks/RESULTS.md, "Node-document vectors"). Without them,
  "max+doc" fuses the node documents' BM25 ranking alone.
- Anchor documents (`anchor_docs`): one row per node that other pages link to,
  in the chunks table with ordinal -2 (ANCHOR_DOC_ORDINAL): the anchor texts of
  its in-links, one a line (transforms/edges.py chooses and bounds them). BM25
  indexes it whole, as a third field; it is never embedded (no vector): the
  words others use for a page are a match signal, not a passage of it.

Chunk ids and text hashes are taken of the embedded text: a chunk whose path
changed is a new chunk (re-embedded, old one tombstoned), and the embedding
cache never hands a chunk the vector of the same words under another path.

The representation is recorded in the manifest (config "representation"); an
index built before it existed reads as LEGACY: template "{title}\\n{body}", no
node documents, postings of the whole stored text, which is exactly what such
builds did. One index holds one representation: an update that asks for another
is refused (rebuild instead).
"""
from __future__ import annotations

import dataclasses
import string
from typing import Any, Callable, Mapping, Sequence

from ritrag.flags import option
from ritrag.schema import NodeRow

NODE_DOC_ORDINAL = -1  # the chunks-table ordinal of a node's own document
ANCHOR_DOC_ORDINAL = -2  # the chunks-table ordinal of a node's in-link anchor texts (never embedded)
PATH_SEPARATOR = " > "
TEMPLATE_FIELDS = frozenset({"path", "title", "body"})
DEFAULT_TEMPLATE = "{path}\n{body}"
DEFAULT_PATH_LEVELS = 4
# Query-time defaults of an index built with node documents, chosen on half:a
# of the development questions and checked on half:b (benchmarks/RESULTS.md,
# "Retrieval with the forest" and the min-max sweep): the path field at half a body's
# weight; the paper's node score ("max+doc", a node's own match added, lost on
# both halves); BM25 and dense fused by their min-max normalized scores at equal
# weights (RRF lost on both halves); the in-link anchors field at weight 0
# (0.5 won on half:a and lost on half:b, "The link graph, query side"). Every
# one can be overridden per query
# (`RetrievalParams`); a parameter an index's manifest does not record (built
# before it existed) takes its default here.
DEFAULT_RETRIEVAL: dict[str, Any] = {"fusion": "minmax", "rrf_k": 60, "sparse_weight": 1.0, "dense_weight": 1.0,
                                     "path_weight": 0.5, "anchor_weight": 0.0, "node_score": "max",
                                     "node_doc_weight": 1.0, "root_weight": 0.0,
                                     "root_dense_weight": 0.0}


@dataclasses.dataclass(frozen=True)
class Representation:
    """How a node's chunks and document are turned into indexed and embedded text."""

    # Each field is a build flag (ritrag/index_config.py INDEX_FLAGS). A command
    # line writes a newline of the template as \n.
    template: str = option(
        DEFAULT_TEMPLATE, "what the model embeds of a chunk: {{path}}, {{title}}, {{body}} (default '{default}'; "
        "'{{title}}\\n{{body}}' is the representation of indexes built before templates)", flag="chunk_template",
        default_in_help=True, to_field=lambda text: text.replace("\\n", "\n"),
        to_flag=lambda text: text.replace("\n", "\\n"))
    path_levels: int = option(DEFAULT_PATH_LEVELS, "most levels of the node path in the representation: the root "
                                                   "and the last ones (default {default})", default_in_help=True)
    node_docs: bool = option(True, "index a per-node document (path, summary, keywords) in BM25 (and dense with "
                                   "--node_doc_vectors on), and keep the path out of chunk postings "
                                   "(default {default})", choices=("on", "off"), default_in_help=True)
    node_doc_vectors: bool = option(False, "embed node documents too, for --node_score max+doc's dense side (the "
                                           "default node score never uses them; off: max+doc fuses their BM25 "
                                           "ranking alone) (default {default})", choices=("on", "off"),
                                    default_in_help=True)
    anchor_docs: bool = option(True, "index the anchor texts other pages link a node with as its anchor document, "
                                     "a third BM25 field, never embedded (default {default})", choices=("on", "off"),
                               default_in_help=True)
    # Whether a node document holds the model's summary and keywords (when the
    # node has them) or only its source's: off keeps model metadata in the ToC
    # only, so an evaluation can tell its effect on ranking from its effect on reading.
    metadata_retrieval: bool = option(True, "put model metadata (--metadata_endpoint) into node documents, BM25 "
                                            "and dense; off: show it in the ToC only (default {default})",
                                      choices=("on", "off"), default_in_help=True)

    def __post_init__(self):
        fields = {name for _, name, _, _ in string.Formatter().parse(self.template) if name is not None}
        unknown = fields - TEMPLATE_FIELDS
        if unknown or "body" not in fields:
            raise ValueError(f"chunk template {self.template!r}: must contain {{body}} and may use only "
                             f"{{path}}, {{title}}, {{body}} (unknown: {sorted(unknown)})")
        if self.path_levels < 1:
            raise ValueError(f"path levels must be at least 1, not {self.path_levels}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "Representation":
        """The representation a manifest's config records (LEGACY when it records
        none; without anchor documents and with node-document vectors when it
        predates them: what such builds did)."""
        recorded = config.get("representation")
        return (cls(**{"anchor_docs": False, "node_doc_vectors": True, **recorded}) if recorded is not None
                else LEGACY)

    def embeds(self, ordinal: int) -> bool:
        """Whether the chunks-table row of `ordinal` has a vector: a chunk, and a
        node document with `node_doc_vectors` (an anchor document never)."""
        return ordinal >= 0 or (ordinal == NODE_DOC_ORDINAL and self.node_doc_vectors)

    @property
    def dense_node_docs(self) -> bool:
        """Whether the dense index holds node documents beside the chunks."""
        return self.node_docs and self.node_doc_vectors

    def path(self, title: str, ancestor_titles: Sequence[str]) -> str:
        """Root > ... > node title, at most `path_levels` levels (root and the last ones)."""
        levels = [t.strip() for t in (*ancestor_titles, title) if t and t.strip()]
        if len(levels) > self.path_levels:
            head = levels[:1] if self.path_levels > 1 else []
            levels = head + levels[len(levels) - self.path_levels + len(head):]
        return PATH_SEPARATOR.join(levels)

    def render(self, node: NodeRow, body: str) -> str:
        """The embedded text of a chunk of `node` holding paragraphs `body`."""
        return self.renderer(node)(body)

    def renderer(self, node: NodeRow) -> Callable[[str], str]:
        """`render` for the chunks of one node, its path worked out once."""
        path, title = self.path(node.title, node.ancestor_titles), node.title.strip()
        return lambda body: self.template.format(path=path, title=title, body=body).strip()

    def node_doc(self, node: NodeRow) -> str:
        """The text of a node's own document: its path, summary and keywords
        (its source's, not the model's, when `metadata_retrieval` is off)."""
        source = not self.metadata_retrieval and node.metadata_key
        summary, keywords = ((node.source_summary, node.source_keywords) if source else (node.summary, node.keywords))
        parts = [self.path(node.title, node.ancestor_titles), summary.strip(),
                 ", ".join(k.strip() for k in keywords if k.strip())]
        return "\n".join(p for p in parts if p)

    def node_inputs(self, node: NodeRow) -> tuple[str, str]:
        """What of a node row its chunks' and document's indexed texts depend on,
        besides its body: when this changes, the node is chunked again."""
        return self.render(node, ""), self.node_doc(node) if self.node_docs else ""

    def bm25_text(self, text: str, ordinal: int) -> str:
        """What BM25 indexes of a chunks-table row of stored `text` and
        `ordinal`: a node or anchor document whole; a chunk's body (its stored
        text less the title line) when node documents carry the path, else its
        whole stored text."""
        if not self.node_docs or ordinal < 0:
            return text
        _, _, body = text.partition("\n")
        return body


def retrieval_defaults(representation: Representation) -> dict[str, Any]:
    """The query-time parameters a build records for its representation: without
    node documents, only the paper's rule (node score = best chunk) applies."""
    if representation.node_docs:
        return dict(DEFAULT_RETRIEVAL)
    return {**DEFAULT_RETRIEVAL, "path_weight": 0.0, "anchor_weight": 0.0, "node_score": "max",
            "node_doc_weight": 0.0}


# What every index built before representations were recorded did.
LEGACY = Representation(template="{title}\n{body}", path_levels=DEFAULT_PATH_LEVELS, node_docs=False,
                        anchor_docs=False)


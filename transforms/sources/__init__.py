"""Input files that are not HTML pages -> the same `ParsedPage` records the HTML
parser makes, so that every later stage treats them alike. One module per kind,
declared in one registry, `dispatch` the one door (`sniff_kind`, `parse_document`):

- `base`       `SourceKind`, the contract of a kind: its sniffs (content, declared
               type, name), its URL rule, multi-page or not, its parser and packages
- `kinds`      the registry: every kind, in the order the sniffer asks them
- `sniff`      the one sniffer (standard library only, the crawler's too), WARC
               files by content
- `dispatch`   the kind of an input or `unknown_kind`, the URL a document is
               served at, its parser (imported on first use)
- `common`     `SourceFile`, heading anchors, a document's page and content hash,
               what a parser takes from the HTML parser
- `nav`        a document's trail: the `mkdocs.yml` nav, else its folders
- `markdown`   Markdown (markdown-it-py): front matter, headings -> sections
- `rst`        reStructuredText (docutils): section tree -> sections, toctree order
- `pdf`        PDF (pypdf): the outline -> sections, else one section per page
- `discourse`  a Discourse topic's JSON: the topic a page, each reply a page under
               the post it answers
- `stackexchange` a Stack Exchange dump's Posts.xml (streamed): a page per question
               and answer, answers under their question, questions under a tag
- `paper`      a paper's JSON (S2ORC / QASPER style): title, abstract, sections
- `record_source` a page's source when it is one record of a file: a WARC
               record (`file#offset`) or a thread's post (`file#post-N`)
- `warc`       WARC input: the 200 responses of WARC files, or of a crawl
               directory's current pages; damage dead-lettered with file#offset
"""
from ritrag.transforms.sources.common import SourceFile
from ritrag.transforms.sources.dispatch import HTML, document_url_path, is_multi_page, parse_document, sniff_kind
from ritrag.transforms.sources.record_source import record_source, split_record_source
from ritrag.transforms.sources.sniff import is_warc, web_kind

__all__ = ["HTML", "SourceFile", "document_url_path", "is_multi_page", "is_warc", "parse_document", "record_source",
           "sniff_kind", "split_record_source", "web_kind"]

"""HTML page -> `ParsedPage`. The one door is `parse_page`; `declared_page_urls` reads
only a page's head. One module per concern, each importing only those listed above it:

- `decode`    bytes -> UTF-8 for libxml2, the encoding cascade, `UnparseablePage`, the
              per-thread HTML parser
- `text`      an element's text with its whitespace collapsed
- `survey`    one pass over the container elements: what each is (trail markup, main
              region, boilerplate, table of contents, navigation, head element)
- `head`      what <head> says: title, canonical, up/home links, meta, JSON-LD
- `location`  the page's URL, canonical URL and base; resolving and judging links
- `trail`     the breadcrumb-trail cascade (its rules are in that module's docstring)
- `declared`  `declared_page_urls`: the URLs a page names for itself
- `content`   the main region, boilerplate stripping, table-of-contents order
- `links`     the links of the page's own text, navigation left out
- `sections`  the main region as text cut into heading sections; the page title
- `page`      `parse_page`: the steps above in order, and the page's content hash
"""
from ritrag.transforms.parse.declared import declared_page_urls
from ritrag.transforms.parse.decode import UnparseablePage
from ritrag.transforms.parse.page import parse_page

__all__ = ["UnparseablePage", "declared_page_urls", "parse_page"]

"""An element's text as libxml2 flattens it (XPath normalize-space), with Unicode
spaces collapsed too: how every other module of the parser reads text."""
from __future__ import annotations

import re

from lxml import etree

# In C: collapses runs of ASCII whitespace, which is what an HTML text's source
# line breaks and indentation are.
normalized_string = etree.XPath("normalize-space()", smart_strings=False)
_SPACES = re.compile(r"[\s\u00a0\u2000-\u200a\u202f\u205f\u3000]+")
# Unicode spaces other than the no-break space, which is by far the most common
# (&nbsp;) and is replaced with str.replace: a regex scan of a page's text costs
# several times more.
_RARE_UNICODE_SPACES = re.compile("[\u0085\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")


def collapse_unicode_spaces(text: str) -> str:
    """Text whose ASCII whitespace normalize-space collapsed, with its Unicode
    spaces collapsed too."""
    text = _RARE_UNICODE_SPACES.sub(" ", text.replace("\xa0", " "))
    while "  " in text:
        text = text.replace("  ", " ")
    return text


def collapse(text: str) -> str:
    return _SPACES.sub(" ", text).strip()


def text_of(el: etree._Element) -> str:
    text = normalized_string(el)
    return text if text.isascii() else collapse(text)  # no-break and other Unicode spaces

"""Bytes -> UTF-8 for libxml2: refusing what is not a page (`UnparseablePage`),
finding the page's encoding, and the per-thread lxml HTML parser."""
from __future__ import annotations

import codecs
import threading

from bs4.dammit import EncodingDetector, UnicodeDammit
from lxml import etree

DEFAULT_MAX_BYTES = 20 * 1024 * 1024


class UnparseablePage(Exception):
    """The input is not an HTML page that can be indexed; `reason` is a short code
    ("empty", "binary", "too_large", "undecodable", "no_content") for dead letters."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail

_BINARY_SIGNATURES = (b"%PDF-", b"\x1f\x8b", b"PK\x03\x04", b"\x89PNG", b"\xff\xd8\xff", b"GIF8")
# C0 controls other than tab and line breaks: neither text nor XML has them (and
# in UTF-8 these bytes are never part of a longer character).
CONTROL_BYTES = bytes([*range(0x00, 0x09), 0x0b, 0x0c, *range(0x0e, 0x20)])
_NOT_CONTROL_BYTES = bytes(b for b in range(256) if b not in CONTROL_BYTES)
_MAX_CONTROL_RATIO = 0.05  # text has next to none; compressed or binary data ~10%
_SNIFF_BYTES = 8192
# Browsers read these labels as windows-1252 (WHATWG Encoding), and so do pages.
_WINDOWS_1252_ALIASES = {"ascii", "latin-1", "iso8859-1"}


def _declared_codec(data: bytes) -> str | None:
    """The codec the page declares (XML declaration, <meta charset>, <meta
    http-equiv=Content-Type>), found by bs4's EncodingDetector; None when it
    declares none or an unknown one."""
    # Searched in the first 8 KiB, however long the page (bs4's own window is 5%).
    declared = EncodingDetector.find_declared_encoding(data[:_SNIFF_BYTES], is_html=True,
                                                       search_entire_document=True)
    if not declared:
        return None
    try:
        name = codecs.lookup(declared).name
    except LookupError:
        return None
    return "cp1252" if name in _WINDOWS_1252_ALIASES else name


def _decode(data: bytes, declared: str | None) -> tuple[str, str]:
    """The text and the codec that decoded it. A declaration is believed only if
    the bytes decode under it: pages declared UTF-8 but saved as windows-1252 are
    common, and so are UTF-8 pages with windows-1252 smart quotes pasted in
    (bs4's `UnicodeDammit.detwingle` converts those, a byte loop run only here)."""
    for codec in dict.fromkeys((declared or "utf-8", "utf-8")):
        try:
            return data.decode(codec), codec
        except UnicodeDecodeError:
            pass
    if declared in (None, "utf-8"):
        try:
            return UnicodeDammit.detwingle(data).decode("utf-8"), "utf-8+windows-1252"
        except UnicodeDecodeError:
            pass
    # A declared legacy codec with a few bad bytes is still the best guess; bytes
    # that are not UTF-8 and declare nothing else are windows-1252.
    fallback = declared if declared not in (None, "utf-8") else "cp1252"
    text = data.decode(fallback, errors="replace")
    if text.count("\ufffd") > 0.01 * len(text):
        raise UnparseablePage("undecodable", f"not {fallback}")
    return text, fallback


def utf8_html(data: bytes, max_bytes: int) -> bytes:
    """The page as UTF-8 bytes for lxml: the input itself when it is UTF-8 already,
    so that the common case copies nothing. Trust goes to a byte-order mark, then
    the declared charset, then UTF-8, then windows-1252 (bs4's EncodingDetector
    reads the mark and the declaration)."""
    if len(data) > max_bytes:
        raise UnparseablePage("too_large", f"{len(data)} bytes > {max_bytes}")
    if not data or data.isspace():
        raise UnparseablePage("empty")
    unmarked, marked_codec = EncodingDetector.strip_byte_order_mark(data)
    if marked_codec:
        return unmarked.decode(marked_codec, errors="replace").encode("utf-8")
    sniff = data[:_SNIFF_BYTES]
    if sniff.startswith(_BINARY_SIGNATURES) or (
        len(sniff.translate(None, _NOT_CONTROL_BYTES)) > _MAX_CONTROL_RATIO * len(sniff)
    ):
        raise UnparseablePage("binary", "control bytes or a binary file signature")
    has_nul = b"\x00" in data  # a stray NUL would end libxml2's text early
    if data.isascii() and not has_nul:
        return data  # valid UTF-8, and the same text in any ASCII-based charset it declares
    text, codec = _decode(data, _declared_codec(data))
    if codec == "utf-8" and not has_nul:
        return data
    return text.replace("\x00", "").encode("utf-8")


_thread_state = threading.local()  # an lxml parser must not be shared between threads


def html_parser() -> etree.HTMLParser:
    parser = getattr(_thread_state, "parser", None)
    if parser is None:
        parser = etree.HTMLParser(encoding="utf-8", remove_comments=True, remove_pis=True,
                                  no_network=True, huge_tree=True, collect_ids=False)
        _thread_state.parser = parser
    return parser

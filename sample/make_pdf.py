"""Writes sample/mixed/manuals/field-guide.pdf: a small PDF with text on three
pages and a nested outline (bookmarks), made with pypdf alone so that the sample
needs no other tool. Its text is original (CC0).

    python sample/make_pdf.py
"""
from __future__ import annotations

import os

from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

PAGES = [
    ["Tidepool Field Guide", "A pocket reference for the controller."],
    ["1 Probes", "Keep probes wet; a dry pH bulb is ruined.", "1.1 Cleaning",
     "Soak the bulb in vinegar for ten minutes."],
    ["2 Alarms", "A red light means a reading left its range.", "Press the button twice to silence it."],
]
OUTLINE = [("1 Probes", 1, None), ("1.1 Cleaning", 1, "1 Probes"), ("2 Alarms", 2, None)]


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def write(path: str, pages: list[list[str]] = PAGES, outline: list[tuple[str, int, str | None]] = OUTLINE,
          password: str | None = None) -> None:
    """A PDF of `pages` (lines of text each) with `outline` ((title, page index,
    parent title) entries), encrypted with `password` if given (tests build variants)."""
    writer = PdfWriter()
    font = DictionaryObject({NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
                             NameObject("/BaseFont"): NameObject("/Helvetica")})
    for lines in pages:
        page = writer.add_blank_page(width=300, height=400)
        ops = "".join(f"BT /F1 11 Tf 20 {370 - 20 * i} Td ({_escape(line)}) Tj ET\n" for i, line in enumerate(lines))
        stream = DecodedStreamObject()
        stream.set_data(ops.encode("latin-1"))
        page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): DictionaryObject(
            {NameObject("/F1"): font})})
        page.replace_contents(stream)
    items = {}
    for title, page_index, parent in outline:
        items[title] = writer.add_outline_item(title=title, page_number=page_index, parent=items.get(parent))
    writer.add_metadata({"/Title": "Tidepool Field Guide", "/Subject": "Pocket reference"})
    if password:
        writer.encrypt(password, algorithm="AES-128")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        writer.write(fh)


if __name__ == "__main__":
    write(os.path.join(os.path.dirname(os.path.abspath(__file__)), "mixed", "manuals", "field-guide.pdf"))

"""Where a page was read from (`ParsedPage.source`): a file's path, or one record
inside a file, `<file>#<record>`. The record is a WARC record's byte offset
(`crawl.warc.gz#1234`, transforms/sources/warc.py) or a post of a thread or dump
(`t/welcome.json#post-3`, the multi-page kinds of dispatch.py). One notation for
both, so that a page is read again (transforms/pages.py `reread_page`) by what
its source says, not by trying each reader.
"""
from __future__ import annotations

import re
from typing import NamedTuple

_RECORD = re.compile(r"\A(.+)#([0-9]+|post-\d+(?:-\d+)?)\Z", re.DOTALL)  # \d: a dump's ids are what str.isdigit takes


class RecordSource(NamedTuple):
    path: str  # the file holding the record
    record: str  # a WARC record's byte offset (digits), or a post's key ("post-<n>", "post-<n>-<k>")

    @property
    def warc_offset(self) -> int | None:
        """The byte offset of a WARC record; None for a post."""
        return int(self.record) if self.record.isdigit() else None


def record_source(path: str, record: str | int) -> str:
    """The source of a record of the file at `path`: a WARC offset or a post's key."""
    return f"{path}#{record}"


def split_record_source(source: str) -> RecordSource | None:
    """The file and record a page source names, None for a whole file."""
    match = _RECORD.match(source)
    return RecordSource(match.group(1), match.group(2)) if match else None

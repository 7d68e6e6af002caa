"""The one error type every face reports: a reason a program can branch on, a
message a person (or a model) can act on, and details such as the limit that
was hit or the budget left. HTTP maps it to a status code and a JSON body, MCP
to a tool result with isError, the CLI to a JSON line on stderr; no face ever
shows a stack trace."""
from __future__ import annotations

from typing import Any

# reason -> HTTP status
STATUS = {
    "invalid_arguments": 422,  # wrong types, missing or extra fields, empty query or id list
    "limit_exceeded": 422,  # query length, ids per Read, max_chars, k, n over the server's limits
    "request_too_large": 413,
    "request_timeout": 408,  # a request body that did not arrive whole in time (serving.http.ServerLimits)
    "unknown_ids": 404,  # none of the ids of a Read exist
    "unknown_handles": 404,  # a Read names outline handles this episode did not issue (or no longer keeps)
    "unknown_tool": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "unauthorized": 401,
    "budget_exhausted": 429,
    "not_ready": 503,
    "budget_store_unavailable": 503,  # the shared episode store (Redis) did not answer; retry shortly
    "unknown_version": 404,  # a version named (rollback, a pinned load) that the index does not hold
    "index_unavailable": 503,  # the index is missing or damaged (CLI: a manifest, CURRENT or file refused)
    "index_locked": 409,  # another job holds the index's lease
    "internal_error": 500,
}


class ToolError(Exception):
    """A call refused or failed, with a reason from `STATUS` and details."""

    def __init__(self, reason: str, message: str, **details: Any):
        super().__init__(message)
        if reason not in STATUS:
            raise ValueError(f"unknown error reason {reason!r}")
        self.reason = reason
        self.message = message
        self.details = details

    @property
    def status(self) -> int:
        return STATUS[self.reason]

    def to_dict(self) -> dict[str, Any]:
        return {"error": {"reason": self.reason, "message": self.message, **self.details}}


def checked_int(field: str, value: Any, minimum: int) -> int:
    """`value` when it is an int (not a bool) of at least `minimum`, else an
    `invalid_arguments` error naming `field`: the one check of every numeric
    argument (k, n, max_chars, offset) that the CLI, the Python API and the
    services all pass through."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ToolError("invalid_arguments", f"{field} must be an integer, not {type(value).__name__}",
                        errors=[{"field": field, "message": "not an integer"}])
    if value < minimum:
        raise ToolError("invalid_arguments", f"{field} must be at least {minimum}, not {value}",
                        errors=[{"field": field, "message": f"less than {minimum}"}])
    return value


def checked_text(field: str, value: Any) -> str:
    """`value` when it is a str that encodes as UTF-8 (no lone surrogates such
    as "\\ud800", which JSON parsing lets through but nothing can render)."""
    if not isinstance(value, str):
        raise ToolError("invalid_arguments", f"{field} must be a string, not {type(value).__name__}",
                        errors=[{"field": field, "message": "not a string"}])
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError("invalid_arguments", f"{field} is not valid Unicode text",
                        errors=[{"field": field, "message": "invalid Unicode"}]) from None
    return value

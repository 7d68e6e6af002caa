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
    "unknown_ids": 404,  # none of the ids of a Read exist
    "unknown_tool": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "unauthorized": 401,
    "budget_exhausted": 429,
    "not_ready": 503,
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

"""How an input file that is not JSON is described in one error line."""

from __future__ import annotations

import json

__all__ = ["not_json_text"]


def not_json_text(exc: json.JSONDecodeError) -> str:
    """``not valid JSON at line L column C: what is wrong`` (the decoder's
    message, whose wording may end in a dangling "at", made a clause)."""
    reason = exc.msg.strip().removesuffix(" at").rstrip(":")
    reason = reason[:1].lower() + reason[1:]
    return f"not valid JSON at line {exc.lineno} column {exc.colno}: {reason}"

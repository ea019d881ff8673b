"""Input files of JSON (profiles, fault files): read strictly and bounded,
and described in one error line when they are not JSON."""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["load_json"]


def load_json(content: bytes) -> Any:
    """The JSON value of an input file's bytes: UTF-8, strict JSON (no
    ``NaN``), nested at most 1,024 levels deep (orjson's bound).

    Raises:
        ValueError: ``not valid JSON at line L column C: what is wrong``
            (the decoder's message made a clause).
    """
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise ValueError(_not_json_text(exc)) from exc


def _not_json_text(exc: json.JSONDecodeError) -> str:
    reason = exc.msg.strip().removesuffix(" at").rstrip(":")
    reason = reason[:1].lower() + reason[1:]
    return f"not valid JSON at line {exc.lineno} column {exc.colno}: {reason}"

"""Input files of JSON (profiles, fault files): read strictly and bounded,
and described in one error line when they are not JSON."""

from __future__ import annotations

import os
from typing import Any

import orjson

__all__ = ["MAX_INPUT_BYTES", "load_json", "read_input"]

#: The most of an input file read: far more than any profile or fault file
#: holds, far less than a device (``/dev/zero``) or a model's weights named
#: by mistake, which would be read until memory ran out.
MAX_INPUT_BYTES = 16 << 20


def read_input(path: str | os.PathLike[str]) -> bytes:
    """An input file's bytes (a pipe's too), at most :data:`MAX_INPUT_BYTES`.

    Raises:
        OSError: it cannot be read.
        ValueError: it holds more.
    """
    with open(path, "rb") as file:
        content = file.read(MAX_INPUT_BYTES + 1)
    if len(content) > MAX_INPUT_BYTES:
        raise ValueError(
            f"larger than {MAX_INPUT_BYTES >> 20} MiB, which no JSON input file is; "
            "name the JSON file meant"
        )
    return content


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
        reason = exc.msg.strip().removesuffix(" at").rstrip(":")
        if not reason[1:2].isupper():  # "UTF-8 ..." stays as it is
            reason = reason[:1].lower() + reason[1:]
        raise ValueError(
            f"not valid JSON at line {exc.lineno} column {exc.colno}: {reason}"
        ) from exc

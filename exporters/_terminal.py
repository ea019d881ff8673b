"""Text from outside made safe to print on a terminal.

Exception messages, file names and notes come from probes, libraries and
log files this package does not control. Printed raw, an escape sequence in
one could clear the screen, recolour or retitle the terminal, or hide text;
a carriage return or a bidirectional override could make a line show
something other than what it holds; and a newline followed by text at the
first column could forge a line of the report (``Root cause: none``).
:func:`terminal_text` is what every text view and the live logging bridge
pass such text through. JSON documents and event logs keep the exact text.
"""

from __future__ import annotations

import re

__all__ = ["terminal_text"]

#: What is escaped (see :func:`terminal_text`); besides, the bidirectional
#: marks (U+200E, U+200F, U+061C) reorder what a line shows, and the
#: zero-width characters (U+200B to U+200D, U+2060 to U+2064, U+FEFF) hide
#: text or make two names that look alike differ.
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028\u2029\u202a-\u202e"
    "\u2060-\u2064\u2066-\u2069\ufeff]"
)
#: The short forms Python's ``repr`` does not use for these two.
_SHORT = {"\x0b": "\\v", "\x0c": "\\f"}
#: A newline followed by something (an empty line stays empty).
_CONTINUATION = re.compile("\n(?=[^\n])")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _SHORT.get(char) or repr(char)[1:-1]


def terminal_text(text: str, *, indent: str = "  ") -> str:
    """``text`` as it may be written to a terminal.

    - Every control character but tab and newline is replaced by its escape
      as Python writes it, shown literally: ESC becomes the four characters
      ``\\x1b``, BEL ``\\x07``, carriage return ``\\r``, DEL ``\\x7f``, a C1
      control (U+0080 to U+009F) ``\\x80``..``\\x9f``. So are the
      bidirectional embedding, override and isolate characters (U+202A to
      U+202E, U+2066 to U+2069: ``\\u202e``) and the line and paragraph
      separators (``\\u2028``, ``\\u2029``), which ``str.splitlines``
      takes for the end of a line. Tab is kept: it only moves the cursor
      forward.
    - Every line after the first that is not empty starts with ``indent``,
      so no text can begin a line at the first column. Put the whole
      message through at once (its first line included): lines of a
      multi-line message are then told apart from the lines around it. An
      ``indent`` of ``""`` escapes only.
    - Nothing else changes. Backslashes are left as they are, so text that
      already reads ``\\x1b`` (four characters) passes unchanged and cannot
      be told from an escaped ESC; the function is not idempotent, since a
      second pass indents continuation lines again.
    """
    escaped = _UNSAFE.sub(_escape, text)
    if indent and "\n" in escaped:
        escaped = _CONTINUATION.sub("\n" + indent, escaped)
    return escaped

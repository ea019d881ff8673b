"""Immutable records of exceptions, captured from live exception objects.

An :class:`ExceptionInfo` is what an event keeps of an exception: enough to
print the traceback, name the root cause and rebuild OpenTelemetry exception
events long after the process that raised it is gone. Capturing is total: it
never raises, never recurses without bound and never keeps a reference to the
live exception, its frames or their locals.
"""

from __future__ import annotations

import json
import os
import re
import traceback
from collections.abc import Callable, Mapping
from types import FrameType, TracebackType
from typing import Any

import attrs

__all__ = ["ExceptionInfo", "FrameInfo", "Redactor", "ThreadStack"]

#: How many links of ``__cause__``/``__context__``/group members are kept in
#: total before the record says ``truncated``. Deep enough for any real chain,
#: small enough that a pathological 10,000-link chain stays a small record.
MAX_CHAIN = 64
#: Frames kept per exception (the innermost ones, where the error happened),
#: and notes (the first ones).
MAX_FRAMES = 64
#: Characters kept of any one message, note or source line.
MAX_TEXT = 8192

_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL", re.IGNORECASE)
#: What ends the text a URL's user information may reach: whitespace but
#: tab (a password may hold one), quotes and angle brackets.
_URL_END = re.compile(r"[^\S\t]|[\"'<>]")
_SCHEME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_REDACTED = "[REDACTED]"
_CAUSE_HEADER = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT_HEADER = "\nDuring handling of the above exception, another exception occurred:\n\n"
#: Secret values shorter than this are not redacted: replacing "1" or "on"
#: everywhere would destroy messages without protecting anything.
_MIN_SECRET_LENGTH = 4


@attrs.frozen(kw_only=True)
class Redactor:
    """Removes credentials from captured text.

    ``secrets`` are the literal values to hide (by default the values of
    environment variables whose names contain TOKEN, SECRET, PASSWORD, KEY or
    CREDENTIAL); user information in URLs (``scheme://user:pass@host``) is
    always hidden.
    """

    secrets: tuple[str, ...] = ()
    #: Each secret as written and as ``repr``, ``ascii`` and JSON escape it
    #: (a message often quotes a value), longest first.
    _forms: tuple[str, ...] = attrs.field(init=False, eq=False, repr=False)

    @_forms.default
    def _written_forms(self) -> tuple[str, ...]:
        forms = {*self.secrets}
        for secret in self.secrets:
            forms.update((repr(secret)[1:-1], ascii(secret)[1:-1], json.dumps(secret)[1:-1]))
        return tuple(sorted(forms, key=len, reverse=True))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Redactor:
        """Build a redactor hiding the secret-looking variables of ``environ``
        (``os.environ`` by default)."""
        env = os.environ if environ is None else environ
        values = {
            value
            for name, value in env.items()
            if _SECRET_NAME.search(name) and len(value) >= _MIN_SECRET_LENGTH
        }
        return cls(secrets=tuple(sorted(values, key=len, reverse=True)))

    def __call__(self, text: str) -> str:
        """Return ``text`` with every known secret and URL credential replaced."""
        for secret in self._forms:
            text = text.replace(secret, _REDACTED)
        if "@" in text and "://" in text:
            text = _hide_url_credentials(text)
        return text


def _hide_url_credentials(text: str) -> str:
    """Replace the user information of every ``scheme://user:pass@host``:
    what stands between ``://`` and the last ``@`` before the URL's end
    (whitespace, a quote), so a password may hold ``@``, ``/`` or a tab; a
    ``/`` with no ``:`` before it is a path (``host/a@b`` hides nothing).

    A regular expression searching for the scheme would restart at every
    letter of a long run of letters and take quadratic time on a hostile
    message; this scan starts from each ``://`` instead, finds each URL's
    end and last ``@`` once, and every other scan it makes ends at the next
    ``/``, so the whole text is read a bounded number of times however it is
    built.
    """
    parts: list[str] = []
    done = 0
    end = at = -1  # the end of the current URL, and its last "@"
    found = text.find("://")
    while found >= 0:
        after = found + 3
        if after > end:
            url_end = _URL_END.search(text, after)
            end = len(text) if url_end is None else url_end.start()
            at = text.rfind("@", after, end)
        if at > after and _has_scheme(text, found, done) and _is_userinfo(text, after, at):
            parts += [text[done:after], _REDACTED]
            done = at
            found = text.find("://", at)
        else:
            found = text.find("://", found + 1)
    parts.append(text[done:])
    return "".join(parts)


def _is_userinfo(text: str, start: int, at: int) -> bool:
    """Whether ``text[start:at]`` is user information: no ``/``, or a
    ``user:password`` whose password holds one (not a nested ``x://``)."""
    slash = text.find("/", start, at)
    if slash < 0:
        return True
    return text.find(":", start, slash) >= 0 and text[slash - 1 : slash + 2] != "://"


def _has_scheme(text: str, end: int, start: int) -> bool:
    """Whether ``text[:end]`` ends in a URL scheme: scheme characters back to
    a letter, without crossing ``start`` (the end of the last replacement)."""
    index = end - 1
    while index >= start and text[index] in _SCHEME_CHARACTERS:
        if text[index].isascii() and text[index].isalpha():
            return True
        index -= 1
    return False


@attrs.frozen(kw_only=True)
class FrameInfo:
    """One frame of a traceback: where it is and the source line, if known."""

    filename: str
    lineno: int | None
    name: str
    line: str | None = None

    def where(self) -> str:
        """``wait (threading.py:331)``: the function and its place."""
        place = os.path.basename(self.filename)
        return f"{self.name} ({place}:{self.lineno})" if self.lineno else f"{self.name} ({place})"


@attrs.frozen(kw_only=True)
class ThreadStack:
    """Where one thread was at a moment: its name and its frames, outermost
    first as in a traceback, the innermost :data:`MAX_FRAMES` kept, texts
    redacted and bounded as an exception's are.

    Attributes:
        thread: the thread's name (``step attention/FLASH_ATTN``).
        frames: its stack.
    """

    thread: str
    frames: tuple[FrameInfo, ...] = ()

    @classmethod
    def capture(
        cls, thread: str, frame: FrameType | None, *, redactor: Redactor | None = None
    ) -> ThreadStack:
        """The stack of ``frame`` (a thread's current frame, as
        :func:`sys._current_frames` gives it); never raises."""
        capture = _Capture(redactor or Redactor.from_environment(), MAX_CHAIN)
        frames = capture.frames(traceback.extract_stack, frame) if frame is not None else ()
        return cls(thread=capture._text(thread), frames=frames)

    @property
    def innermost(self) -> FrameInfo | None:
        """The frame the thread was in."""
        return self.frames[-1] if self.frames else None

    def format(self, limit: int = 8) -> list[str]:
        """At most ``limit`` frames (by default the 8 a reader looks at),
        innermost first, one line each (``wait (/usr/lib/python3.11/
        threading.py:327)``), then a line saying how many outer frames are
        left out, if any."""
        shown = self.frames[-limit:] if limit > 0 else ()
        lines = [f"{frame.name} ({frame.filename}:{frame.lineno})" for frame in reversed(shown)]
        if len(self.frames) > len(shown):
            lines.append(f"... {len(self.frames) - len(shown)} outer frames")
        return lines

    @property
    def waiting_in(self) -> FrameInfo | None:
        """The innermost frame outside Python's standard library (the
        caller of ``Event.wait``, not ``wait``), else the innermost."""
        for frame in reversed(self.frames):
            if _STDLIB.search(frame.filename) is None:
                return frame
        return self.innermost


#: A file of an interpreter's standard library, as a recording machine
#: names it (``/usr/lib/python3.11/threading.py``, ``<frozen os>``).
_STDLIB = re.compile(r"^<frozen |[/\\]lib[/\\]python3\.\d+[/\\](?!(site|dist)-packages[/\\])")


@attrs.frozen(kw_only=True)
class ExceptionInfo:
    """An exception as data.

    Records compare equal when every field is equal, links included, and
    equal records hash equally. Capture and decoding keep at most
    :data:`MAX_CHAIN` linked records, marking the record where they cut
    ``truncated``; comparing, hashing, printing and encoding recurse along
    the links, so a record built by hand should stay within that bound too.

    Attributes:
        type: qualified type name; builtins and a script's own types are
            bare (``PermissionError``; ``MyError`` from ``__main__``, a
            name that differs from process to process), others carry
            their module (``mylib._C.AbiError``).
        message: ``str(exc)``; ``"<unprintable X>"`` if that raised.
        reason: ``f"{type(exc).__name__}: {exc}"``, the form probes report.
        errno, strerror, filename: from :class:`OSError`.
        module_name, module_path: ``name``/``path`` of :class:`ImportError`.
        frames: the innermost frames of the traceback, outermost first.
        cause: ``__cause__`` (explicit ``raise ... from``).
        context: ``__context__`` unless suppressed or identical to the cause.
        notes: ``__notes__``, the first :data:`MAX_FRAMES`.
        exceptions: members of a (Base)ExceptionGroup.
        truncated: the chain was cut (cycle or size bound) below this record.
    """

    type: str
    message: str
    reason: str
    errno: int | None = None
    strerror: str | None = None
    filename: str | None = None
    module_name: str | None = None
    module_path: str | None = None
    frames: tuple[FrameInfo, ...] = ()
    cause: ExceptionInfo | None = None
    context: ExceptionInfo | None = None
    notes: tuple[str, ...] = ()
    exceptions: tuple[ExceptionInfo, ...] = ()
    truncated: bool = False

    @property
    def name(self) -> str:
        """The unqualified type name (``PermissionError``)."""
        return self.type.rpartition(".")[2]

    @classmethod
    def capture(
        cls, exc: BaseException, *, redactor: Redactor | None = None, max_chain: int = MAX_CHAIN
    ) -> ExceptionInfo:
        """Capture ``exc`` and everything linked to it.

        Never raises for any exception object, however hostile its ``__str__``,
        ``__notes__`` or chain. At most ``max_chain`` linked exceptions are
        recorded; a record whose links were cut has ``truncated=True``.
        Secrets are redacted with ``redactor`` (default: from the current
        environment) in the whole of each text, before it is cut to
        :data:`MAX_TEXT` characters.
        """
        capture = _Capture(redactor or Redactor.from_environment(), max_chain)
        try:
            return capture.run(exc)
        except Exception:  # pragma: no cover - last line of defence
            return cls(type="UnknownError", message="<capture failed>", reason="UnknownError")

    def chain(self) -> tuple[ExceptionInfo, ...]:
        """This record followed by its causes (``cause``, else ``context``),
        outermost first, as a traceback prints them last-to-first."""
        out: list[ExceptionInfo] = []
        node: ExceptionInfo | None = self
        while node is not None:
            out.append(node)
            node = node.cause or node.context
        return tuple(out)

    def root(self) -> ExceptionInfo:
        """The innermost cause: the exception that started it all."""
        return self.chain()[-1]

    def format(self, *, chain: bool = True, max_links: int | None = None) -> str:
        """Render like :func:`traceback.format_exception`, causes first.

        Args:
            chain: render the causes too (as ``traceback`` does); ``False``
                renders this record alone (with the members of a group).
            max_links: render at most this many links of the chain (this
                record and the causes nearest to it); one line first says how
                many further down were left out. ``None``: every link.

        Groups nested more than ten deep (``traceback``'s default
        ``max_group_depth``) are summarised in one line, so the text grows
        linearly with the record whatever its shape.
        """
        return self._format(max_links, 0) if chain else self._format_one(max_links, 0)

    def _format(self, max_links: int | None, depth: int) -> str:
        links = self.chain()
        shown = links if max_links is None else links[: max(max_links, 0)]
        parts: list[str] = []
        if len(shown) < len(links):
            hidden = len(links) - len(shown)
            parts.append(f"... ({_count(hidden, 'more linked exception')} not shown)\n")
        for link in reversed(shown):
            if parts:
                parts.append(_CAUSE_HEADER if link.cause is not None else _CONTEXT_HEADER)
            parts.append(link._format_one(max_links, depth))
        return "".join(parts)

    def _format_one(self, max_links: int | None, depth: int) -> str:
        lines: list[str] = []
        if self.frames:
            lines.append("Traceback (most recent call last):\n")
            for frame in self.frames:
                lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}\n')
                if frame.line:
                    lines.append(f"    {frame.line}\n")
        lines.append(f"{self.type}: {self.message}\n" if self.message else f"{self.type}\n")
        lines.extend(f"{note}\n" for note in self.notes)
        if self.exceptions and depth >= _MAX_GROUP_DEPTH:
            lines.append(
                f"  +---------------- ... ----------------\n"
                f"  | ... ({_count(len(self.exceptions), 'member exception')} of a group nested "
                f"more than {_MAX_GROUP_DEPTH} deep not shown)\n"
            )
        else:
            for index, member in enumerate(self.exceptions, 1):
                body = member._format(max_links, depth + 1).rstrip("\n").replace("\n", "\n  | ")
                lines.append(f"  +---------------- {index} ----------------\n  | {body}\n")
        if self.truncated:
            lines.append("  ... (exception chain truncated)\n")
        return "".join(lines)


#: Exception groups nested deeper than this are summarised by format().
_MAX_GROUP_DEPTH = 10


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}" + ("" if number == 1 else "s")


def _plain_text(value: object) -> str:
    """``str(value)`` whole, as valid UTF-8; never raises."""
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:
        return f"<unprintable {_type_name(type(value))}>"
    # Lone surrogates (from bytes decoded with surrogateescape) are not valid
    # UTF-8; replace them so the record always encodes.
    return text.encode("utf-8", "replace").decode("utf-8")


def _type_name(tp: type[Any]) -> str:
    module = getattr(tp, "__module__", None)
    qualname = getattr(tp, "__qualname__", None) or getattr(tp, "__name__", "<unknown>")
    if not isinstance(qualname, str):
        qualname = "<unknown>"
    if module in (None, "builtins", "__main__") or not isinstance(module, str):
        return qualname
    return f"{module}.{qualname}"


class _Capture:
    """One capture: tracks what was seen so cycles end and size stays bounded."""

    def __init__(self, redactor: Redactor, max_chain: int) -> None:
        self._redact = redactor
        self._budget = max_chain
        self._seen: set[int] = set()

    def _text(self, value: object) -> str:
        # Redact the whole text, then cut it: cutting first could split a
        # secret or a URL's credentials at the limit, and a split secret no
        # longer matches while its first part stays readable in the record.
        text = self._redact(_plain_text(value))
        if len(text) > MAX_TEXT:
            return text[:MAX_TEXT] + f"... [{len(text) - MAX_TEXT} more characters]"
        return text

    def _optional_text(self, exc: BaseException, name: str) -> str | None:
        value = _safe_getattr(exc, name)
        return None if value is None else self._text(value)

    def run(self, exc: BaseException) -> ExceptionInfo:
        # Recursion along the links is bounded by the budget, as the chain
        # a record may hold is (MAX_CHAIN links).
        self._budget -= 1
        self._seen.add(id(exc))
        fields = self._fields(exc)
        cause = _safe_getattr(exc, "__cause__")
        context = _safe_getattr(exc, "__context__")
        if isinstance(cause, BaseException):
            link, following = "cause", cause
        elif isinstance(context, BaseException) and not _safe_getattr(exc, "__suppress_context__"):
            link, following = "context", context
        else:
            return ExceptionInfo(**fields)
        if id(following) in self._seen or self._budget <= 0:
            fields["truncated"] = True
        else:
            fields[link] = self.run(following)
        return ExceptionInfo(**fields)

    def _fields(self, exc: BaseException) -> dict[str, Any]:
        message = self._text(exc)
        fields: dict[str, Any] = {
            "type": self._text(_type_name(type(exc))),
            "message": message,
            "reason": f"{self._text(type(exc).__name__)}: {message}",
        }
        # Only a real traceback is walked: an object posing as one could
        # link to itself.
        tb = _safe_getattr(exc, "__traceback__")
        if isinstance(tb, TracebackType):
            fields["frames"] = self.frames(traceback.extract_tb, tb)
        if isinstance(exc, OSError):
            errno = _safe_getattr(exc, "errno")
            # As a log can hold it: an integer (not a bool) of 64 bits.
            if isinstance(errno, int) and not isinstance(errno, bool) and -(2**63) <= errno < 2**63:
                fields["errno"] = int(errno)
            fields["strerror"] = self._optional_text(exc, "strerror")
            fields["filename"] = self._optional_text(exc, "filename")
        if isinstance(exc, ImportError):
            fields["module_name"] = self._optional_text(exc, "name")
            fields["module_path"] = self._optional_text(exc, "path")
        notes = _safe_getattr(exc, "__notes__")
        if isinstance(notes, list | tuple):
            fields["notes"] = tuple(self._text(note) for note in notes[:MAX_FRAMES])
        if isinstance(exc, BaseExceptionGroup):
            members: list[ExceptionInfo] = []
            for member in exc.exceptions:
                if self._budget <= 0:
                    fields["truncated"] = True
                    break
                if id(member) in self._seen:  # listed again: the ones after it are kept
                    fields["truncated"] = True
                    continue
                members.append(self.run(member))
            fields["exceptions"] = tuple(members)
        return fields

    def frames(
        self, extract: Callable[[Any], traceback.StackSummary], origin: object
    ) -> tuple[FrameInfo, ...]:
        """The innermost frames of the stack ``extract(origin)`` lists,
        redacted and bounded; none if it fails."""
        try:
            summary = extract(origin)
        except Exception:
            return ()
        return tuple(
            FrameInfo(
                filename=self._text(frame.filename),
                lineno=frame.lineno,
                name=self._text(frame.name),
                line=self._text(frame.line) if frame.line else None,
            )
            for frame in summary[-MAX_FRAMES:]
        )


def _safe_getattr(obj: object, name: str) -> Any:
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def cut_chain(record: Any, rename: Callable[[str], str] | None = None) -> Any:
    """``record`` (an exception record's JSON) with at most
    :data:`MAX_CHAIN` linked records, links past the bound dropped and the
    record they were dropped from marked ``truncated``, and each kept
    record's ``type`` passed through ``rename`` when given; ``record`` itself
    when nothing changed. The records changed are copies. Anything that is
    not a record is left for the checks to refuse."""
    budget = MAX_CHAIN

    def cut(node: dict[str, Any]) -> dict[str, Any]:
        nonlocal budget
        budget -= 1
        copy = dict(node)
        if rename is not None and type(node.get("type")) is str:
            copy["type"] = rename(node["type"])
        for name in ("cause", "context", "exceptions"):
            value: Any = node.get(name)
            if type(value) is dict:
                if budget > 0:
                    copy[name] = cut(value)
                else:
                    del copy[name]
                    copy["truncated"] = True
            elif type(value) is list:
                kept: list[Any] = []
                for item in value:
                    if type(item) is dict and budget <= 0:
                        copy["truncated"] = True
                        break
                    kept.append(cut(item) if type(item) is dict else item)
                copy[name] = kept
        # Equal only where every link came back as it was (an unchanged
        # value is the same object: comparing it costs nothing).
        return node if copy == node else copy

    return cut(record) if type(record) is dict else record

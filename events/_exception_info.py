"""Immutable records of exceptions, captured from live exception objects.

An :class:`ExceptionInfo` is what an event keeps of an exception: enough to
print the traceback, name the root cause and rebuild OpenTelemetry exception
events long after the process that raised it is gone. Capturing is total: it
never raises, never recurses without bound and never keeps a reference to the
live exception, its frames or their locals.
"""

from __future__ import annotations

import os
import re
import traceback
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import attrs

__all__ = ["ExceptionInfo", "FrameInfo", "Redactor"]

#: How many links of ``__cause__``/``__context__``/group members are kept in
#: total before the record says ``truncated``. Deep enough for any real chain,
#: small enough that a pathological 10,000-link chain stays a small record.
MAX_CHAIN = 64
#: Frames kept per exception (the innermost ones, where the error happened).
MAX_FRAMES = 64
#: Characters kept of any one message, note or source line.
MAX_TEXT = 8192

_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL", re.IGNORECASE)
_URL_CREDENTIALS = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/\s@:]+(?::[^/\s@]*)?)@"
)
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

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Redactor:
        """Build a redactor hiding the secret-looking variables of ``environ``
        (``os.environ`` by default). Longest values go first so a secret that
        contains another is hidden whole."""
        env = os.environ if environ is None else environ
        values = {
            value
            for name, value in env.items()
            if _SECRET_NAME.search(name) and len(value) >= _MIN_SECRET_LENGTH
        }
        return cls(secrets=tuple(sorted(values, key=len, reverse=True)))

    def __call__(self, text: str) -> str:
        """Return ``text`` with every known secret and URL credential replaced."""
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, _REDACTED)
        if "@" in text:
            text = _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{_REDACTED}@", text)
        return text


@attrs.frozen(kw_only=True)
class FrameInfo:
    """One frame of a traceback: where it is and the source line, if known."""

    filename: str
    lineno: int | None
    name: str
    line: str | None = None


@attrs.frozen(kw_only=True)
class ExceptionInfo:
    """An exception as data.

    Attributes:
        type: qualified type name; builtins are bare (``PermissionError``),
            others carry their module (``zentorch._C.AbiError``).
        message: ``str(exc)``; ``"<unprintable X>"`` if that raised.
        reason: ``f"{type(exc).__name__}: {exc}"``, the form probes report.
        errno, strerror, filename: from :class:`OSError`.
        module_name, module_path: ``name``/``path`` of :class:`ImportError`.
        frames: the innermost frames of the traceback, outermost first.
        cause: ``__cause__`` (explicit ``raise ... from``).
        context: ``__context__`` unless suppressed or identical to the cause.
        notes: ``__notes__``.
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
        cls,
        exc: BaseException,
        *,
        redactor: Redactor | None = None,
        max_chain: int = MAX_CHAIN,
    ) -> ExceptionInfo:
        """Capture ``exc`` and everything linked to it.

        Never raises for any exception object, however hostile its ``__str__``,
        ``__notes__`` or chain. At most ``max_chain`` linked exceptions are
        recorded; a record whose links were cut has ``truncated=True``.
        Secrets are redacted with ``redactor`` (default: from the current
        environment).
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

    def format(self) -> str:
        """Render like :func:`traceback.format_exception`, causes first."""
        parts: list[str] = []
        for node in reversed(self.chain()):
            if parts:
                parts.append(_CAUSE_HEADER if node.cause is not None else _CONTEXT_HEADER)
            parts.append(node._format_one())
        return "".join(parts)

    def _format_one(self) -> str:
        lines: list[str] = []
        if self.frames:
            lines.append("Traceback (most recent call last):\n")
            for frame in self.frames:
                lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}\n')
                if frame.line:
                    lines.append(f"    {frame.line}\n")
        lines.append(f"{self.type}: {self.message}\n" if self.message else f"{self.type}\n")
        lines.extend(f"{note}\n" for note in self.notes)
        for index, member in enumerate(self.exceptions, 1):
            body = member.format().rstrip("\n").replace("\n", "\n  | ")
            lines.append(f"  +---------------- {index} ----------------\n  | {body}\n")
        if self.truncated:
            lines.append("  ... (exception chain truncated)\n")
        return "".join(lines)


def _safe_text(value: object, limit: int = MAX_TEXT) -> str:
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:
        return f"<unprintable {_type_name(type(value))}>"
    # Lone surrogates (from bytes decoded with surrogateescape) are not valid
    # UTF-8; replace them so the record always encodes.
    text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) > limit:
        text = text[:limit] + f"... [{len(text) - limit} more characters]"
    return text


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

    def run(self, exc: BaseException) -> ExceptionInfo:
        # Iterative over the cause/context spine, so a 10,000-deep chain never
        # touches the recursion limit; only group members recurse, and they
        # draw on the same budget.
        spine: list[tuple[BaseException, dict[str, Any]]] = []
        link: str | None = None
        current: BaseException | None = exc
        truncated_tail = False
        while current is not None:
            if id(current) in self._seen:
                truncated_tail = True
                break
            if self._budget <= 0:
                truncated_tail = True
                break
            self._budget -= 1
            self._seen.add(id(current))
            fields = self._fields(current)
            spine.append((current, fields))
            nxt, link = self._next_link(current)
            fields["_link"] = link
            current = nxt
        # Build from the innermost outwards.
        built: ExceptionInfo | None = None
        for position, (_exc, fields) in enumerate(reversed(spine)):
            link = fields.pop("_link")
            if position == 0:
                fields["truncated"] = fields.get("truncated", False) or truncated_tail
            elif link == "cause":
                fields["cause"] = built
            elif link == "context":
                fields["context"] = built
            built = ExceptionInfo(**fields)
        assert built is not None
        return built

    @staticmethod
    def _next_link(exc: BaseException) -> tuple[BaseException | None, str | None]:
        cause = _safe_getattr(exc, "__cause__")
        if isinstance(cause, BaseException):
            return cause, "cause"
        context = _safe_getattr(exc, "__context__")
        suppressed = bool(_safe_getattr(exc, "__suppress_context__"))
        if isinstance(context, BaseException) and not suppressed:
            return context, "context"
        return None, None

    def _fields(self, exc: BaseException) -> dict[str, Any]:
        name = _type_name(type(exc))
        message = self._redact(_safe_text(exc))
        fields: dict[str, Any] = {
            "type": name,
            "message": message,
            "reason": f"{type(exc).__name__}: {message}",
            "frames": self._frames(_safe_getattr(exc, "__traceback__")),
        }
        if isinstance(exc, OSError):
            errno_value = _safe_getattr(exc, "errno")
            fields["errno"] = errno_value if isinstance(errno_value, int) else None
            strerror = _safe_getattr(exc, "strerror")
            fields["strerror"] = None if strerror is None else self._redact(_safe_text(strerror))
            filename = _safe_getattr(exc, "filename")
            fields["filename"] = None if filename is None else self._redact(_safe_text(filename))
        if isinstance(exc, ImportError):
            module_name = _safe_getattr(exc, "name")
            module_path = _safe_getattr(exc, "path")
            fields["module_name"] = None if module_name is None else _safe_text(module_name)
            fields["module_path"] = (
                None if module_path is None else self._redact(_safe_text(module_path))
            )
        notes = _safe_getattr(exc, "__notes__")
        if isinstance(notes, list | tuple):
            fields["notes"] = tuple(self._redact(_safe_text(note)) for note in notes[:MAX_FRAMES])
        if isinstance(exc, BaseExceptionGroup):
            members: list[ExceptionInfo] = []
            truncated = False
            for member in exc.exceptions:
                if self._budget <= 0 or id(member) in self._seen:
                    truncated = True
                    break
                members.append(self.run(member))
            fields["exceptions"] = tuple(members)
            fields["truncated"] = truncated
        return fields

    def _frames(self, tb: object) -> tuple[FrameInfo, ...]:
        if not isinstance(tb, TracebackType):
            return ()
        try:
            summary = traceback.extract_tb(tb)
        except Exception:
            return ()
        frames = [
            FrameInfo(
                filename=self._redact(_safe_text(frame.filename)),
                lineno=frame.lineno,
                name=_safe_text(frame.name),
                line=self._redact(_safe_text(frame.line)) if frame.line else None,
            )
            for frame in summary[-MAX_FRAMES:]
        ]
        return tuple(frames)


def _safe_getattr(obj: object, name: str) -> Any:
    try:
        return getattr(obj, name, None)
    except Exception:
        return None

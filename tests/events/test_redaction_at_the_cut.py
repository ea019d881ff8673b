"""Secrets are redacted in the whole text, before it is cut to MAX_TEXT.

A secret that straddles the cut would otherwise survive in part: the cut
text no longer holds the whole secret, so nothing matches it, and its first
characters stay readable in the record and the log.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import events
from events import ExceptionInfo, JsonlLog, Redactor
from events._exception_info import MAX_TEXT

SECRET = "s3cr3t-Value-0123456789abcdef"
PASSWORD = "hunter2-Pa55word-xyz"
REDACTOR = Redactor.from_environment({"SERVICE_API_TOKEN": SECRET, "HOME": "/home/someone"})


def prefixes(secret: str) -> list[str]:
    """Every recognisable start of ``secret``: four characters or more."""
    return [secret[:length] for length in range(4, len(secret) + 1)]


def assert_hidden(text: str, *secrets: str) -> None:
    for secret in secrets:
        leaked = [prefix for prefix in prefixes(secret) if prefix in text]
        assert not leaked, f"{leaked[-1]!r} of a secret is in the text"


def straddling(secret: str, before: str = "", after: str = "") -> str:
    """A message in which ``secret`` starts 5 characters before the cut, so
    the cut falls inside it; ``before`` and ``after`` surround it."""
    lead = MAX_TEXT - len(before) - 5
    return "x" * lead + before + secret + after + " and more after it"


def as_event(info: ExceptionInfo) -> events.StepFailed:
    return events.StepFailed(run_id="r", rank=0, wall_ns=1, mono_ns=1, step="s", cause=info)


@pytest.mark.parametrize(
    ("message", "secret"),
    [
        pytest.param(straddling(SECRET), SECRET, id="environment-secret"),
        pytest.param(
            straddling(PASSWORD, before="https://deploy:", after="@build.example.org/x"),
            PASSWORD,
            id="url-password",
        ),
        pytest.param(
            straddling(f"deploy:{PASSWORD}", before="postgresql://", after="@db:5432/app"),
            f"deploy:{PASSWORD}",
            id="url-userinfo",
        ),
    ],
)
def test_a_secret_across_the_cut_is_redacted_whole(
    message: str, secret: str, tmp_path: Path
) -> None:
    try:
        raise RuntimeError(message)
    except RuntimeError as exc:
        exc.add_note(message)
        info = ExceptionInfo.capture(exc, redactor=REDACTOR)
    redacted = REDACTOR(message)
    assert "[REDACTED]" in redacted
    cut = redacted[:MAX_TEXT] + f"... [{len(redacted) - MAX_TEXT} more characters]"
    assert info.message == cut
    for text in (info.message, info.reason, *info.notes, info.format(), repr(info)):
        assert_hidden(text, secret)
    with JsonlLog(tmp_path / "rank-0.jsonl", run_id="r", rank=0) as log:
        log.append(as_event(info))
    line = (tmp_path / "rank-0.jsonl").read_text(encoding="utf-8")
    assert_hidden(line, secret)
    assert events.read_log(tmp_path / "rank-0.jsonl").events[0].cause == info


class _Hostile(OSError):
    """Every text an exception can carry holds the secret across the cut."""


def test_every_captured_text_is_redacted_before_the_cut() -> None:
    long_secret_text = straddling(SECRET)
    exc = _Hostile(13, long_secret_text, long_secret_text)
    try:
        raise exc
    except _Hostile as caught:
        caught.add_note(long_secret_text)
        info = ExceptionInfo.capture(caught, redactor=REDACTOR)
    assert info.strerror is not None
    assert info.filename is not None
    for text in (info.message, info.strerror, info.filename, *info.notes):
        assert len(text) > MAX_TEXT
        assert_hidden(text, SECRET)
    failed_import = ImportError(long_secret_text, name=long_secret_text, path=long_secret_text)
    imported = ExceptionInfo.capture(failed_import, redactor=REDACTOR)
    assert imported.module_name is not None
    assert imported.module_path is not None
    for text in (imported.message, imported.module_name, imported.module_path):
        assert_hidden(text, SECRET)


def test_url_credentials_in_a_huge_message_are_found_in_linear_time() -> None:
    # Letters with no "://" between them: a scheme search that restarts at
    # every letter would take quadratic time here.
    message = "a" * 2_000_000 + "1" * 100_000 + "://user:" + PASSWORD + "@host/ and a@b"
    started = time.perf_counter()
    hidden = REDACTOR(message)
    elapsed = time.perf_counter() - started
    assert_hidden(hidden, PASSWORD)
    assert hidden.endswith("://[REDACTED]@host/ and a@b")
    # Generous: linear work is milliseconds; quadratic would be hours.
    assert elapsed < 30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("https://user:pw@host/x", "https://[REDACTED]@host/x"),
        ("see git+ssh://git@github.com/a", "see git+ssh://[REDACTED]@github.com/a"),
        ("1abc://u:p@h", "1abc://[REDACTED]@h"),
        ("123://u:p@h", "123://u:p@h"),  # a scheme starts with a letter
        ("a://b://c:d@host", "a://b://[REDACTED]@host"),
        # a password without a user name
        ("x://:p@host", "x://[REDACTED]@host"),
        ("redis://:pw@cache:6379/0", "redis://[REDACTED]@cache:6379/0"),
        ("https://:token@host/x", "https://[REDACTED]@host/x"),
        ("x://:pa/ss@host", "x://[REDACTED]@host"),
        # a password holding "@", "/" or a tab
        ("https://user:p@ss@host/x", "https://[REDACTED]@host/x"),
        ("x://u:pa/ss@h/y", "x://[REDACTED]@h/y"),
        ("x://u:pa\tss@h", "x://[REDACTED]@h"),
        # a path holding "@" is no user information
        ("https://host/org/name@main", "https://host/org/name@main"),
        ("file:///a@b", "file:///a@b"),
        ("x://@h", "x://@h"),
        ('url="https://u:p@h"', 'url="https://[REDACTED]@h"'),
        ("x://u p@host", "x://u p@host"),  # whitespace ends user information
        ("x://u:p@h x://v:q@i", "x://[REDACTED]@h x://[REDACTED]@i"),
        ("mail me@example.org", "mail me@example.org"),
        ("x://u:p:q@h", "x://[REDACTED]@h"),
    ],
)
def test_url_credentials(text: str, expected: str) -> None:
    assert Redactor()(text) == expected


@pytest.mark.parametrize(
    "secret", ["p\x01ss'w\"d-4", "tab\there-4", "back\\slash-4", "naïve-secret"]
)
def test_a_secret_is_hidden_as_repr_ascii_and_json_write_it(secret: str) -> None:
    import json

    redactor = Redactor(secrets=(secret,))
    for written in (secret, repr(secret), ascii(secret), json.dumps(secret)):
        hidden = redactor(f"login failed for {written}")
        assert secret not in hidden, hidden
        assert written[1:-1] not in hidden, hidden
        assert "[REDACTED]" in hidden

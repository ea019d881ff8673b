"""ExceptionInfo.capture: every field of every case, and capture never fails."""

from __future__ import annotations

import os
import sys

import orjson
import pytest

import events
from events import ExceptionInfo, FrameInfo, Redactor, ThreadStack

#: No secrets: the cases below must not depend on the test machine's environment.
PLAIN = Redactor()


def capture(exc: BaseException, **kwargs: object) -> ExceptionInfo:
    kwargs.setdefault("redactor", PLAIN)
    return ExceptionInfo.capture(exc, **kwargs)  # type: ignore[arg-type]


def raised(exc: BaseException) -> BaseException:
    """``exc`` after it was raised and caught, so it has a traceback."""
    try:
        raise exc
    except BaseException as caught:
        return caught


def as_event(info: ExceptionInfo) -> events.StepFailed:
    return events.StepFailed(run_id="r", rank=0, wall_ns=1, mono_ns=1, step="s", cause=info)


def test_permission_error_fields() -> None:
    exc = PermissionError(13, "Permission denied", "/root/.cache/flashinfer")
    info = capture(exc)
    assert info == ExceptionInfo(
        type="PermissionError",
        message="[Errno 13] Permission denied: '/root/.cache/flashinfer'",
        reason="PermissionError: [Errno 13] Permission denied: '/root/.cache/flashinfer'",
        errno=13,
        strerror="Permission denied",
        filename="/root/.cache/flashinfer",
    )
    assert info.type == "PermissionError"
    assert info.name == "PermissionError"
    assert info.message == "[Errno 13] Permission denied: '/root/.cache/flashinfer'"
    assert info.reason == "PermissionError: [Errno 13] Permission denied: '/root/.cache/flashinfer'"
    assert info.errno == 13
    assert info.strerror == "Permission denied"
    assert info.filename == "/root/.cache/flashinfer"
    assert info.module_name is None
    assert info.module_path is None
    assert info.frames == ()
    assert info.cause is None
    assert info.context is None
    assert info.notes == ()
    assert info.exceptions == ()
    assert info.truncated is False


def test_raised_permission_error_has_frames() -> None:
    def open_cache() -> None:
        raise PermissionError(13, "Permission denied", "/root/.cache/flashinfer")

    try:
        open_cache()
    except PermissionError as exc:
        info = capture(exc)
    assert info.reason == "PermissionError: [Errno 13] Permission denied: '/root/.cache/flashinfer'"
    assert info.errno == 13
    assert [frame.name for frame in info.frames] == [
        "test_raised_permission_error_has_frames",
        "open_cache",
    ]
    inner = info.frames[-1]
    assert inner.filename == __file__
    assert isinstance(inner.lineno, int)
    assert inner.line == 'raise PermissionError(13, "Permission denied", "/root/.cache/flashinfer")'


def test_os_error_without_errno() -> None:
    info = capture(OSError("disk on fire"))
    assert info.type == "OSError"
    assert info.message == "disk on fire"
    assert info.reason == "OSError: disk on fire"
    assert info.errno is None
    assert info.strerror is None
    assert info.filename is None


def test_import_error_name_and_path() -> None:
    exc = ImportError("cannot load zentorch", name="zentorch._C", path="/opt/zentorch/_C.so")
    info = capture(exc)
    assert info == ExceptionInfo(
        type="ImportError",
        message="cannot load zentorch",
        reason="ImportError: cannot load zentorch",
        module_name="zentorch._C",
        module_path="/opt/zentorch/_C.so",
    )
    assert info.errno is None
    assert info.filename is None


def test_module_not_found_error_from_a_real_import() -> None:
    name = "startup_orchestrator_no_such_module"
    try:
        __import__(name)
    except ModuleNotFoundError as exc:
        info = capture(exc)
    assert name not in sys.modules
    assert info.type == "ModuleNotFoundError"
    assert info.message == f"No module named '{name}'"
    assert info.reason == f"ModuleNotFoundError: No module named '{name}'"
    assert info.module_name == name
    assert info.module_path is None
    assert info.errno is None
    assert info.frames[0].name == "test_module_not_found_error_from_a_real_import"
    assert info.cause is None
    assert info.context is None


def test_explicit_cause_is_kept_and_context_not_repeated() -> None:
    try:
        try:
            raise OSError(2, "No such file or directory", "/dev/nvidia0")
        except OSError as low:
            raise RuntimeError("no GPU") from low
    except RuntimeError as exc:
        info = capture(exc)
    assert info.type == "RuntimeError"
    assert info.reason == "RuntimeError: no GPU"
    assert info.context is None
    assert info.cause is not None
    assert info.cause.type == "FileNotFoundError"
    assert info.cause.errno == 2
    assert info.cause.filename == "/dev/nvidia0"
    assert info.cause.cause is None
    assert info.cause.context is None
    assert info.chain() == (info, info.cause)
    assert info.root() is info.cause


def test_cause_differing_from_context_keeps_only_the_cause() -> None:
    # ``raise X from Y`` suppresses the context, as Python's traceback does.
    try:
        try:
            raise KeyError("k")
        except KeyError:
            raise ValueError("v") from TypeError("t")
    except ValueError as exc:
        info = capture(exc)
    assert info.cause is not None
    assert info.cause.reason == "TypeError: t"
    assert info.context is None


def test_implicit_context() -> None:
    try:
        try:
            raise KeyError("missing")
        except KeyError:
            raise RuntimeError("while handling")  # noqa: B904 - the implicit context is the point
    except RuntimeError as exc:
        info = capture(exc)
    assert info.cause is None
    assert info.context is not None
    assert info.context.type == "KeyError"
    assert info.context.message == "'missing'"
    assert info.context.reason == "KeyError: 'missing'"
    assert info.root() is info.context


def test_raise_from_none_suppresses_context() -> None:
    try:
        try:
            raise KeyError("missing")
        except KeyError:
            raise RuntimeError("clean") from None
    except RuntimeError as exc:
        info = capture(exc)
    assert info.cause is None
    assert info.context is None
    assert info.chain() == (info,)


def test_notes() -> None:
    exc = ValueError("bad config")
    exc.add_note("while probing flashinfer")
    exc.add_note("rank 3")
    info = capture(exc)
    assert info.notes == ("while probing flashinfer", "rank 3")
    assert info.message == "bad config"


def test_exception_group_members() -> None:
    group = ExceptionGroup(
        "probes failed",
        [PermissionError(13, "Permission denied", "/x"), ValueError("bad")],
    )
    info = capture(raised(group))
    assert info.type == "ExceptionGroup"
    assert info.message == "probes failed (2 sub-exceptions)"
    assert info.reason == "ExceptionGroup: probes failed (2 sub-exceptions)"
    assert info.truncated is False
    assert [member.reason for member in info.exceptions] == [
        "PermissionError: [Errno 13] Permission denied: '/x'",
        "ValueError: bad",
    ]
    assert info.exceptions[0].errno == 13
    assert info.exceptions[0].filename == "/x"
    assert info.frames  # the group itself was raised


def test_base_exception_group_and_nesting() -> None:
    inner = ExceptionGroup("inner", [TypeError("t")])
    group = BaseExceptionGroup("outer", [KeyboardInterrupt(), inner])
    info = capture(group)
    assert info.type == "BaseExceptionGroup"
    assert info.message == "outer (2 sub-exceptions)"
    assert [member.type for member in info.exceptions] == ["KeyboardInterrupt", "ExceptionGroup"]
    assert info.exceptions[0].message == ""
    assert info.exceptions[0].reason == "KeyboardInterrupt: "
    assert info.exceptions[1].exceptions == (
        ExceptionInfo(type="TypeError", message="t", reason="TypeError: t"),
    )


def test_group_members_share_the_size_bound() -> None:
    group = ExceptionGroup("many", [ValueError(str(i)) for i in range(100)])
    info = capture(group, max_chain=10)
    # The group itself takes one of the ten places.
    assert len(info.exceptions) == 9
    assert [member.message for member in info.exceptions] == [str(i) for i in range(9)]
    assert info.truncated is True


def test_a_member_listed_again_is_left_out_and_the_ones_after_it_kept() -> None:
    repeated = ValueError("same")
    info = capture(ExceptionGroup("g", [repeated, repeated, TypeError("after")]))
    assert [member.reason for member in info.exceptions] == [
        "ValueError: same",
        "TypeError: after",
    ]
    assert info.truncated is True


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")


def test_exception_whose_str_raises() -> None:
    info = capture(raised(UnprintableError()))
    qualified = f"{UnprintableError.__module__}.{UnprintableError.__qualname__}"
    assert info.type == qualified
    assert info.name == "UnprintableError"
    assert info.message == f"<unprintable {qualified}>"
    assert info.reason == f"UnprintableError: <unprintable {qualified}>"
    assert info.frames
    events.encode(as_event(info))


def test_notes_are_bounded_to_the_first_64() -> None:
    exc = ValueError("v")
    for index in range(100):
        exc.add_note(f"note {index}")
    assert capture(exc).notes == tuple(f"note {index}" for index in range(64))


def test_hostile_notes_and_attributes() -> None:
    class Hostile(OSError):
        @property
        def filename(self) -> str:  # type: ignore[override]
            raise RuntimeError("no filename for you")

    exc = Hostile(5, "I/O error")
    exc.__notes__ = [UnprintableError(), "fine"]  # type: ignore[list-item]
    info = capture(exc)
    assert info.errno == 5
    assert info.strerror == "I/O error"
    assert info.filename is None
    assert info.notes[1] == "fine"
    assert info.notes[0].startswith("<unprintable ")


@pytest.mark.parametrize("errno", [True, 2**64, -(2**63) - 1, "2", 1.5])
def test_an_errno_a_log_cannot_hold_is_not_kept(errno: object) -> None:
    # Kept, it would make the event unwritable (past 64 bits) or its log
    # unreadable (a bool is not an integer to the decoder).
    exc = OSError(5, "I/O error")
    exc.errno = errno  # type: ignore[assignment]
    info = capture(exc)
    assert info.errno is None
    assert info.strerror == "I/O error"
    event = as_event(info)
    assert events.decode(events.encode(event)) == event


def test_a_deep_traceback_keeps_its_innermost_frames() -> None:
    def descend(depth: int) -> None:
        if depth == 0:
            raise ValueError("bottom")
        descend(depth - 1)

    try:
        descend(100)
    except ValueError as exc:
        info = capture(exc)
    assert len(info.frames) == 64
    assert [frame.name for frame in info.frames] == ["descend"] * 64
    assert info.frames[-1].line == 'raise ValueError("bottom")'
    assert info.frames[0].line == "descend(depth - 1)"


def test_cycle_in_the_cause_chain() -> None:
    first = ValueError("first")
    second = ValueError("second")
    first.__cause__ = second
    second.__cause__ = first
    info = capture(first)
    assert info.message == "first"
    assert info.truncated is False
    assert info.cause is not None
    assert info.cause.message == "second"
    assert info.cause.cause is None
    assert info.cause.truncated is True
    assert len(info.chain()) == 2


def test_cycle_through_context() -> None:
    first = ValueError("first")
    first.__context__ = first
    info = capture(first)
    assert info.context is None
    assert info.truncated is True


def test_ten_thousand_deep_chain_is_bounded() -> None:
    limit = sys.getrecursionlimit()
    head: BaseException = ValueError("link 0")
    for index in range(1, 10_000):
        link = ValueError(f"link {index}")
        link.__cause__ = head
        head = link
    info = capture(head)
    chain = info.chain()
    assert len(chain) == 64
    assert [node.message for node in chain[:2]] == ["link 9999", "link 9998"]
    assert chain[-1].message == "link 9936"
    assert chain[-1].truncated is True
    assert not any(node.truncated for node in chain[:-1])
    assert sys.getrecursionlimit() == limit
    # The bounded record encodes and decodes (JSON nesting stays shallow).
    assert events.decode(events.encode(as_event(info))) == as_event(info)


def test_chain_bound_is_configurable() -> None:
    head: BaseException = ValueError("0")
    for index in range(1, 10):
        link = ValueError(str(index))
        link.__context__ = head
        head = link
    info = capture(head, max_chain=3)
    assert [node.message for node in info.chain()] == ["9", "8", "7"]
    assert info.chain()[-1].truncated is True


def test_lone_surrogates_and_non_utf8_bytes() -> None:
    undecodable = b"/models/\xff\xfe.bin"
    name = os.fsdecode(undecodable)  # surrogateescape: '\udcff\udcfe'
    exc = OSError(2, "No such file or directory", name)
    exc.add_note("note " + name)
    info = capture(ValueError("bad byte " + name))
    assert info.message == "bad byte /models/??.bin"
    assert info.reason == "ValueError: bad byte /models/??.bin"
    os_info = capture(exc)
    assert os_info.filename == "/models/??.bin"
    assert os_info.notes == ("note /models/??.bin",)
    bytes_info = capture(ValueError(undecodable))
    assert bytes_info.message == "b'/models/\\xff\\xfe.bin'"
    for record in (info, os_info, bytes_info):
        event = as_event(record)
        assert events.decode(events.encode(event)) == event


def test_long_messages_are_cut() -> None:
    info = capture(ValueError("x" * 100_000))
    assert info.message.startswith("x" * 8192)
    assert info.message.endswith(f"... [{100_000 - 8192} more characters]")


def test_environment_secrets_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")
    monkeypatch.setenv("MY_SECRET_KEY", "s3cr3t-value-42")
    monkeypatch.setenv("SHORT_TOKEN", "ab")  # too short to redact safely
    try:
        raise RuntimeError("token hf_abcdefghijklmnop and s3cr3t-value-42 rejected (ab)")
    except RuntimeError as exc:
        exc.add_note("retry with s3cr3t-value-42")
        info = ExceptionInfo.capture(exc)
    assert info.message == "token [REDACTED] and [REDACTED] rejected (ab)"
    assert info.reason == "RuntimeError: token [REDACTED] and [REDACTED] rejected (ab)"
    assert info.notes == ("retry with [REDACTED]",)
    line = info.frames[-1].line
    assert line == 'raise RuntimeError("token [REDACTED] and [REDACTED] rejected (ab)")'
    text = orjson.dumps(events.encode_record(as_event(info))).decode()
    assert "hf_abcdefghijklmnop" not in text
    assert "s3cr3t-value-42" not in text
    assert "hf_abcdefghijklmnop" not in info.format()


@pytest.mark.parametrize(("value", "hidden"), [("abc", False), ("abcd", True)])
def test_a_secret_of_four_characters_or_more_is_redacted(value: str, hidden: bool) -> None:
    redactor = Redactor.from_environment({"HF_TOKEN": value})
    assert redactor.secrets == ((value,) if hidden else ())
    expected = "token [REDACTED] rejected" if hidden else f"token {value} rejected"
    assert redactor(f"token {value} rejected") == expected


def test_redactor_from_an_explicit_environment() -> None:
    redactor = Redactor.from_environment(
        {
            "API_KEY": "abcd1234",
            "DB_PASSWORD": "abcd1234-long",
            "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI",
            "GITHUB_TOKEN": "ghp_0123456789",
            "PATH": "/usr/bin:/bin",
            "ONE_TOKEN": "on",
        }
    )
    # Only secret-looking names, only values long enough to hide safely.
    assert set(redactor.secrets) == {"abcd1234-long", "ghp_0123456789", "wJalrXUtnFEMI", "abcd1234"}
    # Longest first, so a secret containing another is hidden whole.
    assert [len(secret) for secret in redactor.secrets] == [14, 13, 13, 8]
    assert redactor("pw=abcd1234-long key=abcd1234 path=/usr/bin:/bin") == (
        "pw=[REDACTED] key=[REDACTED] path=/usr/bin:/bin"
    )
    exc = OSError(13, "Permission denied", "/secrets/wJalrXUtnFEMI")
    info = ExceptionInfo.capture(
        ImportError("bad ghp_0123456789", name="m", path="/p/abcd1234/m.so"), redactor=redactor
    )
    assert info.message == "bad [REDACTED]"
    assert info.module_path == "/p/[REDACTED]/m.so"
    os_info = ExceptionInfo.capture(exc, redactor=redactor)
    assert os_info.filename == "/secrets/[REDACTED]"
    assert os_info.message == "[Errno 13] Permission denied: '/secrets/[REDACTED]'"


def test_url_credentials_are_redacted() -> None:
    exc = ConnectionError(
        "GET https://user:pa55@hub.example.com/x failed; proxy http://bob@proxy:3128 too"
    )
    info = capture(exc)
    assert info.message == (
        "GET https://[REDACTED]@hub.example.com/x failed; proxy http://[REDACTED]@proxy:3128 too"
    )
    assert PLAIN("mail me at a@b.c, see https://host/path@v2") == (
        "mail me at a@b.c, see https://host/path@v2"
    )


def test_frame_lines_are_redacted() -> None:
    redactor = Redactor.from_environment({"HF_TOKEN": "hf_inlinesecret"})
    try:
        raise ValueError("login failed")  # token hf_inlinesecret
    except ValueError as exc:
        info = ExceptionInfo.capture(exc, redactor=redactor)
    assert info.message == "login failed"
    (frame,) = info.frames
    assert frame == FrameInfo(
        filename=__file__,
        lineno=frame.lineno,
        name="test_frame_lines_are_redacted",
        line='raise ValueError("login failed")  # token [REDACTED]',
    )


def test_format_reads_like_a_traceback() -> None:
    try:
        try:
            try:
                raise KeyError("k")
            except KeyError:
                raise OSError(2, "No such file or directory", "/x")  # noqa: B904
        except OSError as low:
            raise RuntimeError("boom") from low
    except RuntimeError as exc:
        exc.add_note("while probing")
        info = capture(exc)
    text = info.format()
    assert text.endswith("RuntimeError: boom\nwhile probing\n")
    assert text.startswith("Traceback (most recent call last):\n")
    key_at = text.index("KeyError: 'k'\n")
    context_at = text.index("During handling of the above exception, another exception occurred:")
    os_at = text.index("FileNotFoundError: [Errno 2] No such file or directory: '/x'\n")
    cause_at = text.index("The above exception was the direct cause of the following exception:")
    boom_at = text.index("RuntimeError: boom")
    assert key_at < context_at < os_at < cause_at < boom_at
    assert f'File "{__file__}", line ' in text
    assert 'raise RuntimeError("boom") from low' in text


def test_format_of_groups_and_truncation() -> None:
    group = ExceptionGroup("two", [ValueError("a"), TypeError("b")])
    text = capture(group).format()
    assert text == (
        "ExceptionGroup: two (2 sub-exceptions)\n"
        "  +---------------- 1 ----------------\n"
        "  | ValueError: a\n"
        "  +---------------- 2 ----------------\n"
        "  | TypeError: b\n"
    )
    looped = ValueError("loop")
    looped.__cause__ = looped
    assert capture(looped).format() == "ValueError: loop\n  ... (exception chain truncated)\n"
    assert capture(KeyboardInterrupt()).format() == "KeyboardInterrupt\n"


def test_a_record_with_both_a_cause_and_a_context_follows_its_cause() -> None:
    # A log written elsewhere may hold both; the cause is the chain, as in
    # a traceback.
    cause = ExceptionInfo(type="OSError", message="disk", reason="OSError: disk")
    context = ExceptionInfo(type="KeyError", message="'k'", reason="KeyError: 'k'")
    boom = {"type": "RuntimeError", "message": "boom", "reason": "RuntimeError: boom"}
    top = ExceptionInfo(**boom, cause=cause, context=context)
    assert top.chain() == (top, cause)
    assert top.root() == cause
    assert top.format() == (
        "OSError: disk\n"
        "\nThe above exception was the direct cause of the following exception:\n\n"
        "RuntimeError: boom\n"
    )


@pytest.mark.parametrize(
    ("lineno", "where"), [(331, "wait (threading.py:331)"), (None, "wait (threading.py)")]
)
def test_a_frame_is_named_by_its_function_and_place(lineno: int | None, where: str) -> None:
    frame = FrameInfo(filename="/usr/lib/python3.11/threading.py", lineno=lineno, name="wait")
    assert frame.where() == where


def stack_of(count: int) -> ThreadStack:
    """A thread ``count`` frames deep, ``f1`` outermost."""
    frames = tuple(
        FrameInfo(filename=f"/src/f{index}.py", lineno=index, name=f"f{index}")
        for index in range(1, count + 1)
    )
    return ThreadStack(thread="step s", frames=frames)


def test_a_thread_stack_is_shown_innermost_first_and_outer_frames_counted() -> None:
    assert stack_of(10).format() == [
        *(f"f{index} (/src/f{index}.py:{index})" for index in range(10, 2, -1)),
        "... 2 outer frames",
    ]
    assert stack_of(2).format() == ["f2 (/src/f2.py:2)", "f1 (/src/f1.py:1)"]
    assert stack_of(3).format(limit=1) == ["f3 (/src/f3.py:3)", "... 2 outer frames"]
    assert stack_of(3).format(limit=0) == ["... 3 outer frames"]


def test_a_thread_waits_in_its_innermost_frame_outside_the_standard_library() -> None:
    main = FrameInfo(filename="/app/serve.py", lineno=10, name="main")
    barrier = FrameInfo(
        filename="/usr/lib/python3.11/site-packages/torch/distributed/c10d.py",
        lineno=20,
        name="barrier",
    )
    wait = FrameInfo(filename="/usr/lib/python3.11/threading.py", lineno=331, name="wait")
    frozen = FrameInfo(filename="<frozen os>", lineno=5, name="read")
    assert ThreadStack(thread="t", frames=(main, barrier, wait)).waiting_in == barrier
    assert ThreadStack(thread="t", frames=(main, wait, frozen)).waiting_in == main
    assert ThreadStack(thread="t", frames=(wait, frozen)).waiting_in == frozen
    assert ThreadStack(thread="t").waiting_in is None

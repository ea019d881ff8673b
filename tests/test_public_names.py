"""Every exception type a package exports is named by its public path
(``orchestrator.engine.UnspecifiedPlatformError``) in tracebacks, logs, the
JSON report and spans, and sits under its package's root error."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import events
import exporters
import orchestrator
from events._errors import public_type_name
from exporters import report_json, spans_from_events

ROOT = Path(__file__).resolve().parent.parent

#: Each package with a public surface, and the root of the errors it exports.
ROOTS: dict[str, type[Exception]] = {
    "events": events.EventsError,
    "orchestrator": orchestrator.OrchestratorError,
    "orchestrator.engine": orchestrator.OrchestratorError,
    "orchestrator.cli": orchestrator.OrchestratorError,
    "orchestrator.ray": orchestrator.OrchestratorError,
    "exporters": exporters.ExportersError,
}


#: Exceptions whose defining module another change is rewriting; each must
#: get its public ``__module__`` there (remove the entry when it has).
def exported_exceptions() -> list[tuple[str, str, type[BaseException]]]:
    """``(package, defining module, class)`` for every exception class a
    package of :data:`ROOTS` exports, found where its ``class`` statement is
    (``__module__`` no longer says)."""
    found = []
    for package_name in ROOTS:
        package = importlib.import_module(package_name)
        for name in package.__all__:
            value = getattr(package, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                found.append((package_name, defining_module(package_name, name), value))
    return found


def defining_module(package_name: str, class_name: str) -> str:
    """The module of ``package_name`` (or below it) whose source defines
    ``class_name`` at top level."""
    directory = ROOT.joinpath(*package_name.split("."))
    for path in sorted(directory.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.ClassDef) and n.name == class_name for n in tree.body):
            parts = path.relative_to(ROOT).with_suffix("").parts
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    raise AssertionError(f"no module under {directory} defines {class_name}")


EXPORTED = exported_exceptions()


def test_every_package_exports_errors() -> None:
    assert {package for package, _module, _cls in EXPORTED} == set(ROOTS)


@pytest.mark.parametrize(
    ("package", "module", "cls"), EXPORTED, ids=[f"{p}.{c.__name__}" for p, _m, c in EXPORTED]
)
def test_an_exported_error_has_its_public_name(
    package: str, module: str, cls: type[BaseException]
) -> None:
    public = f"{package}.{cls.__qualname__}"
    assert cls.__module__ == package
    assert events.ExceptionInfo.capture(_instance(cls)).type == public
    # A version 1 log recorded the defining module's path; reading it back
    # gives the same public name a new log records.
    assert public_type_name(f"{module}.{cls.__qualname__}") == public


@pytest.mark.parametrize(
    ("package", "module", "cls"), EXPORTED, ids=[f"{p}.{c.__name__}" for p, _m, c in EXPORTED]
)
def test_an_exported_error_is_under_its_package_root(
    package: str, module: str, cls: type[BaseException]
) -> None:
    assert issubclass(cls, ROOTS[package])


def test_builtin_bases_are_kept() -> None:
    # Callers that catch the builtin keep catching these.
    assert issubclass(orchestrator.FaultSpecError, ValueError)
    assert issubclass(orchestrator.StepTimeoutError, TimeoutError)
    assert issubclass(events.PolicyError, ValueError)
    from orchestrator.engine import EngineConfigError, UnspecifiedPlatformError

    assert issubclass(EngineConfigError, ValueError)
    assert issubclass(UnspecifiedPlatformError, RuntimeError)


def test_a_version_1_log_reports_and_traces_public_names() -> None:
    contents = events.read_log(
        ROOT / "tests" / "events" / "fixtures" / "private-type-names" / "rank-0.jsonl"
    )
    document = report_json(events.replay([contents]))
    assert document["root_cause"]["exception"]["type"] == (
        "orchestrator.engine.UnspecifiedPlatformError"
    )
    types = [
        span_event.attributes["exception.type"]
        for span in spans_from_events(contents.events)
        for span_event in span.events
        if span_event.attributes is not None and "exception.type" in span_event.attributes
    ]
    assert "orchestrator.engine.UnspecifiedPlatformError" in types
    assert not [name for name in types if "._" in str(name)]


def _instance(cls: type[BaseException]) -> BaseException:
    """An instance of ``cls`` without knowing its constructor's arguments
    (capture reads only the type and the message)."""
    exc = cls.__new__(cls)
    exc.args = ("m",)
    return exc


def test_one_invalid_value_error() -> None:
    # One "unknown X 'y'; valid: ..." error: each package's kind of it keeps
    # its own root and is caught as the one base (and as a ValueError).
    from exporters import TracingSettingError
    from orchestrator.engine import EngineConfig, EngineConfigError

    assert issubclass(events.InvalidValueError, events.EventsError)
    assert issubclass(events.InvalidValueError, ValueError)
    assert issubclass(TracingSettingError, exporters.ExportersError)
    assert issubclass(EngineConfigError, orchestrator.OrchestratorError)
    for cls in (TracingSettingError, EngineConfigError):
        assert issubclass(cls, events.InvalidValueError)

    error = events.InvalidValueError("scope", "node", ("process", "local"), "rule 'x'")
    assert str(error) == "unknown scope 'node' in rule 'x'; valid: process, local"
    with pytest.raises(events.InvalidValueError) as raised:
        EngineConfig(dtype="fp3")
    assert str(raised.value).startswith("unknown dtype 'fp3'; valid: auto, ")
    assert (raised.value.what, raised.value.field, raised.value.value) == ("dtype", "dtype", "fp3")
    with pytest.raises(events.InvalidValueError, match="unknown severity 'loud'"):
        events.Severity.parse("loud")
    with pytest.raises(events.InvalidValueError, match="unknown scope 'node'"):
        events.Scope.parse("node")


@pytest.mark.parametrize(
    "error",
    [
        events.InvalidValueError("severity", "loud", ("debug", "info"), "a rule"),
        exporters.TracingSettingError("OTLP protocol", "zipkin", ("grpc",), "OTEL_X"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_an_invalid_value_error_survives_pickling(error: events.InvalidValueError) -> None:
    import pickle

    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert (copy.what, copy.value, copy.valid, copy.where) == (
        error.what,
        error.value,
        error.valid,
        error.where,
    )


def test_an_engine_config_error_survives_pickling() -> None:
    import pickle

    from orchestrator.engine import EngineConfigError

    for error in (
        EngineConfigError("tp", 0, "must be a positive integer"),
        EngineConfigError("dtype", "fp3", valid=("auto", "bfloat16")),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert (str(copy), copy.field, copy.reason, copy.valid) == (
            str(error),
            error.field,
            error.reason,
            error.valid,
        )

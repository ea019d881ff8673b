"""The embedding API: one rank's startup, set up from the environment, with
every exit path flushed and the original error raised."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest

from events import (
    Column,
    Event,
    JsonValue,
    MessageRule,
    Outcome,
    RunFinished,
    RunOutcome,
    RunStarted,
    Severity,
    Slice,
    StepStarted,
    read_log,
    replay,
    validate,
)
from orchestrator import (
    Graph,
    RankEnvironmentError,
    RunDirectoryError,
    Startup,
    StartupInterrupted,
    Step,
    StepContext,
)
from orchestrator.engine import EngineConfig


def _startup(tmp_path: Path, **options: object) -> Startup:
    settings: dict[str, object] = {
        "run_dir": tmp_path / "run",
        "profile": "xeon",
        "tracing": None,
        "configure_logging": False,
        "handle_signals": False,
        "environ": {},
    }
    settings.update(options)
    return Startup(EngineConfig(), **settings)  # type: ignore[arg-type]


def _finished(path: Path) -> RunFinished:
    assert [problem for problem in validate(path) if problem.fatal] == []
    events = read_log(path).events
    assert isinstance(events[0], RunStarted)
    assert isinstance(events[-1], RunFinished)
    return events[-1]


def test_a_ready_start_returns_what_it_decided(tmp_path: Path) -> None:
    startup = _startup(tmp_path)
    with startup:
        result = startup.run()

    assert result.ready
    assert (result.platform, result.platform_class) == ("cpu", "CpuPlatform")
    assert result.attention_backend == "CPU_ATTN"
    assert result.log_path == tmp_path / "run" / "rank-0.jsonl"
    assert result.run_dir == tmp_path / "run"
    assert "attention.selected" in [message.code for message in result.messages]
    assert _finished(result.log_path).outcome is RunOutcome.READY
    started = read_log(result.log_path).events[0]
    assert isinstance(started, RunStarted)
    assert started.simulated == "xeon"


def test_run_opens_and_closes_by_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    startup = Startup(profile="xeon", tracing=None, configure_logging=False, environ={})
    result = startup.run()

    # The default run directory, named by a fresh run id.
    assert result.run_dir == Path("startup-runs") / result.run_id
    assert (tmp_path / result.log_path).exists()
    with pytest.raises(RuntimeError, match="runs once"):
        startup.run()


@pytest.mark.parametrize(
    ("fault", "raised", "outcome"),
    [
        ("attention/CPU_ATTN=RuntimeError:no kernel", RuntimeError, RunOutcome.FAILED),
        ("attention/CPU_ATTN=SystemExit", SystemExit, RunOutcome.FAILED),
        ("attention/CPU_ATTN=KeyboardInterrupt", KeyboardInterrupt, RunOutcome.INTERRUPTED),
    ],
)
def test_a_failure_raises_the_original_error_after_everything_is_flushed(
    tmp_path: Path, fault: str, raised: type[BaseException], outcome: RunOutcome
) -> None:
    startup = _startup(tmp_path, faults=[fault])
    with startup, pytest.raises(raised):
        startup.run()

    assert startup.result is not None
    assert startup.result.outcome is outcome
    finished = _finished(tmp_path / "run" / "rank-0.jsonl")
    assert finished.outcome is outcome
    assert finished.failed_step == "attention/CPU_ATTN"


def test_a_directory_of_another_run_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    with _startup(tmp_path, run_id="first") as first:
        first.run()
    before = sorted(p.name for p in (tmp_path / "run").iterdir())

    with pytest.raises(RunDirectoryError) as refused:
        _startup(tmp_path, run_id="second").open()

    assert refused.value.held_by == "first"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before


def test_an_inconsistent_environment_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RankEnvironmentError, match="SLURM_PROCID"):
        _startup(tmp_path, environ={"SLURM_PROCID": "4", "SLURM_NTASKS": "4"}).open()
    assert not (tmp_path / "run").exists()


def test_ranks_without_a_shared_run_id_or_group_are_refused(tmp_path: Path) -> None:
    environ = {"RANK": "1", "WORLD_SIZE": "2"}
    with pytest.raises(RankEnvironmentError, match="share no run id"):
        _startup(tmp_path, environ=environ, run_dir=None).open()


def test_logging_is_configured_only_when_nobody_did(tmp_path: Path) -> None:
    logger = logging.getLogger("orchestrator")
    before = list(logger.handlers)
    root = logging.getLogger()
    caller = logging.NullHandler()
    root.addHandler(caller)
    try:
        with _startup(tmp_path, configure_logging=None) as startup:
            startup.run()
        assert logger.handlers == before
    finally:
        root.removeHandler(caller)


@pytest.mark.anyio
async def test_a_launcher_that_owns_its_signals_stops_the_run(tmp_path: Path) -> None:
    startup = _startup(tmp_path, faults=["attention/CPU_ATTN=hang"])
    probing = anyio.Event()

    def watch(event: Event) -> None:
        # Steps start on the event loop's thread.
        if isinstance(event, StepStarted) and event.step == "attention/CPU_ATTN":
            probing.set()

    with startup:
        assert startup.log is not None
        log_subscription = startup.log.subscribe(watch)
        async with anyio.create_task_group() as group:

            async def stop_when_probing() -> None:
                await probing.wait()
                startup.stop()

            group.start_soon(stop_when_probing)
            with pytest.raises(StartupInterrupted) as raised:
                await startup.arun()
        log_subscription.close()

    assert raised.value.signal is None
    finished = _finished(tmp_path / "run" / "rank-0.jsonl")
    assert finished.outcome is RunOutcome.INTERRUPTED
    assert finished.cause is not None
    assert finished.cause.message == "stopped: asked by its launcher"


# --- a graph of your own ---------------------------------------------------------------


def _own_graph() -> Graph:
    def attention(context: StepContext) -> JsonValue:
        return {"backend": "mine"}

    def cache(context: StepContext) -> JsonValue:
        raise PermissionError(13, "Permission denied", "/cache")

    return Graph(
        "mine",
        [
            Step(name="attention", body=attention),
            Step(name="cache", body=cache, depends_on=("attention",)),
        ],
    )


OWN_SLICE = Slice(
    name="mine",
    steps=("attention", "cache"),
    rules=[
        MessageRule(
            code="mine.attention",
            step="attention",
            outcomes="ok",
            text="Attention by {result[backend]}.",
        ),
        MessageRule(
            code="mine.cache_denied",
            step="cache",
            outcomes="unavailable",
            severity=Severity.WARNING,
            text="No cache: {error}",
        ),
    ],
    columns=[Column(title="ATTENTION", fact="attention", step="attention", key="backend")],
)


def _own_startup(tmp_path: Path, **options: object) -> Startup:
    return Startup(
        graph=_own_graph(),
        run_dir=tmp_path / "run",
        tracing=None,
        configure_logging=False,
        handle_signals=False,
        environ={},
        **options,  # type: ignore[arg-type]
    )


def test_a_graph_of_your_own_speaks_with_its_own_slice_only(tmp_path: Path) -> None:
    result = _own_startup(tmp_path, slices=[OWN_SLICE]).run()

    texts = [message.text for message in result.messages]
    # A step named attention is the caller's, not the reference engine's.
    assert "Attention by mine." in texts
    assert not any("attention backend" in text for text in texts), texts
    assert any(text.startswith("No cache: PermissionError") for text in texts), texts
    assert result.facts["attention"] == "mine"
    assert result.steps["attention"].outcome is Outcome.OK
    assert result.steps["attention"].value == {"backend": "mine"}
    assert result.steps["cache"].outcome is Outcome.UNAVAILABLE
    assert result.steps["cache"].exception is not None
    assert result.steps["cache"].exception.name == "PermissionError"
    assert (result.platform, result.attention_backend, result.fusion_enabled) == (None, None, False)


def test_without_slices_a_graph_of_your_own_gets_the_kernels_messages(tmp_path: Path) -> None:
    result = _own_startup(tmp_path).run()
    codes = {message.code for message in result.messages}
    assert codes <= {"run.ready", "step.unavailable"}, codes
    assert result.facts == {}


def test_slices_without_a_graph_of_your_own_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="slices describe a graph of your own"):
        _startup(tmp_path, slices=[OWN_SLICE])


# --- the lifecycle ---------------------------------------------------------------------


def test_a_set_up_that_fails_after_the_log_opened_raises_its_own_error(tmp_path: Path) -> None:
    from exporters import Tracing

    startup = _startup(tmp_path, tracing=Tracing(otlp_endpoint="http://[::1"))
    with pytest.raises(ValueError, match="Invalid IPv6 URL"):
        startup.open()
    assert startup.log_path is not None
    finished = _finished(startup.log_path)
    assert finished.outcome is RunOutcome.FAILED
    assert finished.cause is not None
    assert finished.cause.name == "ValueError"
    startup.close()  # closing again is harmless


def test_opened_and_closed_without_running_the_log_says_so(tmp_path: Path) -> None:
    startup = _startup(tmp_path)
    startup.open()
    startup.close()
    assert startup.log_path is not None
    finished = _finished(startup.log_path)
    assert finished.outcome is RunOutcome.INTERRUPTED
    assert finished.cause is not None
    assert finished.cause.message == "stopped: closed before it ran"
    assert replay(read_log(startup.log_path).events).outcome is RunOutcome.INTERRUPTED


def test_a_stop_before_the_run_ends_it_interrupted(tmp_path: Path) -> None:
    startup = _startup(tmp_path).open()
    startup.stop()
    with pytest.raises(StartupInterrupted, match="asked by its launcher"):
        startup.run()
    assert startup.log_path is not None
    finished = _finished(startup.log_path)
    assert finished.outcome is RunOutcome.INTERRUPTED
    assert startup.result is not None
    assert startup.result.outcome is RunOutcome.INTERRUPTED


def test_a_startup_opens_once_and_runs_once(tmp_path: Path) -> None:
    startup = _startup(tmp_path)
    assert startup.run().ready
    with pytest.raises(RuntimeError, match="runs once"):
        startup.run()
    with pytest.raises(RuntimeError, match="opens once"):
        startup.open()
    startup.close()  # closed already: harmless
    with pytest.raises(RuntimeError, match="runs once"):
        startup.run()


def test_entering_an_open_startup_keeps_it_open_until_the_block_ends(tmp_path: Path) -> None:
    startup = _startup(tmp_path).open()
    with startup as entered:
        assert entered is startup
        assert entered.run().ready
    assert startup.log_path is not None
    assert _finished(startup.log_path).outcome is RunOutcome.READY
    with pytest.raises(RuntimeError, match="opens once"):
        startup.open()

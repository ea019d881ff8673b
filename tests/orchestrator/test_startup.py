"""The embedding API: one rank's startup, set up from the environment, with
every exit path flushed and the original error raised."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest

from events import Event, RunFinished, RunOutcome, RunStarted, StepStarted, read_log, validate
from orchestrator import (
    RankEnvironmentError,
    RunDirectoryError,
    Startup,
    StartupInterrupted,
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

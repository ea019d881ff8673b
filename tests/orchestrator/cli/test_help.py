"""``--help`` and ``--version``, called in this process."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import pytest

from events import Severity
from orchestrator.cli._parser import build_parser
from orchestrator.engine import BUILTIN_PROFILES, injection_targets

from .harness import call_cli

_SUBCOMMANDS = ("run", "replay", "explain", "blame", "critical-path", "diff", "watch", "validate")


def test_version(tmp_path: Path) -> None:
    shown = call_cli("--version", cwd=tmp_path)

    assert shown.returncode == 0, shown.describe()
    assert shown.stdout == f"startup-orchestrator {version('startup-orchestrator')}\n"


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ([], ["run", "replay", "explain", "blame", "critical-path", "diff", "validate"]),
        (["run"], ["--nproc", "--grace", "STARTUP_ORCHESTRATOR_GRACE_S", "--simulate"]),
        (["replay"], ["--until", "--level", "--export KIND[=FILE]", "jaeger-json=FILE", "--html"]),
    ],
)
def test_help(tmp_path: Path, arguments: list[str], expected: list[str]) -> None:
    shown = call_cli(*arguments, "--help", cwd=tmp_path)

    assert shown.returncode == 0, shown.describe()
    assert shown.stdout.startswith("usage: startup-orchestrator")
    for word in expected:
        assert word in shown.stdout, word


def _help(tmp_path: Path, *arguments: str) -> str:
    shown = call_cli(*arguments, "--help", cwd=tmp_path)
    assert shown.returncode == 0, shown.describe()
    # One paragraph per line, so a phrase that argparse wrapped still matches.
    return " ".join(shown.stdout.split())


@pytest.mark.parametrize("command", _SUBCOMMANDS)
def test_every_subcommand_has_exit_status_and_an_example(tmp_path: Path, command: str) -> None:
    shown = _help(tmp_path, command)

    assert re.search(r"exit status[:,].* 0 .*; 1 .*; 2 bad usage", shown), shown
    assert f"examples: startup-orchestrator {command} " in shown


@pytest.mark.parametrize("command", ["replay", "explain", "blame", "critical-path", "validate"])
def test_path_is_described(tmp_path: Path, command: str) -> None:
    shown = _help(tmp_path, command)

    assert (
        "PATH a run directory (every rank-N.jsonl in it, and its manifest.json), or rank "
        "log files of one run (rank-N.jsonl)" in shown
    )


def test_validate_has_a_description(tmp_path: Path) -> None:
    shown = _help(tmp_path, "validate")

    assert "Check the logs of runs for every integrity problem." in shown
    assert "exit status: 0 nothing is wrong; 1 anything is; 2 bad usage" in shown


def test_run_help_shows_defaults_and_the_engine_options(tmp_path: Path) -> None:
    shown = _help(tmp_path, "run")

    for phrase in (
        "--timeout S seconds each probe may take",
        "(default: none)",
        "--level LEVEL lowest severity printed: debug, info, warning, error (default: info)",
        "--head-size N the model's attention head size; backends that do not support it are "
        "skipped (default: 128)",
        "--kv-cache-dtype DTYPE KV-cache dtype: auto, float16, bfloat16, fp8, fp8_e4m3, fp8_e5m2;",
        "--durability {always,interval,never} when the log is fsynced (default: interval)",
        "--allreduce-backend {auto,mnnvl,trtllm} all-reduce fusion workspace backend "
        "(default: auto)",
        "exit status: 0 ready; 1 failed",
        "2 bad usage, with nothing written",
    ):
        assert phrase in shown, phrase


def test_run_help_lists_the_builtin_profiles_and_the_profile_format(tmp_path: Path) -> None:
    shown = _help(tmp_path, "run")

    assert f"a built-in profile ({', '.join(sorted(BUILTIN_PROFILES))})" in shown
    assert "docs/profiles.md" in shown
    assert "examples/profile-custom.json" in shown


def test_run_help_lists_every_inject_target_and_action(tmp_path: Path) -> None:
    shown = _help(tmp_path, "run")
    targets = injection_targets()

    assert "[RANKS:]TARGET=ACTION[:MESSAGE]" in shown
    assert "hang (the probe never returns" in shown
    assert "crash (the rank dies by SIGSEGV)" in shown
    # The same table a spec is checked against, in full.
    assert f"modules the probes import: {', '.join(targets.modules)} and step paths: " in shown
    assert f"and step paths: {', '.join(targets.steps)}" in shown


def test_plain_help_does_not_import_the_engine(tmp_path: Path) -> None:
    # --help is what a new user runs first; the fault targets are listed
    # only in run --help, where the engine is imported to list them.
    script = textwrap.dedent(
        """
        import contextlib, io, sys
        from orchestrator.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            for arguments in (["--help"], ["replay", "--help"]):
                assert main(arguments) == 0
        assert "orchestrator.engine" not in sys.modules, "engine imported"
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["run", "--help"]) == 0
        assert "orchestrator.engine" in sys.modules
        """
    )
    checked = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stderr


def test_replaying_an_engine_run_does_not_import_the_runtime(tmp_path: Path) -> None:
    # Replay (its decision check included) runs the engine's pure modules
    # only: a bug report's logs replay without anyio, the runner, the
    # engine's probes or the entry-point machinery they use.
    run_dir = tmp_path / "run"
    started = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--simulate",
            "h200x8",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stderr
    script = textwrap.dedent(
        f"""
        import contextlib, io, sys
        from orchestrator.cli import main
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert main(["replay", {str(run_dir)!r}]) == 0
        assert "ready" in out.getvalue()
        runtime = ("anyio", "importlib.metadata", "orchestrator._runner",
                   "orchestrator.engine._platform", "orchestrator.engine._graph")
        loaded = [name for name in runtime if name in sys.modules]
        assert loaded == [], loaded
        assert "orchestrator.engine._resolution" in sys.modules, "the decision check ran"
        """
    )
    checked = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize(
    ("arguments", "defaults"),
    [
        (
            ["run"],
            {
                "nproc": None,
                "grace": None,  # then $STARTUP_ORCHESTRATOR_GRACE_S, else 10
                "group_timeout": 120.0,
                "stall": 10.0,
                "timeout": None,
                "engine": "reference",
                "allreduce_backend": "auto",
                "dtype": "auto",
                "kv_cache_dtype": "auto",
                "head_size": 128,
                "durability": "interval",
                "level": Severity.INFO,
            },
        ),
        (["replay", "run"], {"level": Severity.INFO, "until": None, "rank": None}),
        (["watch", "run"], {"stall": 10.0, "interval": 0.5, "timeout": None}),
    ],
    ids=["run", "replay", "watch"],
)
def test_the_defaults_are_those_the_help_names(
    arguments: list[str], defaults: dict[str, object]
) -> None:
    parsed = vars(build_parser().parse_args(arguments))

    assert {name: parsed[name] for name in defaults} == defaults

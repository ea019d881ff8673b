"""Bad input: one line on stderr naming the bad value (and, where there is a
short list, what would be valid), exit 2 for usage and 1 for unreadable or
corrupt input — never a traceback (the harness checks stderr for one).

Each command ends before a startup runs, so it is called in this process
(:func:`call_cli`); the one that reaches the embedding API runs as its own
process."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from orchestrator.cli._parser import build_parser

from . import harness
from .conftest import StoredRun
from .harness import LAUNCH_TIMEOUT_S, Completed, call_cli, environment, run_cli

PROG = "startup-orchestrator: error: "


def _one_line_error(completed: Completed, code: int, *fragments: str) -> str:
    assert completed.returncode == code, completed.describe()
    assert completed.stdout == "", completed.describe()
    lines = completed.stderr.splitlines()
    assert len(lines) == 1, completed.describe()
    assert lines[0].startswith(PROG), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.mark.parametrize(
    ("arguments", "fragments"),
    [
        (
            ["run", "--simulate", "h100x8"],
            ["'h100x8'", "unknown profile", "a100x4, b200x8, h200x8, xeon, zen4"],
        ),
        (["run", "--inject", "zentorch"], ["'zentorch'", "[RANKS:]TARGET=EXCEPTION[:MESSAGE]"]),
        (["run", "--inject", "zentorch=NoSuchError"], ["'NoSuchError'", "builtin exception"]),
        (["run", "--inject", "zentorch="], ["<empty exception>", "hang, crash"]),
        (["run", "--inject", "=OSError"], ["<empty target>", "attention/FLASH_ATTN"]),
        (["run", "--inject", "x-y:zentorch=OSError"], ["'x-y'", "3, 0-3 or 1,5"]),
        (["run", "--inject", "3-1:zentorch=OSError"], ["'3-1'", "backwards"]),
        # One rank forms no process group: the fault was accepted, never fired.
        (
            ["run", "--simulate", "h200x8", "--inject", "process_group=hang"],
            ["'process_group'", "forms no process group", "launch two ranks or more"],
        ),
        (["run", "--inject-file", "missing.json"], ["--inject-file missing.json", "cannot read"]),
        (
            ["run", "--attention-backend", "FLASH_ATTENTION"],
            ["'FLASH_ATTENTION'", "unknown backend", "FLASH_ATTN, FLASHINFER, TRITON_ATTN"],
        ),
        (
            ["run", "--allreduce-backend", "nccl"],
            ["'nccl'", "'auto', 'mnnvl', 'trtllm'"],
        ),
        (["run", "--tp", "0"], ["--tp", "'0'", "positive integer"]),
        (["run", "--tp", "two"], ["--tp", "'two'", "positive integer"]),
        (["run", "--nproc", "-2"], ["--nproc", "'-2'", "positive integer"]),
        (["run", "--timeout", "0"], ["--timeout", "'0'", "seconds (> 0, at most 604,800)"]),
        (["run", "--timeout", "soon"], ["--timeout", "'soon'", "seconds (> 0, at most 604,800)"]),
        (["run", "--grace", "0"], ["--grace", "'0'", "seconds (> 0, at most 604,800)"]),
        (["run", "--grace", "inf"], ["--grace", "'inf'", "seconds (> 0, at most 604,800)"]),
        (["run", "--timeout", "nan"], ["--timeout", "'nan'", "seconds (> 0, at most 604,800)"]),
        (["run", "--group-timeout", "1e300"], ["--group-timeout", "'1e300'", "at most 604,800"]),
        (
            ["run", "--nproc", "99999999999999999999"],
            ["--nproc", "'99999999999999999999'", "positive integer (at most 65,536)"],
        ),
        (["run", "--tp", str(2**64)], ["--tp", str(2**64), "(at most 65,536)"]),
        (["run", "--run-dir", ""], ["--run-dir", "expected a path, got ''"]),
        (["replay", ""], ["expected a path, got ''"]),
        (["run", "--head-size", str(2**64)], ["--head-size", str(2**64), "(at most 65,536)"]),
        # Fault specs are checked against the launch before anything starts.
        (
            ["run", "--inject", "zentorhc=RuntimeError:typo"],
            ["'zentorhc'", "did you mean zentorch?", "valid targets:", "attention/FLASH_ATTN"],
        ),
        (
            ["run", "--nproc", "2", "--inject", "5:zentorch=RuntimeError:x"],
            ["'5'", "rank 5 is outside the world of 2 ranks (0-1)"],
        ),
        (
            ["run", "--inject", "0-999999999:zentorch=RuntimeError:x"],
            ["'0-999999999'", "outside the world of 1 rank"],
        ),
        (
            ["run", "--inject", "zentorch=UnicodeDecodeError:typo"],
            ["UnicodeDecodeError('typo')", "5 arguments"],
        ),
        (["run", "--run-id", ""], ["--run-id ''", "1-128 letters"]),
        (["run", "--nproc", "2", "--run-id", ""], ["--run-id ''", "1-128 letters"]),
        ([], ["the following arguments are required: COMMAND"]),
        (["launch"], ["'launch'", "'run', 'replay'"]),
        (["replay"], ["PATH"]),
        (["replay", "missing-run"], ["missing-run: no such file or directory"]),
        (["replay", "--level", "loud", "x"], ["'loud'", "debug, info, warning, error"]),
        (["replay", "--until", "-1", "x"], ["--until", "'-1'"]),
        (
            ["replay", "--export", "otlp=spans.json", "x"],
            ["'otlp=spans.json'", "expected otlp, console, or jaeger-json=FILE"],
        ),
        (["replay", "--export", "jaeger-json=", "x"], ["'jaeger-json='", "as jaeger-json=FILE"]),
        (
            ["run", "--otlp-endpoint", "http://:4317"],
            ["--otlp-endpoint", "expected http(s)://HOST[:PORT], got 'http://:4317'"],
        ),
        (["explain", "missing-run"], ["missing-run: no such file or directory"]),
        (["validate", "missing-run"], ["missing-run: no such file or directory"]),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_usage_errors(tmp_path: Path, arguments: list[str], fragments: list[str]) -> None:
    _one_line_error(call_cli(*arguments, cwd=tmp_path), 2, *fragments)


@pytest.mark.parametrize(
    ("arguments", "line"),
    [
        (
            ["run", "--simulate", "h100x8"],
            "profile 'h100x8': unknown profile; built-in profiles: a100x4, b200x8, h200x8, xeon, "
            "zen4, or the path of a JSON profile file",
        ),
        (
            ["run", "--dtype", "float8"],
            "unknown dtype 'float8'; valid: auto, float16, bfloat16, float32",
        ),
    ],
)
def test_an_error_of_the_layer_below_is_its_own_message(
    tmp_path: Path, arguments: list[str], line: str
) -> None:
    # The profile's and the engine configuration's errors, as they say them.
    completed = call_cli(*arguments, cwd=tmp_path)

    assert completed.returncode == 2, completed.describe()
    assert completed.stderr == f"{PROG}{line}\n"


@pytest.mark.parametrize(
    ("arguments", "name", "value"),
    [
        (["run", "--nproc", "65536"], "nproc", 65_536),
        (["run", "--tp", "65536"], "tp", 65_536),
        (["run", "--head-size", "65536"], "head_size", 65_536),
        (["run", "--timeout", "604800"], "timeout", 604_800.0),
        (["watch", "run", "--stall", "1e-3"], "stall", 0.001),
        (["replay", "run", "--rank", "0"], "rank", 0),
        (["replay", "run", "--until", "0"], "until", 0),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_the_bounds_of_a_value_are_accepted(arguments: list[str], name: str, value: object) -> None:
    # The largest world, a week, rank and event 0: each is a value a run can have.
    assert getattr(build_parser().parse_args(arguments), name) == value


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        ("{not json", ["--inject-file faults.json", "not valid JSON"]),
        (
            '[{"target": "a\tb"}]',
            [
                "--inject-file faults.json: not valid JSON at line 1 column 15: "
                "unexpected control character in string"
            ],
        ),
        ('{"target": "zentorch"}', ["expected a list of fault objects"]),
        ('[{"target": "zentorch", "exception": "Nope"}]', ["'Nope'"]),
        (
            '[{"target": "zentorch", "exception": "hang", "args": ["x"]}]',
            ["'entry 0: args': hang takes no arguments"],
        ),
        ('[{"target": "flashinfer", "exception": "OSError", "args": [{}]}]', ["entry 0: args"]),
        ("[" * 100_000 + "]" * 100_000, ["not valid JSON at line 1 column 1026: depth limit"]),
        ('[{"target": "zentorch", "exception": NaN}]', ["not valid JSON at line 1 column 38"]),
    ],
)
def test_malformed_inject_file(tmp_path: Path, content: str, fragments: list[str]) -> None:
    (tmp_path / "faults.json").write_text(content, encoding="utf-8")

    completed = call_cli("run", "--inject-file", "faults.json", cwd=tmp_path)

    _one_line_error(completed, 2, "faults.json", *fragments)
    assert not (tmp_path / "startup-runs").exists()


@pytest.mark.parametrize(
    ("inject", "entry", "option"),
    [
        ("nosuch=ImportError", "zentorch", "--inject 'nosuch=ImportError'"),
        ("5:zentorch=ImportError", "zentorch", "--inject '5:zentorch=ImportError'"),
        ("zentorch=ImportError", "nosuch", "--inject-file 'nosuch=ImportError'"),
    ],
)
def test_a_bad_fault_is_named_with_the_option_it_came_from(
    tmp_path: Path, inject: str, entry: str, option: str
) -> None:
    # With both options given, a bad --inject spec was named as --inject-file's.
    faults = [{"target": entry, "exception": "ImportError"}]
    (tmp_path / "faults.json").write_text(json.dumps(faults), encoding="utf-8")

    completed = call_cli(
        "run", "--simulate", "zen4", "--inject", inject, "--inject-file", "faults.json",
        cwd=tmp_path,
    )  # fmt: skip

    _one_line_error(completed, 2, f"error: {option}: ")


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        ('{"name": "mine", "gpus": [', ["'profile.json'", "not valid JSON"]),
        (
            '{"name": "a\tb"}',
            [
                "'profile.json': not valid JSON at line 1 column 12: "
                "unexpected control character in string"
            ],
        ),
        (
            '{"name": "mine", "gpu": []}',
            ["'profile.json'", "gpu", "not a field of Profile (valid: build"],
        ),
        ("[]", ["'profile.json'", "expected a JSON object"]),
        ('\ufeff{"name": "bom"}', ["'profile.json'", ": UTF-8 byte order mark (BOM)"]),
        ("[" * 100_000 + "]" * 100_000, ["'profile.json'", "depth limit exceeded"]),
        (
            '{"name": "big", "gpus": {"vendor": "nvidia", "count": 1000000000}}',
            ["'profile.json'", "gpus.count", "from 0 to 1,024, not 1000000000"],
        ),
    ],
)
def test_malformed_profile_file(tmp_path: Path, content: str, fragments: list[str]) -> None:
    (tmp_path / "profile.json").write_text(content, encoding="utf-8")

    completed = call_cli("run", "--simulate", "profile.json", cwd=tmp_path)

    _one_line_error(completed, 2, *fragments)


def test_a_profile_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "profile.json").write_bytes(b'{"name": "caf\xe9"}')
    completed = call_cli("run", "--simulate", "profile.json", cwd=tmp_path)
    _one_line_error(completed, 2, "'profile.json'", "not valid UTF-8")


@pytest.mark.parametrize(
    ("option", "fragment"),
    [("--simulate", "profile 'huge.json': "), ("--inject-file", "huge.json: ")],
)
def test_an_input_file_too_large_to_be_one_is_not_read_whole(
    tmp_path: Path, option: str, fragment: str
) -> None:
    # A device (/dev/zero) or a model's weights named by mistake were read
    # until memory ran out; a sparse file stands for them.
    with (tmp_path / "huge.json").open("wb") as file:
        file.truncate(64 << 20)

    completed = call_cli("run", option, "huge.json", cwd=tmp_path)

    _one_line_error(completed, 2, fragment + "larger than 16 MiB", "name the JSON file meant")
    assert not (tmp_path / "startup-runs").exists()


def test_bad_grace_from_the_environment_starts_no_rank(tmp_path: Path) -> None:
    completed = call_cli(
        "run",
        "--simulate",
        "h200x8",
        "--nproc",
        "2",
        "--run-dir",
        "run",
        cwd=tmp_path,
        env=environment(STARTUP_ORCHESTRATOR_GRACE_S="soon"),
    )

    _one_line_error(
        completed, 2, "STARTUP_ORCHESTRATOR_GRACE_S='soon'", "seconds (> 0, at most 604,800)"
    )
    assert list((tmp_path / "run").glob("*.jsonl")) == []


def test_grace_on_the_command_line_wins_over_the_environments(tmp_path: Path) -> None:
    # With --grace, STARTUP_ORCHESTRATOR_GRACE_S is not read: the launch goes
    # on to its next check, the launcher's trace context.
    completed = call_cli(
        "run", "--simulate", "h200x8", "--nproc", "2", "--grace", "1", "--run-dir", "run",
        cwd=tmp_path,
        env=environment(STARTUP_ORCHESTRATOR_GRACE_S="soon", TRACEPARENT="00-not-a-trace-01"),
    )  # fmt: skip

    line = _one_line_error(completed, 2, "TRACEPARENT", "00-not-a-trace-01")
    assert "STARTUP_ORCHESTRATOR_GRACE_S" not in line


@pytest.mark.parametrize(
    ("variable", "value"),
    [("STARTUP_ORCHESTRATOR_RUN_ID", "a/b"), ("TORCHELASTIC_RUN_ID", "../up")],
)
def test_a_bad_run_id_from_the_environment_is_bad_usage_for_a_launch(
    tmp_path: Path, variable: str, value: str
) -> None:
    # As for a single rank: exit 2, the variable named, nothing written.
    completed = call_cli(
        "run", "--simulate", "h200x8", "--nproc", "2", "--run-dir", "run",
        cwd=tmp_path, env=environment(**{variable: value}),
    )  # fmt: skip

    _one_line_error(completed, 2, f"{variable}={value!r}", "a run id is 1-128 letters")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "launcher",
    [
        {"RANK": "0", "WORLD_SIZE": "2"},
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"},
        {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
    ],
    ids=["torchrun", "SLURM", "Open MPI"],
)
def test_a_launch_under_another_launcher_is_refused(
    tmp_path: Path, launcher: dict[str, str]
) -> None:
    # Each rank of the other launcher would start ranks of its own.
    completed = call_cli(
        "run", "--simulate", "h200x8", "--nproc", "2", "--run-dir", "run",
        cwd=tmp_path, env=environment(**launcher),
    )  # fmt: skip

    assert _one_line_error(completed, 2) == (
        f"{PROG}--nproc starts local ranks itself; under torchrun leave it out "
        "(torchrun --nproc-per-node N -m orchestrator run ...), and under srun or mpirun too"
    )
    assert not (tmp_path / "run").exists()


def test_a_launch_with_the_run_id_of_a_single_run_in_its_directory_is_refused(
    healthy: StoredRun, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(healthy.directory, run)
    run_id = (run / ".run-id").read_text().strip()
    before = sorted(path.name for path in run.iterdir())

    completed = call_cli(
        "run", "--simulate", "h200x8", "--nproc", "2", "--run-id", run_id, "--run-dir", "run",
        cwd=tmp_path,
    )  # fmt: skip

    line = _one_line_error(completed, 2, "already holds rank-0.jsonl", f"of run {run_id}")
    assert "use a new --run-id or --run-dir" in line
    assert sorted(path.name for path in run.iterdir()) == before  # no manifest


def test_a_log_named_with_a_digit_that_is_no_decimal_is_read(
    healthy: StoredRun, tmp_path: Path
) -> None:
    # "rank-\u00b2" (a superscript two) passed str.isdigit and then broke
    # int() with a traceback. It names no rank; an Arabic-Indic three is a
    # decimal digit, so that name says rank 3, which the log is not.
    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(healthy.directory / "rank-0.jsonl", run / "rank-\u00b2.jsonl")
    for target in (run, run / "rank-\u00b2.jsonl"):
        completed = call_cli("replay", "--json", str(target), cwd=tmp_path)
        assert completed.returncode == 0, completed.describe()
        assert [r["rank"] for r in json.loads(completed.stdout)["ranks"]] == [0]
    (run / "rank-\u00b2.jsonl").rename(run / "rank-\u0663.jsonl")
    completed = call_cli("replay", str(run), cwd=tmp_path)
    _one_line_error(completed, 1, "holds the events of rank 0, not of rank 3")


def test_a_rank_no_launch_started_is_refused_by_a_launch_of_its_run_id(tmp_path: Path) -> None:
    # It joined the launch's directory and was replayed as one of its ranks
    # ("3 ready, 3 of 2 ranks").
    launch = run_cli(
        "run", "--simulate", "h200x8", "--nproc", "2", "--run-id", "twice", "--run-dir", "run",
        cwd=tmp_path, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip
    assert launch.returncode == 0, launch.describe()
    run = tmp_path / "run"
    before = {path.name: path.read_bytes() for path in run.iterdir()}

    for rank, world, fragment in (
        ("2", "3", "holds the manifest of launch twice (2 ranks, launcher pid"),
        ("0", "1", "already exists: run twice already has a rank 0"),
    ):
        completed = run_cli(
            "run", "--simulate", "h200x8", "--run-id", "twice", "--run-dir", "run",
            cwd=tmp_path, env=environment(RANK=rank, WORLD_SIZE=world, LOCAL_RANK="0"),
        )  # fmt: skip
        _one_line_error(completed, 2, fragment, "use a new")
    assert {path.name: path.read_bytes() for path in run.iterdir()} == before


def test_a_malformed_traceparent_is_a_usage_error(tmp_path: Path) -> None:
    # The launcher's trace context is checked at the door.
    done = run_cli(
        "run", "--simulate", "xeon", "--run-dir", str(tmp_path / "run"),
        env=environment(TRACEPARENT="00-not-a-trace-01"),
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "TRACEPARENT" in line
    assert "00-not-a-trace-01" in line


def test_run_directory_that_holds_a_run_is_refused(healthy: StoredRun, tmp_path: Path) -> None:
    # A single rank finds out when the embedding API claims the directory
    # (after it has set up signals and logging): a process of its own.
    before = (healthy.directory / "rank-0.jsonl").read_bytes()

    single = run_cli(
        "run", "--simulate", "h200x8", "--run-dir", str(healthy.directory), cwd=tmp_path
    )
    launched = run_cli(
        "run",
        "--simulate",
        "h200x8",
        "--nproc",
        "2",
        "--run-dir",
        str(healthy.directory),
        cwd=tmp_path,
    )

    for completed in (single, launched):
        _one_line_error(completed, 2, "one run directory holds one run", "--run-dir")
    assert (healthy.directory / "rank-0.jsonl").read_bytes() == before


@pytest.mark.parametrize(
    ("spec", "fragments"),
    [
        ("events", ["--slice 'events'", "expected MODULE:NAME"]),
        ("events:", ["expected MODULE:NAME"]),
        (
            "no_such_module_here:SLICE",
            [
                "cannot load no_such_module_here: ModuleNotFoundError",
                "put its directory on PYTHONPATH, or pass its file: FILE.py:SLICE",
            ],
        ),
        ("needs_a_missing.py:SLICE", ["ModuleNotFoundError: No module named 'nowhere_'"]),
        ("events:NOT_THERE", ["events has no attribute NOT_THERE"]),
        ("events:Severity", ["Severity is of type EnumType, not events.Slice"]),
        ("missing.py:SLICE", ["no such file: missing.py"]),
        ("broken.py:SLICE", ["cannot load broken.py", "ZeroDivisionError"]),
    ],
)
def test_bad_slice_is_one_line(
    healthy: StoredRun, tmp_path: Path, spec: str, fragments: list[str]
) -> None:
    (tmp_path / "broken.py").write_text("SLICE = 1 / 0\n", encoding="utf-8")
    (tmp_path / "needs_a_missing.py").write_text("import nowhere_\n", encoding="utf-8")
    completed = call_cli("replay", str(healthy.directory), "--slice", spec, cwd=tmp_path)
    line = _one_line_error(completed, 2, *fragments)
    # Only a module that is not importable itself is told where to put it.
    assert ("PYTHONPATH" in line) == spec.startswith("no_such_module_here"), line


def test_a_keyboard_interrupt_from_a_slice_module_is_one_line(
    healthy: StoredRun, tmp_path: Path
) -> None:
    (tmp_path / "interrupts.py").write_text("raise KeyboardInterrupt\n", encoding="utf-8")

    completed = call_cli(
        "replay", str(healthy.directory), "--slice", "interrupts.py:SLICE", cwd=tmp_path
    )

    assert completed.returncode == 1, completed.describe()
    assert completed.stdout == ""
    assert completed.stderr == "startup-orchestrator: interrupted\n"


def test_a_json_lines_file_of_something_else_is_named_as_such(tmp_path: Path) -> None:
    (tmp_path / "other.jsonl").write_text('{"hello": 1}\n', encoding="utf-8")
    _one_line_error(
        call_cli("replay", "other.jsonl", cwd=tmp_path),
        1,
        "other.jsonl:1: not a startup event",
        "is this a startup-orchestrator log?",
    )


def test_directory_without_logs(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()

    for command in ("replay", "explain", "blame", "critical-path"):
        _one_line_error(call_cli(command, "empty", cwd=tmp_path), 1, "empty: no rank-*.jsonl logs")
    # validate goes on over every path and summarises; the problem is one line.
    validated = call_cli("validate", "empty", cwd=tmp_path)
    assert validated.returncode == 1
    assert validated.lines() == [
        "empty: no rank-*.jsonl logs in this directory [run, error]",
        "1 path(s), 0 file(s), 1 problem(s)",
    ]


def test_a_directory_a_launch_only_claimed_names_the_run(tmp_path: Path) -> None:
    # A launcher killed between claiming its run directory and writing the
    # manifest leaves the claim alone: the error says whose it is and why.
    (tmp_path / "claimed").mkdir()
    (tmp_path / "claimed" / ".run-id").write_text("run-7f3a\n")
    said = (
        "claimed: no rank-*.jsonl logs or manifest, only the claim of run run-7f3a: "
        "its launch was stopped before it started a rank"
    )

    _one_line_error(call_cli("replay", "claimed", cwd=tmp_path), 1, said)
    validated = call_cli("validate", "claimed", cwd=tmp_path)
    assert validated.lines()[0] == f"{said} [run, error]"


def _copy(run: StoredRun, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run.directory, copy)
    return copy / "rank-0.jsonl"


@pytest.mark.parametrize("view", ["replay", "validate", "explain"])
def test_a_manifest_given_as_a_log_names_its_run_directory(
    healthy: StoredRun, tmp_path: Path, view: str
) -> None:
    # A manifest read as a rank log was "not valid JSON" at its line 1 (and
    # validate listed an error for each of its lines).
    _copy(healthy, tmp_path)
    manifest = {"version": 1, "run_id": "r", "world_size": 1, "ranks": []}
    (tmp_path / "run" / "manifest.json").write_text(json.dumps(manifest, indent=2))
    _one_line_error(
        call_cli(view, "run/manifest.json", cwd=tmp_path),
        2,
        "run/manifest.json: a launch's manifest, not a rank log: name its run directory, run",
    )


def test_garbage_in_the_middle_of_a_log(healthy: StoredRun, tmp_path: Path) -> None:
    log = _copy(healthy, tmp_path)
    lines = log.read_text(encoding="utf-8").splitlines(keepends=True)
    lines.insert(5, "this is not an event\n")
    log.write_text("".join(lines), encoding="utf-8")

    for command in (
        ["replay"],
        ["replay", "--json"],
        ["explain"],
        ["diff", str(healthy.directory)],
    ):
        line = _one_line_error(call_cli(*command, "run", cwd=tmp_path), 1)
        assert "run/rank-0.jsonl:6: not valid JSON" in line, line


def test_a_linked_log_is_validated_as_replay_reads_it(healthy: StoredRun, tmp_path: Path) -> None:
    # validate said a log linked into the run directory "is not a regular
    # file" (an error, exit 1) while replay read it as the rank's log.
    log = _copy(healthy, tmp_path)
    log.rename(tmp_path / "kept.jsonl")
    log.symlink_to(tmp_path / "kept.jsonl")

    validated = call_cli("validate", "run", cwd=tmp_path)
    assert validated.returncode == 0, validated.describe()
    assert validated.lines() == ["run/rank-0.jsonl: ok", "1 path(s), 1 file(s), 0 problem(s)"]
    assert call_cli("replay", "run", cwd=tmp_path).returncode == 0

    log.unlink()
    log.symlink_to(log.name)
    looped = call_cli("validate", "run", cwd=tmp_path)
    assert looped.returncode == 1, looped.describe()
    assert "run/rank-0.jsonl: cannot read: Too many levels of symbolic links" in looped.stdout


def test_validate_lists_every_problem(healthy: StoredRun, tmp_path: Path) -> None:
    log = _copy(healthy, tmp_path)
    lines = log.read_text(encoding="utf-8").splitlines(keepends=True)
    foreign = json.loads(lines[3])
    foreign["run_id"] = "another-run"
    damaged = [
        *lines[:3],
        json.dumps(foreign) + "\n",  # line 4: another run's event
        *lines[4:6],
        "garbage\n",  # line 7
        *lines[6:10],
        lines[9],  # line 12: an event repeated
        *lines[10:-1],  # the run never finishes
    ]
    log.write_text("".join(damaged), encoding="utf-8")

    checked = call_cli("validate", "run", cwd=tmp_path)

    assert checked.returncode == 1, checked.describe()
    out = checked.lines()
    assert any(line.startswith("run/rank-0.jsonl:4: ") for line in out), out
    assert any(line.startswith("run/rank-0.jsonl:7: not valid JSON") for line in out), out
    assert any(line.startswith("run/rank-0.jsonl:12: sequence gap") for line in out), out
    assert any("[not_finished" in line for line in out), out
    problems = [line for line in out if line.startswith("run/rank-0.jsonl:")]
    assert len(problems) >= 4
    assert out[-1] == f"1 path(s), 1 file(s), {len(problems)} problem(s)"


def test_torn_last_line_is_tolerated_and_reported(healthy: StoredRun, tmp_path: Path) -> None:
    log = _copy(healthy, tmp_path)
    whole = log.read_bytes()
    log.write_bytes(whole + b'{"v":1,"type":"step.sta')
    lines = whole.count(b"\n")

    text = call_cli("replay", "run", cwd=tmp_path)
    document = call_cli("replay", "--json", "run", cwd=tmp_path)
    checked = call_cli("validate", "run", cwd=tmp_path)

    assert text.returncode == 0, text.describe()
    assert text.lines()[0].startswith("Startup ready: 1 ready")
    assert "Log warnings:" in text.lines()
    assert f"run/rank-0.jsonl:{lines + 1}: torn last line" in text.stdout
    assert document.returncode == 0
    assert len(document.json()["warnings"]) == 1
    assert document.json()["outcome"] == "ready"
    assert f"run/rank-0.jsonl:{lines + 1}: torn last line" in checked.stdout
    assert "[torn_tail, warning]" in checked.stdout
    # Reading never repairs: the torn bytes are still there.
    assert log.read_bytes().endswith(b'"step.sta')


def test_unwritable_export_destinations(healthy: StoredRun, tmp_path: Path) -> None:
    run = str(healthy.directory)
    missing = tmp_path / "no" / "such" / "dir"

    _one_line_error(
        call_cli("replay", run, f"--export=jaeger-json={missing / 't.json'}", cwd=tmp_path),
        1,
        "--export jaeger-json",
        "cannot write",
    )
    _one_line_error(
        call_cli("replay", run, "--html", str(missing / "t.html"), cwd=tmp_path),
        1,
        "--html",
        "cannot write",
    )
    _one_line_error(
        call_cli("replay", run, "--export", "zipkin", cwd=tmp_path),
        2,
        "'zipkin'",
        "otlp, console, or jaeger-json=FILE",
    )
    _one_line_error(
        call_cli("replay", run, "--rank", "4", cwd=tmp_path), 2, "--rank 4", "the run has rank 0"
    )


def test_the_rank_just_past_the_world_is_bad_usage(healthy: StoredRun, tmp_path: Path) -> None:
    # Ranks count from 0: a world of one has no rank 1.
    completed = call_cli("replay", str(healthy.directory), "--rank", "1", cwd=tmp_path)

    _one_line_error(completed, 2, "--rank 1", "the run has rank 0 (world size 1)")


@pytest.mark.parametrize("command", ["replay", "explain", "blame", "critical-path"])
@pytest.mark.slow
def test_a_rank_outside_the_run_is_bad_usage(
    eight_ranks: StoredRun, tmp_path: Path, command: str
) -> None:
    # The views printed nothing and exited 0 for a rank the run does not have.
    completed = call_cli(command, str(eight_ranks.directory), "--rank", "42", cwd=tmp_path)

    _one_line_error(completed, 2, "--rank 42", "the run has ranks 0-7 (world size 8)")


def test_the_directory_of_run_directories_names_the_newest(
    healthy: StoredRun, attention_failure: StoredRun, tmp_path: Path
) -> None:
    runs = tmp_path / "startup-runs"
    runs.mkdir()
    for index, stored in enumerate((healthy, attention_failure, healthy, healthy, healthy)):
        copy = runs / f"run-{index}"
        shutil.copytree(stored.directory, copy)
        os.utime(copy, (1_000_000 + index, 1_000_000 + index))
    (runs / "not-a-run").mkdir()

    for command in ("replay", "explain", "blame", "critical-path"):
        _one_line_error(
            call_cli(command, "startup-runs", cwd=tmp_path),
            2,
            "startup-runs: holds 5 run directories, not a run's logs; name one (newest first): "
            "startup-runs/run-4, startup-runs/run-3, startup-runs/run-2, and 2 more",
        )


def test_a_rank_log_compressed_in_place_is_named_not_taken_as_missing(
    healthy: StoredRun, tmp_path: Path
) -> None:
    # As a run directory attached to a bug report may come back.
    run = tmp_path / "run"
    shutil.copytree(healthy.directory, run)
    plain = (run / "rank-0.jsonl").read_bytes()
    (run / "rank-0.jsonl").unlink()
    (run / "rank-0.jsonl.gz").write_bytes(gzip.compress(plain))
    said = "run/rank-0.jsonl.gz:0: is gzip-compressed: decompress it first (gzip -d)"

    for view in ("replay", "explain"):
        _one_line_error(call_cli(view, "run", cwd=tmp_path), 1, said)
    validated = call_cli("validate", "run", cwd=tmp_path)
    assert f"{said} [unreadable, error]" in validated.lines(), validated.describe()
    # Beside its plain log, a compressed copy is not read.
    (run / "rank-0.jsonl").write_bytes(plain)
    assert call_cli("replay", "run", cwd=tmp_path).returncode == 0


def test_validate_goes_on_over_every_path(healthy: StoredRun, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    shutil.copytree(healthy.directory, tmp_path / "run")

    validated = call_cli("validate", "empty", "run", cwd=tmp_path)

    assert validated.returncode == 1, validated.describe()
    out = validated.lines()
    assert out[0] == "empty: no rank-*.jsonl logs in this directory [run, error]"
    assert "run/rank-0.jsonl: ok" in out
    assert out[-1] == "2 path(s), 1 file(s), 1 problem(s)"


def test_validate_checks_each_run_a_directory_of_runs_holds(
    healthy: StoredRun, attention_failure: StoredRun, tmp_path: Path
) -> None:
    runs = tmp_path / "startup-runs"
    shutil.copytree(healthy.directory, runs / "a")
    shutil.copytree(attention_failure.directory, runs / "b")
    (runs / "b" / "rank-0.jsonl").write_bytes(b"{not json\n")
    (runs / "not-a-run").mkdir()

    validated = call_cli("validate", "startup-runs", cwd=tmp_path)

    assert validated.returncode == 1, validated.describe()
    out = validated.lines()
    assert out[0] == "startup-runs: holds 2 run directories; checking each"
    assert "startup-runs/a/rank-0.jsonl: ok" in out
    assert any(line.startswith("startup-runs/b/rank-0.jsonl:1: ") for line in out), out
    assert not any("not-a-run" in line for line in out)
    assert out[-1].startswith("1 path(s), 2 file(s), "), out


def test_validate_checks_the_runs_of_a_directory_of_runs_oldest_first(
    healthy: StoredRun, attention_failure: StoredRun, tmp_path: Path
) -> None:
    runs = tmp_path / "startup-runs"
    shutil.copytree(healthy.directory, runs / "a")
    shutil.copytree(attention_failure.directory, runs / "b")
    # b is the older run, though its name sorts after a's.
    os.utime(runs / "b", (1_000_000, 1_000_000))
    os.utime(runs / "a", (2_000_000, 2_000_000))

    validated = call_cli("validate", "startup-runs", cwd=tmp_path)

    assert validated.returncode == 0, validated.describe()
    assert validated.lines() == [
        "startup-runs: holds 2 run directories; checking each",
        "startup-runs/b/rank-0.jsonl: ok",
        "startup-runs/a/rank-0.jsonl: ok",
        "1 path(s), 2 file(s), 0 problem(s)",
    ]


@pytest.mark.parametrize("logs", [False, True])
def test_two_runs_to_replay_suggest_diff(
    healthy: StoredRun, attention_failure: StoredRun, tmp_path: Path, logs: bool
) -> None:
    # Was "two logs for rank 0 ...; pass one log per rank".
    a, b = healthy.directory, attention_failure.directory
    if logs:
        a, b = a / "rank-0.jsonl", b / "rank-0.jsonl"

    for command in ("replay", "explain"):
        line = _one_line_error(
            call_cli(command, str(a), str(b), cwd=tmp_path),
            2,
            "the paths are of different runs",
            f"to compare them: startup-orchestrator diff {a} {b}",
        )
        assert "two logs for rank" not in line


def test_a_log_of_another_run_in_a_run_directory_is_named(
    healthy: StoredRun, attention_failure: StoredRun, tmp_path: Path
) -> None:
    # Another run's log of a rank the directory has a log of, copied in
    # beside it: it was left out without a word.
    mixed = tmp_path / "mixed"
    shutil.copytree(healthy.directory, mixed)
    stranger = mixed / "rank-0-other.jsonl"
    shutil.copy(attention_failure.directory / "rank-0.jsonl", stranger)

    for command in ("replay", "explain"):
        _one_line_error(
            call_cli(command, str(mixed), cwd=tmp_path),
            1,
            f"{stranger}: a log of run ",
            "a report is of one run: move that log out, or replay it on its own",
        )


def test_a_run_directory_that_is_a_file_or_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("a file\n", encoding="utf-8")

    for run_dir in ("README.md", "/proc/nope"):
        completed = run_cli("run", "--simulate", "h200x8", "--run-dir", run_dir, cwd=tmp_path)
        _one_line_error(completed, 2, f"error: {run_dir}: ", "with --run-dir")
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == "a file\n"
    # It was "cannot create the run directory: File exists".
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    completed = run_cli("run", "--simulate", "h200x8", "--run-dir", "dangling", cwd=tmp_path)
    _one_line_error(completed, 2, "error: dangling: is not a directory")
    assert not (tmp_path / "gone").exists()


#: util-linux's ``setpriv``: runs a command as another user.
SETPRIV = shutil.which("setpriv") or "setpriv"
_AS_NOBODY = ("--reuid=65534", "--regid=65534", "--clear-groups")


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run as another user",
)
@pytest.mark.parametrize(
    "view",
    [
        ["validate"],
        ["replay"],
        ["explain"],
        ["blame"],
        ["critical-path"],
        ["watch", "--timeout", "5"],
    ],
)
def test_a_directory_the_user_cannot_read_is_one_line(healthy: StoredRun, view: list[str]) -> None:
    # As root every directory reads, so the views run as another user:
    # `validate` and `watch` ended in a PermissionError traceback.
    with tempfile.TemporaryDirectory() as place:
        base = Path(place)
        base.chmod(0o755)
        run = base / "run"
        shutil.copytree(healthy.directory, run)
        run.chmod(0)
        process = subprocess.run(
            [SETPRIV, *_AS_NOBODY, *harness.command(*view, str(run))],
            cwd=base,
            env=environment(HOME=str(base)),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        run.chmod(0o755)
    assert process.returncode == 1, process
    assert "Traceback" not in process.stderr, process.stderr
    assert "Permission denied" in process.stdout + process.stderr, process
    assert len(process.stderr.splitlines()) <= 1, process.stderr

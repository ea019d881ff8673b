"""The examples run as a user runs them: real subprocesses, in a fresh
directory, and they print and write what their documentation says."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from events import StepSucceeded, read_log

from .helpers import EXAMPLES, clean_environment, only_run_dir


def run_example(
    cwd: Path, script: str, *args: str, timeout: float = 60.0, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=cwd,
        env=clean_environment(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def section(stdout: str, title: str) -> str:
    """The block of output under ``title:``, up to the next blank line."""
    blocks = stdout.split("\n\n")
    for block in blocks:
        if block.lstrip("\n").startswith(f"{title}:"):
            return block
    raise AssertionError(f"no section {title!r} in:\n{stdout}")


def step_row(block: str, step: str) -> str:
    for line in block.splitlines():
        if line.split()[:1] == [step]:
            return line
    raise AssertionError(f"no row for step {step!r} in:\n{block}")


# --- launcher_torchrun.py -----------------------------------------------------------


def test_launcher_as_a_single_process_is_a_world_of_one(tmp_path: Path) -> None:
    done = run_example(tmp_path, "launcher_torchrun.py", TORCHELASTIC_RUN_ID="launch-1")

    assert done.returncode == 0, done.stderr
    log_path = tmp_path / "startup-runs" / "launch-1" / "rank-0.jsonl"
    assert done.stdout.startswith("rank 0 of 1, run launch-1: ready platform=cuda (CudaPlatform)")
    assert f"log={log_path.relative_to(tmp_path)}" in done.stdout
    assert "[rank 0] Startup ready." in done.stderr  # the logging bridge, live
    contents = read_log(log_path)
    assert contents.events[0].run_id == "launch-1"
    assert contents.torn_tail is None


def test_launcher_reports_an_injected_failure_and_exits_1(tmp_path: Path) -> None:
    done = run_example(
        tmp_path,
        "launcher_torchrun.py",
        "a100x4",
        "--inject",
        "flash_attn=RuntimeError:broken build",
    )

    assert done.returncode == 1, done.stderr
    assert ": failed platform=cuda (CudaPlatform) attention=-" in done.stdout
    # Live, one line for the one failure: the step's, not the run's again.
    assert "ERROR   [rank 0] Step attention/FLASH_ATTN failed: RuntimeError: broken build" in (
        done.stderr
    )
    assert "Startup failed" not in done.stderr
    assert "Traceback" not in done.stderr
    assert len(list(only_run_dir(tmp_path).glob("rank-*.jsonl"))) == 1


def test_launcher_rejects_an_unknown_profile(tmp_path: Path) -> None:
    done = run_example(tmp_path, "launcher_torchrun.py", "h100x3")

    assert done.returncode == 1
    assert "profile 'h100x3': unknown profile; built-in profiles:" in done.stderr
    assert "Traceback" not in done.stderr


def _torchrun() -> Path | None:
    if importlib.util.find_spec("torch") is None:
        return None
    candidate = Path(sys.executable).with_name("torchrun")
    return candidate if candidate.exists() else None


@pytest.mark.slow
@pytest.mark.skipif(_torchrun() is None, reason="torch (and its torchrun) is not installed")
@pytest.mark.slow
def test_launcher_under_torchrun_shares_one_run_and_agrees_over_gloo(tmp_path: Path) -> None:
    torchrun = _torchrun()
    assert torchrun is not None
    done = subprocess.run(
        # --standalone: a rendezvous on a free port, so parallel launches
        # never collide on torchrun's default 29500.
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            str(EXAMPLES / "launcher_torchrun.py"),
        ],
        cwd=tmp_path,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = only_run_dir(tmp_path)
    # Rank 0 collected the run (both logs were already here) and recorded it.
    assert sorted(p.name for p in run_dir.iterdir()) == [
        ".run-id",
        "manifest.json",
        "rank-0.jsonl",
        "rank-1.jsonl",
    ]
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["collected_by"] == 0
    assert [entry.get("not_delivered") for entry in manifest["ranks"]] == [None, None]
    logs = [read_log(run_dir / f"rank-{rank}.jsonl") for rank in (0, 1)]
    assert {contents.events[0].run_id for contents in logs} == {run_dir.name}
    for rank in (0, 1):
        assert (
            f"rank {rank} of 2, run {run_dir.name}: ready platform=cuda (CudaPlatform) "
            "attention=FLASH_ATTN allreduce=trtllm fusion=on"
        ) in done.stdout
    # The all-reduce agreement went through the gloo group: each rank's
    # agreement step saw both ranks' statuses.
    for contents in logs:
        (agreed,) = [
            event
            for event in contents.events
            if isinstance(event, StepSucceeded) and event.step == "allreduce_workspace/agree"
        ]
        assert isinstance(agreed.result, dict)
        assert agreed.result["backend"] == "trtllm"
        group = agreed.result["group"]
        assert isinstance(group, list)
        assert len(group) == 2


# --- custom_probe_graph.py ----------------------------------------------------------


def test_custom_probe_graph_records_a_fault_instead_of_raising_it(tmp_path: Path) -> None:
    done = run_example(tmp_path, "custom_probe_graph.py")

    assert done.returncode == 0, done.stderr
    healthy = section(done.stdout, "This machine")
    assert step_row(healthy, "cache_dir").split()[2] == "ok"
    assert step_row(healthy, "tokenizer").split()[2] in ("ok", "absent")
    assert step_row(healthy, "kernels/reference").split()[1:3] == ["candidate", "ok"]
    assert "run: ready" in healthy
    assert (tmp_path / "my-engine-cache").is_dir()

    denied = section(done.stdout, "Cache directory not writable (recorded)")
    row = step_row(denied, "cache_dir")
    assert row.split()[2] == "unavailable"
    assert "PermissionError: [Errno 13] Permission denied: 'my-engine-cache'" in row
    # Without a cache only the reference kernels were candidates.
    assert "selected kernels: {'selected': 'reference', 'considered': ['reference']}" in denied
    assert "kernels/triton" not in denied
    assert "run: ready" in denied

    broken = section(done.stdout, "Tokenizer raises RuntimeError (recorded, then raised)")
    assert "raised RuntimeError: tokenizer extension failed to initialise" in broken
    row = step_row(broken, "tokenizer")
    assert row.split()[2] == "failed"
    assert "RuntimeError: tokenizer extension failed to initialise" in row
    assert "run: failed" in broken


def table_row(block: str, rank: str) -> list[str]:
    """The cells of the report table's row for ``rank`` in ``block``."""
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["RANKS", "OUTCOME"])
    header = lines[start].split()
    assert header[2] == "KERNELS", lines[start]
    return next(line.split() for line in lines[start + 1 :] if line.split()[:1] == [rank])


def test_custom_probe_graph_declares_its_messages_and_column(tmp_path: Path) -> None:
    done = run_example(tmp_path, "custom_probe_graph.py")

    assert done.returncode == 0, done.stderr
    healthy = section(done.stdout, "This machine")
    outcome, kernels = table_row(healthy, "0")[1:3]
    assert (outcome, kernels in ("reference", "triton")) == ("ready", True)
    assert f"INFO [rank 0] Using the {kernels} kernels." in healthy
    assert "my_engine" not in healthy, "the report shows texts, not codes"

    denied = section(done.stdout, "Cache directory not writable (recorded)")
    assert table_row(denied, "0")[1:3] == ["ready", "reference"]
    assert (
        "WARNING [rank 0] Kernel cache is not writable (PermissionError: [Errno 13] "
        "Permission denied: 'my-engine-cache'); compiled kernels are off."
    ) in denied
    assert "INFO [rank 0] Using the reference kernels." in denied

    # No rule speaks for the tokenizer: the kernel's generic messages do.
    broken = section(done.stdout, "Tokenizer raises RuntimeError (recorded, then raised)")
    assert table_row(broken, "0")[1:3] == ["failed", "-"]
    assert (
        "ERROR [rank 0] Step tokenizer failed: RuntimeError: tokenizer extension failed to "
        "initialise; the error propagated and stopped the startup."
    ) in broken
    assert "Kernel cache is not writable" not in broken


def test_custom_probe_graph_runs_replay_on_the_command_line_with_their_slice(
    tmp_path: Path,
) -> None:
    from tests.orchestrator.cli.harness import call_cli

    done = run_example(tmp_path, "custom_probe_graph.py", "--runs", "runs")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        "cache-denied",
        "healthy",
        "tokenizer-broken",
    ]
    slice_spec = f"{EXAMPLES / 'custom_probe_graph.py'}:MY_ENGINE"

    replayed = call_cli("replay", "runs/cache-denied", "--slice", slice_spec, cwd=tmp_path)
    assert replayed.returncode == 0, replayed.describe()
    lines = replayed.lines()
    assert lines[0] == "Startup ready: 1 ready (run custom-graph, 1 of 1 ranks)"
    header = next(line for line in lines if line.split()[:2] == ["RANKS", "OUTCOME"])
    assert header.split() == ["RANKS", "OUTCOME", "KERNELS", "LAST", "STEP"]
    assert lines[lines.index(header) + 1].split()[:3] == ["0", "ready", "reference"]
    assert (
        "  WARNING [rank 0] Kernel cache is not writable (PermissionError: [Errno 13] "
        "Permission denied: 'my-engine-cache'); compiled kernels are off."
    ) in lines
    assert "  INFO [rank 0] Using the reference kernels." in lines
    # The same text as the example printed from its own replay.
    report = section(done.stdout, "Cache directory not writable (recorded)").split("report:\n")[1]
    assert [line.strip() for line in report.splitlines() if line.strip()] == [
        line.strip() for line in lines if line.strip()
    ]

    # Without --slice the reference engine's columns are of no use here, and
    # the custom messages are gone: the slice is what gives them meaning.
    plain = call_cli("replay", "runs/cache-denied", cwd=tmp_path)
    assert plain.returncode == 0, plain.describe()
    assert "Kernel cache is not writable" not in plain.stdout
    assert "KERNELS" not in plain.stdout

    failed = call_cli(
        "replay", "runs/tokenizer-broken", "--json", "--slice", slice_spec, cwd=tmp_path
    )
    assert failed.returncode == 1, failed.describe()
    document = failed.json()
    assert document["outcome"] == "failed"
    assert document["root_cause"]["step"] == "tokenizer"

    # diff and the views take the slice too: the message only it derives
    # is a difference between the runs.
    warning = "WARNING [rank 0] Kernel cache is not writable"
    compared = call_cli(
        "diff", "runs/healthy", "runs/cache-denied", "--slice", slice_spec, cwd=tmp_path
    )
    assert compared.returncode == 1, compared.describe()
    assert any(line.startswith(f"+ {warning}") for line in compared.lines()), compared.stdout
    unsliced = call_cli("diff", "runs/healthy", "runs/cache-denied", cwd=tmp_path)
    assert warning not in unsliced.stdout
    for view in ("explain", "blame", "critical-path"):
        shown = call_cli(view, "runs/tokenizer-broken", "--slice", slice_spec, cwd=tmp_path)
        assert shown.returncode == 0, shown.describe()


# --- failed_start_and_replay.py -----------------------------------------------------


def test_failed_start_replay_names_rank_5_and_its_exception_chain_first(tmp_path: Path) -> None:
    done = run_example(tmp_path, "failed_start_and_replay.py", "--run-dir", "failed")

    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Startup failed: 1 failed, 7 ready (run failed-zen4-")
    assert lines[0].endswith(", 8 of 8 ranks)")
    # An injected failure never reads as a real one.
    assert lines[1] == (
        "Not a real start: simulated host zen4; injected faults: "
        "5:zentorch=RuntimeError:unknown zentorch failure"
    )
    assert lines[2] == "Root cause: rank 5, step platform"
    assert lines[3].startswith(
        "  UnspecifiedPlatformError: Failed to infer device type: no platform plugin "
        "activated. tpu: libtpu is not installed; "
    )
    assert lines[3].endswith("; cpu failed: RuntimeError: unknown zentorch failure")
    assert "  caused by RuntimeError: unknown zentorch failure" in lines[4:7]
    assert "  5        failed   -" in done.stdout
    assert "INFO [ranks 0-4,6-7] Startup ready." in done.stdout
    assert "rank 5: failed (UnspecifiedPlatformError)" in done.stderr
    # Why the README's tour of the same case reads "8 failed".
    assert "without a process group, so none waited for rank 5" in done.stderr
    assert "8 failed" in done.stderr
    assert sorted(p.name for p in (tmp_path / "failed").iterdir()) == [
        f"rank-{rank}.jsonl" for rank in range(8)
    ]


# --- export_jaeger.py ---------------------------------------------------------------


def _jaeger(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return document


def _error_operations(trace: dict[str, Any]) -> set[str]:
    return {
        span["operationName"]
        for span in trace["spans"]
        if {"key": "error", "type": "bool", "value": True} in span["tags"]
    }


@pytest.mark.slow
def test_export_jaeger_writes_one_trace_of_every_rank(tmp_path: Path) -> None:
    made = run_example(tmp_path, "export_jaeger.py")

    assert made.returncode == 0, made.stderr
    run_dir = only_run_dir(tmp_path)
    # Into the run directory, never the current one (a repository's root).
    output = run_dir / f"jaeger-{run_dir.name}.json"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["startup-runs"]
    assert f"to {output.relative_to(tmp_path)}" in made.stdout
    assert "Search -> the 'JSON File' tab" in made.stdout
    assert f"upload {output}" in made.stdout
    document = _jaeger(output)
    (trace,) = document["data"]
    spans = trace["spans"]
    assert {span["traceID"] for span in spans} == {trace["traceID"]}
    operations = [span["operationName"] for span in spans]
    # One root span per rank, named after it.
    assert sorted(o for o in operations if o.startswith("startup")) == sorted(
        f"startup rank {rank}" for rank in range(8)
    )
    assert {
        "platform",
        "platform/cuda",
        "attention",
        "attention/FLASH_ATTN",
        "flashinfer_comm",
        "allreduce_workspace",
        "allreduce_workspace/mnnvl",
        "allreduce_workspace/trtllm",
    } <= set(operations)
    assert len(trace["processes"]) == 8  # one per rank
    # h200x8 has no NVSwitch multicast: the mnnvl attempt falls back to
    # trtllm, a WARNING, not an error; the start is healthy, nothing is red.
    assert _error_operations(trace) == set()
    assert "Spans with status ERROR: none" in made.stdout

    # A stored run exports the same spans again, to the file named.
    again = run_example(tmp_path, "export_jaeger.py", str(run_dir), "-o", "again.json")
    assert again.returncode == 0, again.stderr
    (second,) = _jaeger(tmp_path / "again.json")["data"]
    assert sorted(span["spanID"] for span in second["spans"]) == sorted(
        span["spanID"] for span in spans
    )


def test_export_jaeger_says_when_a_directory_has_no_logs(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = run_example(tmp_path, "export_jaeger.py", "empty")

    assert done.returncode == 1
    assert "empty: no rank-*.jsonl logs" in done.stderr


# --- docker-compose.yml and the README ----------------------------------------------


def test_docker_compose_starts_jaeger_with_otlp_and_the_ui() -> None:
    text = (EXAMPLES / "docker-compose.yml").read_text(encoding="utf-8")
    assert "\t" not in text  # YAML forbids tabs in indentation
    assert (
        "#   OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 "
        "startup-orchestrator run --simulate h200x8 --nproc 8\n"
    ) in text
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        lines = [line.split("#")[0].rstrip() for line in text.splitlines()]
        for expected in (
            "services:",
            "  jaeger:",
            "    image: jaegertracing/all-in-one:1.76.0",
            '      COLLECTOR_OTLP_ENABLED: "true"',
            '      - "16686:16686"',
            '      - "4317:4317"',
            '      - "4318:4318"',
        ):
            assert expected in lines
        return
    jaeger = yaml.safe_load(text)["services"]["jaeger"]
    assert jaeger["image"].startswith("jaegertracing/all-in-one:")
    assert jaeger["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    assert set(jaeger["ports"]) >= {"16686:16686", "4317:4317", "4318:4318"}


_NO_RAY = importlib.util.find_spec("ray") is None or importlib.util.find_spec("torch") is None


@pytest.mark.slow
@pytest.mark.skipif(_NO_RAY, reason="needs Ray and torch: pip install -e '.[test,torch,ray]'")
@pytest.mark.slow
def test_ray_launch_replays_four_actors_and_names_the_injected_rank(tmp_path: Path) -> None:
    done = run_example(
        tmp_path,
        "ray_launch.py",
        "--inject",
        "2:flash_attn=RuntimeError:broken build",
        timeout=240.0,
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
    )

    assert done.returncode == 1, done.stderr
    run_dir = only_run_dir(tmp_path)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Startup failed: ")
    assert lines[0].endswith("4 of 4 ranks)")
    assert lines[2] == "Root cause: rank 2, step attention/FLASH_ATTN"
    assert lines[3].strip() == "RuntimeError: broken build"
    assert lines[-2:] == [
        f"The run directory: {Path('startup-runs') / run_dir.name}",
        f"Replay it: startup-orchestrator replay {Path('startup-runs') / run_dir.name}",
    ]
    assert sorted(p.name for p in run_dir.glob("rank-*.jsonl")) == [
        f"rank-{rank}.jsonl" for rank in range(4)
    ]
    assert json.loads((run_dir / "manifest.json").read_text())["world_size"] == 4


def test_readme_shows_a_command_for_every_example() -> None:
    readme = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert scripts == [
        "custom_probe_graph.py",
        "export_jaeger.py",
        "failed_start_and_replay.py",
        "launcher_spawn.py",
        "launcher_torchrun.py",
        "ray_launch.py",
    ]
    for script in scripts:
        assert f"examples/{script}" in readme
    assert "docker compose -f examples/docker-compose.yml up -d" in readme
    assert "torchrun --nproc-per-node 2 examples/launcher_torchrun.py" in readme


def test_the_failed_start_example_and_the_readme_tour_say_why_they_differ() -> None:
    # The example's report reads "1 failed, 7 ready", the tour's "8 failed".
    tour = (EXAMPLES.parent / "README.md").read_text(encoding="utf-8")
    examples = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    assert "Startup failed: 8 failed (run " in tour
    for text in (tour, examples):
        flat = " ".join(text.split())
        assert '"1 failed, 7 ready"' in flat
        assert "no process group" in flat


def test_examples_need_nothing_outside_the_package() -> None:
    # Copyable means importable from the installed packages and the standard
    # library alone; torch is reached only through the orchestrator's group,
    # and Ray, which the ray extra brings, only by the example about it.
    allowed = {"anyio", "events", "exporters", "orchestrator"}
    extras = {"ray_launch.py": {"ray"}}
    for script in EXAMPLES.glob("*.py"):
        for line in script.read_text(encoding="utf-8").splitlines():
            if line.startswith(("import ", "from ")):
                top = line.split()[1].split(".")[0]
                permitted = allowed | extras.get(script.name, set())
                assert top in permitted or top in sys.stdlib_module_names or top == "__future__", (
                    f"{script.name}: {line}"
                )

"""The engine's slice: the codes and columns it declares, an engine log
replayed with it without the runtime or torch, its pure modules importing
only ``events``, and ``events`` and ``exporters`` naming none of it (the
kernel keeps the meaning generic; the slice brings the engine's)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from events import Event, FrameInfo, RunOutcome, replay
from events.testing import EventStream, exception_info
from orchestrator.engine import ENGINE

ROOT = Path(__file__).resolve().parents[3]


def test_the_engine_slice_declares_every_code_it_derives() -> None:
    declared = ENGINE.code_rules()
    extension = {
        "platform.divergence",
        "attention.divergence",
        "flashinfer_comm.divergence",
        "platform.device_unusable",
        "platform.vllm_code",
        "platform.vllm_untested",
        "allreduce.unsupported",
    }
    assert extension <= set(declared)
    assert [column.title for column in ENGINE.columns] == [
        "PLATFORM",
        "CLASS",
        "ATTENTION",
        "ALLREDUCE",
        "FUSION",
    ]


SITE = "/venv/lib/python3.11/site-packages"


def _stalled(rank: int, filename: str, name: str, *, died: bool) -> list[Event]:
    """Rank ``rank`` of three stalled in ``startup`` waiting in ``name``
    (``filename``), then stopped: killed unrecorded, or failed 60 s on."""
    stream = EventStream(rank=rank, world_size=3).run_started()
    frame = FrameInfo(filename=filename, lineno=1, name=name)
    stream.started("startup").stalled("startup", waiting_in=frame)
    if died:
        return stream.events
    stream.advance(60_000_000_000).failed("startup", exception_info("SystemExit", ""))
    return stream.run_finished(RunOutcome.FAILED, failed_step="startup")


def test_a_recorded_vllm_process_waiting_for_another_is_not_the_root_cause() -> None:
    # What a real start stuck in one worker left when it was stopped: its
    # main process waits for the engine core over zmq (and died first), the
    # engine core for its worker, the worker in code of its own.
    run = replay(
        [
            _stalled(0, f"{SITE}/zmq/sugar/poll.py", "poll", died=True),
            _stalled(
                1, f"{SITE}/vllm/v1/executor/multiproc_executor.py", "wait_for_ready", died=False
            ),
            _stalled(2, "/srv/loader/weights.py", "read_weights", died=False),
        ],
        slices=[ENGINE],
    )
    assert run.root_cause is not None
    assert run.root_cause.rank == 2


def test_replaying_an_engine_log_imports_neither_the_runtime_nor_torch() -> None:
    fixture = ROOT / "tests" / "events" / "fixtures" / "legacy-attention-none-valid.jsonl"
    code = f"""
import sys
from events import read_log
from events import replay
from orchestrator.engine import ENGINE
from exporters import report_text
result = replay([read_log({str(fixture)!r})], slices=[ENGINE])
assert "attention.none_valid" in [m.code for m in result.messages]
report_text(result)
loaded = sorted(
    name for name in sys.modules
    if name.split(".")[0] in ("anyio", "torch", "opentelemetry")
    or (name.startswith("orchestrator.") and name.split(".")[1].startswith("_"))
    or (name.startswith("orchestrator.engine.") and name.split(".")[2] not in
        ("_conventions", "_messages", "_slice"))
)
print(loaded)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _literals(path: Path) -> list[str]:
    return [
        node.value
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_events_and_exporters_name_no_engine_step_code_or_message() -> None:
    from orchestrator.engine import _conventions

    steps = {
        value
        for name, value in vars(_conventions).items()
        if name.endswith("_STEP") and isinstance(value, str)
    }
    generic = {"step.failed", "step.timed_out", "step.crashed", "run.ready", "run.failed"}
    engine_codes = (set(ENGINE.code_rules()) - generic) - {"run.interrupted"}
    # Distinctive text of the engine's messages and of the errors it raises.
    sentences = ("Selected backend", "No valid", "FlashInfer", "NVSwitch")
    names = ("zentorch", "flashinfer", "vllm", "mnnvl", "trtllm")
    sources = sorted([*(ROOT / "events").glob("*.py"), *(ROOT / "exporters").glob("*.py")])
    assert len(sources) > 20
    found: list[str] = []
    for path in sources:
        text = path.read_text(encoding="utf-8")
        found.extend(f"{path.name}: step {v!r}" for v in _literals(path) if v in steps)
        found.extend(f"{path.name}: code {code!r}" for code in engine_codes if code in text)
        found.extend(f"{path.name}: text {t!r}" for t in sentences if t in text)
        found.extend(f"{path.name}: name {n!r}" for n in names if n in text.lower())
    assert found == []


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
    return found


def test_the_engine_slice_modules_import_only_events_and_each_other() -> None:
    pure = {"._conventions", "._messages", "._slice"}
    allowed_third_party = {"attrs", "events"}
    for name in sorted(pure):
        path = ROOT / "orchestrator" / "engine" / f"{name[1:]}.py"
        for module in _imports(path):
            top = module.split(".")[0]
            assert (
                module in pure
                or top in allowed_third_party
                or top in sys.stdlib_module_names
                or module == "__future__"
            ), f"{path.name} imports {module}"

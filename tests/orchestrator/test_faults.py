"""Fault plans: parsing, JSON, rank filtering, the injecting importer, and
faults firing on probes and step paths."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

import orchestrator
from events import (
    JsonValue,
    MemoryLog,
    Outcome,
    StallReason,
    StepStalled,
    StepTimedOut,
    StepUnavailable,
)
from orchestrator import (
    Candidate,
    Fault,
    FaultAction,
    FaultPlan,
    FaultSpecError,
    Graph,
    InjectingImporter,
    RankRanges,
    RealImporter,
    Step,
    StepContext,
)
from orchestrator._identity import identity_from_environment

from .harness import DEADLINE_S, assert_log_contract, new_log, of_type, only

# Parsing -----------------------------------------------------------------------------


def test_a_message_may_contain_colons() -> None:
    (fault,) = FaultPlan.parse(["zentorch=OSError:libzentorch.so: undefined symbol: x"]).faults
    assert fault == Fault(
        target="zentorch",
        action=FaultAction.RAISE,
        exception="OSError",
        args=("libzentorch.so: undefined symbol: x",),
        ranks=None,
    )
    error = fault.make_exception()
    assert type(error) is OSError
    assert str(error) == "libzentorch.so: undefined symbol: x"


def test_a_rank_prefix_and_a_dotted_module() -> None:
    (fault,) = FaultPlan.parse(
        ["3:flashinfer.comm=TypeError:type 'array.array' is not subscriptable"]
    ).faults
    assert fault.target == "flashinfer.comm"
    assert fault.ranks == RankRanges.parse("3")
    assert set(fault.ranks) == {3}
    error = fault.make_exception()
    assert type(error) is TypeError
    assert str(error) == "type 'array.array' is not subscriptable"


def test_a_rank_range_and_a_hang_on_a_step_path() -> None:
    (fault,) = FaultPlan.parse(["0-3:attention/FLASH_ATTN=hang"]).faults
    assert fault.target == "attention/FLASH_ATTN"
    assert fault.action is FaultAction.HANG
    assert fault.exception is None
    assert fault.ranks == RankRanges(((0, 3),))


def test_a_rank_list_and_a_crash() -> None:
    (fault,) = FaultPlan.parse(["1,5:platform/cuda=crash"]).faults
    assert fault.action is FaultAction.CRASH
    assert fault.ranks == RankRanges(((1, 1), (5, 5)))


def test_an_exception_without_a_message() -> None:
    (fault,) = FaultPlan.parse(["flash_attn=ImportError"]).faults
    error = fault.make_exception()
    assert type(error) is ImportError
    assert error.name == "flash_attn"


def test_module_not_found_without_a_message_names_the_module() -> None:
    (fault,) = FaultPlan.parse(["zentorch=ModuleNotFoundError"]).faults
    error = fault.make_exception()
    assert type(error) is ModuleNotFoundError
    assert str(error) == "No module named 'zentorch'"
    assert error.name == "zentorch"


def test_module_not_found_keeps_the_message_it_is_given() -> None:
    (fault,) = FaultPlan.parse(
        ["zentorch=ModuleNotFoundError:No module named 'zentorch._C'"]
    ).faults
    error = fault.make_exception()
    assert type(error) is ModuleNotFoundError
    assert str(error) == "No module named 'zentorch._C'"
    assert error.name == "zentorch"


@pytest.mark.parametrize(
    ("text", "ranks"),
    [("3", {3}), ("0-3", {0, 1, 2, 3}), ("1,5", {1, 5}), ("0-1, 6-7", {0, 1, 6, 7}), ("2-2", {2})],
)
def test_rank_sets(text: str, ranks: set[int]) -> None:
    assert frozenset(RankRanges.parse(text)) == frozenset(ranks)


def test_structured_arguments_from_json() -> None:
    plan = FaultPlan.from_json(
        [
            {
                "target": "flashinfer",
                "exception": "PermissionError",
                "args": [13, "Permission denied", "/root/.cache/flashinfer"],
                "ranks": "0-3",
            },
            {"target": "zentorch", "exception": "ModuleNotFoundError"},
        ]
    )
    permission = plan.faults[0].make_exception()
    assert type(permission) is PermissionError
    assert str(permission) == "[Errno 13] Permission denied: '/root/.cache/flashinfer'"
    assert permission.errno == 13
    assert permission.filename == "/root/.cache/flashinfer"
    assert plan.faults[0].ranks == RankRanges.of(range(4))
    assert str(plan.faults[1].make_exception()) == "No module named 'zentorch'"


def test_a_plan_survives_its_json_form() -> None:
    plan = FaultPlan.parse(
        [
            "zentorch=OSError:libzentorch.so: undefined symbol: x",
            "0-3:attention/FLASH_ATTN=hang",
            "1,5:platform/cuda=crash",
        ]
    ) + FaultPlan.from_json(
        [{"target": "flashinfer", "exception": "ImportError", "kwargs": {"name": "flashinfer"}}]
    )
    assert FaultPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_a_fault_file_is_loaded(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    path.write_text(json.dumps({"faults": [{"target": "zentorch", "exception": "hang"}]}))
    assert FaultPlan.load(path).faults[0].action is FaultAction.HANG


# Malformed specs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "part", "reason"),
    [
        ("zentorch", "zentorch", "expected [RANKS:]TARGET=EXCEPTION"),
        ("zentorch=OsError:x", "OsError", "did you mean OSError"),
        ("zentorch=PermissionErr", "PermissionErr", "did you mean PermissionError"),
        ("zentorch=Boom", "Boom", "expected hang, crash or a builtin exception class name"),
        ("x:zentorch=OSError", "x", "ranks are like 3, 0-3 or 1,5"),
        ("-1:zentorch=OSError", "-1", "ranks are like"),
        ("3-1:zentorch=OSError", "3-1", "must not run backwards"),
        ("zentorch=hang:forever", "hang:forever", "hang takes no message"),
        ("zentorch=crash:now", "crash:now", "crash takes no message"),
        ("=OSError", "<empty target>", "the target is a module name"),
        ("zen torch=OSError", "zen torch", "the target is a module name"),
    ],
)
def test_malformed_specs_name_the_bad_part(spec: str, part: str, reason: str) -> None:
    with pytest.raises(FaultSpecError) as raised:
        FaultPlan.parse([spec])
    assert raised.value.spec == spec
    assert raised.value.part == part
    assert reason in raised.value.reason
    assert isinstance(raised.value, ValueError)


def test_one_spec_given_as_a_string_is_named_not_split_into_letters() -> None:
    with pytest.raises(TypeError, match=r"pass a list of specs: \['zentorch=OSError'\]"):
        FaultPlan.parse("zentorch=OSError")


@pytest.mark.parametrize(
    ("data", "part"),
    [
        ({"target": "x"}, "<top level>"),
        (["zentorch=OSError"], "entry 0"),
        ([{"target": "x", "exception": "OSError", "colour": "red"}], "entry 0: colour"),
        ([{"exception": "OSError"}], "entry 0: target"),
        ([{"target": "zen torch", "exception": "OSError"}], "zen torch"),
        ([{"target": "", "exception": "OSError"}], "<empty target>"),
        ([{"target": "x", "exception": 3}], "entry 0: exception"),
        ([{"target": "x", "exception": "OSError", "args": [[1]]}], "entry 0: args[0]"),
        ([{"target": "x", "exception": "OSError", "kwargs": {"name": "x"}}], "entry 0: kwargs"),
        ([{"target": "x", "exception": "OSError", "ranks": [-1]}], "entry 0: ranks"),
        ([{"target": "x", "exception": "OSError", "ranks": [True]}], "entry 0: ranks"),
        ([{"target": "x", "exception": "UnicodeDecodeError", "args": ["x"]}], "entry 0: args"),
        ([{"target": "x", "exception": "hang", "args": ["forever"]}], "entry 0: args"),
        ([{"target": "x", "exception": "crash", "args": [11]}], "entry 0: args"),
        (
            [{"target": "x", "exception": "ImportError", "kwargs": {"msg": "x"}}],
            "entry 0: kwargs",
        ),
    ],
)
def test_malformed_json_names_the_bad_entry_and_field(data: Any, part: str) -> None:
    with pytest.raises(FaultSpecError) as raised:
        FaultPlan.from_json(data)
    assert raised.value.part == part


def test_a_fault_file_is_read_as_strictly_as_an_event() -> None:
    with pytest.raises(FaultSpecError) as unknown:
        FaultPlan.from_json([{"target": "x", "exception": "OSError", "colour": "red"}])
    with pytest.raises(FaultSpecError) as mistyped:
        FaultPlan.from_json([{"target": "x", "exception": "ImportError", "kwargs": {"name": 3}}])

    assert unknown.value.reason == (
        "field 'colour' is not a field of FaultEntry"
        " (valid: args, exception, kwargs, ranks, target)"
    )
    assert mistyped.value.part == "entry 0: kwargs['name']"
    assert mistyped.value.reason == "expected a string, got integer 3"


def test_a_fault_file_that_is_not_json_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    path.write_text('[\n  {"target": "zentorch",, }\n]')
    with pytest.raises(FaultSpecError) as raised:
        FaultPlan.load(path)
    assert raised.value.spec == str(path)
    assert raised.value.part == str(path)
    assert raised.value.reason == (
        "not valid JSON at line 2 column 25: unexpected character, expected a string key"
    )


def test_a_missing_fault_file_is_a_fault_spec_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.json"
    with pytest.raises(FaultSpecError) as raised:
        FaultPlan.load(path)
    assert raised.value.spec == str(path)
    assert raised.value.part == str(path)
    assert raised.value.reason == "cannot read: No such file or directory"


@pytest.mark.parametrize(
    ("spec", "part", "reason"),
    [
        (
            "zentorch=UnicodeDecodeError:typo",
            "UnicodeDecodeError:typo",
            "UnicodeDecodeError('typo'): function takes exactly 5 arguments (1 given)",
        ),
        (
            "2:flashinfer=UnicodeEncodeError",
            "UnicodeEncodeError",
            "UnicodeEncodeError(): function takes exactly 5 arguments (0 given)",
        ),
    ],
)
def test_an_exception_that_cannot_be_built_is_refused_when_parsed(
    spec: str, part: str, reason: str
) -> None:
    with pytest.raises(FaultSpecError) as raised:
        FaultPlan.parse([spec])
    assert raised.value.spec == spec
    assert raised.value.part == part
    assert raised.value.reason == reason
    assert isinstance(raised.value.__cause__, TypeError)


def test_json_and_command_line_refuse_the_same_construction_error() -> None:
    with pytest.raises(FaultSpecError) as from_json:
        FaultPlan.from_json(
            [{"target": "zentorch", "exception": "UnicodeDecodeError", "args": ["typo"]}]
        )
    with pytest.raises(FaultSpecError) as from_spec:
        FaultPlan.parse(["zentorch=UnicodeDecodeError:typo"])
    assert from_json.value.part == "entry 0: args"
    assert from_json.value.reason == from_spec.value.reason


# Rank ranges ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "spans", "canonical"),
    [
        ("3", ((3, 3),), "3"),
        ("0-3", ((0, 3),), "0-3"),
        ("1,5", ((1, 1), (5, 5)), "1,5"),
        ("0-1, 6-7", ((0, 1), (6, 7)), "0-1,6-7"),
        ("0-1,2-3", ((0, 3),), "0-3"),
        ("5,0-2,1,3", ((0, 3), (5, 5)), "0-3,5"),
        ("4-9,2-6", ((2, 9),), "2-9"),
    ],
)
def test_rank_ranges_are_merged_and_print_as_spec_text(
    text: str, spans: tuple[tuple[int, int], ...], canonical: str
) -> None:
    ranks = RankRanges.parse(text)
    assert ranks.spans == spans
    assert str(ranks) == canonical
    assert RankRanges.parse(canonical) == ranks
    assert frozenset(ranks) == frozenset(RankRanges.parse(text))
    assert len(ranks) == len(frozenset(RankRanges.parse(text)))


def test_ranges_given_directly_are_normalised_and_checked() -> None:
    assert RankRanges(((5, 6), (0, 1), (2, 2), (1, 1))) == RankRanges.parse("0-2,5-6")
    assert RankRanges(()).spans == ()
    with pytest.raises(ValueError, match="runs backwards"):
        RankRanges(((3, 1),))
    with pytest.raises(ValueError, match="non-negative"):
        RankRanges(((-1, 2),))


def test_membership_is_answered_by_range() -> None:
    ranks = RankRanges.parse("2-4,8,10-11")
    inside = {r for r in range(-2, 15) if r in ranks}
    assert inside == {2, 3, 4, 8, 10, 11}
    assert "3" not in ranks
    assert list(ranks) == [2, 3, 4, 8, 10, 11]


def test_a_huge_rank_range_stays_one_range() -> None:
    (fault,) = FaultPlan.parse(["0-999999999:zentorch=RuntimeError:x"]).faults
    assert fault.ranks is not None
    assert fault.ranks.spans == ((0, 999_999_999),)
    assert fault.applies_to(999_999_999)
    assert not fault.applies_to(1_000_000_000)
    assert len(fault.ranks) == 1_000_000_000
    assert fault.to_json()["ranks"] == "0-999999999"
    assert FaultPlan.from_json([fault.to_json()]).faults[0] == fault


def test_a_fault_takes_ranks_as_text_ranges_or_any_iterable() -> None:
    expected = RankRanges(((0, 1), (5, 5)))
    assert Fault(target="t", exception="OSError", ranks="0-1,5").ranks == expected
    assert Fault(target="t", exception="OSError", ranks=frozenset({5, 1, 0})).ranks == expected
    assert Fault(target="t", exception="OSError", ranks=[0, 1, 5, 5]).ranks == expected
    assert Fault(target="t", exception="OSError", ranks=expected).ranks is expected
    assert Fault(target="t", exception="OSError").ranks is None
    with pytest.raises(ValueError, match="non-negative"):
        RankRanges.of([-1])


def test_json_rank_lists_become_ranges() -> None:
    (fault,) = FaultPlan.from_json(
        [{"target": "zentorch", "exception": "OSError", "ranks": [7, 0, 1, 2]}]
    ).faults
    assert fault.ranks == RankRanges(((0, 2), (7, 7)))


# Describing a fault ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        "1:zentorch=RuntimeError:unknown zentorch failure",
        "attention/FLASH_ATTN=hang",
        "0-3,7:platform/cuda=crash",
        "zentorch=OSError:libzentorch.so: undefined symbol: x",
        "flash_attn=ImportError",
        "zentorch=OSError:",
    ],
)
def test_a_command_line_fault_describes_itself_as_its_spec(spec: str) -> None:
    (fault,) = FaultPlan.parse([spec]).faults
    assert fault.describe() == spec
    assert str(fault) == spec
    assert FaultPlan.parse([fault.describe()]).faults == (fault,)


def test_the_description_is_canonical() -> None:
    (fault,) = FaultPlan.parse(["5, 0-1,2-3:zentorch=OSError:x"]).faults
    assert fault.describe() == "0-3,5:zentorch=OSError:x"


@pytest.mark.parametrize(
    ("entry", "described"),
    [
        (
            {
                "target": "flashinfer",
                "exception": "PermissionError",
                "args": [13, "Permission denied", "/root/.cache/flashinfer"],
                "ranks": "0-3",
            },
            "0-3:flashinfer=PermissionError(13, 'Permission denied', '/root/.cache/flashinfer')",
        ),
        (
            {"target": "flashinfer", "exception": "ImportError", "kwargs": {"name": "flashinfer"}},
            "flashinfer=ImportError(name='flashinfer')",
        ),
        (
            {"target": "zentorch", "exception": "OSError", "args": ["two\nlines"]},
            "zentorch=OSError('two\\nlines')",
        ),
        ({"target": "zentorch", "exception": "SystemExit", "args": [3]}, "zentorch=SystemExit(3)"),
        (
            {
                "target": "flashinfer",
                "exception": "ImportError",
                "args": ["broken build"],
                "kwargs": {"name": "flashinfer.comm"},
            },
            "flashinfer=ImportError('broken build', name='flashinfer.comm')",
        ),
        (
            {"target": "zentorch", "exception": "RuntimeError", "args": ["first", "second"]},
            "zentorch=RuntimeError('first', 'second')",
        ),
    ],
)
def test_structured_arguments_are_described_as_a_call(
    entry: dict[str, Any], described: str
) -> None:
    (fault,) = FaultPlan.from_json([entry]).faults
    assert fault.describe() == described
    assert "\n" not in fault.describe()


# Checking a plan against a launch --------------------------------------------------------

TARGETS = (
    "zentorch",
    "flashinfer.comm",
    "torch",
    "platform",
    "platform/cpu",
    "attention/FLASH_ATTN",
    "allreduce_workspace/quant",
)


def check(specs: list[str], *, world_size: int = 2) -> FaultSpecError:
    with pytest.raises(FaultSpecError) as raised:
        FaultPlan.parse(specs).check(world_size=world_size, targets=TARGETS)
    return raised.value


def test_a_plan_within_the_world_and_the_graph_passes() -> None:
    FaultPlan.parse(
        [
            "1:zentorch=RuntimeError:x",
            "0-1:attention/FLASH_ATTN=hang",
            "flashinfer.comm=TypeError:y",
            "platform/cpu=crash",
        ]
    ).check(world_size=2, targets=TARGETS)
    FaultPlan().check(world_size=1, targets=())


@pytest.mark.parametrize(
    ("spec", "world_size", "part", "reason"),
    [
        ("5:zentorch=RuntimeError:x", 2, "5", "rank 5 is outside the world of 2 ranks (0-1)"),
        ("0-3:zentorch=hang", 2, "0-3", "rank 2 is outside the world of 2 ranks (0-1)"),
        ("0,4-6:zentorch=hang", 4, "0,4-6", "rank 4 is outside the world of 4 ranks (0-3)"),
        ("1:zentorch=hang", 1, "1", "rank 1 is outside the world of 1 rank (0)"),
        (
            "0-999999999:zentorch=hang",
            8,
            "0-999999999",
            "rank 8 is outside the world of 8 ranks (0-7)",
        ),
    ],
)
def test_a_rank_outside_the_world_is_refused(
    spec: str, world_size: int, part: str, reason: str
) -> None:
    error = check([spec], world_size=world_size)
    assert error.spec == spec
    assert error.part == part
    assert error.reason == reason


def test_an_unknown_target_names_the_valid_ones_and_a_close_match() -> None:
    error = check(["zentorhc=RuntimeError:typo"])
    assert error.spec == "zentorhc=RuntimeError:typo"
    assert error.part == "zentorhc"
    assert error.reason == (
        "unknown target 'zentorhc' (did you mean zentorch?); valid targets: "
        + ", ".join(sorted(TARGETS))
    )


@pytest.mark.parametrize(
    ("target", "suggestion"),
    [
        ("attention/flash_attn", "attention/FLASH_ATTN"),
        ("attention/FLASH_ATN", "attention/FLASH_ATTN"),
        ("allreduce_workspace/qaunt", "allreduce_workspace/quant"),
        ("flashinfer.com", "flashinfer.comm"),
    ],
)
def test_close_matches_ignore_case(target: str, suggestion: str) -> None:
    assert f"(did you mean {suggestion}?)" in check([f"{target}=OSError"]).reason


def test_an_unknown_target_with_nothing_close_has_no_suggestion() -> None:
    reason = check(["numpy=OSError"]).reason
    assert reason.startswith("unknown target 'numpy'; valid targets: ")


def test_a_graph_without_targets_says_there_are_none() -> None:
    with pytest.raises(FaultSpecError) as raised:
        FaultPlan.parse(["zentorch=OSError"]).check(world_size=1, targets=())
    assert raised.value.reason == "unknown target 'zentorch'; valid targets: none"


def test_a_package_of_a_known_module_is_a_target_but_a_submodule_is_not() -> None:
    # A fault on flashinfer breaks the import of flashinfer.comm ...
    FaultPlan.parse(["flashinfer=OSError"]).check(world_size=1, targets=TARGETS)
    # ... but nothing imports torch.cuda, so a fault on it would never fire.
    assert check(["torch.cuda=OSError"]).part == "torch.cuda"
    # Step paths are matched whole: a prefix names no step.
    assert check(["attention=hang"]).part == "attention"
    assert check(["platform/cp=hang"]).part == "platform/cp"


def test_a_step_path_is_no_package_of_a_step_whose_name_has_a_dot() -> None:
    # Only a module's packages are imported before it; a step path names one step.
    with pytest.raises(FaultSpecError) as raised:
        FaultPlan.parse(["load/model=hang"]).check(world_size=1, targets={"load/model.v2"})
    assert raised.value.part == "load/model"


def test_the_first_bad_fault_is_reported() -> None:
    error = check(["zentorch=OSError", "7:torch=OSError", "nothing=OSError"])
    assert error.spec == "7:torch=OSError"


def test_a_world_must_have_a_rank() -> None:
    with pytest.raises(ValueError, match="world_size must be at least 1"):
        FaultPlan().check(world_size=0, targets=TARGETS)


# Ranks and the injecting importer -----------------------------------------------------


def test_faults_apply_only_on_their_ranks() -> None:
    plan = FaultPlan.parse(["1,5:flashinfer=OSError:rank-local", "flashinfer=ImportError:all"])
    assert plan.for_target("flashinfer", 1) == plan.faults[0]
    assert plan.for_target("flashinfer", 5) == plan.faults[0]
    assert plan.for_target("flashinfer", 2) == plan.faults[1]
    assert plan.for_target("zentorch", 1) is None
    assert plan.targets(0) == frozenset({"flashinfer"})
    assert FaultPlan.parse(["3:zentorch=OSError"]).targets(0) == frozenset()


def test_the_injecting_importer_makes_faulted_modules_findable_and_failing() -> None:
    plan = FaultPlan.parse(["3:flashinfer.comm=OSError:libnccl.so: cannot open", "zentorch=hang"])
    importer = InjectingImporter(RealImporter(), plan, rank=3)

    assert importer.find_spec("flashinfer.comm") is not None
    assert importer.find_spec("flashinfer") is not None  # its parent package, too
    assert importer.find_spec("zentorch") is not None
    assert importer.find_spec("surely_not_installed_anywhere") is None
    assert importer.find_spec("json") is not None
    with pytest.raises(OSError, match=re.escape("libnccl.so: cannot open")):
        importer.import_module("flashinfer.comm")
    assert importer.import_module("json").__name__ == "json"

    other_rank = InjectingImporter(RealImporter(), plan, rank=0)
    assert other_rank.find_spec("flashinfer.comm") is None
    with pytest.raises(ModuleNotFoundError):
        other_rank.import_module("flashinfer.comm")


def test_a_fault_on_a_package_breaks_the_import_of_its_modules() -> None:
    plan = FaultPlan.parse(["flashinfer=OSError:libcuda.so.1: cannot open shared object file"])
    importer = InjectingImporter(RealImporter(), plan, rank=0)
    message = "libcuda.so.1: cannot open shared object file"
    with pytest.raises(OSError, match=f"^{re.escape(message)}$") as raised:
        importer.import_module("flashinfer.comm")
    assert type(raised.value) is OSError


# Faults during a run -----------------------------------------------------------------


def import_probe(module: str) -> Any:
    def probe(ctx: StepContext) -> list[str]:
        ctx.import_module(module)
        return []

    return probe


def attention(first: str, second: str) -> Step:
    """An attention step whose candidates import ``first`` and ``second``."""

    async def select(ctx: StepContext) -> JsonValue:
        candidates = [
            Candidate(name="FLASH_ATTN", priority=0, probe=import_probe(first)),
            Candidate(name="FLASHINFER", priority=1, probe=import_probe(second)),
        ]
        return (await orchestrator.select_candidate(ctx, candidates)).selected

    return Step(name="attention", body=select)


async def run(graph: Graph, log: MemoryLog, **options: Any) -> orchestrator.RunResult:
    with anyio.fail_after(DEADLINE_S):
        return await orchestrator.run(graph, log, **options)


@pytest.mark.anyio
async def test_an_import_fault_fires_in_the_probe_on_the_faulted_rank_only() -> None:
    plan = FaultPlan.parse(["1:json=PermissionError:/root/.cache/flashinfer"])
    graph = Graph("g", [attention("json", "os")])

    rank0 = MemoryLog("run-ranks", 0)
    rank1 = MemoryLog("run-ranks", 1)
    identity1 = identity_from_environment({}, rank=1, world_size=2)
    result0 = await run(graph, rank0, faults=plan)
    result1 = await run(graph, rank1, faults=plan, identity=identity1)

    assert result0["attention"].value == "FLASH_ATTN"
    assert not of_type(rank0, StepUnavailable)
    assert result1["attention"].value == "FLASHINFER"
    assert only(rank1, StepUnavailable, "attention/FLASH_ATTN").reasons == (
        "PermissionError: /root/.cache/flashinfer",
    )
    assert_log_contract(rank0)
    assert_log_contract(rank1)


@pytest.mark.anyio
async def test_a_step_path_fault_fires_on_the_faulted_rank_only() -> None:
    plan = FaultPlan.parse(["1:attention=OSError:injected on rank 1"])
    graph = Graph("g", [attention("json", "os")])

    rank0 = MemoryLog("run-ranks", 0)
    rank1 = MemoryLog("run-ranks", 1)
    identity1 = identity_from_environment({}, rank=1, world_size=2)
    result0 = await run(graph, rank0, faults=plan)
    result1 = await run(graph, rank1, faults=plan, identity=identity1)

    assert result0["attention"].value == "FLASH_ATTN"
    assert not of_type(rank0, StepUnavailable)
    assert result1["attention"].outcome is Outcome.UNAVAILABLE
    assert only(rank1, StepUnavailable, "attention").reasons == ("OSError: injected on rank 1",)


@pytest.mark.anyio
async def test_a_step_path_fault_fires_on_the_step() -> None:
    plan = FaultPlan.parse(["attention/FLASH_ATTN=OSError:injected on the step"])
    log = new_log()

    with pytest.raises(ValueError, match="No valid backend"):
        await run(
            Graph("g", [attention("json", "surely_not_installed_anywhere")]), log, faults=plan
        )

    assert only(log, StepUnavailable, "attention/FLASH_ATTN").reasons == (
        "OSError: injected on the step",
    )
    assert only(log, StepUnavailable, "attention/FLASHINFER").reasons == (
        "ModuleNotFoundError: No module named 'surely_not_installed_anywhere'",
    )


@pytest.mark.anyio
async def test_a_step_path_hang_times_out() -> None:
    plan = FaultPlan.parse(["0-3:platform/cuda=hang"])

    async def never_called(ctx: StepContext) -> JsonValue:
        raise AssertionError("the fault replaces the body")

    log = new_log()
    result = await run(
        Graph("g", [Step(name="platform/cuda", body=never_called, timeout=0.05)]), log, faults=plan
    )

    assert result["platform/cuda"].outcome is Outcome.TIMED_OUT
    assert only(log, StepTimedOut, "platform/cuda").timeout_s == 0.05


@pytest.mark.anyio
async def test_an_injected_hang_is_never_released_and_is_recorded_where_it_waits() -> None:
    importer = InjectingImporter(RealImporter(), FaultPlan.parse(["zentorch=hang"]), rank=0)
    returned = threading.Event()

    def probe_zentorch(ctx: StepContext) -> JsonValue:
        try:
            ctx.import_module("zentorch")
        finally:
            returned.set()
        return None  # pragma: no cover

    log = new_log()
    with anyio.fail_after(DEADLINE_S):
        result = await orchestrator.run(
            Graph("g", [Step(name="zentorch", body=probe_zentorch, timeout=0.05)]),
            log,
            importer=importer,
        )
    assert result["zentorch"].outcome is Outcome.TIMED_OUT

    # As a real hang: the run's end does not release it. Its thread is a
    # daemon, abandoned where it waits, and the log says where that is.
    assert not returned.is_set()
    abandoned = [t for t in threading.enumerate() if t.name == "step zentorch"]
    assert abandoned
    assert all(t.daemon for t in abandoned)
    stall = only(log, StepStalled, "zentorch")
    assert stall.why is StallReason.TIMED_OUT
    names = [frame.name for frame in stall.threads[0].frames]
    assert names[-1] == "wait"
    assert "fire" in names
    assert "probe_zentorch" in names

"""The views and ``validate`` read several run directories of one run (one
per node, copied side by side) as one run: a rank log found in several is
read once when the copies are the same log, and two different logs of one
rank are a clear error."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from .conftest import StoredRun
from .harness import call_cli

pytestmark = pytest.mark.slow


def _split(run: StoredRun, tmp_path: Path) -> tuple[Path, Path]:
    """The 8-rank run as two nodes' directories: ranks 0-4 and ranks 3-7
    (ranks 3 and 4 in both, as node 0's collected copies and node 1's own)."""
    nodes = (tmp_path / "node0", tmp_path / "node1")
    for node, ranks in zip(nodes, (range(5), range(3, 8)), strict=True):
        node.mkdir()
        shutil.copy(run.directory / ".run-id", node)
        for rank in ranks:
            shutil.copy(run.directory / f"rank-{rank}.jsonl", node)
    return nodes


def test_the_directories_of_the_nodes_replay_as_one_run(
    eight_ranks: StoredRun, tmp_path: Path
) -> None:
    _split(eight_ranks, tmp_path)
    # Node 1's copy of rank 4 stops short (copied mid-write): the longer is read.
    copy = tmp_path / "node1" / "rank-4.jsonl"
    lines = copy.read_bytes().splitlines(keepends=True)
    copy.write_bytes(b"".join(lines[: len(lines) // 2]))

    # The same logs in one directory (without the launcher's manifest,
    # which the nodes' directories do not have).
    shutil.copytree(eight_ranks.directory, tmp_path / "whole")
    (tmp_path / "whole" / "manifest.json").unlink()
    whole = call_cli("replay", "--json", "whole", cwd=tmp_path).json()
    together = call_cli("replay", "--json", "node1", "node0", cwd=tmp_path)
    assert together.returncode == 0, together.describe()
    assert together.json() == whole
    explained = call_cli("explain", "node0", "node1", cwd=tmp_path)
    assert explained.returncode == 0, explained.describe()
    assert explained.lines()[0].startswith("Startup ready: 8 ready"), explained.describe()
    validated = call_cli("validate", "node0", "node1", cwd=tmp_path)
    assert validated.returncode == 0, validated.describe()
    assert validated.lines()[-1] == "2 path(s), 8 file(s), 0 problem(s)"
    page = call_cli("replay", "node0", "node1", "--html", "run.html", cwd=tmp_path)
    assert page.returncode == 0, page.describe()
    assert "Ranks (1 lane for 8 ranks)" in (tmp_path / "run.html").read_text(encoding="utf-8")
    # Either directory alone is an incomplete run.
    alone = call_cli("replay", "--json", "node1", cwd=tmp_path)
    assert alone.json()["outcome"] == "incomplete"


def test_two_different_logs_of_one_rank_are_an_error(
    eight_ranks: StoredRun, tmp_path: Path
) -> None:
    _split(eight_ranks, tmp_path)
    changed = tmp_path / "node1" / "rank-3.jsonl"
    changed.write_bytes(changed.read_bytes().replace(b'"rank":3,"seq":0', b'"rank":3,"seq":0 '))

    replayed = call_cli("replay", "node0", "node1", cwd=tmp_path)
    assert replayed.returncode == 1, replayed.describe()
    assert (
        "rank 3 has two different logs, node0/rank-3.jsonl and node1/rank-3.jsonl "
        "(neither is a copy or a prefix of the other)"
    ) in replayed.stderr, replayed.describe()
    validated = call_cli("validate", "node0", "node1", cwd=tmp_path)
    assert validated.returncode == 1, validated.describe()
    assert "rank 3 has two different logs" in validated.stdout, validated.describe()


def test_diff_compares_two_multi_node_runs(eight_ranks: StoredRun, tmp_path: Path) -> None:
    _split(eight_ranks, tmp_path)
    # The same start again under another run id, in its nodes' directories.
    run_id = eight_ranks.directory.name
    for node in ("node0", "node1"):
        again = tmp_path / "again" / node
        again.mkdir(parents=True)
        for path in (tmp_path / node).iterdir():
            text = path.read_text(encoding="utf-8").replace(run_id, "run-again")
            (again / path.name).write_text(text, encoding="utf-8")

    same = call_cli("diff", "node0", "node1", "again/node1", "again/node0", cwd=tmp_path)
    assert same.returncode == 0, same.describe()
    # Without its node 1, the second run is incomplete: they differ.
    differ = call_cli("diff", "node0", "node1", "again/node0", cwd=tmp_path)
    assert differ.returncode == 1, differ.describe()
    assert "node0 node1" in differ.stdout, differ.describe()
    assert "incomplete" in differ.stdout, differ.describe()
    one_run = call_cli("diff", "node0", "node1", "node0", cwd=tmp_path)
    assert one_run.returncode == 2, one_run.describe()
    assert "diff compares two runs; the paths hold 1" in one_run.stderr, one_run.describe()


def test_a_fifo_beside_a_copy_of_its_rank_is_reported_not_read(
    eight_ranks: StoredRun, tmp_path: Path
) -> None:
    node0, _ = _split(eight_ranks, tmp_path)
    fifo = node0 / "rank-3.jsonl"
    fifo.unlink()
    os.mkfifo(fifo)

    validated = call_cli("validate", "node0", "node1", cwd=tmp_path)
    assert validated.returncode == 1, validated.describe()
    assert "node0/rank-3.jsonl: is not a regular file; it was not read" in validated.stdout
    # Node 1's copy of rank 3 is checked instead.
    assert "node1/rank-3.jsonl: ok" in validated.stdout, validated.describe()

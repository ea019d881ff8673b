"""A rank log found in two places (node 0's collected copy and the node's
own) is read once, and of a copy cut short and the whole log, the whole
log is read, whichever path is named first."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .conftest import StoredRun
from .harness import call_cli, rank_logs


@pytest.mark.parametrize("order", [("short", "whole"), ("whole", "short")], ids="-then-".join)
def test_the_whole_copy_of_a_rank_log_is_read_not_one_cut_short(
    healthy: StoredRun, tmp_path: Path, order: tuple[str, str]
) -> None:
    (log,) = rank_logs(healthy.directory)
    for name in ("short", "whole"):
        (tmp_path / name).mkdir()
        shutil.copy(log, tmp_path / name)
    # Copied mid-write: the first half of its lines.
    cut = tmp_path / "short" / log.name
    lines = cut.read_bytes().splitlines(keepends=True)
    cut.write_bytes(b"".join(lines[: len(lines) // 2]))

    replayed = call_cli("replay", "--json", *order, cwd=tmp_path)
    assert replayed.returncode == 0, replayed.describe()
    document = replayed.json()
    assert document["outcome"] == "ready"
    assert [rank["log"] for rank in document["ranks"]] == ["complete"]

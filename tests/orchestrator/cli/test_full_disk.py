"""A full disk is named as the cause, never called a crash: a run whose log
the disk refuses says "cannot write ...: No space left on device", exits 1
and leaves no temporary file behind. The disk is a real one, a small tmpfs
(mounting one needs root; elsewhere the tests are skipped)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import LAUNCH_TIMEOUT_S, run_cli

pytestmark = pytest.mark.slow

NO_SPACE = "No space left on device; the run's record ends where the write failed"


@pytest.fixture
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A file system of a few pages (``request.param`` KiB): room for a
    run's claim and a few events."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={request.param}k", "tmpfs", str(disk)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.parametrize("small_disk", [8], indirect=True)
def test_a_single_run_on_a_full_disk_names_it(small_disk: Path, tmp_path: Path) -> None:
    completed = run_cli(
        "run", "--simulate", "h200x8", "--run-dir", str(small_disk / "r"), cwd=tmp_path
    )
    assert completed.returncode == 1, completed.describe()
    assert f"error: cannot write {small_disk / 'r' / 'rank-0.jsonl'}: {NO_SPACE}" in (
        completed.stderr
    )
    assert "crashed or was killed" not in completed.stdout + completed.stderr
    assert not [p for p in (small_disk / "r").iterdir() if p.name.startswith(".manifest")]


@pytest.mark.parametrize("small_disk", [16], indirect=True)
def test_a_launch_on_a_full_disk_names_it_and_leaves_no_litter(
    small_disk: Path, tmp_path: Path
) -> None:
    run = small_disk / "r"
    completed = run_cli(
        "run", "--simulate", "h200x8", "--nproc", "2", "--grace", "2", "--group-timeout", "10",
        "--run-dir", str(run), cwd=tmp_path, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip
    assert completed.returncode == 1, completed.describe()
    assert NO_SPACE in completed.stderr
    assert "crashed or was killed" not in completed.stdout + completed.stderr
    names = sorted(path.name for path in run.iterdir())
    assert all(not name.startswith(".manifest.json.") for name in names), names


@pytest.mark.parametrize("small_disk", [8], indirect=True)
def test_a_disk_with_no_room_for_the_first_event_names_it(small_disk: Path, tmp_path: Path) -> None:
    # Room for the run's claim, none for its first event: nothing is recorded.
    (small_disk / "filler").write_bytes(bytes(4096))
    completed = run_cli(
        "run", "--simulate", "h200x8", "--run-dir", str(small_disk / "r"), cwd=tmp_path
    )
    assert completed.returncode == 2, completed.describe()
    log = small_disk / "r" / "rank-0.jsonl"
    assert f"error: {log}: cannot write the run directory: No space left on device" in (
        completed.stderr
    )
    assert "Traceback" not in completed.stderr
    assert not log.exists()

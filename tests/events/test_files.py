"""Files written whole or not at all (events._files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from events._files import check_writable, write_file


def test_a_file_is_written_whole_and_leaves_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    assert write_file(target, b"first") is True
    assert write_file(target, b"second") is True
    assert target.read_bytes() == b"second"
    assert os.listdir(tmp_path) == ["manifest.json"]


def test_an_exclusive_write_never_replaces_what_is_there(tmp_path: Path) -> None:
    target = tmp_path / "claim"
    assert write_file(target, b"run-1\n", exclusive=True) is True
    assert write_file(target, b"run-2\n", exclusive=True) is False
    assert target.read_bytes() == b"run-1\n"
    assert os.listdir(tmp_path) == ["claim"]


def test_a_directory_is_not_writable_and_nothing_is_left(tmp_path: Path) -> None:
    directory = tmp_path / "out"
    directory.mkdir()
    with pytest.raises(IsADirectoryError):
        check_writable(directory)
    check_writable(tmp_path / "page.html")
    assert os.listdir(tmp_path) == ["out"]

"""The documented profile format: the example file and the page's example
are what ``run --simulate`` accepts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs

from orchestrator.engine import BUILTIN_PROFILES, Profile, load_profile

from .harness import run_cli

_ROOT = Path(__file__).resolve().parents[3]
_EXAMPLE = _ROOT / "examples" / "profile-custom.json"
_PAGE = _ROOT / "docs" / "profiles.md"


def _page_json_blocks() -> list[object]:
    text = _PAGE.read_text(encoding="utf-8")
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", text, re.DOTALL)]


def test_the_example_file_sets_every_field() -> None:
    profile = load_profile(_EXAMPLE)
    document = json.loads(_EXAMPLE.read_text(encoding="utf-8"))

    # Complete: every field of the format, each with a value of its own.
    assert set(document) == {field.name for field in attrs.fields(Profile)}
    assert set(document["cpu"]) == {"vendor_id", "model_name", "flags"}
    assert set(document["gpus"]) == {"vendor", "count", "name", "capability"}
    assert {type(rule) for rule in document["modules"].values()} == {str, dict}
    assert profile.name == "l40s-x4"
    assert profile.gpus.capability == (8, 9)
    assert profile.to_json()["modules"] == document["modules"]


def test_the_page_shows_the_example_file() -> None:
    [shown] = _page_json_blocks()

    assert shown == json.loads(_EXAMPLE.read_text(encoding="utf-8"))
    assert Profile.from_json(shown, source="docs/profiles.md") == load_profile(_EXAMPLE)


def test_the_page_lists_every_field() -> None:
    text = _PAGE.read_text(encoding="utf-8")
    fields = BUILTIN_PROFILES["h200x8"].to_json()

    for field, value in fields.items():
        assert f"| `{field}` |" in text, field
        if isinstance(value, dict) and field != "modules":
            for sub in value:
                assert f"| `{field}.{sub}` |" in text, f"{field}.{sub}"


def test_run_simulates_the_example_profile(tmp_path: Path) -> None:
    completed = run_cli(
        "run", "--simulate", str(_EXAMPLE), "--json", "--run-dir", "run", cwd=tmp_path
    )

    assert completed.returncode == 0, completed.describe()
    document = completed.json()
    assert document["outcome"] == "ready"
    [rank] = document["ranks"]
    # flash_attn's import fails as the file says; the next candidate is chosen.
    assert rank["attention_backend"] == "FLASHINFER", rank

"""``replay --html`` pages as a browser shows them: headless Chromium
through Playwright.

The browser tests need the ``chromium`` executable (Debian's package;
``.ci/run`` installs it) and the ``playwright`` package (the ``test``
extra); Playwright's own browser downloads are never used. Without them the
tests skip, unless ``STARTUP_REQUIRE_BROWSER`` is set (``.ci/run`` sets it),
where they fail: continuous integration always runs them.

Each test saves a screenshot of the page under its ``tmp_path``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from events import format_ranks, replay
from exporters import report_html
from tests.exporters.html_runs import HOSTILE, rank_events, synthetic_run

from .conftest import StoredRun
from .harness import LAUNCH_TIMEOUT_S, run_cli

pytestmark = pytest.mark.slow

VIEWPORT = {"width": 1280, "height": 800}


def _missing(why: str) -> None:
    if os.environ.get("STARTUP_REQUIRE_BROWSER"):
        pytest.fail(f"{why} (STARTUP_REQUIRE_BROWSER is set)")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = shutil.which("chromium")
    if executable is None:
        _missing("no chromium on PATH (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (the test extra)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@attrs.define
class Shown:
    """A report open in the browser, and what it did while loading."""

    page: Any
    requests: list[str]
    errors: list[str]

    def lanes(self) -> list[str]:
        return [lane.get_attribute("data-ranks") for lane in self.page.query_selector_all(".lane")]

    def assert_root_cause_in_view(self) -> None:
        box = self.page.locator("#root-cause").bounding_box()
        assert box is not None
        assert box["y"] >= 0
        assert box["y"] + box["height"] <= VIEWPORT["height"], box

    def assert_quiet(self) -> None:
        assert self.errors == []
        assert self.requests == []
        assert self.page.evaluate("typeof window.pwned") == "undefined"


@pytest.fixture
def show(browser: Any, tmp_path: Path) -> Iterator[Any]:
    pages: list[Any] = []

    def open_report(path: Path, *, script: bool = True) -> Shown:
        # The page has no script of its own: it works the same without.
        page = browser.new_context(viewport=VIEWPORT, java_script_enabled=script).new_page()
        pages.append(page)
        url = path.resolve().as_uri()
        shown = Shown(page=page, requests=[], errors=[])
        page.on("request", lambda r: r.url == url or shown.requests.append(r.url))
        page.on("console", lambda m: m.type in ("error", "warning") and shown.errors.append(m.text))
        page.on("pageerror", lambda e: shown.errors.append(str(e)))
        page.goto(url)
        page.wait_for_load_state("load")
        return shown

    yield open_report
    for index, page in enumerate(pages):
        page.screenshot(path=str(tmp_path / f"report-{index}.png"), full_page=True)
        page.context.close()


def replay_html(directory: Path, cwd: Path) -> Path:
    page = cwd / "report.html"
    run_cli("replay", str(directory), "--html", str(page), cwd=cwd)
    assert page.is_file()
    return page


def test_a_healthy_eight_rank_run(eight_ranks: StoredRun, show: Any, tmp_path: Path) -> None:
    shown = show(replay_html(eight_ranks.directory, tmp_path))

    shown.assert_quiet()
    shown.assert_root_cause_in_view()
    assert shown.page.inner_text("#outcome") == "ready"
    assert "No root cause" in shown.page.inner_text("#root-cause")
    assert shown.page.inner_text("#simulated") == "h200x8"
    assert shown.lanes() == ["ranks 0-7"]
    step = shown.page.locator('.step[data-step="platform"] > summary').first
    info = shown.page.locator('.step[data-step="platform"] > .info').first
    assert not info.is_visible()
    step.click()
    assert info.is_visible()
    assert "outcome ok" in info.inner_text()


@pytest.fixture(scope="module")
def four_failed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four simulated A100 ranks; rank 2's FLASH_ATTN import fails."""
    cwd = tmp_path_factory.mktemp("four-failed")
    completed = run_cli(
        "run",
        "--simulate",
        "a100x4",
        "--nproc",
        "4",
        "--run-dir",
        "run",
        "--inject",
        "2:flash_attn=RuntimeError:bad",
        cwd=cwd,
        timeout=LAUNCH_TIMEOUT_S,
    )
    assert completed.returncode == 1, completed.describe()
    return cwd / "run"


def test_a_failed_four_rank_run(four_failed: Path, show: Any, tmp_path: Path) -> None:
    shown = show(replay_html(four_failed, tmp_path))

    shown.assert_quiet()
    shown.assert_root_cause_in_view()
    assert shown.page.inner_text("#outcome") == "failed"
    cause = shown.page.inner_text("#root-cause")
    assert "rank 2, step attention/FLASH_ATTN: RuntimeError: bad" in cause
    assert "2:flash_attn=RuntimeError:bad" in shown.page.inner_text("#injected")
    assert shown.lanes() == ["rank 2", "ranks 0-1,3"]
    # The root cause's step is open from the start.
    failed = shown.page.locator('.lane >> nth=0 >> .step.root[data-step="attention/FLASH_ATTN"]')
    info = failed.locator("> .info")
    assert info.is_visible()
    text = info.inner_text()
    assert "outcome failed" in text
    assert "RuntimeError: bad" in text
    assert "step.failed" in text


def test_a_thousand_ranks_with_hostile_text(show: Any, tmp_path: Path) -> None:
    runs = synthetic_run(1024, failing=517, message=HOSTILE)
    path = tmp_path / "report.html"
    path.write_text(report_html(replay(runs)), encoding="utf-8")
    shown = show(path)

    shown.assert_quiet()
    shown.assert_root_cause_in_view()
    assert HOSTILE in shown.page.inner_text("#root-cause")
    assert shown.lanes() == ["rank 517", "ranks 0-516,518-1023"]
    failed = shown.page.locator('.step.root[data-step="attention/FLASH_ATTN"]')
    chain = failed.locator("> .info .chain").first
    assert chain.is_visible()
    links = chain.locator("> li.exc").all_inner_texts()
    assert len(links) == 2
    assert links[0].startswith("RuntimeError: ")
    assert HOSTILE in links[0]
    assert links[1].startswith("caused by OSError: libflash.so")
    shown.page.click("label[for=expand-all]")
    assert (
        shown.page.locator("details.step > .info:visible").count()
        == shown.page.locator("details.step").count()
    )
    shown.assert_quiet()


def _bar_width(shown: Shown, step: str) -> float:
    box = shown.page.locator(f'.lane >> nth=0 >> .step[data-step="{step}"] > summary .bar')
    found = box.bounding_box()
    assert found is not None
    width: float = found["width"]
    return width


def test_an_operator_reads_the_failed_run_without_javascript(
    four_failed: Path, show: Any, tmp_path: Path
) -> None:
    shown = show(replay_html(four_failed, tmp_path), script=False)

    shown.assert_quiet()
    page = shown.page
    # The root-cause box links to its step, which is open from the start.
    root = page.locator("#root-step")
    assert root.get_attribute("data-step") == "attention/FLASH_ATTN"
    assert root.locator("> .info").is_visible()
    page.click("#root-cause a[href='#root-step']")
    assert page.evaluate("location.hash") == "#root-step"
    box = root.bounding_box()
    assert box is not None
    assert -1 <= box["y"] < VIEWPORT["height"]  # scrolled to it
    # Each bar's row says its duration; ticks are round times.
    durations = page.locator(".lane >> nth=0 >> .step > summary .dur").all_inner_texts()
    assert durations
    assert all(re.fullmatch(r"(\u2265 )?\d+(\.\d+)? (ms|s)", text) for text in durations), durations
    ticks = page.locator(".axis .ticks.full .tick").all_inner_texts()
    assert ticks[0] == "0"
    assert all(re.fullmatch(r"\d+(\.\d+)? (\u00b5s|ms|s)", tick) for tick in ticks[1:]), ticks
    # Zoomed from the first step that waited for process_group, a probe is
    # wide enough to read; the whole-run scale gives it a sliver.
    assert "process_group" in page.inner_text("label[for=zoom]")
    whole = _bar_width(shown, "platform")
    page.click("label[for=zoom]")
    zoomed = _bar_width(shown, "platform")
    assert zoomed > 4 * whole, (whole, zoomed)
    assert page.locator(".axis .ticks.zoomed").is_visible()
    assert not page.locator(".axis .ticks.full").is_visible()
    # Lanes say where and when their ranks ran; a folded lane its spread.
    [cause_lane, others] = page.locator(".lane").all()
    facts = cause_lane.locator(".lane-facts").inner_text()
    assert re.search(r"host \S+ \u00b7 pid \d+ \u00b7 started \d\d:\d\d:\d\d\.\d{3}", facts)
    spread = others.locator(".lane-facts").inner_text()
    assert re.search(r"fastest rank [013] \(.+\), slowest rank [013] \(.+\)", spread), spread
    assert "pids " in spread
    # Every step opens at once, without a script.
    closed = page.locator("details.step > .info:visible").count()
    page.click("label[for=expand-all]")
    assert (
        page.locator("details.step > .info:visible").count()
        == page.locator("details.step").count()
        > closed
    )
    shown.assert_quiet()


def test_a_long_multi_line_exception_message_stays_on_the_page(show: Any, tmp_path: Path) -> None:
    # A path longer than the page with no space to break at, then a
    # traceback the probe's message carried: wrapped, its lines kept.
    message = "/opt/" + "very_long_directory_name/" * 80 + "lib.so\nline two\n  line three"
    path = tmp_path / "report.html"
    path.write_text(report_html(replay(synthetic_run(8, failing=2, message=message))))
    shown = show(path)

    shown.assert_quiet()
    assert shown.page.evaluate("document.documentElement.scrollWidth") <= VIEWPORT["width"]
    chain = shown.page.locator("#root-cause .chain > li.exc .msg").first
    assert chain.inner_text().endswith("lib.so\nline two\n  line three")


def test_a_message_from_one_rank_a_node_stays_on_the_page(show: Any, tmp_path: Path) -> None:
    # ranks 0,8,16,..,1016 with no space to break at: the rank column
    # breaks after a comma, never inside a rank, and the page keeps its width.
    runs = [
        rank_events(rank, 1024, failing=rank if rank % 8 == 0 else None) for rank in range(1024)
    ]
    path = tmp_path / "report.html"
    path.write_text(report_html(replay(runs)))
    shown = show(path)

    shown.assert_quiet()
    assert shown.page.evaluate("document.documentElement.scrollWidth") <= VIEWPORT["width"]
    cell = shown.page.locator("#messages tr >> nth=1 >> td >> nth=2")
    assert cell.inner_text().replace("\xa0", " ").replace("\n", "") == format_ranks(
        range(0, 1024, 8)
    )
    box = cell.bounding_box()
    assert box is not None
    assert box["height"] > 40  # wrapped onto several lines

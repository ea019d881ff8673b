"""Regenerate docs/html-report.png, the README's picture of ``replay --html``.

The run is synthetic (tests/exporters/html_runs.py: eight ranks, rank 2's
FLASH_ATTN candidate fails with a chained exception) and its clocks are
fixed, so the picture changes only when the report does::

    PYTHONPATH=. .venv/bin/python docs/html_report_screenshot.py

Needs the ``chromium`` executable and the ``playwright`` package.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from events import replay
from exporters import report_html
from tests.exporters.html_runs import synthetic_run


def main() -> None:
    runs = synthetic_run(8, failing=2, message="no kernel image is available for sm_90")
    page_text = report_html(replay(runs))
    target = Path(__file__).with_name("html-report.png")
    with tempfile.TemporaryDirectory() as directory, sync_playwright() as playwright:
        path = Path(directory) / "report.html"
        path.write_text(page_text, encoding="utf-8")
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"))
        page = browser.new_page(viewport={"width": 1100, "height": 760})
        page.goto(path.as_uri())
        page.screenshot(path=str(target))
        browser.close()
    print(f"wrote {target} ({target.stat().st_size} bytes)")


if __name__ == "__main__":
    main()

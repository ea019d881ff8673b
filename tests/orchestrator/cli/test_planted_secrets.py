"""No secret leaves the process: secrets planted where an operator's would
be (a token in the environment and in an ``--inject`` message, a URL's
password, credentials in the OTLP endpoint) appear in no file a run and the
views write, and on no line they print."""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import LAUNCH_TIMEOUT_S, Completed, environment, run_cli

pytestmark = pytest.mark.slow

#: The value of a secret-looking variable (GITHUB_TOKEN).
TOKEN = "ghp_planted0123456789abcdef"
#: A password in a URL without a user name, in an exception message.
URL_PASSWORD = "url-planted-pw"
#: The password of the OTLP endpoint.
OTLP_PASSWORD = "otlp-planted-pw"
PLANTED = (TOKEN, URL_PASSWORD, OTLP_PASSWORD)


def _clean(completed: Completed) -> None:
    for secret in PLANTED:
        assert secret not in completed.stdout, (secret, completed.describe())
        assert secret not in completed.stderr, (secret, completed.describe())


def test_no_planted_secret_reaches_a_file_or_a_printed_line(tmp_path: Path) -> None:
    endpoint = f"http://collector:{OTLP_PASSWORD}@127.0.0.1:9"
    env = environment(GITHUB_TOKEN=TOKEN, OTEL_EXPORTER_OTLP_TIMEOUT="2")
    inject = f"1:attention/FLASH_ATTN=RuntimeError:login {TOKEN} at https://:{URL_PASSWORD}@hub/x"
    launched = run_cli(
        "run", "--simulate", "h200x8", "--nproc", "2", "--run-dir", "run",
        "--inject", inject, "--trace-file", "trace.json", "--otlp-endpoint", endpoint,
        cwd=tmp_path, env=env, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip
    assert launched.returncode == 1, launched.describe()
    _clean(launched)
    # The failure is there, with its secrets hidden.
    assert "login [REDACTED] at https://[REDACTED]@hub/x" in launched.stdout

    views = [
        ("replay", "run", "--html", "page.html"),
        ("replay", "--json", "run"),
        ("replay", "run", "--export", "jaeger-json=spans.json"),
        ("replay", "run", "--export", "otlp"),
        ("explain", "run"),
        ("blame", "run"),
        ("critical-path", "run"),
        ("validate", "run"),
    ]
    for view in views:
        completed = run_cli(
            *view, cwd=tmp_path, env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
        )
        assert completed.returncode in (0, 1), completed.describe()
        _clean(completed)

    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    names = {path.name for path in written}
    assert {"manifest.json", "rank-0.jsonl", "rank-1.jsonl", "trace.json"} <= names, names
    assert {"page.html", "spans.json"} <= names, names
    for path in written:
        content = path.read_bytes()
        for secret in PLANTED:
            assert secret.encode() not in content, (secret, path)

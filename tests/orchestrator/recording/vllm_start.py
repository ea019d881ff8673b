"""One real vLLM start: ``python vllm_start.py MODEL TP UTILIZATION``, in
the virtualenv with vLLM's CPU build. Prints ``ready`` when the engine is
up and has generated a few tokens."""

from __future__ import annotations

import sys


def main(model: str, tp: int, utilization: float) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        tensor_parallel_size=tp,
        dtype="float32",
        max_model_len=128,
        enforce_eager=True,
        gpu_memory_utilization=utilization,
    )
    llm.generate(["hi"], SamplingParams(max_tokens=2))
    print("ready", flush=True)


# vLLM starts its processes with the spawn method: they import this module.
if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))

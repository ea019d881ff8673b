"""A world of one over a real gloo process group, exercising
:class:`orchestrator.TorchDistributedGroup` as a :class:`orchestrator.Mailbox`.

Run as ``python -m tests.orchestrator.mailbox_worker`` with ``MASTER_ADDR``
and ``MASTER_PORT`` set; prints one JSON document of what it saw.
"""

from __future__ import annotations

import time

import orjson

from orchestrator import Mailbox, TorchDistributedGroup


def main() -> None:
    # init_torch_distributed_group forms nothing for a world of one (there is
    # nobody to agree with); the test's world is one on purpose, no peer to
    # start, so the group is formed directly.
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", rank=0, world_size=1)
    group = TorchDistributedGroup(owned=True)
    assert isinstance(group, Mailbox)
    log = b'{"a": 1}\n' * 50_000
    group.post("run/log/1", log)
    taken = group.take("run/log/1", 5.0)
    again = group.take("run/log/1", 0.0)
    started = time.monotonic()
    absent = group.take("run/log/2", 0.3)
    waited = time.monotonic() - started
    group.close()
    print(
        orjson.dumps(
            {
                "taken_whole": taken == log,
                "taken_once": again is None,
                "absent": absent is None,
                "waited_s": waited,
            }
        ).decode()
    )


if __name__ == "__main__":
    main()

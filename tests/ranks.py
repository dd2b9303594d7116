"""Tests on several ranks of a gloo group, spawned from the test process (the unit and the
training tiers both use them):

    spawn(work, 2, tmp_path, out)      # work(rank, out) on ranks 0 and 1, then back here
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch.multiprocessing as mp


def _in_group(rank: int, work, world: int, rendezvous: str, *args) -> None:
    """One spawned rank: `work(rank, *args)` in a gloo group of `world` ranks.

    A rank that succeeded leaves with os._exit, not through the interpreter's finalization:
    gloo's worker threads may still hold the last reference to a finished collective's tensors,
    and one that drops it while the interpreter is being torn down needs the GIL, which a
    finalizing Python 3.11 refuses by ending the thread, and the C++ destructor it is in aborts
    the process ("terminate called without an active exception", SIGABRT; seen on a loaded
    machine about once in eight runs of these tests). A failure still goes back to mp.spawn,
    which writes its traceback before the process exits."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        work(rank, *args)
    finally:
        if dist.is_initialized():  # vLLM destroys the group it joined when it shuts down
            dist.destroy_process_group()
    import multiprocessing  # children of this rank (Megatron's checkpoint writer's manager)
    for child in multiprocessing.active_children():  # would outlive it: os._exit runs no atexit
        child.terminate()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(work, world: int, tmp_path, *args) -> None:
    """Run `work(rank, *args)` on `world` ranks of a gloo group (a new rendezvous each call)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rendezvous = tempfile.mkdtemp(dir=tmp_path, prefix="rendezvous-")
    mp.spawn(_in_group, args=(work, world, f"{rendezvous}/file", *args), nprocs=world, join=True)

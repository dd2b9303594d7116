"""Weights from a trainer to rollout engines on other devices, bucket by bucket, over a `Link`
(`rl_core.collectives`): what a rollout pool of its own (`parallel.colocate_actor_rollout:
false`) is synced by after every update.

    # the trainer's ranks (all iterate the buckets: gathering a sharded tensor is collective)
    sent = send_weights(link, engine.weight_buckets(), version)   # rank 0 of the link sends
    # each rollout rank
    rollout.load_weights(receive_weights(link, version, device), version)  # the same, in order

A bucket travels as one broadcast of its tensors' bytes after a small manifest (names, shapes,
dtypes, the policy version): one collective a bucket, whatever its tensor count, and no rank
holds more than a bucket beyond its own copy. The end is a manifest without tensors.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from rl_core.collectives import Link
from rl_core.engines.base import WeightBucket
from rl_core.errors import StaleWeightsError

SENDER = 0  # the link's rank that holds the trainer's weights


def send_weights(link: Link | None, buckets: Iterable[WeightBucket], version: int) -> int:
    """Broadcast `buckets` from this rank (the link's rank 0) as policy version `version`;
    returns the bytes sent. A trainer rank that is not on the link (`link` None) still
    iterates the buckets, which its peers gather with it."""
    sent = 0
    for bucket in buckets:
        items = [(name, tensor.detach()) for name, tensor in bucket]
        if link is None:
            continue
        _send_object(link, {"version": version, "tensors": [
            (name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in items]})
        if items:
            flat = torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for _, t in items])
            link.broadcast(flat, src=SENDER)
            sent += flat.numel()
    if link is not None:
        _send_object(link, {"version": version, "tensors": None})
    return sent


def receive_weights(link: Link, version: int, device: torch.device | str = "cpu"
                    ) -> Iterator[WeightBucket]:
    """The buckets the link's rank 0 sends, as they arrive, their tensors on `device`; a
    StaleWeightsError when they carry another policy version than `version`."""
    while True:
        manifest = _receive_object(link)
        if manifest["version"] != version:
            raise StaleWeightsError(f"the trainer sent weights of policy version "
                                    f"{manifest['version']}, the rollout expected {version}")
        if manifest["tensors"] is None:
            return
        dtypes = [getattr(torch, dtype) for _, _, dtype in manifest["tensors"]]
        sizes = [math.prod(shape) * dtype.itemsize
                 for (_, shape, _), dtype in zip(manifest["tensors"], dtypes)]
        flat = link.broadcast(torch.empty(sum(sizes), dtype=torch.uint8, device=device),
                              src=SENDER)
        bucket, start = [], 0
        for (name, shape, _), dtype, size in zip(manifest["tensors"], dtypes, sizes):
            bucket.append((name, flat[start:start + size].view(dtype).view(shape)))
            start += size
        yield bucket


def _send_object(link: Link, value: Any) -> None:
    """A small picklable value to the link's other ranks: its length, then its bytes."""
    data = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8).to(link.device)
    link.broadcast(torch.tensor([data.numel()], dtype=torch.int64, device=link.device),
                   src=SENDER)
    link.broadcast(data, src=SENDER)


def _receive_object(link: Link) -> Any:
    size = link.broadcast(torch.zeros(1, dtype=torch.int64, device=link.device), src=SENDER)
    data = link.broadcast(torch.empty(int(size.item()), dtype=torch.uint8, device=link.device),
                          src=SENDER)
    return pickle.loads(data.cpu().numpy().tobytes())


__all__ = ["SENDER", "receive_weights", "send_weights"]

"""Weights from a trainer to rollout engines on other devices, bucket by bucket, over a `Link`
(`rl_core.collectives`): what a rollout pool of its own (`parallel.colocate_actor_rollout:
false`) is synced by after every update.

    # the trainer's ranks (all iterate the buckets: gathering a sharded tensor is collective)
    sent = send_weights(link, engine.weight_buckets(), version)   # rank 0 of the link sends
    # each rollout rank
    incoming = receive_weights(link, version, device)   # the same buckets, in order
    rollout.load_weights(incoming, version)

A bucket travels as one broadcast of its tensors' bytes after a small manifest (names, shapes,
dtypes, the policy version): one collective a bucket, whatever its tensor count, and no rank
holds more than a bucket beyond its own copy. The end is a manifest without tensors.
"""

from __future__ import annotations

import math
import pickle
import time
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
            link.broadcast(flat.to(link.device), src=SENDER)  # (a host copy: to the device)
            sent += flat.numel()
    if link is not None:
        _send_object(link, {"version": version, "tensors": None})
    return sent


class Incoming:
    """The buckets the link's rank 0 sends, as they arrive (iterate once), their tensors on
    `device`; `version` is the policy version they carry: `version` when given (another is a
    StaleWeightsError), else the sender's, known once the first manifest is in."""

    def __init__(self, link: Link, version: int | None = None,
                 device: torch.device | str = "cpu") -> None:
        self.link, self.version, self.device = link, version, device
        self.arrived: float | None = None  # time.perf_counter() when the first manifest came

    def __iter__(self) -> Iterator[WeightBucket]:
        while True:
            manifest = _receive_object(self.link)
            if self.arrived is None:
                self.arrived = time.perf_counter()
            if self.version is None:
                self.version = manifest["version"]
            elif manifest["version"] != self.version:
                raise StaleWeightsError(f"the trainer sent weights of policy version "
                                        f"{manifest['version']}, the rollout expected "
                                        f"{self.version}")
            if manifest["tensors"] is None:
                return
            yield self._bucket(manifest["tensors"])

    def _bucket(self, tensors: list[tuple[str, tuple[int, ...], str]]) -> WeightBucket:
        dtypes = [getattr(torch, dtype) for _, _, dtype in tensors]
        sizes = [math.prod(shape) * dtype.itemsize for (_, shape, _), dtype in zip(tensors, dtypes)]
        flat = self.link.broadcast(torch.empty(sum(sizes), dtype=torch.uint8, device=self.device),
                                   src=SENDER)
        bucket, start = [], 0
        for (name, shape, _), dtype, size in zip(tensors, dtypes, sizes):
            bucket.append((name, flat[start:start + size].view(dtype).view(shape)))
            start += size
        return bucket


def receive_weights(link: Link, version: int | None = None,
                    device: torch.device | str = "cpu") -> Incoming:
    """The weights the link's rank 0 sends next (`Incoming`: iterate it for the buckets)."""
    return Incoming(link, version, device)


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


__all__ = ["SENDER", "Incoming", "receive_weights", "send_weights"]

"""Name lookup in the algos registries, with an error that lists the valid names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name missing from a registry; both a KeyError and a ValueError, so either catch works."""

    def __str__(self) -> str:  # KeyError would print the message inside quotes
        return str(self.args[0])


def lookup(registry: Mapping[str, T], name: str, kind: str) -> T:
    """`registry[name]`, or UnknownNameError naming `kind` and every valid name."""
    try:
        return registry[name]
    except (KeyError, TypeError):
        valid = ", ".join(sorted(registry))
        raise UnknownNameError(f"unknown {kind} {name!r}: choose one of {valid}") from None

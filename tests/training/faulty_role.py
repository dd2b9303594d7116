"""A role that fails on purpose (tests/training/test_distributed.py), in a module of its own: a
Ray worker imports the module that defines its actor's class, and this one imports only what the
role needs, not torch and the trainers a test module brings."""

from __future__ import annotations

import time

from rl_core.errors import InputError
from rl_core.roles.group import Worker


class Faulty(Worker):
    role = "faulty"

    def explode(self) -> None:
        raise ZeroDivisionError("the fault under test")

    def bad_input(self) -> None:
        raise InputError("data.train_files: no such file")

    def wait(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

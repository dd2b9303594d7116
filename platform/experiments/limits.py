"""The bounds of a run's scheduling settings: one definition for the model, the API and the UI."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bounds:
    """A whole-number setting of a run: its inclusive range, its default and the one message
    every entry point gives for a value outside it."""

    low: int
    high: int
    default: int

    @property
    def message(self) -> str:
        return f"Enter a whole number from {self.low} to {self.high}."

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and self.low <= value <= self.high

    def error_messages(self) -> dict[str, str]:
        """DRF IntegerField messages: a bad value reads the same as in the submit form."""
        return dict.fromkeys(("invalid", "min_value", "max_value", "max_string_length"), self.message)


# Higher runs first; ties go to the oldest (experiments/placement.py adds aging on top).
PRIORITY = Bounds(low=-100, high=100, default=0)
# How often a run that failed for a reason other than its spec or input is tried again.
MAX_RESTARTS = Bounds(low=0, high=20, default=0)
# A project's device quota per kind (platform administrators set it).
QUOTA_DEVICES = Bounds(low=0, high=1_000_000, default=0)
# The submit form's settings, by field name.
RUN_SETTINGS = {"priority": PRIORITY, "max_restarts": MAX_RESTARTS}

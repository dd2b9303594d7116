"""Input rules for a run's tags and note, and for a project's quotas and share: one definition,
used by the REST API and the web UI's forms, so both accept and refuse the same things (the API's
serializers also refuse keys they do not know)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from accounts.models import SHARE_WEIGHT_MAX, SHARE_WEIGHT_MIN
from experiments.limits import QUOTA_DEVICES
from rl_core.spec import NOT_PLAIN_CHARS, plain_text_problem

TAG_MAX_CHARS = 40
MAX_TAGS = 20
NOTE_MAX_CHARS = 10_000
# What the OpenAPI document says a tag is: plain text without commas, not only spaces.
TAG_PATTERN = f"^[^,{NOT_PLAIN_CHARS}]*[^,\\s{NOT_PLAIN_CHARS}][^,{NOT_PLAIN_CHARS}]*$"


def clean_tag(text: str) -> str:
    """A tag with runs of spaces collapsed to one; a comma (the page's tag field separates tags
    with commas) or anything but one line of plain text (ascent.validators.PlainText's rule:
    no control character, tab or newline, no bidirectional control) is refused."""
    if "," in text:
        raise serializers.ValidationError(
            f"{text!r} holds a comma, which separates tags: give each tag on its own.")
    problem = plain_text_problem(text)
    if problem:
        raise serializers.ValidationError(f"{text!r} {problem}.")
    return " ".join(text.split())


@extend_schema_field({"type": "string", "minLength": 1, "maxLength": TAG_MAX_CHARS,
                      "pattern": TAG_PATTERN})
class TagField(serializers.CharField):
    """One tag: 1 to TAG_MAX_CHARS characters by clean_tag's rule."""

    def __init__(self, **kwargs):
        super().__init__(max_length=TAG_MAX_CHARS, validators=[clean_tag], **kwargs)


def split_tags(text: str) -> list[str]:
    """The tags typed into one field, separated by commas (empty parts dropped)."""
    return [part.strip() for part in text.split(",") if part.strip()]


class RunNotesInput(serializers.Serializer):
    """New tags (replacing the run's) and a new note; a key left out keeps what the run has."""

    tags = serializers.ListField(
        child=TagField(),
        max_length=MAX_TAGS, required=False,
        help_text=f"The run's tags, replacing those it has: at most {MAX_TAGS}, each 1 to "
                  f"{TAG_MAX_CHARS} characters without commas; repeats (in any case) count once.",
    )
    note = serializers.CharField(
        max_length=NOTE_MAX_CHARS, allow_blank=True, required=False, trim_whitespace=False,
        help_text=f"Free text about the run (at most {NOTE_MAX_CHARS} characters); empty clears it.",
    )

    def validate_tags(self, tags: list[str]) -> list[str]:
        unique: dict[str, str] = {}
        for tag in map(clean_tag, tags):
            unique.setdefault(tag.casefold(), tag)
        return list(unique.values())

    def validate_note(self, note: str) -> str:
        return note.strip()


def _quota_field() -> serializers.IntegerField:
    return serializers.IntegerField(required=False, allow_null=True, min_value=QUOTA_DEVICES.low,
                                    max_value=QUOTA_DEVICES.high)


class QuotasInput(serializers.Serializer):
    """Device kind -> the most devices of that kind the project's active runs may hold at
    once; null removes the quota (no limit). A quota below what the project holds now applies
    to new admissions only."""

    npu = _quota_field()
    gpu = _quota_field()
    cpu = _quota_field()


class AllocationInput(serializers.Serializer):
    """A project's fair-share weight and device quotas, as platform administrators set them
    (PUT/PATCH of /projects/{id}/allocation/ and the settings page's form)."""

    share_weight = serializers.FloatField(
        required=False, min_value=SHARE_WEIGHT_MIN, max_value=SHARE_WEIGHT_MAX,
        help_text=f"Fair-share weight, {SHARE_WEIGHT_MIN:g} to {SHARE_WEIGHT_MAX:g} (1 by "
                  "default): devices are shared among projects in proportion to it.")
    quotas = QuotasInput(required=False)

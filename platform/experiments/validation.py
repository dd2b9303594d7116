"""Input rules for a run's tags and note: one definition, used by the REST API (PATCH of a run)
and the run page's form, so both accept and refuse the same things (the API's serializer also
refuses keys it does not know)."""

from __future__ import annotations

import re

from rest_framework import serializers

TAG_MAX_CHARS = 40
MAX_TAGS = 20
NOTE_MAX_CHARS = 10_000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def clean_tag(text: str) -> str:
    """A tag with its inner whitespace collapsed to single spaces; a comma or a control
    character is refused (the page's tag field separates tags with commas)."""
    tag = " ".join(text.split())
    if "," in tag:
        raise serializers.ValidationError(
            f"{tag!r} holds a comma, which separates tags: give each tag on its own.")
    if _CONTROL.search(text.replace("\t", " ").replace("\n", " ")):
        raise serializers.ValidationError(f"{tag!r} holds a control character: use plain text.")
    return tag


def split_tags(text: str) -> list[str]:
    """The tags typed into one field, separated by commas (empty parts dropped)."""
    return [part.strip() for part in text.split(",") if part.strip()]


class RunNotesInput(serializers.Serializer):
    """New tags (replacing the run's) and a new note; a key left out keeps what the run has."""

    tags = serializers.ListField(
        child=serializers.CharField(max_length=TAG_MAX_CHARS, validators=[clean_tag]),
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

"""What the API itself stores: the claims of open log streams (api.stream_slots)."""

from __future__ import annotations

from django.db import models


class StreamSlot(models.Model):
    """One open log stream's claim on a slot: `user:<id>:<n>` (the user's n-th) or `all:<n>`
    (the service's). The key is unique, so two processes cannot take one slot; a claim left by
    a crashed process is taken over once `expires_at` has passed."""

    key = models.CharField(max_length=64, primary_key=True)
    token = models.CharField(max_length=32)
    expires_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return self.key

"""The audit app: connects the sign-in signals and the creation tracker at start-up."""

from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit log"

    def ready(self):
        from audit import signals

        signals.connect()

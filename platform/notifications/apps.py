"""The notifications app: turns run events into e-mails and webhook deliveries."""

from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Notifications"

    def ready(self):
        from django.db.models.signals import post_save

        from experiments.models import RunEvent
        from notifications import services

        post_save.connect(services.on_run_event, sender=RunEvent,
                          dispatch_uid="notifications.on_run_event")

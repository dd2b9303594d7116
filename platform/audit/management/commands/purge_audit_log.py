"""`manage.py purge_audit_log [--days N]`: delete audit entries older than the retention."""

from django.conf import settings
from django.core.management.base import BaseCommand

from audit import services


class Command(BaseCommand):
    help = "Delete audit entries older than ASCENT_AUDIT_RETENTION_DAYS (or --days; 0 keeps all)."

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=None,
                            help="Keep this many days instead of ASCENT_AUDIT_RETENTION_DAYS.")

    def handle(self, *args, days=None, **options):
        days = settings.ASCENT_AUDIT_RETENTION_DAYS if days is None else days
        if days <= 0:
            self.stdout.write("Retention is 0 days: the audit log is kept forever; nothing deleted.")
            return
        deleted = services.purge_expired(days)
        self.stdout.write(f"Deleted {deleted} audit entries older than {days} days.")

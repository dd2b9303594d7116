"""`python manage.py createtoken USERNAME`: create the user if needed and print a new API token.

The token is the last line of the output, so scripts can take it with `| tail -n1`.
"""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from accounts.models import ApiToken
from accounts.tokens import token_expiry
from ascent.errors import RequestError


class Command(BaseCommand):
    help = "Create USERNAME if missing and print a new API token for it as the last line."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="a label for the token (default: cli)")
        parser.add_argument(
            "--days",
            type=int,
            default=settings.ASCENT_TOKEN_DEFAULT_DAYS,
            help="days until it expires, at most ASCENT_TOKEN_MAX_DAYS "
            f"({settings.ASCENT_TOKEN_MAX_DAYS}); 0 = never, only where that is 0 "
            "(default: %(default)s)",
        )
        parser.add_argument(
            "--admin", action="store_true", help="make the user a staff member (cluster admin)"
        )

    def handle(self, username, name, days, admin, **options):
        try:
            expires = token_expiry(days)
        except RequestError as exc:
            raise CommandError(f"--days: {exc}") from None
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(username=username)
        if created:
            user.set_unusable_password()
        if admin:
            user.is_staff = True
        if created or admin:
            user.save()
        _, raw = ApiToken.issue(user, name, expires_at=expires)
        self.stderr.write(
            f"{'Created user' if created else 'User'} {username}; token '{name}' "
            f"{'expires ' + expires.date().isoformat() if expires else 'never expires'}. "
            "It is shown once:"
        )
        self.stdout.write(raw)

"""Production settings: the base settings, refusing values that are only safe on a laptop."""

from django.core.exceptions import ImproperlyConfigured

from ascent.settings import *  # noqa: F403
from ascent.settings import INSECURE_DEFAULT_SECRET_KEY, SECRET_KEY
from ascent.envconf import env_bool, env_int, env_str

SECRET_KEY_MIN_LENGTH = 50  # what `manage.py check --deploy` asks for (security.W009)


def _check_secret_key(key: str) -> None:
    """Refuse the development key and keys `check --deploy` would call weak."""
    if key == INSECURE_DEFAULT_SECRET_KEY or key.startswith("django-insecure-"):
        problem = "it is the development default"
    elif len(key) < SECRET_KEY_MIN_LENGTH:
        problem = f"it has {len(key)} characters"
    elif len(set(key)) < 5:
        problem = "it has fewer than 5 different characters"
    else:
        return
    raise ImproperlyConfigured(
        f"SECRET_KEY must be set to a random value of at least {SECRET_KEY_MIN_LENGTH} characters "
        f"in production ({problem}): make one with "
        "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`."
    )


_check_secret_key(SECRET_KEY)

DEBUG = env_bool("DEBUG", False)

# HTTPS. X-Forwarded-Proto is trusted only behind a proxy that sets it on every request (the
# Caddy service of deploy/compose.yaml); exposed directly, any client could claim HTTPS with it.
# The Host header is used as sent (USE_X_FORWARDED_HOST stays off): the proxy passes it through.
ASCENT_BEHIND_PROXY = env_bool("ASCENT_BEHIND_PROXY", False)
if ASCENT_BEHIND_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
USE_X_FORWARDED_HOST = False
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", ASCENT_BEHIND_PROXY)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # container health checks call plain HTTP
# HSTS (sent on HTTPS responses only): browsers use HTTPS alone for this long. Preloading is a
# request to browser vendors that is hard to undo, so it stays an explicit choice.
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
if not SECURE_HSTS_PRELOAD:
    # "SECURE_HSTS_PRELOAD is not True"
    SILENCED_SYSTEM_CHECKS = [*globals().get("SILENCED_SYSTEM_CHECKS", []), "security.W021"]
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = env_str("SECURE_REFERRER_POLICY", "same-origin")
X_FRAME_OPTIONS = "DENY"

# Cookies: sent over HTTPS only, the session cookie unreadable by scripts, neither sent on
# cross-site subrequests.
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", True)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 1_209_600, minimum=60)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", True)
CSRF_COOKIE_SAMESITE = "Lax"

# gunicorn serves no files: WhiteNoise serves the collected static files (`manage.py collectstatic`
# into STATIC_ROOT, done by the image build) with far-future cache headers.
_after = MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1  # noqa: F405
MIDDLEWARE = [*MIDDLEWARE[:_after], "whitenoise.middleware.WhiteNoiseMiddleware",  # noqa: F405
              *MIDDLEWARE[_after:]]  # noqa: F405
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

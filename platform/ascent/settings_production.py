"""Production settings: the base settings, refusing values that are only safe on a laptop."""

from django.core.exceptions import ImproperlyConfigured

from ascent.settings import *  # noqa: F403
from ascent.settings import INSECURE_DEFAULT_SECRET_KEY, SECRET_KEY
from ascent.envconf import env_bool, env_int

if SECRET_KEY == INSECURE_DEFAULT_SECRET_KEY or len(SECRET_KEY) < 32:
    raise ImproperlyConfigured(
        "SECRET_KEY must be set to a random value of at least 32 characters in production, e.g. "
        "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`."
    )

DEBUG = env_bool("DEBUG", False)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", True)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", True)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# gunicorn serves no files: WhiteNoise serves the collected static files (`manage.py collectstatic`
# into STATIC_ROOT, done by the image build) with far-future cache headers.
_after = MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1  # noqa: F405
MIDDLEWARE = [*MIDDLEWARE[:_after], "whitenoise.middleware.WhiteNoiseMiddleware",  # noqa: F405
              *MIDDLEWARE[_after:]]  # noqa: F405
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

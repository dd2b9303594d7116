"""Ascent settings: everything comes from the environment, with embedded defaults.

The defaults run the whole platform on one machine with no services installed: SQLite under
var/, the Celery SQLAlchemy transport on SQLite, an MLflow server on localhost. Production sets
DATABASE_URL, CELERY_BROKER_URL, REDIS_URL, MLFLOW_TRACKING_URI, SECRET_KEY and ALLOWED_HOSTS and
uses `ascent.settings_production`, which refuses unsafe values.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from ascent.envconf import env_bool, env_database, env_int, env_list, env_rate, env_str, env_url

BASE_DIR = Path(__file__).resolve().parents[2]
VAR_DIR = Path(env_str("ASCENT_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

INSECURE_DEFAULT_SECRET_KEY = "ascent-insecure-development-key-change-me"
SECRET_KEY = env_str("SECRET_KEY", INSECURE_DEFAULT_SECRET_KEY)
DEBUG = env_bool("DEBUG", True)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "csp",
    "accounts",
    "clusters",
    "experiments",
    "api",
    "frontend",
    "axes",
    "audit",
    "notifications",
    "registry",
]

MIDDLEWARE = [
    "ascent.middleware.BodySizeLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Records successful writes (API, UI forms, admin) in the audit log.
    "audit.middleware.AuditMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "frontend.middleware.NotFoundPageMiddleware",
    # Last: turns a locked-out sign-in into the sign-in page with a 429 (AXES_LOCKOUT_CALLABLE).
    "axes.middleware.AxesMiddleware",
]

# Content-Security-Policy on every response, the same in development, tests and production: the
# UI loads its scripts and styles only as static files (no inline code, no style attributes; htmx's
# indicator styles are in app.css). The API docs page adds a nonce for its inline code (urls.py).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

ROOT_URLCONF = "ascent.urls"
# Error reports (the DEBUG page, mails to admins) hide store addresses too: ascent/reporting.py
DEFAULT_EXCEPTION_REPORTER_FILTER = "ascent.reporting.ReporterFilter"
WSGI_APPLICATION = "ascent.wsgi.application"
ASGI_APPLICATION = "ascent.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "frontend.context.permissions",
            ],
        },
    },
]

DATABASES = {"default": env_database("DATABASE_URL", f"sqlite:///{VAR_DIR / 'ascent.sqlite3'}")}
DATABASES["default"].setdefault("CONN_MAX_AGE", env_int("DATABASE_CONN_MAX_AGE", 0, minimum=0))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_url("REDIS_URL", "", schemes=("redis", "rediss")) if env_str("REDIS_URL", "") else ""
CACHES = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
        if REDIS_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}

CELERY_BROKER_URL = env_url(
    "CELERY_BROKER_URL",
    f"sqla+sqlite:///{VAR_DIR / 'celery-broker.sqlite3'}",
    schemes=("redis", "rediss", "amqp", "amqps", "pyamqp", "sqla+sqlite", "sqla+postgresql"),
)
MLFLOW_TRACKING_URI = env_url(
    "MLFLOW_TRACKING_URI", "http://127.0.0.1:5000", schemes=("http", "https", "file", "sqlite")
)

# Celery: the worker dispatches runs (workers/tasks.py). A task is acknowledged only when it has
# finished and is redelivered when its worker dies, so a launch interrupted by a crash runs again
# (and finds its Ray job by submission id instead of starting another).
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A request that queues a task must not hang on a broker that is down (beat catches up).
CELERY_BROKER_CONNECTION_TIMEOUT = 2
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2,
                                    "interval_max": 0.5}
CELERY_BEAT_SCHEDULE = {
    "schedule-runs": {"task": "workers.tasks.schedule_runs",
                      "schedule": env_int("ASCENT_SCHEDULE_EVERY_S", 5, minimum=1)},
    "watch-runs": {"task": "workers.tasks.watch_runs",
                   "schedule": env_int("ASCENT_WATCH_EVERY_S", 2, minimum=1)},
    "reconcile-runs": {"task": "workers.tasks.reconcile_runs",
                       "schedule": env_int("ASCENT_RECONCILE_EVERY_S", 30, minimum=1)},
    "probe-clusters": {"task": "workers.tasks.probe_clusters",
                       "schedule": env_int("ASCENT_PROBE_EVERY_S", 30, minimum=1)},
    "purge-audit-log": {"task": "workers.tasks.purge_audit_log", "schedule": 24 * 3600},
    "deliver-notifications": {"task": "workers.tasks.deliver_notifications",
                              "schedule": env_int("ASCENT_DELIVER_EVERY_S", 5, minimum=1)},
    "find-stalled-runs": {"task": "workers.tasks.find_stalled_runs",
                          "schedule": env_int("ASCENT_STALL_CHECK_EVERY_S", 60, minimum=1)},
}

# Notifications (notifications/services.py): links in e-mails and webhook payloads point here;
# e-mail goes through Django's mail backend (SMTP: EMAIL_HOST, EMAIL_PORT, EMAIL_HOST_USER,
# EMAIL_HOST_PASSWORD, EMAIL_USE_TLS, as Django reads them).
ASCENT_PUBLIC_URL = env_str("ASCENT_PUBLIC_URL", "http://localhost:8000")
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "ascent@localhost")

# Dispatch. Each run's training output (checkpoints, metrics file) lives in
# ASCENT_RUNS_DIR/run-<id>, shared by its attempts so a restart resumes from the latest
# checkpoint: on a multi-node cluster it must be storage every node sees.
ASCENT_RUNS_DIR = Path(env_str("ASCENT_RUNS_DIR", str(VAR_DIR / "runs"))).absolute()
# The Python of the training environment on the cluster (with rl_core installed).
ASCENT_JOB_PYTHON = env_str("ASCENT_JOB_PYTHON", "python")
# Environment variables copied from the worker's environment into every job (comma-separated).
ASCENT_JOB_ENV_PASSTHROUGH = env_list("ASCENT_JOB_ENV_PASSTHROUGH", ["ASCENT_CACHE_DIR", "HF_HOME"])
# The token of Ray clusters that enforce token authentication (RAY_AUTH_MODE=token).
RAY_AUTH_TOKEN = env_str("RAY_AUTH_TOKEN", "")
# A run whose job status has not been read for this long is restarted or failed by reconcile.
ASCENT_SILENCE_LIMIT_S = env_int("ASCENT_SILENCE_LIMIT_S", 600, minimum=10)
# Aging in the placement order: priority points gained per hour of waiting.
ASCENT_AGING_PER_HOUR = float(env_str("ASCENT_AGING_PER_HOUR", "1.0"))
# Preemption: a waiting run of higher priority may stop runs of projects above their share.
ASCENT_PREEMPTION = env_bool("ASCENT_PREEMPTION", True)
# How long a stopped job (a cancel or a preemption) has to save its step before it is killed
# (Ray's RAY_JOB_STOP_WAIT_TIME_S for every job).
ASCENT_STOP_GRACE_S = env_int("ASCENT_STOP_GRACE_S", 300, minimum=1)
# The model registry (registry/services.py): how long the worker's export of one checkpoint to a
# Hugging Face folder may take (`python -m rl_core export`), in ASCENT_RUNS_DIR's disk space.
ASCENT_EXPORT_TIMEOUT_S = env_int("ASCENT_EXPORT_TIMEOUT_S", 6 * 3600, minimum=60)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(VAR_DIR / "static")))
# The web UI's browser packages come from the npm registry (`make install` runs `npm ci` in
# frontend/); only their built files are served, under static/vendor/<package>/.
NODE_MODULES = BASE_DIR / "frontend" / "node_modules"
STATICFILES_DIRS = [
    ("vendor/htmx", NODE_MODULES / "htmx.org" / "dist"),
    ("vendor/uplot", NODE_MODULES / "uplot" / "dist"),
    # a colour emoji font for glyphs the system fonts lack (the 🏃 and 🧪 that MLflow prints in
    # run logs): the browser loads only the subsets a page uses (unicode-range)
    ("vendor/noto-color-emoji", NODE_MODULES / "@fontsource" / "noto-color-emoji"),
]

# The web UI signs people in with Django sessions; the API also accepts bearer tokens.
LOGIN_URL = "frontend:sign-in"
LOGIN_REDIRECT_URL = "frontend:dashboard"
LOGOUT_REDIRECT_URL = "frontend:sign-in"

# Client addresses: X-Forwarded-For is believed only behind a proxy that sets it (its right-most
# entry, the one the proxy added); otherwise the connection's address is used.
ASCENT_BEHIND_PROXY = env_bool("ASCENT_BEHIND_PROXY", False)
# Audit log entries older than this many days are deleted daily (0 = keep them forever).
ASCENT_AUDIT_RETENTION_DAYS = env_int("ASCENT_AUDIT_RETENTION_DAYS", 365, minimum=0)

# Sign-in lockout (django-axes) for the sign-in page and /admin/login/: after this many failures
# for one username from one address, even the right password is refused for the cool-off
# (counted from the last failure). A success resets the count; `manage.py axes_reset` unlocks.
ASCENT_LOGIN_FAILURE_LIMIT = env_int("ASCENT_LOGIN_FAILURE_LIMIT", 10, minimum=1)
ASCENT_LOGIN_COOLOFF_MINUTES = env_int("ASCENT_LOGIN_COOLOFF_MINUTES", 15, minimum=1)
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = ASCENT_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=ASCENT_LOGIN_COOLOFF_MINUTES)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_HTTP_RESPONSE_CODE = 429
AXES_LOCKOUT_CALLABLE = "frontend.views.sign_in.locked_out"
# The same client address as the API's limits (ASCENT_BEHIND_PROXY decides about X-Forwarded-For).
AXES_CLIENT_IP_CALLABLE = "accounts.authentication.client_ip"

# Request bodies above this size are answered 413 before any view reads them.
ASCENT_MAX_BODY_BYTES = env_int("ASCENT_MAX_BODY_BYTES", 1_048_576, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = ASCENT_MAX_BODY_BYTES
# API tokens live this many days unless the creator asks otherwise (0 = never expire).
ASCENT_TOKEN_DEFAULT_DAYS = env_int("ASCENT_TOKEN_DEFAULT_DAYS", 90, minimum=0)
# No token may live longer than this many days (0 = no limit, and only then may one never expire).
ASCENT_TOKEN_MAX_DAYS = env_int("ASCENT_TOKEN_MAX_DAYS", 365, minimum=0)
if ASCENT_TOKEN_MAX_DAYS and not 0 < ASCENT_TOKEN_DEFAULT_DAYS <= ASCENT_TOKEN_MAX_DAYS:
    raise ImproperlyConfigured(
        f"ASCENT_TOKEN_DEFAULT_DAYS={ASCENT_TOKEN_DEFAULT_DAYS} exceeds ASCENT_TOKEN_MAX_DAYS="
        f"{ASCENT_TOKEN_MAX_DAYS} (0 means never expires): set it between 1 and "
        f"{ASCENT_TOKEN_MAX_DAYS}, or raise ASCENT_TOKEN_MAX_DAYS."
    )

# API rate limits (DRF throttles, api/throttling.py; token creation, shared with the UI, in
# accounts/throttling.py): per token or signed-in user, per address for anonymous requests, and
# token creation per user. A refused request is a 429 with Retry-After.
ASCENT_API_RATE_USER = env_rate("ASCENT_API_RATE_USER", "1200/min")
ASCENT_API_RATE_ANON = env_rate("ASCENT_API_RATE_ANON", "60/min")
ASCENT_TOKEN_CREATE_RATE = env_rate("ASCENT_TOKEN_CREATE_RATE", "20/hour")
# Invitations: sent per user (API and settings page alike), and pending at once per project.
ASCENT_INVITE_RATE = env_rate("ASCENT_INVITE_RATE", "30/hour")
ASCENT_INVITATIONS_PENDING_MAX = env_int("ASCENT_INVITATIONS_PENDING_MAX", 50, minimum=1)
# Failed bearer tokens per client address: beyond this many within the window, an invalid token
# from that address is a 429 (not a 401) until the window ends; valid tokens still pass.
ASCENT_TOKEN_FAILURE_LIMIT = env_int("ASCENT_TOKEN_FAILURE_LIMIT", 20, minimum=1)
ASCENT_TOKEN_FAILURE_WINDOW_S = env_int("ASCENT_TOKEN_FAILURE_WINDOW_S", 600, minimum=1)
# Live log streams (server-sent events): open at once per user (more are answered 429), a
# keep-alive comment after this many quiet seconds, and the seconds after which a stream ends
# (the client reconnects from its offset).
ASCENT_LOG_STREAMS_PER_USER = env_int("ASCENT_LOG_STREAMS_PER_USER", 4, minimum=1)
# ... and in all, across every web process; and per threaded (WSGI) process, whose threads they
# hold (the ASGI worker holds none per stream).
ASCENT_LOG_STREAMS_TOTAL = env_int("ASCENT_LOG_STREAMS_TOTAL", 200, minimum=1)
ASCENT_LOG_STREAMS_PER_SYNC_PROCESS = env_int("ASCENT_LOG_STREAMS_PER_SYNC_PROCESS", 4, minimum=1)
ASCENT_LOG_STREAM_HEARTBEAT_S = env_int("ASCENT_LOG_STREAM_HEARTBEAT_S", 15, minimum=1)
ASCENT_LOG_STREAM_LIMIT_S = env_int("ASCENT_LOG_STREAM_LIMIT_S", 300, minimum=1)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
        "rest_framework.filters.SearchFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "api.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "api.schema.AscentAutoSchema",
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
    # JSON without NaN/Infinity and with bounded nesting (api/parsers.py), then DRF's form parsers.
    "DEFAULT_PARSER_CLASSES": [
        "api.parsers.StrictJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_THROTTLE_CLASSES": ["api.throttling.UserRateThrottle", "api.throttling.AnonRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"user": ASCENT_API_RATE_USER, "anon": ASCENT_API_RATE_ANON,
                               "token-create": ASCENT_TOKEN_CREATE_RATE, "invite": ASCENT_INVITE_RATE},
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Ascent API",
    "DESCRIPTION": (
        "Submit and manage reinforcement-learning post-training runs (GRPO, DAPO, PPO, DPO), "
        "experiments, projects and cluster inventories. Authenticate with `Authorization: Bearer "
        "<token>` (create one with `python manage.py createtoken USER` or POST /api/v1/tokens/)."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI assets come from the drf-spectacular-sidecar package, so the docs work offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "ENUM_NAME_OVERRIDES": {
        "RunStateEnum": "experiments.choices.RunState",
        "ProjectRoleEnum": "accounts.choices.Role",
        "DeviceKindEnum": "clusters.choices.DeviceKind",
        "ModelVersionStateEnum": "registry.models.VersionState",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}

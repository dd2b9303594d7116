"""What Django's error reports (the DEBUG error page, mails to admins) may show."""

from __future__ import annotations

import re

from django.views.debug import SafeExceptionReporterFilter


class ReporterFilter(SafeExceptionReporterFilter):
    """Django's filter hides settings and request variables named like secrets (KEY, TOKEN,
    PASS…); addresses of the service's stores carry credentials too (`DATABASE_URL`,
    `CELERY_BROKER_URL`, `MLFLOW_TRACKING_URI`, and under runserver the environment in
    request.META), so those names are hidden as well."""

    hidden_settings = re.compile(
        "API|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|URL|URI|DSN|DATABASE|BROKER|REDIS",
        flags=re.IGNORECASE)

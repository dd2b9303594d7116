from django.apps import AppConfig
from django.core import checks


class FrontendConfig(AppConfig):
    name = "frontend"
    verbose_name = "Web UI"

    def ready(self) -> None:
        checks.register(check_vendor_packages, checks.Tags.staticfiles)


def check_vendor_packages(app_configs, **kwargs):
    """The UI's browser packages must be installed from npm before pages can work."""
    from django.conf import settings

    missing = [str(path) for _, path in settings.STATICFILES_DIRS if not path.is_dir()]
    if not missing:
        return []
    return [checks.Warning(
        f"The web UI's browser packages are missing ({', '.join(missing)}): pages will render "
        "without charts and live updates.",
        hint="Run `make install` (or `npm ci --prefix frontend`).",
        id="frontend.W001",
    )]

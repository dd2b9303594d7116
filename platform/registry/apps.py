"""The model registry app: a run's checkpoint registered as a versioned model, with its lineage."""

from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Model registry"

    def ready(self):
        from experiments import services as runs
        from registry import services

        if services.check_model_paths not in runs.SPEC_CHECKS:
            runs.SPEC_CHECKS.append(services.check_model_paths)

"""Celery tasks and the two adapters to the outside: Ray Jobs (ray_jobs) and MLflow (tracking)."""

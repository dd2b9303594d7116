"""Template context of every page."""

from frontend.views.common import writable_experiments


def permissions(request) -> dict:
    """`can_submit`: whether the user may submit runs anywhere (write buttons hide otherwise)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"can_submit": False}
    return {"can_submit": writable_experiments(user).exists()}

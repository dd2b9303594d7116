"""The sign-in page shown when too many failed sign-ins locked a username out (django-axes)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.shortcuts import render


def lockout_message() -> str:
    minutes = settings.ASCENT_LOGIN_COOLOFF_MINUTES
    return (f"Too many failed sign-ins; try again in {minutes} minute{'s' if minutes != 1 else ''}, "
            "or ask an administrator to unlock your account.")


def locked_out(request, response=None, credentials=None):
    """AXES_LOCKOUT_CALLABLE: the sign-in page (for /admin/login/ too) with the reason, as a 429."""
    username = (credentials or {}).get("username") or request.POST.get("username", "")
    form = AuthenticationForm(request, initial={"username": username})
    context = {"form": form, "locked_out": lockout_message(), "username": username,
               "next": request.POST.get("next") or request.GET.get("next", "")}
    return render(request, "frontend/sign_in.html", context, status=429)

from django.contrib.auth.decorators import login_required
from django.shortcuts import render


@login_required
def settings_page(request):
    return render(request, "frontend/base.html")


@login_required
def member_action(request, pk):
    return render(request, "frontend/base.html")


@login_required
def token_create(request):
    return render(request, "frontend/base.html")


@login_required
def token_revoke(request, pk):
    return render(request, "frontend/base.html")

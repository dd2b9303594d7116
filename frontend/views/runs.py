from django.contrib.auth.decorators import login_required
from django.shortcuts import render


@login_required
def run_list(request):
    return render(request, "frontend/base.html")


@login_required
def run_detail(request, pk):
    return render(request, "frontend/base.html")


@login_required
def run_status(request, pk):
    return render(request, "frontend/base.html")


@login_required
def run_cancel(request, pk):
    return render(request, "frontend/base.html")


@login_required
def run_restart(request, pk):
    return render(request, "frontend/base.html")

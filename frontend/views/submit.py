from django.contrib.auth.decorators import login_required
from django.shortcuts import render


@login_required
def submit(request):
    return render(request, "frontend/base.html")


@login_required
def convert(request):
    return render(request, "frontend/base.html")

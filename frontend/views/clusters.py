from django.contrib.auth.decorators import login_required
from django.shortcuts import render


@login_required
def cluster_list(request):
    return render(request, "frontend/base.html")


@login_required
def node_action(request, pk, action):
    return render(request, "frontend/base.html")

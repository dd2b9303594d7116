"""Conditional GET for pages that clients poll: an ETag on each answer, 304 when it is unchanged.

The ETag is a hash of the answer's body as rendered for this request (user, query string and
Accept), so it changes whenever anything in the answer changes and two users share one only
where they would read the same bytes. It is not taken from `updated_at` or a count: a run's
progress, its tags, its attempts and what MLflow holds all change without moving those. So a 304
costs the server what a 200 does; it spares the client and the network the body, which the
client neither downloads nor parses again."""

from __future__ import annotations

from django.utils.cache import get_conditional_response, patch_cache_control, set_response_etag


def conditional(request, response):
    """`response` (a 200 to a GET or HEAD) with an ETag and `Cache-Control: private, no-cache`
    (keep it, but ask again before using it), or a bodiless 304 Not Modified carrying the same
    headers when the request's If-None-Match names that ETag."""
    if request.method not in ("GET", "HEAD") or response.status_code != 200:
        return response
    if getattr(response, "streaming", False):
        return response
    response.render()
    set_response_etag(response)
    patch_cache_control(response, private=True, no_cache=True)
    return get_conditional_response(request, etag=response.headers.get("ETag"), response=response)

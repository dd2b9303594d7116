"""Template filters of the web UI."""

from django import template

register = template.Library()


@register.filter
def duration(start, end) -> str:
    """`start|duration:end`: '42 s', '3 min 5 s', '2 h 10 min'; empty without both times."""
    if not start or not end:
        return ""
    return seconds_text((end - start).total_seconds())


@register.filter
def seconds_text(seconds) -> str:
    """`value|seconds_text`: a number of seconds as '42 s', '3 min 5 s', '2 h 10 min'."""
    if seconds is None:
        return ""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"

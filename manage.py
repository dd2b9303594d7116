#!/usr/bin/env python
"""Django's command-line utility for Ascent: `python manage.py migrate`, `runserver`, `createtoken`, ..."""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def main() -> None:
    # platform/ holds the Django project; it is a folder on sys.path, never a package named "platform".
    sys.path.insert(0, str(ROOT / "platform"))
    sys.path.insert(1, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ascent.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()

"""The layers import downwards only: the web UI (frontend/) and the REST API (api/) both stand on
the domain apps (accounts, clusters, experiments), and neither the UI nor the domain imports the
API; the domain imports neither of them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOMAIN_APPS = ("accounts", "clusters", "experiments")


def modules(folder: Path) -> list[Path]:
    """Every Python file under `folder`, skipping installed JavaScript packages."""
    return sorted(p for p in folder.rglob("*.py") if "node_modules" not in p.parts)


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) for each absolute import in the file, e.g. (8, "api.run_data")."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def offending(folder: Path, forbidden: tuple[str, ...]) -> list[str]:
    """'frontend/views/x.py:8 imports api.run_data' for each import, under `folder`, of a
    forbidden package or a module in it."""
    return [f"{path.relative_to(folder.parent)}:{line} imports {name}"
            for path in modules(folder) for line, name in imported(path)
            if name.split(".")[0] in forbidden]


def test_it_finds_every_absolute_import_of_a_package(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "views.py").write_text(
        "import api\nfrom api.run_data import x\nfrom . import api\n"
        "from apiary import y\nimport os, frontend.urls\n")

    assert offending(tmp_path / "app", ("api", "frontend")) == [
        "app/views.py:1 imports api",
        "app/views.py:2 imports api.run_data",
        "app/views.py:5 imports frontend.urls",
    ]


def test_it_keeps_the_ui_off_the_api():
    assert modules(ROOT / "frontend"), "no modules found under frontend/"

    assert offending(ROOT / "frontend", ("api",)) == [], (
        "frontend/ uses the domain apps (accounts, clusters, experiments), never api/: move what "
        "it needs into the domain and import it from there in both")


@pytest.mark.parametrize("app", DOMAIN_APPS)
def test_it_keeps_the_domain_off_the_api_and_the_ui(app):
    folder = ROOT / "platform" / app
    assert modules(folder), f"no modules found under platform/{app}/"

    assert offending(folder, ("api", "frontend")) == [], (
        f"platform/{app}/ is domain code: it must not import api/ or frontend/ (they import it)")

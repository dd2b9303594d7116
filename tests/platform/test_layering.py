"""The layers import downwards only: the web UI (frontend/) and the REST API (api/) both stand on
the domain apps (accounts, clusters, experiments), and neither the UI nor the domain imports the
API; the domain imports neither of them. No two apps import each other, even through others;
the project package (ascent/) is below every app, and platform/ below the Celery workers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOMAIN_APPS = ("accounts", "clusters", "experiments", "notifications")


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


# --- the apps' graph --------------------------------------------------------------------------

PACKAGES = {**{p.name: p for p in sorted((ROOT / "platform").iterdir())
               if (p / "__init__.py").exists()},
            "frontend": ROOT / "frontend", "workers": ROOT / "workers"}


def app_graph(packages: dict[str, Path]) -> dict[str, dict[str, str]]:
    """app -> {app it imports: one place that does}, over every import at any depth (one inside
    a function runs too)."""
    graph: dict[str, dict[str, str]] = {name: {} for name in packages}
    for name, folder in packages.items():
        for path in modules(folder):
            for line, module in imported(path):
                target = module.split(".")[0]
                if target in packages and target != name:
                    graph[name].setdefault(target, f"{path.relative_to(ROOT)}:{line}")
    return graph


def cycle(graph: dict[str, dict[str, str]]) -> list[str]:
    """One import cycle of the graph as 'a -> b (where) -> …', or [] when there is none."""
    state: dict[str, str] = {}

    def visit(node: str, nodes: list[str], edges: list[str]) -> list[str]:
        state[node] = "open"
        for target, where in sorted(graph[node].items()):
            edge = f"{node} -> {target} ({where})"
            if state.get(target) == "open":
                return [*edges[nodes.index(target):], edge]
            if target not in state and (found := visit(target, [*nodes, target], [*edges, edge])):
                return found
        state[node] = "done"
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node, [node], [])):
            return found
    return []


def test_it_finds_a_cycle_between_apps():
    graph = {"a": {"b": "a.py:1"}, "b": {"c": "b.py:2"}, "c": {"a": "c.py:3"}, "d": {}}
    assert cycle(graph) == ["a -> b (a.py:1)", "b -> c (b.py:2)", "c -> a (c.py:3)"]
    assert cycle({"a": {"b": "a.py:1"}, "b": {}}) == []


def test_the_apps_import_each_other_without_a_cycle():
    graph = app_graph(PACKAGES)
    assert {"accounts", "clusters", "experiments", "api", "audit", "ascent"} <= set(graph)
    assert cycle(graph) == [], (
        "an import cycle between apps: move the shared piece down (errors to ascent.errors, a "
        "query to the app that owns its model) or the importing code up")


def test_the_platform_never_imports_the_celery_workers():
    assert offending(ROOT / "platform", ("workers",)) == [], (
        "platform/ is below workers/ (the Celery tasks import the platform, not the reverse)")


def test_the_project_package_imports_no_app():
    apps = tuple(name for name in PACKAGES if name != "ascent")
    assert offending(ROOT / "platform" / "ascent", apps) == [], (
        "ascent/ (settings, shared errors and validators) is below every app; urls.py names the "
        "apps' URL modules as text (include('api.urls'))")


# --- rl_core's surface ------------------------------------------------------------------------

# What the service (platform/, frontend/, workers/) may import of rl_core, by module: None for
# any public name, else the names. Everything else in rl_core is the trainer's business.
RL_CORE_SURFACE: dict[str, frozenset[str] | None] = {
    "rl_core.spec": None,  # the run spec: its model, resolution, errors, schema and reference
    "rl_core.admission": None,  # admission of a spec: rewards, paths, host memory, memory plan
    "rl_core.tracking": frozenset({"STEP_LINE"}),  # the metric line a job prints
    "rl_core.precision": frozenset({"compare"}),  # the comparison of two runs' tensor dumps
}


def rl_core_imports(folder: Path) -> list[tuple[str, str, str]]:
    """(where, module, name) of each import of rl_core under `folder`; name is "" for
    `import rl_core.x`."""
    found = []
    for path in modules(folder):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            where = f"{path.relative_to(folder.parent)}:{node.lineno}" if hasattr(
                node, "lineno") else ""
            if isinstance(node, ast.Import):
                found += [(where, alias.name, "") for alias in node.names
                          if alias.name.split(".")[0] == "rl_core"]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                    node.module.split(".")[0] == "rl_core"):
                found += [(where, node.module, alias.name) for alias in node.names]
    return found


def off_surface(folder: Path) -> list[str]:
    """'api/x.py:3 imports rl_core.paths.check_paths' for each import outside RL_CORE_SURFACE."""
    bad = []
    for where, module, name in rl_core_imports(folder):
        if module == "rl_core" and name:  # from rl_core import spec
            module, name = f"rl_core.{name}", ""
        allowed = RL_CORE_SURFACE.get(module, frozenset())
        if module not in RL_CORE_SURFACE or (allowed is not None and name not in allowed):
            bad.append(f"{where} imports {module}{'.' + name if name else ''}")
    return bad


def test_it_finds_every_import_of_rl_core_outside_its_surface(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "views.py").write_text(
        "from rl_core.spec import RunSpec\nfrom rl_core.paths import check_paths\n"
        "import rl_core.memory_plan\nfrom rl_core.tracking import STEP_LINE, log_metrics\n"
        "def f():\n    from rl_core.precision import compare\n    from rl_core import errors\n")

    assert off_surface(tmp_path / "app") == [
        "app/views.py:2 imports rl_core.paths.check_paths",
        "app/views.py:3 imports rl_core.memory_plan",
        "app/views.py:4 imports rl_core.tracking.log_metrics",
        "app/views.py:7 imports rl_core.errors",
    ]


@pytest.mark.parametrize("folder", ["platform", "frontend", "workers"])
def test_the_service_imports_only_rl_cores_public_surface(folder):
    assert rl_core_imports(ROOT / folder), f"no import of rl_core found under {folder}/"

    assert off_surface(ROOT / folder) == [], (
        "the service imports rl_core only through its public surface (RL_CORE_SURFACE): the "
        "spec, admission (rl_core/admission.py), the metric line and precision's compare; add "
        "what it needs to rl_core.admission rather than reaching into the trainer's modules")

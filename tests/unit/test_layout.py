"""rl_core's layout, read from its imports (ast, nothing is imported): components never import a
recipe or the command line, no import cycle exists inside rl_core, and no module reaches for
another module's private names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "rl_core"
ENTRY_POINTS = ("rl_core.recipes", "rl_core.cli", "rl_core.__main__")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def resolve(name: str) -> str | None:
    """The rl_core module an import names (a package's `__init__` for a package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) of every rl_core import in `module`,
    at any depth (imports inside functions count: they run too), except those under
    `if TYPE_CHECKING:`, which never run."""
    tree = ast.parse(MODULES[module].read_text())
    typing_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                   for inner in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out += [(resolve(a.name), "", node.lineno) for a in node.names
                    if a.name.startswith("rl_core")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rl_core"):
            for alias in node.names:
                target = resolve(f"{node.module}.{alias.name}")
                submodule = target == f"{node.module}.{alias.name}"
                out.append((target, "" if submodule else alias.name, node.lineno))
    return [(m, n, line) for m, n, line in out if m and m != module]


GRAPH = {m: sorted({target for target, _, _ in imports(m)}) for m in MODULES}


def is_entry_point(module: str) -> bool:
    return any(module == e or module.startswith(e + ".") for e in ENTRY_POINTS)


def test_the_tree_has_components_and_recipes():
    recipes = {m for m in MODULES if m.startswith("rl_core.recipes.")}
    assert {"rl_core.recipes.rl", "rl_core.recipes.dpo", "rl_core.recipes.sft",
            "rl_core.recipes.eval"} <= recipes
    assert len(MODULES) > 40, "the scan found too few modules to mean anything"


def test_no_component_imports_a_recipe_or_the_command_line():
    wrong = [f"{m} imports {target} (line {line})"
             for m in MODULES if not is_entry_point(m)
             for target, _, line in imports(m) if is_entry_point(target)]
    assert not wrong, "components must not depend on recipes or the CLI:\n" + "\n".join(wrong)


def cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, []):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_there_is_no_import_cycle_in_rl_core():
    found = cycles(GRAPH)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert cycles({"a": ["b"], "b": []}) == []


def _private_uses(module: str) -> list[str]:
    tree = ast.parse(MODULES[module].read_text())
    problems = [f"{module} imports {name} from {target} (line {line})"
                for target, name, line in imports(module)
                if name.startswith("_") and not name.startswith("__")]
    aliases = {}  # local name -> rl_core module, for `from rl_core import x` / `import ... as`
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rl_core"):
            for a in node.names:
                target = f"{node.module}.{a.name}"
                if target in MODULES:
                    aliases[a.asname or a.name] = target
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in MODULES:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            problems.append(f"{module} uses {aliases[node.value.id]}.{node.attr} (line {node.lineno})")
    return problems


def test_no_module_uses_another_modules_private_names():
    problems = [p for m in MODULES for p in _private_uses(m)]
    assert not problems, "private names used across modules:\n" + "\n".join(problems)


SPEC_MODULES = sorted(m for m in MODULES if m == "rl_core.spec" or m.startswith("rl_core.spec."))


@pytest.mark.parametrize("module", [*SPEC_MODULES, "rl_core.errors", "rl_core.paths",
                                    "rl_core.models.presets", "rl_core.models.registry"])
def test_what_the_web_process_imports_stays_free_of_torch(module):
    # rl_core.models.presets (the tiny models' names and shapes) imports only dataclasses;
    # rl_core.models.registry parses `models:/` paths with the standard library.
    light = ("rl_core", "rl_core.errors", *SPEC_MODULES, "rl_core.models.presets",
             "rl_core.models.registry")
    heavy = [target for target, _, _ in imports(module) if target not in light]
    assert not heavy, f"{module} imports {heavy}"


def test_only_the_command_line_parses_arguments():
    """The command line is one package (rl_core.cli); library modules hold no argparse."""
    parsing = []
    for name, path in MODULES.items():
        if name.startswith("rl_core.cli") or name == "rl_core.__main__":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) else [])
            if "argparse" in names:
                parsing.append(f"{name} (line {node.lineno})")
    assert not parsing, f"argparse outside rl_core.cli: {parsing}; move the command there"


COLLECTIVES = {"all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
               "gather", "scatter", "send", "recv", "isend", "irecv"}


def test_every_collective_goes_through_rl_core_collectives():
    """NCCL and HCCL take device tensors only and HCCL has no float64: rl_core.collectives puts
    each tensor where its group's backend takes it, so no other module calls torch.distributed's
    collectives itself (`dist.all_reduce(...)`)."""
    direct = []
    for name, path in MODULES.items():
        if name == "rl_core.collectives":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in COLLECTIVES and isinstance(node.func.value, ast.Name)
                    and node.func.value.id in ("dist", "distributed")):
                direct.append(f"{name} (line {node.lineno}): dist.{node.func.attr}")
    assert not direct, f"collectives outside rl_core.collectives: {direct}; use its helpers"

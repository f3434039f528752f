"""The package's import graph, read from the source (every import, at module level or inside
a function): no cycle between modules, and each layer imports only those below it, so the
folders keep meaning what docs/architecture.md says they mean."""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "sglang_domino"
PLUGIN = f"{PACKAGE}.sglang"


def _modules() -> dict[str, str]:
    out = {}
    base = os.path.join(ROOT, PACKAGE)
    for folder, _, names in os.walk(base):
        if "__pycache__" in folder:
            continue
        for name in names:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(folder, name)
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The longest module of the package `name` names (a module, or an attribute of one)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in MODULES:
            return candidate
    return None


def imports_of(module: str) -> set[str]:
    path = MODULES[module]
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            names = [f"{stem}.{a.name}" for a in node.names] + [stem]
        else:
            continue
        for name in names:
            target = _resolve(name) if name.startswith(PACKAGE) else None
            if target and target != module:
                found.add(target)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def _package_of(module: str, target: str) -> bool:
    """An import of a package's `__init__` from inside that package is how Python loads it, not an edge."""
    return module.startswith(target + ".")


def test_no_import_cycle():
    """A depth-first walk finds no module that reaches itself (package `__init__`s entered
    from inside are not edges)."""
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(GRAPH[m]):
            if _package_of(m, t):
                continue
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)
    assert not cycles, cycles


# the launchers of SGLang servers (`launch`, `demo`) read the plugin's environment table
LAUNCHERS = (f"{PACKAGE}.launch", f"{PACKAGE}.demo")

# what each layer may not import: the core (math, checkpoints, the Transformers backend, the
# trainer) knows nothing of SGLang's plugin; the CPU port (stock SGLang on CPU) imports from the
# plugin above it only its two leaves, the environment table and the settings channel
FORBIDDEN = {
    "core": (lambda m: not m.startswith(PLUGIN) and m not in LAUNCHERS, lambda t: t.startswith(PLUGIN)),
    "cpu port": (lambda m: m.startswith(f"{PLUGIN}.cpu"),
                 lambda t: t.startswith(PLUGIN) and not t.startswith(f"{PLUGIN}.cpu")
                 and t not in (PLUGIN, f"{PLUGIN}.environment", f"{PLUGIN}.settings", f"{PLUGIN}.adaptive",
                               f"{PLUGIN}.adaptive.settings")),
}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_upward_import(layer):
    inside, forbidden = FORBIDDEN[layer]
    bad = sorted(f"{m} -> {t}" for m in GRAPH if inside(m) for t in GRAPH[m] if forbidden(t))
    assert not bad, bad


def test_the_graph_sees_relative_and_lazy_imports():
    """The reader resolves relative imports and imports inside functions (a check of the check)."""
    assert f"{PLUGIN}.cpu.compiled.switches" in GRAPH[f"{PLUGIN}.step.compiled_rollout"]
    assert f"{PLUGIN}.seam.hooks" in GRAPH[f"{PLUGIN}.step.worker"]
    assert f"{PACKAGE}.rollout" in GRAPH[f"{PLUGIN}.step.compiled_rollout"]

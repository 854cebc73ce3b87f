"""The package's import layout (docs/architecture.md, "The wings"), read from the source with `ast`: no import circle
between files, no wing importing one after it in the list (a climb), and no import of the package's own modules inside
a function."""

from __future__ import annotations

import ast
from pathlib import Path

import mot_viz

ROOT = Path(mot_viz.__file__).parent
BASE = ("errors", "cli", "fsutil")  # the shared modules every wing may import; they import only each other
WINGS = ("engine", "data", "train", "sharing", "eval", "analysis", "app")  # each imports only the wings before it (and BASE)
# the project imports that stay inside a function, each for an optional heavy dependency
INNER_ALLOWED = {
    ("mot_viz.engine.models", "mot_viz.engine.hf"): "hf imports transformers: loaded with the first model, so that "
                                                    "reading a model's name, spec or cache folder does not pay for it",
}


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(module: str, source: str | None = None) -> list[tuple[str, int, bool]]:
    """(imported project module, line, inside a function) of every import statement of `module` (its file, or
    `source` in its place)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source, str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    inner = {id(node) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
             for node in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] != "mot_viz":
                continue
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != module:
                found.append((target, node.lineno, id(node) in inner))
    return found


IMPORTS = {m: _imports(m) for m in MODULES}


def _wing(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _circles() -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan), each sorted."""
    edges = {m: sorted({t for t, _, _ in found}) for m, found in IMPORTS.items()}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                circles.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return circles


def test_every_module_is_in_a_wing():
    strays = [m for m in MODULES if _wing(m) not in ("", *BASE, *WINGS)]
    assert not strays, f"modules outside the wings of docs/architecture.md: {strays}"


def test_no_import_circle_between_files():
    assert not _circles(), f"import circles (each a set of files importing one another): {_circles()}"


def test_no_wing_imports_one_after_it():
    climbs = []
    for module, found in IMPORTS.items():
        wing = _wing(module)
        for target, line, _ in found:
            to = _wing(target)
            if wing in BASE or wing == "":
                bad = to not in BASE and wing != ""
            else:
                bad = to in WINGS and WINGS.index(to) > WINGS.index(wing)
            if bad:
                climbs.append(f"{module}:{line} -> {target}")
    assert not climbs, ("imports of a wing after the importer's in docs/architecture.md's list:\n"
                        + "\n".join(sorted(set(climbs))))


def test_no_project_import_inside_a_function():
    inner = [f"{m}:{line} -> {t}" for m, found in IMPORTS.items() for t, line, inside in found
             if inside and (m, t) not in INNER_ALLOWED]
    assert not inner, ("imports of the package's own modules inside a function (move them to the top of the "
                       "module):\n" + "\n".join(sorted(set(inner))))


def test_each_import_left_inside_a_function_says_why():
    for (module, target), _ in INNER_ALLOWED.items():
        lines = MODULES[module].read_text(encoding="utf-8").splitlines()
        found = [line for t, line, inside in IMPORTS[module] if t == target and inside]
        assert found, f"{module} no longer imports {target} inside a function: drop it from INNER_ALLOWED"
        assert all("#" in lines[line - 1] for line in found), f"{module}:{found[0]}: say in a comment why it stays"


def test_the_walk_sees_imports_of_every_kind():
    """The checks above read what they should: relative (a module or a name of it), absolute and function-level."""
    source = ("import torch\nfrom . import hf\nfrom .alignment import encode\nimport mot_viz.errors\n"
              "from ..eval.answers import answers_from_caches\n"
              "def f():\n    from ..data import eval_data\n    return [lambda: __import__('x')]\n")
    assert _imports("mot_viz.engine.mot", source) == [
        ("mot_viz.engine.hf", 2, False), ("mot_viz.engine.alignment", 3, False), ("mot_viz.errors", 4, False),
        ("mot_viz.eval.answers", 5, False), ("mot_viz.data.eval_data", 7, True)]
    assert _wing("mot_viz.eval.answers") == "eval" and _wing("mot_viz.cli") == "cli"

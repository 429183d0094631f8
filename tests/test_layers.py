"""The package's layers and its import graph: imports flow one way and no module imports itself back.

cli → sweep → run → engine → model, and run also uses data, io and tracking; each top-level package
may import only the layers below it. Every import counts, also one inside a function, because a
cycle hidden in a function is still a cycle. ``pytest tests/test_layers.py`` is the check.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pvm_dist

PACKAGE = Path(pvm_dist.__file__).resolve().parent
BASE = {"_version", "_native"}  # the version, and the compiled module (part of the engine)
BELOW: dict[str, set[str]] = {
    "model": set(),
    "data": set(),
    "tracking": set(),
    "io": {"model"},
    "engine": {"model"},
    "run": {"engine", "model", "data", "io", "tracking"},
    "sweep": {"run", "engine", "model", "data", "io", "tracking"},
    "cli": {"sweep", "run", "engine", "model", "data", "io", "tracking"},
}
ROOT_MAY_IMPORT = {"model", "engine"}  # pvm_dist/__init__.py re-exports load_spec, build_engine


def _module_name(path: Path) -> str:
    parts = ["pvm_dist", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    """Every pvm_dist module that ``path`` imports, anywhere in the file."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "pvm_dist")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if base.split(".")[0] != "pvm_dist":
                continue
            for alias in node.names:  # `from pvm_dist.x import y` may import the module pvm_dist.x.y
                sub = f"{base}.{alias.name}"
                out.add(sub if _is_module(sub) else base)
    return out


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


def _graph() -> dict[str, set[str]]:
    files = sorted(p for p in PACKAGE.rglob("*.py") if "model_zoo" not in p.parts)
    return {_module_name(p): _imports(p, _module_name(p)) for p in files}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_import_goes_down_a_layer() -> None:
    wrong = []
    for module, deps in _graph().items():
        layer = _layer(module)
        if layer in BASE:
            assert not deps, f"{module} is imported by every layer, so it imports nothing of pvm_dist"
            continue
        allowed = ROOT_MAY_IMPORT if layer == "" else BELOW.get(layer)
        assert allowed is not None, f"{module}: top-level package {layer!r} has no place in the layers"
        for dep in deps:
            target = _layer(dep)
            if target != layer and target not in BASE and target not in allowed:
                wrong.append(f"{module} imports {dep} ({layer or 'root'} may use {sorted(allowed)})")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def test_no_import_cycles() -> None:
    graph = _graph()
    cycles = _strongly_connected(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in cycles)


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_check_sees_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from pvm_dist.model import spec\n    import pvm_dist.engine.base\n")
    assert _imports(source, "pvm_dist.x.m") == {"pvm_dist.model.spec", "pvm_dist.engine.base"}

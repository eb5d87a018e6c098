"""The layers of zsim's real-run side: zsim.backend (runs a plan for real) <-
zsim.calibration (measures and fits) <- zsim.validation (compares), read from the
source's import statements (every one, those inside functions too):

- no import cycle among their modules;
- a layer imports nothing from the layers above it;
- zsim's core imports none of them: only zsim.calibrate_api and zsim.validate_api do, and
  only inside their functions, so that the `zsim` command starts without torch;
- torch and deepspeed are imported only under the three packages;
- no module of theirs is over MAX_LINES lines.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ZSIM = Path(__file__).resolve().parents[1] / "zsim"
LAYERS = ("zsim.backend", "zsim.calibration", "zsim.validation")
"""Bottom first: each may import the ones before it, never one after it."""
API = {"zsim.calibrate_api", "zsim.validate_api"}
"""The modules of zsim's core that call into the layers (inside their functions)."""
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    """Every module under zsim/, by dotted name (a package by its __init__'s)."""
    out = {}
    for path in sorted(ZSIM.rglob("*.py")):
        parts = path.relative_to(ZSIM.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module imported, whether at the module's top level) of every import statement; a
    `from package import name` names package.name where that is a module."""
    modules = _modules()
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                out.append((name if name in modules else node.module, id(node) in top))
    return out


def _layer(module: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS)
                 if module == layer or module.startswith(layer + ".")), None)


def _graph() -> dict[str, set[str]]:
    """Imports among the layers' modules."""
    modules = _modules()
    return {name: {m for m, _ in _imports(path) if m in modules and _layer(m) is not None}
            for name, path in modules.items() if _layer(name) is not None}


def test_the_layers_hold_modules() -> None:
    """The checks below see the real packages (a renamed folder would pass them empty)."""
    graph = _graph()
    for layer in LAYERS:
        assert sum(_layer(m) == LAYERS.index(layer) for m in graph) > 5, layer


def test_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            assert state.get(dep) != 1, "cycle: " + " -> ".join([*path, module, dep])
            if dep not in state:
                visit(dep, [*path, module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_a_layer_imports_nothing_above_it() -> None:
    wrong = [(module, dep) for module, deps in _graph().items() for dep in deps
             if (_layer(dep) or 0) > (_layer(module) or 0)]
    assert not wrong


def test_the_core_reaches_the_layers_only_through_the_api_modules() -> None:
    wrong = []
    for name, path in _modules().items():
        if _layer(name) is not None:
            continue
        for module, at_top in _imports(path):
            if _layer(module) is not None and (name not in API or at_top):
                wrong.append((name, module))
    assert not wrong


def test_torch_is_imported_only_under_the_layers() -> None:
    wrong = [(name, module) for name, path in _modules().items() if _layer(name) is None
             for module, _ in _imports(path)
             if module.split(".")[0] in ("torch", "deepspeed")]
    assert not wrong


def test_the_command_line_starts_without_torch() -> None:
    """Importing the CLI (every command's module) imports neither torch nor the layers."""
    code = ("import sys, zsim.cli; print(sorted(m for m in sys.modules if m == 'torch' or "
            "m.startswith(('zsim.backend', 'zsim.calibration', 'zsim.validation'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_no_module_of_the_layers_is_over_max_lines() -> None:
    long = {name: n for name, path in _modules().items() if _layer(name) is not None
            and (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long

"""The house's arrows (ARCHITECTURE.md), read from the imports of every source file.

Every ``import`` is counted, including those inside functions: an import deferred to a
function still ties the two modules together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: source folder -> the module name it installs as (setup.py's package_dir)
SOURCES = {"alt_tvm": "alt_tvm", "strategies": "alt_tvm.strategies", "tuning": "alt_tvm.tuning",
           "vta_mapping": "alt_tvm.vta_mapping"}

#: importer prefix -> module prefixes it must never import
FORBIDDEN = {
    "alt_tvm.strategies": ("alt_tvm.graph", "alt_tvm.tuning", "alt_tvm.integration", "alt_tvm.in_model",
                           "alt_tvm.cli", "alt_tvm.models"),
    "alt_tvm.tuning": ("alt_tvm.graph", "alt_tvm.integration", "alt_tvm.in_model", "alt_tvm.cli", "alt_tvm.models"),
    "alt_tvm.graph": ("alt_tvm.tuning", "alt_tvm.integration", "alt_tvm.in_model", "alt_tvm.cli"),
    "alt_tvm.in_model": ("alt_tvm.tuning", "alt_tvm.integration", "alt_tvm.cli", "alt_tvm.models"),
    "alt_tvm.records": ("alt_tvm.graph", "alt_tvm.tuning", "alt_tvm.strategies", "alt_tvm.integration",
                        "alt_tvm.layout", "alt_tvm.ops"),
    "alt_tvm.layout": ("alt_tvm.ops", "alt_tvm.strategies", "alt_tvm.graph", "alt_tvm.tuning", "alt_tvm.records",
                       "alt_tvm.integration", "alt_tvm.target", "alt_tvm.vta_mapping", "alt_tvm.models"),
    "alt_tvm.ops": ("alt_tvm.strategies", "alt_tvm.graph", "alt_tvm.tuning", "alt_tvm.records",
                    "alt_tvm.integration", "alt_tvm.vta_mapping"),
    "alt_tvm.vta_mapping": ("alt_tvm.strategies", "alt_tvm.graph", "alt_tvm.tuning", "alt_tvm.integration"),
    # what runs a compiled model: loading an artifact must not pull in the build code
    "alt_tvm.deploy": ("alt_tvm.graph", "alt_tvm.strategies", "alt_tvm.tuning", "alt_tvm.integration",
                       "alt_tvm.in_model", "alt_tvm.cli", "alt_tvm.models", "alt_tvm.layout", "alt_tvm.ops",
                       "alt_tvm.records", "alt_tvm.vta_mapping", "alt_tvm.bench"),
    # the benchmarking package: peers and timing, used by the in-model stage and the tuner's runners
    "alt_tvm.bench": ("alt_tvm.tuning", "alt_tvm.integration", "alt_tvm.in_model", "alt_tvm.cli"),
    "alt_tvm.rpc": ("alt_tvm.graph", "alt_tvm.strategies", "alt_tvm.tuning", "alt_tvm.deploy"),
    "alt_tvm.toolchain": ("alt_tvm.graph", "alt_tvm.strategies", "alt_tvm.tuning", "alt_tvm.deploy"),
    "alt_tvm.native_log": ("alt_tvm.graph", "alt_tvm.strategies", "alt_tvm.tuning", "alt_tvm.deploy"),
}

#: the packages whose mutual imports must form no cycle
PACKAGES = ("alt_tvm.layout", "alt_tvm.ops", "alt_tvm.strategies", "alt_tvm.graph", "alt_tvm.tuning",
            "alt_tvm.records", "alt_tvm.integration", "alt_tvm.in_model", "alt_tvm.target", "alt_tvm.vta_mapping",
            "alt_tvm.cli", "alt_tvm.deploy", "alt_tvm.rpc", "alt_tvm.toolchain", "alt_tvm.native_log",
            "alt_tvm.models", "alt_tvm.bench")


def module_name(path: Path) -> str:
    folder = path.relative_to(ROOT).parts[0]
    parts = [SOURCES[folder], *path.relative_to(ROOT / folder).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, *, is_package: bool = False, typing: bool = True) -> set[str]:
    """Absolute names of every module ``source`` (the text of ``module``) imports; without the
    imports under ``if TYPE_CHECKING:`` when ``typing`` is False (they do not run)."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    if not typing:
        tree.body = [node for node in tree.body if not (
            isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module
            found.add(prefix)
            found.update(f"{prefix}.{alias.name}" for alias in node.names)  # "from pkg import module"
    return found


def source_files() -> list[Path]:
    return sorted(p for folder in SOURCES for p in (ROOT / folder).rglob("*.py"))


def violations(importer: str, imported: set[str]) -> list[str]:
    bad = []
    for prefix, never in FORBIDDEN.items():
        if importer == prefix or importer.startswith(prefix + "."):
            bad += [f"{importer} imports {name}" for name in sorted(imported)
                    if any(name == n or name.startswith(n + ".") for n in never)]
    return bad


def package_of(name: str) -> str | None:
    return next((p for p in PACKAGES if name == p or name.startswith(p + ".")), None)


def test_the_checker_sees_a_forbidden_import_inside_a_function():
    source = "def f():\n    from alt_tvm.graph.build import prepare\n    from ..graph import partition\n"
    imported = imports_of(source, "alt_tvm.strategies.alt.conv")
    assert "alt_tvm.graph.build" in imported
    assert violations("alt_tvm.strategies.alt.conv", imported)
    assert violations("alt_tvm.tuning.task", imports_of("import alt_tvm.graph", "alt_tvm.tuning.task"))
    assert not violations("alt_tvm.integration", imported)


def test_relative_imports_resolve_against_the_installed_package():
    assert "alt_tvm.strategies.alt.conv" in imports_of("from .conv import X", "alt_tvm.strategies.alt.conv_cuda")
    assert "alt_tvm.strategies.base" in imports_of("from ..base import X", "alt_tvm.strategies.alt.gemm")
    assert "alt_tvm.strategies.alt.conv" in imports_of("from . import conv", "alt_tvm.strategies.alt",
                                                       is_package=True)


@pytest.mark.parametrize("path", source_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_forbidden_import(path):
    module = module_name(path)
    assert violations(module, imports_of(path.read_text(), module, is_package=path.name == "__init__.py")) == []


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` (node -> successors) as a list of nodes, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for succ in sorted(graph.get(node, ())):
            if state.get(succ) == 1:
                return stack[stack.index(succ):] + [succ]
            if succ not in state and (found := visit(succ)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_imports_for_annotations_only_are_told_apart():
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .base import Partition\n"
              "from . import space\n")
    assert "alt_tvm.strategies.base" in imports_of(source, "alt_tvm.strategies.pattern")
    runtime = imports_of(source, "alt_tvm.strategies.pattern", typing=False)
    assert "alt_tvm.strategies.base" not in runtime and "alt_tvm.strategies.space" in runtime


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def test_packages_import_each_other_without_cycles():
    graph: dict[str, set[str]] = {}
    for path in source_files():
        module = module_name(path)
        owner = package_of(module)
        if owner is None:
            continue
        for name in imports_of(path.read_text(), module, is_package=path.name == "__init__.py"):
            other = package_of(name)
            if other is not None and other != owner:
                graph.setdefault(owner, set()).add(other)
    assert _cycle(graph) is None


def test_modules_of_a_package_import_each_other_without_cycles():
    files = {module_name(p): p for p in source_files()}
    # Imports for type annotations only do not run: two modules of one contract may name each
    # other's types.
    graph = {module: {name for name in imports_of(path.read_text(), module, is_package=path.name == "__init__.py",
                                                  typing=False)
                      if name in files and name != module and not module.startswith(name + ".")}
             for module, path in files.items()}
    # A package's __init__ importing its own modules (to register them) is not a cycle between files.
    for module in graph:
        graph[module] = {n for n in graph[module] if not (files[n].name == "__init__.py" and module.startswith(n))}
    assert _cycle(graph) is None

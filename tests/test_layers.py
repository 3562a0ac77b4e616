"""The package's imports run one way, down these layers (docs/architecture.md, "Layers"):

    cli -> bench -> train / check -> workloads -> launch -> watch -> shim -> ray / spark -> the Horovod API
    -> engine -> env

``ringtrain.exceptions`` is at the bottom, usable from anywhere. Imports are read from the source
with ``ast``, those inside functions included: a lazy import that goes upward is a cycle in disguise.

Inside a layer, no two modules import each other, lazily or not; nor do two packages or modules that
sit side by side in one package (``ringtrain.ops`` and ``ringtrain.process_sets``, say), through any
of their modules, at import time. Between such siblings an import inside a function is the way to
defer one that must go back.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "ringtrain"

#: (layer, rank, module prefixes), top first. An import may stay inside its own layer or go to a
#: layer of lower rank; layers of equal rank do not import each other.
LAYERS: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    ("entry", 90, ("ringtrain.__main__",)),
    ("cli", 80, ("ringtrain.cli",)),
    ("bench", 70, ("ringtrain.bench",)),
    ("train", 60, ("ringtrain.train",)),
    ("check", 60, ("ringtrain.check",)),
    ("workloads", 50, ("ringtrain.workloads",)),
    ("launch", 40, ("ringtrain.launch",)),
    # The watch of stuck ranks: the agent's side and the ranks' probes; it needs nothing of ours.
    ("watch", 38, ("ringtrain.watch",)),
    # The horovod shim forwards to the API; the launcher puts it on the workers' PYTHONPATH.
    ("shim", 35, ("ringtrain.shim",)),
    # Horovod's Ray executor: the shim's horovod.ray forwards to it; it needs only the engine.
    ("ray", 33, ("ringtrain.ray",)),
    # Horovod's Spark runner: the shim's horovod.spark forwards to it; like ray, it needs only the engine.
    ("spark", 33, ("ringtrain.spark",)),
    ("api", 30, ("ringtrain.mpi_ops", "ringtrain.optimizer", "ringtrain.functions", "ringtrain.compression",
                 "ringtrain.elastic", "ringtrain.process_sets", "ringtrain.sync_batch_norm", "ringtrain.ops",
                 "ringtrain.op_requests", "ringtrain.optimizer_names", "ringtrain.adasum_optimizer",
                 "ringtrain.overlap", "ringtrain.powersgd", "ringtrain.local_sgd", "ringtrain.exchange",
                 "ringtrain.sharding")),
    ("engine", 20, ("ringtrain.engine",)),
    ("env", 10, ("ringtrain.env",)),
    ("exceptions", 0, ("ringtrain.exceptions",)),
)

#: The package itself: ``import ringtrain as hvd`` resolves its names on first use (PEP 562), so it
#: reaches every layer lazily (``hvd.run`` is the launcher, ``hvd.Trainer`` the Trainer) and is outside
#: the layering; any module may import it, which is why it may import nothing of ours at module level.
FACADE = "ringtrain"

#: Upward imports that another change removes; each entry says which. Keep this empty otherwise.
ALLOWED: frozenset[tuple[str, str]] = frozenset()

#: Import circles that another change removes; each entry says which. Keep this empty otherwise.
ALLOWED_CIRCLES: frozenset[frozenset[str]] = frozenset()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


MODULES = all_modules()


def _type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``: true for type checkers only."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _run_at_import(tree: ast.Module) -> Iterator[ast.AST]:
    """The nodes that run when the module is imported: not function bodies, nor ``if TYPE_CHECKING:``."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and _type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, module_level_only: bool = False) -> Iterator[tuple[str, int]]:
    """(imported ringtrain module, line) for every import in ``path``, at any depth; with
    ``module_level_only``, those that run when the module is imported (none inside a function)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = _run_at_import(tree) if module_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                # "from ringtrain import mpi_ops" names a submodule; "from ringtrain import __version__" not
                sub = f"{target}.{alias.name}"
                yield (sub if sub in MODULES else target), node.lineno


def ours(target: str) -> bool:
    return target == FACADE or target.startswith(FACADE + ".")


def layer_of(name: str) -> tuple[str, int] | None:
    for layer, rank, prefixes in LAYERS:
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return layer, rank
    return None


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = [name for name in MODULES if name != FACADE and layer_of(name) is None]
    assert unplaced == [], f"add these modules to LAYERS in {Path(__file__).name}: {unplaced}"


def test_imports_run_down_the_layers() -> None:
    violations = []
    for name, path in MODULES.items():
        if name == FACADE:
            continue
        source_layer, source_rank = layer_of(name) or ("?", -1)
        for target, line in imports_of(name, path):
            if not ours(target) or target == FACADE:
                continue
            target_layer, target_rank = layer_of(target) or ("?", -1)
            if target_layer == source_layer or target_rank < source_rank or (name, target) in ALLOWED:
                continue
            violations.append(f"{name}:{line} ({source_layer}) imports {target} ({target_layer})")
    assert violations == [], "imports that go up or sideways:\n" + "\n".join(violations)


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (the facade left out: it is imported by everyone)."""
    graph: dict[str, set[str]] = {name: set() for name in MODULES if name != FACADE}
    for name in graph:
        graph[name] = {t for t, _ in imports_of(name, MODULES[name]) if ours(t) and t not in (FACADE, name)}
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_circle() -> None:
    found = [sorted(c) for c in circles(import_graph()) if c not in ALLOWED_CIRCLES]
    assert found == [], f"modules that import each other (lazy imports included): {found}"


def packages() -> list[str]:
    return sorted(name for name, path in MODULES.items() if path.name == "__init__.py")


def sibling_graph(package: str) -> dict[str, set[str]]:
    """The modules and subpackages directly in ``package``, each standing for all of its modules ->
    the siblings they import when imported (imports inside functions left out)."""
    depth = package.count(".") + 1

    def sibling(module: str) -> str | None:
        if not module.startswith(package + "."):
            return None
        return ".".join(module.split(".")[: depth + 1])

    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        source = sibling(name)
        if source is None:
            continue
        graph.setdefault(source, set())
        for target, _ in imports_of(name, path, module_level_only=True):
            other = sibling(target) if ours(target) else None
            if other is not None and other != source:
                graph[source].add(other)
    return graph


@pytest.mark.parametrize("package", packages())
def test_no_import_circle_between_siblings(package: str) -> None:
    found = [sorted(c) for c in circles(sibling_graph(package)) if c not in ALLOWED_CIRCLES]
    assert found == [], (
        f"modules or packages of {package} that import each other at import time (through any of their "
        f"modules; defer one import into a function, or move what both need below them): {found}"
    )


def test_the_sibling_graph_stands_a_package_for_its_modules() -> None:
    graph = sibling_graph("ringtrain")
    assert "ringtrain.engine" in graph["ringtrain.ops"]  # ringtrain.ops.* imports ringtrain.engine.*
    assert "ringtrain.engine.state" not in graph["ringtrain.ops"]
    assert all(not t.startswith("ringtrain.ops.") for t in graph.get("ringtrain.mpi_ops", ()))
    # an import under "if TYPE_CHECKING:" does not run, one inside a function runs later
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import a\nelse:\n    import b\n"
        "def f():\n    import c\n"
        "class K:\n    import d\n"
        "try:\n    import e\nexcept ImportError:\n    pass\n"
    )
    nodes = _run_at_import(ast.parse(source))
    run = {alias.name for node in nodes if isinstance(node, ast.Import) for alias in node.names}
    assert run == {"b", "d", "e"}


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [frozenset({"a", "b", "c"})]


def test_the_package_facade_imports_nothing_of_ours_at_module_level() -> None:
    found = [t for t, _ in imports_of(FACADE, MODULES[FACADE], module_level_only=True) if ours(t)]
    assert found == []


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("ringtrain.launch")))
def test_launch_is_a_library_without_argparse_or_cli(name: str) -> None:
    targets = {t for t, _ in imports_of(name, MODULES[name])}
    assert "argparse" not in targets
    assert not [t for t in targets if t.startswith("ringtrain.cli")]


def test_the_graph_is_read_correctly() -> None:
    # the reader itself: relative, lazy and "from package import submodule" imports are all seen
    launch_api = dict(imports_of("ringtrain.launch.api", MODULES["ringtrain.launch.api"]))
    assert "ringtrain.launch.entry" in launch_api  # imported inside run()
    name = "ringtrain.train.strategies"  # says "from ringtrain import mpi_ops"
    assert "ringtrain.mpi_ops" in {t for t, _ in imports_of(name, MODULES[name])}
    assert layer_of("ringtrain.engine.background") == ("engine", 20)

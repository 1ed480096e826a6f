"""The package's shape, read from its source (issue 19): no import cycle, dependencies one way, no
library module over the size limit without its reason, models/ holding adapters only.

The import graph is built here from the files' syntax trees (every ``import``, including those inside
functions, and package ``__init__`` files as modules of their own), independently of the package: a
module is never imported, so an import that only happens at run time counts as much as one at the top.

A command is not the library: a package's ``__main__`` module and a module's ``if __name__ == "__main__":``
block may hand over to a higher layer's command (``python -m videokv_node.eval --via ros`` runs
``programs/evaluate.py``). That code runs only as the program itself (``__main__``), which no module imports,
so its imports make neither a cycle nor a dependency of the library: the graph leaves them out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "videokv_node" / "videokv_node"

# Layers, lowest first: a module may import its own layer and those below, never above.
# programs -> ros -> runtime / eval / spava / tinyvlm -> memory -> ingest / vision -> models -> the ground floor.
# programs (demo, client, synthetic camera, launcher, long-replay service, evaluation over DDS) use the node
# from outside, as a user would; ros/ is the node and its surfaces only.
# view (issue 46: the memory drawn as marker content and a contact sheet) reads the memory's blocks.
# tinyvlm (the self-trained model's data, training and evaluation) sits beside eval: its evaluation
# streams frames into the memory engine and asks it questions.
LAYERS = {
    "programs": 6,
    "ros": 5,
    "runtime": 4, "eval": 4, "spava": 4, "tinyvlm": 4, "view": 4,
    "memory": 3,
    "ingest": 2, "vision": 2,
    "models": 1,
}
MAX_LINES = 350
SIZE_REASON = "Why one module:"  # a docstring line that says why a longer module is kept whole
ROS_ONLY = ("rclpy", "rosidl_runtime_py", "launch", "launch_ros", "tf2_ros", "videokv_interfaces",
            "sensor_msgs", "geometry_msgs", "nav_msgs", "diagnostic_msgs", "std_msgs", "builtin_interfaces",
            "lifecycle_msgs", "rosbag2_py", "message_filters", "cv_bridge", "visualization_msgs")


def module_files() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


MODULES = module_files()


def _resolve(name: str) -> str | None:
    """The package module that ``name`` (a module or a name inside one) lives in, or None if outside."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _is_main_guard(node: ast.AST) -> bool:
    """``if __name__ == "__main__":``"""
    test = getattr(node, "test", None)
    return (isinstance(node, ast.If) and isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__" and len(test.comparators) == 1
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == "__main__")


def _library_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under an ``if __name__ == "__main__":`` block."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        todo.extend(child for child in ast.iter_child_nodes(node) if not _is_main_guard(child))


def imports_of(module: str, commands: bool = True) -> tuple[set[str], set[str]]:
    """(package modules, top-level outside packages) that ``module``'s source imports anywhere;
    ``commands`` False: leaving out a ``__main__`` module's and ``__main__`` blocks' imports."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    inside, outside = set(), set()
    if not commands and path.name == "__main__.py":
        return inside, outside
    tree = ast.parse(path.read_text(), str(path))
    for node in (ast.walk(tree) if commands else _library_nodes(tree)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names = [f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source for a in node.names]
        for name in names:
            target = _resolve(name)
            if target is not None:
                if target != module:
                    inside.add(target)
            else:
                outside.add(name.split(".")[0])
    return inside, outside


GRAPH = {m: imports_of(m, commands=False)[0] for m in MODULES}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module (an iterative walk: no recursion limit)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    cycles = strongly_connected(GRAPH)
    assert not cycles, "import cycles (each a set of modules that import each other, directly or not):\n" + \
        "\n".join(" <-> ".join(c) for c in cycles)


def test_no_import_circle_through_a_command_block():
    """A module's ``__main__`` block may hand over to a higher layer's command, but not to one that imports the
    module back (issue 35: ``spava/server.py`` and the service's command imported each other's ``main``).
    ``__main__`` modules are left out: no module imports them."""
    graph = {m: imports_of(m, commands=True)[0] for m in MODULES if MODULES[m].name != "__main__.py"}
    graph = {m: targets & graph.keys() for m, targets in graph.items()}
    cycles = strongly_connected(graph)
    assert not cycles, "import circles through command blocks:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_main_guard_imports_are_commands_not_library():
    tree = ast.parse("import a\nif __name__ == '__main__':\n    import b\nif x:\n    import c\n")
    names = {alias.name for node in _library_nodes(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert names == {"a", "c"}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_dependencies_point_one_way():
    upward = [f"{m} -> {t}" for m, targets in GRAPH.items() for t in sorted(targets)
              if _layer(m) is not None and _layer(t) is not None and _layer(t) > _layer(m)]
    assert not upward, "imports from a lower layer into a higher one:\n" + "\n".join(upward)


# Inside memory/, every module has a layer, lowest first (docs/ARCHITECTURE.md, issue 45): the records at the
# bottom (settings, clocks, state errors, and the engine's vocabulary: its configs, requests and stats), then a
# method's arithmetic (scoring/: no blocks, no model), the store (no context), a question's context and the model
# runner (no policy), the policies, the engine's collaborators (frames/: ingest; questions/; snapshot/: the state
# out and in), and the engine on top. No module of memory/ is left without a layer.
MEMORY_LAYERS = {"records": 0, "scoring": 1, "store": 2, "context": 3, "policies": 4, "frames": 5, "questions": 5, "snapshot": 5}
# The loose modules of memory/: the engine's face, what ``memory/__init__`` exports, and nothing else.
MEMORY_FACE = {"config": 0, "question": 0, "stats": 0, "engine": 6}
MEMORY_TOP = 6  # memory/__init__ itself


def _memory_layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] != "memory":
        return None
    if len(parts) == 2:
        return MEMORY_TOP
    if parts[2] in MEMORY_LAYERS:
        return MEMORY_LAYERS[parts[2]]
    return MEMORY_FACE.get(parts[2]) if len(parts) == 3 else None


def test_every_memory_module_has_a_layer():
    """A new loose module in memory/ (or a new subpackage) must be placed: its layer named above."""
    unplaced = [m for m in MODULES if m.startswith("videokv_node.memory") and _memory_layer(m) is None]
    assert not unplaced, "modules of memory/ without a layer (MEMORY_LAYERS, MEMORY_FACE):\n" + "\n".join(unplaced)


def test_memory_face_is_what_the_package_exports():
    tree = ast.parse(MODULES["videokv_node.memory"].read_text())
    home = next(node.value for node in ast.walk(tree) if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_HOME")
    assert {v.value for v in home.values} == set(MEMORY_FACE)


def test_memory_subpackages_point_one_way():
    upward = [f"{m} -> {t}" for m, targets in GRAPH.items() for t in sorted(targets)
              if _memory_layer(m) is not None and _memory_layer(t) is not None and _memory_layer(t) > _memory_layer(m)]
    assert not upward, "imports from a lower memory/ layer into a higher one:\n" + "\n".join(upward)


def test_layer_finder_places_every_kind_of_module():
    assert _memory_layer("videokv_node.memory") == MEMORY_TOP
    assert _memory_layer("videokv_node.memory.engine") == 6 and _memory_layer("videokv_node.memory.config") == 0
    assert _memory_layer("videokv_node.memory.scoring.rekv") == 1 and _memory_layer("videokv_node.memory.scoring") == 1
    assert _memory_layer("videokv_node.memory.loose") is None and _memory_layer("videokv_node.ros.node") is None


def _calls_and_names(module: str) -> tuple[set[str], set[str]]:
    """(attributes called as methods, names imported) in ``module``'s source."""
    tree = ast.parse(MODULES[module].read_text())
    calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    names = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    return calls, names


# Issue 45: one object runs the model for the memory (context/model_runner.py, and the batch prefill it runs).
MODEL_RUNNERS = {"videokv_node.memory.context.model_runner", "videokv_node.memory.context.batch_prefill"}


def test_one_place_runs_the_model_for_the_memory():
    callers = sorted(m for m in MODULES if m.startswith("videokv_node.memory.") and m not in MODEL_RUNNERS
                     and "forward" in _calls_and_names(m)[0])
    assert not callers, f"modules of memory/ that run the model themselves (ask the ModelRunner): {callers}"


def test_scoring_imports_no_model_and_policies_build_no_cache():
    scoring = [f"{m} -> {t}" for m in MODULES if m.startswith("videokv_node.memory.scoring") for t in GRAPH[m]
               if t.startswith("videokv_node.models")]
    scoring += [f"{m} imports transformers" for m in MODULES if m.startswith("videokv_node.memory.scoring")
                and "transformers" in imports_of(m)[1]]
    assert not scoring, "scoring/ is a method's arithmetic, no model:\n" + "\n".join(scoring)
    builders = {"placed_cache", "place_layer", "DynamicCache", "transformers.cache_utils"}
    policies = [f"{m}: {sorted(builders & _calls_and_names(m)[1])}" for m in MODULES
                if m.startswith("videokv_node.memory.policies") and builders & _calls_and_names(m)[1]]
    assert not policies, "policies ask their host for caches and passes:\n" + "\n".join(policies)


ROS_PACKAGES = ("ros", "programs")  # the only packages that may import ROS


@pytest.mark.parametrize("module", sorted(m for m in MODULES if "." in m and m.split(".")[1] not in ROS_PACKAGES))
def test_library_never_imports_ros(module):
    outside = imports_of(module)[1]
    assert not outside & set(ROS_ONLY), f"{module} imports {sorted(outside & set(ROS_ONLY))}"


def test_the_installed_package_imports_nothing_of_the_repository():
    """bench/, tests/ and scripts/ are the repository's, not installed: a module of the package importing them
    (even lazily, inside a function) breaks where only the package is installed (issue 45: tinyvlm's writers)."""
    offenders = {m: sorted(imports_of(m)[1] & {"bench", "tests", "scripts"}) for m in MODULES}
    assert not {m: o for m, o in offenders.items() if o}


def test_models_holds_adapters_only():
    """Training data, training and the self-trained model's evaluation live in tinyvlm/, not models/."""
    offenders = [m for m in MODULES if m.startswith("videokv_node.models.")
                 and any(word in m.rpartition(".")[2] for word in ("train", "scene", "story", "variety", "eval"))]
    assert not offenders, f"not model adapters: {offenders}"


BENCH = PACKAGE.parents[1] / "bench"


def test_modules_within_size_or_say_why():
    """The package's modules and the benchmarks' (bench/ is read and changed as often, issue 45)."""
    long = []
    benches = {f"bench.{p.stem}": p for p in BENCH.glob("*.py")}
    assert "bench.accuracy" in benches  # the glob sees bench/
    for module, path in {**MODULES, **benches}.items():
        lines = path.read_text().count("\n")
        if lines > MAX_LINES:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            if SIZE_REASON not in doc:
                long.append(f"{module}: {lines} lines")
    assert not long, f"modules over {MAX_LINES} lines whose docstring has no '{SIZE_REASON}' line:\n" + "\n".join(long)

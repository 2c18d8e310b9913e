"""The project's modules import each other without a circle, lazy (function-level) imports included.

Read from the source with ``ast``, nothing imported: every top-level ``*.py``, ``bench/*.py`` and ``examples/*.py``,
each ``import X`` / ``from X import ...`` anywhere in the file (module level or inside a function) that names a
project module. A circle (evaluate -> policy -> toy -> evaluate was one) means a module cannot be read, tested or
copied without the ones above it; the bottom of the stack (the credit rules, the grader, the toy) imports no project
module at all, as their headers promise.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Modules that import no project module: delta.py, cscr.py and verify.py are copied into other trainers on their own
# (README), toy.py is imported by policy.py to resolve --model toy, memory_plan.py plans a run before anything loads
# (torch, transformers' AutoConfig and the standard library only).
LEAVES = {"delta", "cscr", "verify", "toy", "memory_plan"}


def import_graph() -> dict[str, set[str]]:
    """``{module: the project modules it imports}``; top-level modules by name, the others as ``bench.x`` or
    ``examples.x`` (a bench script's ``import _common`` is ``bench._common``)."""
    files = {p.stem: p for p in ROOT.glob("*.py")}
    for folder in ("bench", "examples"):
        files.update({f"{folder}.{p.stem}": p for p in (ROOT / folder).glob("*.py")})
    graph = {}
    for name, path in files.items():
        folder = name.rpartition(".")[0]
        named = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                named |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                named.add(node.module)
                named |= {f"{node.module}.{alias.name}" for alias in node.names}  # from bench import _common
        resolved = {m if m in files else f"{folder}.{m}" for m in named}  # a script's sibling, found on its path
        graph[name] = {m for m in resolved if m in files and m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports as ``[a, b, ..., a]``, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circle():
    graph = import_graph()
    assert {"grpo", "policy", "evaluate", "toy", "bench._common", "bench.toy_rebuild"} <= graph.keys()
    assert graph["bench.toy_rebuild"] >= {"toy", "evaluate", "policy"}  # the graph sees lazy imports
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_bottom_of_the_stack_imports_no_project_module_and_nothing_imports_upward_into_scripts():
    graph = import_graph()
    assert {name: sorted(graph[name]) for name in LEAVES if graph[name]} == {}
    upward = {name: sorted(d for d in deps if d.startswith(("bench.", "examples.")))
              for name, deps in graph.items() if "." not in name}
    assert {name: deps for name, deps in upward.items() if deps} == {}


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None

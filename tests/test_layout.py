"""The project's modules import each other without a circle, lazy (function-level) imports included, and every
arrow points from a file to something it needs for its own concept.

Read from the source with ``ast``, nothing imported: every top-level ``*.py``, ``tools/bench/*.py`` and ``tools/examples/*.py``,
each ``import X`` / ``from X import ...`` anywhere in the file (module level or inside a function) that names a
project module. A circle (evaluate -> policy -> toy -> evaluate was one) means a module cannot be read, tested or
copied without the ones above it; the bottom of the stack (the credit rules, the grader, the toy) imports no project
module at all, as their headers promise. The top-level modules then stand on floors (a file imports only files on
lower floors): ``python tests/test_layout.py`` prints them, and README.md (above its file table) must hold that
block as printed.
"""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Modules that import no project module: delta.py, cscr.py and verify.py are copied into other trainers on their own
# (README), memory_plan.py plans a run before anything loads (torch, transformers' AutoConfig and the standard
# library only), hub.py is asked by the model and the data alike. (toy.py is not one: its ``register`` fills the
# generic modules' registries, and the entry points call it.)
LEAVES = {"delta", "cscr", "verify", "memory_plan", "hub"}
# Arrows that must not exist, directly or through other files (issue #33): the model (policy.py) knows no run
# folder, report, evaluation, data or sampler; the run folder (checkpoint.py) no report page and no model code; the
# data (problems.py) no model, sampler, run folder or evaluation.
FORBIDDEN = {"policy": {"checkpoint", "report", "evaluate", "problems", "rollout", "recipes", "grpo"},
             "checkpoint": {"report", "policy", "evaluate", "problems", "grpo"},
             "problems": {"policy", "rollout", "checkpoint", "evaluate", "report", "recipes", "grpo"}}
# Imports point down (issue #39): the generic modules know nothing of the toy, the comparison rules or the memory
# planner, directly or through other files; the entry points (grpo.py, evaluate.py, the tools) register the toy and
# choose the rules.
GENERIC = ("policy", "rollout", "problems", "recipes", "report", "grpo_config", "checkpoint")
SPECIFIC = {"toy", "baselines", "delta_ablations", "cscr_ablations", "memory_plan", "preflight"}
for _name in GENERIC:
    FORBIDDEN[_name] = FORBIDDEN.get(_name, set()) | SPECIFIC
# What grpo.py takes from evaluate.py: the held-out evaluation only (its data comes from problems.py).
GRPO_USES_OF_EVALUATE = {"heldout"}
GRAPH_FILES = ("README.md",)  # where the floors block is written (above its file table)


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


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for dep in graph[todo.pop()] - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


def floors(graph: dict[str, set[str]]) -> list[list[str]]:
    """The top-level modules by floor: floor 0 imports no project module, floor n only modules of floors < n (and at
    least one of floor n - 1). Needs a graph without a circle."""
    top = {name: deps for name, deps in graph.items() if "." not in name}
    floor: dict[str, int] = {}
    while len(floor) < len(top):
        ready = [m for m in top if m not in floor and top[m] <= floor.keys()]
        assert ready, "import circle among " + ", ".join(sorted(set(top) - floor.keys()))
        for m in ready:
            floor[m] = max((floor[d] + 1 for d in top[m]), default=0)
    return [sorted(m for m in floor if floor[m] == n) for n in range(max(floor.values()) + 1)]


def render_floors(graph: dict[str, set[str]], width: int = 116) -> str:
    """The floors as a fenced block, top floor first: ``floor n  file: what it imports · ...``, wrapped at ``width``
    columns; floor 0 lists its files only."""
    lines = []
    for n, names in reversed(list(enumerate(floors(graph)))):
        items = [f"{' '.join(names)} (import no project file)"] if n == 0 else \
            [f"{m}: {' '.join(sorted(graph[m]))}" for m in names]
        line = f"floor {n}  "
        for item in items:
            if line.strip() and not line.endswith("  ") and len(line) + 3 + len(item) > width:
                lines.append(line)
                line = " " * 9
            for k, word in enumerate(item.split(" ")):  # a file that imports many wraps within its own list
                if k and len(line) + 1 + len(word) > width:
                    lines.append(line)
                    line = " " * 11
                line += word if line.endswith(" ") else (f" · {word}" if k == 0 else f" {word}")
        lines.append(line)
    return "\n".join(["```text", *lines, "```"])


def test_the_model_knows_no_run_folder_and_the_run_folder_no_report():
    graph = import_graph()
    found = {name: sorted(reachable(graph, name) & banned) for name, banned in FORBIDDEN.items()}
    assert {name: deps for name, deps in found.items() if deps} == {}


def _attributes_of(path: Path, module: str) -> set[str]:
    """The names ``path`` reads as ``module.<name>``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == module}


def test_the_data_comes_from_problems_not_from_evaluate():
    assert _attributes_of(ROOT / "run_setup.py", "evaluate") == GRPO_USES_OF_EVALUATE  # grpo.train's setup
    tree = ast.parse((ROOT / "problems.py").read_text(encoding="utf-8"))
    data_names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))} | \
        {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    assert "load_problems" in data_names
    files = [*ROOT.glob("*.py"), *ROOT.glob("tools/bench/*.py"), *ROOT.glob("tools/examples/*.py"), *ROOT.glob("tests/*.py")]
    wrong = {p.relative_to(ROOT).as_posix(): sorted(_attributes_of(p, "evaluate") & data_names) for p in files}
    assert {path: names for path, names in wrong.items() if names} == {}


def test_problems_loads_no_model_code():
    code = ("import sys, problems, toy; toy.register_data(); problems.load_problems('toy', split='test'); "
            "problems.load_problems('math_train'); "
            "print(sorted(m for m in ('torch', 'transformers', 'policy', 'rollout') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_written_floors_are_the_codes():
    graph = import_graph()
    top = {name: deps for name, deps in graph.items() if "." not in name}
    for n, names in enumerate(floors(graph)):  # each file stands one floor above its highest import
        for m in names:
            assert all(any(d in lower for lower in floors(graph)[:n]) for d in top[m])
    block = render_floors(graph)
    written = [name for name in GRAPH_FILES if (ROOT / name).exists() and block in (ROOT / name).read_text("utf-8")]
    assert written, f"none of {GRAPH_FILES} holds the import floors as the code has them:\n{block}"


if __name__ == "__main__":  # the floors block, as README.md holds it
    print(render_floors(import_graph()))


def test_no_project_file_reads_a_private_name_of_the_copyable_modules():
    """delta.py, cscr.py and verify.py are copied into other trainers alone: what the project itself needs of them
    (the trainer, the diagnostics, the examples, the benches) is public, so a copy needs nothing private either."""
    files = [*ROOT.glob("*.py"), *ROOT.glob("tools/bench/*.py"), *ROOT.glob("tools/examples/*.py")]
    private = {p.relative_to(ROOT).as_posix(): sorted(n for m in ("delta", "cscr", "verify")
                                                       for n in _attributes_of(p, m) if n.startswith("_"))
               for p in files}
    assert {path: names for path, names in private.items() if names} == {}

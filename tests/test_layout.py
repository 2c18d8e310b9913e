"""The repository a student opens is the design card (issue #44): six files at the top, four folders beside them,
and imports that point one way.

Read from the source with ``ast``, nothing imported (``git ls-files`` only for what is tracked): every top-level
``*.py`` and every ``*.py`` under trainer/, comparisons/, toy/ and tools/, each ``import X`` / ``from X import ...``
anywhere in the file (module level or inside a function) that names a project module. The rules:

* the top level holds only the method: grpo.py, delta.py, cscr.py, rollout.py, verify.py, evaluate.py;
* delta.py, cscr.py and verify.py import no project module (they are copied into other trainers alone);
* grpo.py reads as the method: it imports at most 8 project modules;
* trainer/ (generic code) knows nothing of the toy, of a comparison or of a tool; comparisons/ imports no tool;
  nothing but tools/ (and the tests) imports tools/;
* no import circle; the model, the run folder and the data import nothing above them;
* docs/layout.md holds the import floors as the code has them (``python tests/test_layout.py`` prints the block).

Where today's code still breaks a rule, the arrow is named in an allow-list below (``*_TO_REMOVE``): each entry is an
arrow that a named change removes, and an entry that no longer exists fails the test, so the lists only shrink.
"""

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIX = {"grpo", "delta", "cscr", "rollout", "verify", "evaluate"}  # the top level: the method, in reading order
FOLDERS = ("trainer", "comparisons", "toy", "tools")
# Tracked top-level entries, dotfiles not counted: .ci/, .gitignore and .pre-commit-config.yaml are tool configuration
# (CI, git, pre-commit), not something a reader opens. Today: the six files, the four folders, data/, docs/, tests/,
# LICENSE, README.md, pyproject.toml, requirements.txt.
MAX_TOP_LEVEL_ENTRIES = 17
MAX_README_LINES = 200
MAX_GRPO_IMPORTS = 8
# The copyable files: the libraries each may import besides the standard library (their headers say so).
# verify.py's one library is math-verify, with the parsers it ships on (sympy, latex2sympy2_extended); pebble runs it
# in worker processes with a time limit.
COPYABLE = {
    "delta": {"torch"},
    "cscr": {"torch"},
    "verify": {"math_verify", "sympy", "latex2sympy2_extended", "pebble"},
}
# What their script blocks (``if __name__ == "__main__":``, the header's example on a tiny random Qwen3) may import
# besides: transformers, and the file itself (the example's ``import delta``), never at import time.
SCRIPT_LIBRARIES = {"transformers"}
# Modules that import no project module: the copyable files, the memory planner (it plans a run before anything
# loads), the hub check (asked by the model and the data alike).
LEAVES = set(COPYABLE) | {"trainer.memory_plan", "trainer.hub"}

# Arrows that break a rule today, each removed by a named change (an entry that no longer exists fails: delete it).
# grpo.py's imports beyond the method: the loss-rule hooks become registries filled by the comparisons, the toy is
# registered and the run set up in trainer/run_setup.py (the grpo.py restructuring of issue #44).
GRPO_IMPORTS_TO_REMOVE: set[str] = set()  # done: grpo.py imports the methods, the verifier and trainer/ only
# trainer/ -> comparisons/, tools/ or the toy: the run's setup (run_setup.py) keeps DelTA's frozen γ of an ablation in
# checkpoints (delta_ablations.kept_gamma) and writes samples/summary.json with report.py (write_samples_summary).
TRAINER_ARROWS_TO_REMOVE = {
    # run_setup registers the comparisons and the toy into grpo.py's registries when a run starts (grpo.register):
    # the one place where flags meet the comparisons' names; and its samples/ summary uses report.credit_lands
    # (issue #44: the toy's truth and the credit summary belong where they are read, the report).
    ("trainer.run_setup", "comparisons"),
    ("trainer.run_setup", "toy"),
    ("trainer.run_setup", "tools.report"),
}
# The one import circle: rollout.sample calls the vLLM engine, and trainer/vllm_engine.py builds rollout's Rollout
# from rollout's SamplingSettings and build_rollout (issue #44's move of the engine). The floors leave this arrow out.
CIRCLE_ARROWS_TO_REMOVE = {
    ("trainer.vllm_engine", "rollout"),
    # the comparisons import grpo (the functions they replace or reuse), and run_setup imports the comparisons to
    # register them when a run starts (a lazy import of their modules; issue #44: break it by registering from the
    # entry point)
    ("trainer.run_setup", "comparisons"),
}
# Arrows that must not exist, directly or through other files (issue #33): the model (policy) knows no run folder,
# report, evaluation, data or sampler; the run folder (checkpoint) no report page and no model code; the data
# (problems) no model, sampler, run folder or evaluation.
FORBIDDEN = {
    "trainer.policy": {
        "trainer.checkpoint",
        "tools.report",
        "evaluate",
        "trainer.problems",
        "rollout",
        "trainer.recipes",
        "grpo",
    },
    "trainer.checkpoint": {"tools.report", "trainer.policy", "evaluate", "trainer.problems", "grpo"},
    "trainer.problems": {
        "trainer.policy",
        "rollout",
        "trainer.checkpoint",
        "evaluate",
        "tools.report",
        "trainer.recipes",
        "grpo",
    },
}
# What grpo.py's run setup takes from evaluate.py: the held-out evaluation and its settings (its data comes from
# trainer/problems.py).
RUN_SETUP_USES_OF_EVALUATE = {"heldout", "EvalSettings"}
FLOORS_FILE = "docs/layout.md"  # where the import floors block is written


@functools.cache
def _tree(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once per test session."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def module_files() -> dict[str, Path]:
    """``{dotted module name: file}`` of the project: the top-level files by stem, the folders' files by their import
    path (``trainer/policy.py`` is ``trainer.policy``, ``toy/__init__.py`` is ``toy``)."""
    files = {p.stem: p for p in ROOT.glob("*.py")}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _imported_names(path: Path, script_only: bool | None = None) -> set[str]:
    """Every module name a file's import statements could mean: ``import a.b`` is ``a.b``; ``from a import b`` is
    ``a.b`` (a submodule) or ``a`` (a name in a). ``script_only`` True: those in its top-level ``if __name__ ==
    "__main__":`` block only; False: those outside it; None: all."""
    tree = _tree(path)
    scripts = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "__name__ == '__main__'"]
    if script_only is None:
        nodes = list(ast.walk(tree))
    elif script_only:
        nodes = [n for block in scripts for n in ast.walk(block)]
    else:
        nodes = [n for top in tree.body if top not in scripts for n in ast.walk(top)]
    named = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            named |= {f"{node.module}.{alias.name}" for alias in node.names}
            named.add(node.module)
    return named


def imports_of(path: Path, files: dict[str, Path]) -> set[str]:
    """The project modules a file imports, lazy imports included: ``import a.b`` is ``a.b``; ``from a import b`` is
    ``a.b`` when that is a module (``from trainer import policy``), else ``a`` (a name defined in ``a``)."""
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in files}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in files:
                    found.add(submodule)
                elif node.module in files:
                    found.add(node.module)
    return found


def import_graph(with_known_circle: bool = False) -> dict[str, set[str]]:
    """``{module: the project modules it imports}`` (``imports_of``), for every project module; without the arrows of
    ``CIRCLE_ARROWS_TO_REMOVE`` unless ``with_known_circle``."""
    files = module_files()
    graph = {name: imports_of(path, files) - {name} for name, path in files.items()}
    if not with_known_circle:
        for name, dep in CIRCLE_ARROWS_TO_REMOVE:
            graph[name] = graph[name] - {dep}
    return graph


def third_party_roots(path: Path, script: bool | None = None) -> set[str]:
    """The top-level names of what a file imports that is neither the standard library nor the project; ``script``
    True: only in its ``if __name__ == "__main__":`` block, False: outside it, None: anywhere."""
    files = module_files()
    roots = {name.split(".")[0] for name in _imported_names(path, script_only=script) if name not in files}
    return {r for r in roots if r not in sys.stdlib_module_names and r != "__future__" and r not in files}


def tracked_top_level() -> set[str]:
    """The top-level names of the files git tracks."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"git ls-files failed ({err}): not a git checkout")
    return {line.split("/")[0] for line in out.stdout.splitlines() if line}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports as ``[a, b, ..., a]``, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                return stack[stack.index(dep) :] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for dep in graph[todo.pop()] - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


def in_folder(name: str, *folders: str) -> bool:
    """Whether the module ``name`` is one of ``folders`` or inside one."""
    return any(name == f or name.startswith(f + ".") for f in folders)


def floor_modules(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The modules the floors show: all but the scripts of tools/bench/ and tools/examples/, ``__main__`` files and
    the folders' ``__init__`` files that import nothing and that nothing imports (docstrings only)."""
    imported = set().union(*graph.values())
    return {
        name: deps
        for name, deps in graph.items()
        if not in_folder(name, "tools.bench", "tools.examples")
        and not name.endswith(".__main__")
        and (deps or name in imported or name not in FOLDERS)
    }


def floors(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules by floor: floor 0 imports no project module, floor n only modules of floors < n (and at least one
    of floor n - 1). Needs a graph without a circle."""
    top = floor_modules(graph)
    floor: dict[str, int] = {}
    while len(floor) < len(top):
        ready = [m for m in top if m not in floor and top[m] <= floor.keys()]
        assert ready, "import circle among " + ", ".join(sorted(set(top) - floor.keys()))
        for m in ready:
            floor[m] = max((floor[d] + 1 for d in top[m]), default=0)
    return [sorted(m for m in floor if floor[m] == n) for n in range(max(floor.values()) + 1)]


def render_floors(graph: dict[str, set[str]], width: int = 116) -> str:
    """The floors as a fenced block, top floor first: ``floor n  module: what it imports · ...``, wrapped at
    ``width`` columns; floor 0 lists its modules only."""
    lines = []
    for n, names in reversed(list(enumerate(floors(graph)))):
        items = (
            [f"{' '.join(names)} (import no project module)"]
            if n == 0
            else [f"{m}: {' '.join(sorted(graph[m]))}" for m in names]
        )
        line = f"floor {n}  "
        for item in items:
            if line.strip() and not line.endswith("  ") and len(line) + 3 + len(item) > width:
                lines.append(line)
                line = " " * 9
            for k, word in enumerate(item.split(" ")):  # a module that imports many wraps within its own list
                if k and len(line) + 1 + len(word) > width:
                    lines.append(line)
                    line = " " * 11
                line += word if line.endswith(" ") else (f" · {word}" if k == 0 else f" {word}")
        lines.append(line)
    return "\n".join(["```text", *lines, "```"])


def _attributes_of(path: Path, module: str) -> set[str]:
    """The names ``path`` reads as ``module.<name>``."""
    tree = _tree(path)
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == module
    }


def test_the_top_level_holds_the_six_files_and_few_entries():
    top = tracked_top_level()
    assert {Path(name).stem for name in top if name.endswith(".py")} == SIX
    entries = sorted(name for name in top if not name.startswith("."))
    assert len(entries) <= MAX_TOP_LEVEL_ENTRIES, f"{len(entries)} top-level entries: {entries}"
    assert {*FOLDERS, "data", "docs", "tests", "LICENSE", "README.md"} <= set(entries)


def test_readme_is_short_and_the_licence_is_there():
    n_lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n_lines <= MAX_README_LINES, f"README.md has {n_lines} lines (at most {MAX_README_LINES}): move to docs/"
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    assert {
        "grpo",
        "trainer.policy",
        "comparisons.fipo",
        "toy",
        "tools.report",
        "tools.bench._common",
    } <= graph.keys()
    assert "trainer.policy" in graph["grpo"]  # from trainer import policy
    assert "trainer.grpo_config" in graph["grpo"]  # from trainer.grpo_config import GRPOConfig
    assert "trainer" not in graph["comparisons.q2"]  # from trainer import credit_methods: no arrow to the package
    assert graph["tools.bench.toy_rebuild"] >= {"toy", "evaluate", "trainer.policy"}  # lazy imports count


def test_the_copyable_files_import_no_project_module_and_one_library():
    graph = import_graph()
    assert {name: sorted(graph[name]) for name in LEAVES if graph[name]} == {}
    libraries = {name: third_party_roots(ROOT / f"{name}.py", script=False) for name in COPYABLE}
    assert libraries == COPYABLE
    scripts = {name: third_party_roots(ROOT / f"{name}.py", script=True) for name in COPYABLE}
    assert all(found <= COPYABLE[name] | SCRIPT_LIBRARIES for name, found in scripts.items()), scripts


def test_grpo_imports_at_most_eight_project_modules():
    imports = import_graph()["grpo"]
    stale = GRPO_IMPORTS_TO_REMOVE - imports
    assert not stale, f"grpo.py no longer imports {sorted(stale)}: delete them from GRPO_IMPORTS_TO_REMOVE"
    counted = sorted(imports - GRPO_IMPORTS_TO_REMOVE)
    assert len(counted) <= MAX_GRPO_IMPORTS, f"grpo.py imports {len(counted)} project modules: {counted}"


def test_trainer_knows_no_comparison_no_tool_and_no_toy():
    graph = import_graph(with_known_circle=True)
    arrows = {
        (name, dep)
        for name, deps in graph.items()
        if in_folder(name, "trainer")
        for dep in deps
        if in_folder(dep, "comparisons", "tools", "toy")
    }
    stale = TRAINER_ARROWS_TO_REMOVE - arrows
    assert not stale, f"these arrows are gone: delete them from TRAINER_ARROWS_TO_REMOVE: {sorted(stale)}"
    assert sorted(arrows - TRAINER_ARROWS_TO_REMOVE) == []


def test_comparisons_import_no_tool_and_only_tools_import_tools():
    graph = import_graph()
    allowed = {name: deps - {d for n, d in TRAINER_ARROWS_TO_REMOVE if n == name} for name, deps in graph.items()}
    from_comparisons = {  # through the arrows the trainer is still to lose (TRAINER_ARROWS_TO_REMOVE): none
        name: sorted(d for d in reachable(allowed, name) if in_folder(d, "tools"))
        for name in graph
        if in_folder(name, "comparisons")
    }
    assert {name: deps for name, deps in from_comparisons.items() if deps} == {}
    into_tools = {
        (name, dep)
        for name, deps in graph.items()
        if not in_folder(name, "tools")
        for dep in deps
        if in_folder(dep, "tools")
    }
    assert sorted(into_tools - TRAINER_ARROWS_TO_REMOVE) == []


def test_each_folder_says_what_it_holds_and_who_imports_it():
    for folder in FOLDERS:
        doc = ast.get_docstring(_tree(ROOT / folder / "__init__.py"))
        assert doc and "import" in doc, f"{folder}/__init__.py: a docstring saying what it holds and who imports it"


def test_no_import_circle_but_the_known_one():
    full = import_graph(with_known_circle=True)
    stale = {(name, dep) for name, dep in CIRCLE_ARROWS_TO_REMOVE if dep not in full[name]}
    assert not stale, f"these arrows are gone: delete them from CIRCLE_ARROWS_TO_REMOVE: {sorted(stale)}"
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_model_knows_no_run_folder_and_the_run_folder_no_report():
    graph = import_graph()
    found = {name: sorted(reachable(graph, name) & banned) for name, banned in FORBIDDEN.items()}
    assert {name: deps for name, deps in found.items() if deps} == {}


def test_the_data_comes_from_problems_not_from_evaluate():
    assert _attributes_of(ROOT / "trainer" / "run_setup.py", "evaluate") == RUN_SETUP_USES_OF_EVALUATE
    tree = _tree(ROOT / "trainer" / "problems.py")
    data_names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))} | {
        t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)
    }
    assert "load_problems" in data_names
    files = [*module_files().values(), *ROOT.glob("tests/*.py")]
    wrong = {p.relative_to(ROOT).as_posix(): sorted(_attributes_of(p, "evaluate") & data_names) for p in files}
    assert {path: names for path, names in wrong.items() if names} == {}


def _module_level_imports(path: Path) -> set[str]:
    """What a file imports when it is imported: the imports outside any function (``if`` and ``try`` blocks count)."""
    tree = _tree(path)
    named, todo = set(), list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            named |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return named


def test_problems_loads_no_model_code():
    """Importing trainer/problems.py (the data) loads no torch, transformers, model or sampler: what the modules it
    imports import at import time, followed through the project."""
    files = module_files()
    seen, todo, loaded = set(), ["trainer.problems"], set()
    while todo:
        names = _module_level_imports(files[todo.pop()])
        loaded |= {n.split(".")[0] for n in names if n not in files}
        for dep in {n for n in names if n in files} - seen:
            seen.add(dep)
            todo.append(dep)
    assert sorted(({"torch", "transformers"} & loaded) | ({"trainer.policy", "rollout"} & seen)) == []


def test_no_project_file_reads_a_private_name_of_the_copyable_modules():
    """delta.py, cscr.py and verify.py are copied into other trainers alone: what the project itself needs of them
    (the trainer, the diagnostics, the examples, the benches) is public, so a copy needs nothing private either."""
    private = {
        p.relative_to(ROOT).as_posix(): sorted(n for m in COPYABLE for n in _attributes_of(p, m) if n.startswith("_"))
        for p in module_files().values()
    }
    assert {path: names for path, names in private.items() if names} == {}


def test_the_written_floors_are_the_codes():
    graph = import_graph()
    shown = floor_modules(graph)
    levels = floors(graph)
    for n, names in enumerate(levels):  # each module stands one floor above its highest import
        for m in names:
            assert all(any(d in lower for lower in levels[:n]) for d in shown[m])
    block = render_floors(graph)
    assert block in (ROOT / FLOORS_FILE).read_text(encoding="utf-8"), (
        f"{FLOORS_FILE} does not hold the import floors as the code has them (python tests/test_layout.py):\n{block}"
    )


if __name__ == "__main__":  # the floors block, as docs/layout.md holds it
    print(render_floors(import_graph()))

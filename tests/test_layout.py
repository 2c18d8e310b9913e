"""The repository a student opens is the design card: six files at the top, four folders beside them, and imports
that point one way (issues #44, #52).

Read from the source with ``ast``, nothing imported (``git ls-files`` only for what is tracked): every top-level
``*.py`` and every ``*.py`` under trainer/, comparisons/, toy/ and tools/, each ``import X`` / ``from X import ...``
anywhere in the file (module level or inside a function) that names a project module. The rules, with no exception:

* the top level holds only the method: grpo.py, delta.py, cscr.py, rollout.py, verify.py, evaluate.py;
* delta.py, cscr.py and verify.py import no project module (they are copied into other trainers alone);
* grpo.py reads as the method: it imports at most 8 project modules, and ``import grpo`` loads at most 14;
* the core (the six files and trainer/) imports nothing of comparisons/ or tools/, not even by a module name in a
  string; trainer/ knows no toy and names no comparison's flag or statistic; comparisons/ imports no tool; nothing but
  tools/ (and the tests) imports tools/;
* no import circle, lazy imports included; the model, the run folder and the data import nothing above them;
* the core trains without comparisons/ and tools/; a new credit method is its file and its name in one list;
* stage 6's micro-batch loop is written once (``grpo.minibatch_backward``): a comparison passes its loss to it.
"""

import ast
import functools
import json
import re
import shutil
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
# What grpo.py's run setup takes from evaluate.py: the held-out evaluation, its settings and a run's (``run_settings``);
# its data comes from trainer/problems.py.
RUN_SETUP_USES_OF_EVALUATE = {"heldout", "EvalSettings", "run_settings"}
MAX_GRPO_LOADS = 14  # project modules ``import grpo`` loads
CORE = SIX | {"trainer"}
# What only a comparison names (its flags, its per-token statistic, its name): trainer/'s code names none of them
COMPARISON_WORDS = (
    "sum_sq_prob",
    "mass_off_argmax",
    "sum_sq_off_argmax",
    "entropy_top_ratio",
    "top_entropy_quantile",
    "fipo",
    "sapo",
    "delta_select",
    "otb",
)


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


def import_graph() -> dict[str, set[str]]:
    """``{module: the project modules it imports}`` (``imports_of``), for every project module."""
    files = module_files()
    return {name: imports_of(path, files) - {name} for name, path in files.items()}


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


def test_grpo_imports_at_most_eight_project_modules_and_loads_at_most_fourteen():
    imports = sorted(import_graph()["grpo"])
    assert len(imports) <= MAX_GRPO_IMPORTS, f"grpo.py imports {len(imports)} project modules: {imports}"
    code = "import sys, grpo; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True
    )
    loaded = [m for m in out.stdout.split() if m in module_files() or m.split(".")[0] in module_files()]
    assert len(loaded) <= MAX_GRPO_LOADS, f"import grpo loads {len(loaded)} project modules: {loaded}"


def _core(name: str) -> bool:
    return name in SIX or in_folder(name, "trainer")


def test_the_core_imports_no_comparison_and_no_tool_not_even_by_name():
    graph = import_graph()
    arrows = sorted(
        (n, d) for n, deps in graph.items() if _core(n) for d in deps if in_folder(d, "comparisons", "tools")
    )
    assert arrows == []
    module_name = re.compile(r"^(comparisons|tools)(\.\w+)*$")  # a module named in a string (importlib, __import__)
    named = {
        path.relative_to(ROOT).as_posix(): sorted(value for value in _code_strings(path) if module_name.match(value))
        for name, path in module_files().items()
        if _core(name)
    }
    assert {path: values for path, values in named.items() if values} == {}


def test_trainer_knows_no_toy_and_names_no_comparisons_flag_or_statistic():
    graph = import_graph()
    assert (
        sorted((n, d) for n, deps in graph.items() if in_folder(n, "trainer") for d in deps if in_folder(d, "toy"))
        == []
    )
    found = {}
    for name, path in module_files().items():
        if not in_folder(name, "trainer"):
            continue
        words = {w.lower() for text in _code_strings(path) | _code_names(path) for w in re.findall(r"\w+", text)}
        hits = sorted(set(COMPARISON_WORDS) & words)
        if hits:
            found[path.relative_to(ROOT).as_posix()] = hits
    assert found == {}


def test_comparisons_import_no_tool_and_only_tools_import_tools():
    graph = import_graph()
    from_comparisons = {
        name: sorted(d for d in reachable(graph, name) if in_folder(d, "tools"))
        for name in graph
        if in_folder(name, "comparisons")
    }
    assert {name: deps for name, deps in from_comparisons.items() if deps} == {}
    into_tools = sorted(
        (name, dep)
        for name, deps in graph.items()
        if not in_folder(name, "tools")
        for dep in deps
        if in_folder(dep, "tools")
    )
    assert into_tools == []


def test_each_folder_says_what_it_holds_and_who_imports_it():
    for folder in FOLDERS:
        doc = ast.get_docstring(_tree(ROOT / folder / "__init__.py"))
        assert doc and "import" in doc, f"{folder}/__init__.py: a docstring saying what it holds and who imports it"


def test_no_import_circle_lazy_imports_included():
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


def test_the_update_loop_is_written_once():
    """Stage 6's micro-batch loop (forward, loss, ``loss.backward()``) is ``grpo.minibatch_backward``'s alone: a
    comparison's loss stage passes its micro-batch loss to it (``micro_loss``), it does not copy the loop. Calls
    ``x.backward()`` with no argument in grpo.py and comparisons/, by the function they sit in."""
    found = []
    for name, path in module_files().items():
        if name != "grpo" and not in_folder(name, "comparisons"):
            continue
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            calls = [
                c
                for c in ast.walk(fn)
                if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "backward"
            ]
            if any(not c.args and not c.keywords for c in calls):
                found.append(f"{name}.{fn.name}")
    assert found == ["grpo.minibatch_backward"]


def test_no_project_file_reads_a_private_name_of_the_copyable_modules():
    """delta.py, cscr.py and verify.py are copied into other trainers alone: what the project itself needs of them
    (the trainer, the diagnostics, the examples, the benches) is public, so a copy needs nothing private either."""
    private = {
        p.relative_to(ROOT).as_posix(): sorted(n for m in COPYABLE for n in _attributes_of(p, m) if n.startswith("_"))
        for p in module_files().values()
    }
    assert {path: names for path, names in private.items() if names} == {}


def _code_strings(path: Path) -> set[str]:
    """The string constants of a file's code: every ``str`` literal but the docstrings (of the module, a class, a
    function)."""
    tree = _tree(path)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    }


def _code_names(path: Path) -> set[str]:
    """The identifiers of a file's code: names, attributes, arguments, functions and classes it defines."""
    out = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.keyword) and node.arg:
            out.add(node.arg)
    return out


def _copy(tmp_path: Path, leave_out=()) -> Path:
    """The tracked files (``git ls-files``) copied into ``tmp_path``/repo, the folders ``leave_out`` left out."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"git ls-files failed ({err}): not a git checkout")
    dest = tmp_path / "repo"
    for rel in listed.stdout.splitlines():
        if rel.split("/")[0] in leave_out or not (ROOT / rel).is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    return dest


TINY_RUN = ["--max_steps", "2", "--num_prompts_per_step", "4", "--num_generations", "4"]
TINY_RUN += ["--max_completion_length", "24", "--eval_num_generations", "0", "--save_steps", "0"]


@pytest.mark.slow
@pytest.mark.parametrize("credit", ["grpo", "delta", "cscr"])
def test_the_core_trains_without_comparisons_and_tools(tmp_path, credit):
    """A copy of the repository without comparisons/ and tools/ trains the toy two steps with the paper's methods."""
    repo = _copy(tmp_path, leave_out=("comparisons", "tools"))
    out = tmp_path / "run"
    command = [sys.executable, "grpo.py", "--credit", credit, *TINY_RUN, "--output_dir", str(out)]
    done = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2


NEW_METHOD = '''"""A token-credit method of one's own (tests/test_layout.py): Ã = Â·(1 + s·ramp), ramp from −1 at
a response's first token to +1 at the batch's last position, s = --tilt_strength."""

from dataclasses import dataclass

import torch

from trainer import credit_methods
from trainer.grpo_config import flag

MORE_CHOICES = {"credit": {"tilt": "Â tilted along the response (comparisons/tilt.py)"}}


@dataclass
class Flags:
    tilt_strength: float = flag(0.0, "the tilt s of --credit tilt")


def checks(cfg):
    return [(abs(cfg.tilt_strength) >= 1, "--tilt_strength must be in (-1, 1)")]


def replace(cfg, method):
    return method._replace(credit=TiltCredit, label="tilt") if cfg.credit == "tilt" else method


class TiltCredit(credit_methods.GRPOCredit):
    def __call__(self, model, x):
        ramp = torch.linspace(-1.0, 1.0, x.loss_mask.shape[1])
        token_adv = x.adv[:, None] * (1 + self.cfg.tilt_strength * ramp) * x.loss_mask
        return credit_methods.CreditResult(token_adv, {"tilt/strength": self.cfg.tilt_strength}, {})
'''


@pytest.mark.slow
def test_a_new_credit_method_is_its_file_and_its_name_in_one_list(tmp_path):
    """A new token-credit method with a flag of its own: its file in comparisons/ and its name in COMPARISONS; it trains
    two steps with ``python -m comparisons``, its flag saved in config.json and its statistic logged, and the copy's
    ``git status`` shows those two changes and nothing else (no document regenerated, no field added elsewhere)."""
    repo = _copy(tmp_path)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy"]):
        subprocess.run([*git, *args], cwd=repo, check=True, capture_output=True, timeout=120)
    (repo / "comparisons" / "tilt.py").write_text(NEW_METHOD)
    listing = repo / "comparisons" / "__init__.py"
    text = listing.read_text()
    assert text.count('COMPARISONS = ("') == 1
    listing.write_text(text.replace('COMPARISONS = ("', 'COMPARISONS = ("tilt", "', 1))
    status = subprocess.run([*git, "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True)
    assert sorted(status.stdout.splitlines()) == [" M comparisons/__init__.py", "?? comparisons/tilt.py"]
    out = tmp_path / "run"
    command = [sys.executable, "-m", "comparisons", "--credit", "tilt", "--tilt_strength", "0.5", *TINY_RUN]
    done = subprocess.run([*command, "--output_dir", str(out)], cwd=repo, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((out / "config.json").read_text())["config"]["tilt_strength"] == 0.5
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(line["tilt/strength"] == 0.5 for line in lines)
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "tests/test_layout.py", "-k", "circle or core_imports or trainer_knows"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert tests.returncode == 0, tests.stdout[-2000:]

"""The command blocks of README.md and docs/*.md run top to bottom (issue #53): no two training commands of a page
share a run folder unless the later one is a --resume of it (a second run there would be refused).

Read from the pages' ```bash blocks: each ``python grpo.py ...``, ``python -m comparisons ...`` or ``torchrun ...
grpo.py ...`` line (a trailing backslash continues it) is parsed by its entry point's own parser; its folder is its
--output_dir, else the default (``checkpoint.default_run_folder`` of its model and its method's label). A line with
a shell variable (``$ROW``), --dry_run or --help trains nothing and is left out."""

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]


def bash_lines(text: str) -> list[str]:
    """The commands of a page's ```bash blocks, in order: continuation lines joined, comments cut, ``a && b`` two."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for command in re.split(r"&&|;", line.split(" #", 1)[0]):  # a chain: each command in turn
                if command.strip() and not command.strip().startswith("#"):
                    lines.append(command.strip())
    return lines


def training_command(line: str) -> list[str] | None:
    """(the entry point, its flags) of a training command line, or None."""
    words = shlex.split(line)
    if "$" in line or "--dry_run" in words or "--help" in words or "-h" in words:
        return None
    if "grpo.py" in words:
        return ["grpo.py", *words[words.index("grpo.py") + 1 :]]
    if "comparisons" in words and words[words.index("comparisons") - 1] == "-m":
        return ["comparisons", *words[words.index("comparisons") + 1 :]]
    return None


def run_folder(entry: str, flags: list[str]) -> str:
    import comparisons
    import grpo
    from trainer import checkpoint, grpo_config

    config = comparisons.config_class() if entry == "comparisons" else grpo.GRPOConfig
    cfg = config(**vars(grpo_config.build_parser(config).parse_args(flags)))
    label = comparisons.method(cfg).label if entry == "comparisons" else grpo.paper_method(cfg).label
    return cfg.output_dir or checkpoint.default_run_folder(cfg.model, label)


@pytest.mark.parametrize("page", PAGES)
def test_no_two_training_commands_of_a_page_share_a_run_folder(page):
    seen = {}
    for line in bash_lines((ROOT / page).read_text()):
        command = training_command(line)
        if command is None:
            continue
        folder = run_folder(command[0], command[1:])
        if "--resume" in command:
            assert folder in seen, f"{page}: {line!r} resumes {folder}, which no line before it ran"
            continue
        assert folder not in seen, f"{page}: {line!r} and {seen.get(folder)!r} both train in {folder}"
        seen[folder] = line


def test_the_check_sees_a_collision():
    text = "```bash\npython grpo.py --credit delta\npython grpo.py --credit delta --num_mini_batches 4\n```\n"
    lines = bash_lines(text)
    folders = [run_folder(*[c[0], c[1:]]) for c in map(training_command, lines)]
    assert folders[0] == folders[1] == "runs/delta"

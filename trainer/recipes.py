"""Recipes: the settings of grpo.py that belong together, as named tables of overrides of ``GRPOConfig``.

A recipe is one short table. ``--recipe auto`` (the default) takes a model's own recipe when an entry point
registered one (``register``: toy/'s ``toy`` for the toy model, ``--model toy`` or a folder holding the toy's
``toy_info.json``) and ``delta_paper`` for any other model. A flag given on the command line beats the recipe;
config.json records the recipe and every resolved value, and ``--resume`` compares resolved values
(checkpoint.check_resume_config).

* ``toy``: ``GRPOConfig``'s own defaults, unchanged (the quickstart's run).
* ``delta_paper``: the DelTA paper's training recipe (docs/specs/delta.md §4, row by row; the same for every
  ``--credit``, so GRPO/DAPO and CSCR run as its baselines). It needs several GPUs at its size (docs/scaling.md):
  float32 master weights, which torchrun's FSDP2 shards and computes in bfloat16, as verl does (bf16 weights at
  lr 1e-6 round the updates away, policy.build warns).
* ``delta_one_gpu``: the same method scaled to one 80 GB GPU for Qwen3-8B-Base: LoRA, gradient checkpointing,
  DelTA streamed, a colocated vLLM that sleeps during the update, a smaller batch and response budget
  (memory_plan.py shows that it fits, docs/scaling.md the arithmetic).

What the trainer checks with the resolved run before loading the model is preflight.py's.

Left out on purpose: recipes for other papers' settings (their rows are flags: README), learning-rate schedules,
and any setting a recipe would change silently: every value it sets is printed by ``--dry_run``.
"""

from __future__ import annotations

import dataclasses

# the tables and their messages: grpo_config.py, which reads no model code
from trainer.grpo_config import (  # noqa: F401
    DELTA_ONE_GPU,
    DELTA_PAPER,
    ON_GPUS,
    ONE_GPU_CHANGES,
    RECIPES,
    help_text,
    name_the_recipe,
)


def on_gpus(cfg) -> bool:
    """The run is on GPUs (CUDA here), or ``--dry_run --gpu_memory_gb`` plans one for them (a real run on this
    machine ignores ``--gpu_memory_gb``'s GPU: it would run on the CPU)."""
    import torch

    return torch.cuda.is_available() or (cfg.dry_run and cfg.gpu_memory_gb is not None)


# What an entry point adds (``toy.register``): ``AUTO_RECIPES``, rules ``rule(model) -> recipe name | None`` for
# ``--recipe auto`` (the toy's: ``toy`` for the toy model), and ``CHECKS``, ``check(name, cfg) -> error | None`` on
# the resolved config under recipe ``name`` (the toy's: no paper recipe on the toy's data).
AUTO_RECIPES: list = []
CHECKS: list = []


def register(auto=None, check=None) -> None:
    """Add an ``auto`` rule to ``AUTO_RECIPES`` and a ``check`` to ``CHECKS`` (each once; either may be None)."""
    for item, into in ((auto, AUTO_RECIPES), (check, CHECKS)):
        if item is not None and item not in into:
            into.append(item)


def own_recipe(model: str) -> str | None:
    """The recipe a rule of ``AUTO_RECIPES`` names for ``model`` (``toy`` for the toy model), else None. A run under
    its model's own recipe prints no recipe line and no memory plan (the quickstart's output stays as it is)."""
    return next((name for rule in AUTO_RECIPES if (name := rule(model))), None)


def auto_recipe(model: str) -> str:
    """The model's own recipe (``own_recipe``: ``toy`` for the toy model), ``delta_paper`` for any other."""
    return own_recipe(model) or "delta_paper"


def apply(cfg, given: set[str] | None = None, say=None):
    """``cfg`` with its recipe applied: every field of ``RECIPES[name]`` not in ``given`` takes the recipe's value.

    Args:
        cfg: a ``GRPOConfig`` (a dataclass) whose ``recipe`` is ``auto`` or a key of ``RECIPES``.
        given: the flags given on the command line (``grpo.main``); None: the fields whose value differs
            from the dataclass default (``GRPOConfig(...)`` built in code).
        say: told the recipe in one line, for any model but the toy (whose output stays as it is).
    Returns a new config with ``recipe`` resolved to the name used.
    Raises ValueError: an unknown recipe, or ``--data toy`` under ``delta_paper`` (the paper's recipe on the toy's
    20-token task is a mistake: use ``--recipe toy``).
    """
    name = auto_recipe(cfg.model) if cfg.recipe == "auto" else cfg.recipe
    if name not in RECIPES:
        raise ValueError(f"--recipe {cfg.recipe}: unknown recipe; choose from auto, {', '.join(RECIPES)}")
    if given is None:
        given = {f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) != f.default}
    gpus = on_gpus(cfg) and not ("use_vllm" in given and not cfg.use_vllm)  # --no-use_vllm: HF generate, awake
    table = {**RECIPES[name], **(ON_GPUS.get(name, {}) if gpus else {})}
    overrides = {k: v for k, v in table.items() if k not in given}
    out = dataclasses.replace(cfg, recipe=name, **overrides)
    for check in CHECKS:
        if error := check(name, out):
            raise ValueError(error)
    if say and name != own_recipe(cfg.model):
        why = "--recipe" if cfg.recipe != "auto" else "auto: a real model"
        say(
            f"[recipe] {name} ({why}): "
            + (
                "GRPOConfig's defaults"
                if name == "toy"
                else f"{len(overrides)} settings from the recipe, {len(given & set(RECIPES[name]))} of its settings "
                f"given as flags (--dry_run lists them)"
            )
        )
        if "data" in overrides:
            say(
                f"[data] --data {out.data}: the {name} recipe's default (the shipped MATH training set); the paper "
                f"trains on DeepMath-103K (data/README.md: how to fetch it and pass --data)"
            )
    return out


def describe(cfg, given: set[str] | None, defaults) -> list[str]:
    """The resolved settings that differ from ``defaults`` (a ``GRPOConfig()``), one ``--flag value (source)`` line
    each, the source being ``flag`` or ``recipe``: what ``--dry_run`` prints."""
    recipe = {**RECIPES.get(cfg.recipe, {}), **(ON_GPUS.get(cfg.recipe, {}) if on_gpus(cfg) else {})}
    lines = [f"--recipe {cfg.recipe}"]
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name == "recipe" or value == getattr(defaults, f.name):
            continue
        source = (
            "flag"
            if given is None or f.name in given
            else "recipe"
            if f.name in recipe
            else "memory plan"
            if f.name == "vllm_gpu_memory_utilization"
            else "default"
        )
        lines.append(f"--{f.name} {value} ({source})")
    return lines

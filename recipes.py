"""Recipes: the settings of grpo.py that belong together, as named tables of overrides of ``GRPOConfig``.

A recipe is one short table. ``--recipe auto`` (the default) takes a model's own recipe when an entry point
registered one (``register``: toy.py's ``toy`` for the toy model, ``--model toy`` or a folder holding the toy's
``toy_info.json``) and ``delta_paper`` for any other model. A flag given on the command line beats the recipe;
config.json records the recipe and every resolved value, and ``--resume`` compares resolved values (checkpoint.check_resume_config).

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
import re

# DelTA paper App. I, Tab. 4-5, and the official run_DelTA.sh (docs/specs/delta.md §4), row by row.
DELTA_PAPER = {
    "data": "math_train",                # the paper trains on DeepMath-103K (README: fetch it, pass --data); MATH ships
    "eval_data": "aime25",               # checkpoints are chosen by AIME25 avg@8, validated every 4 steps (test_freq)
    "eval_num_generations": 8, "eval_steps": 4,
    "eval_temperature": 1.0, "eval_top_p": 0.7,  # in-training validation: T = 1.0, top-p 0.7
    "num_prompts_per_step": 128, "num_generations": 16,  # train_prompt_bsz 128, rollout n 16
    "num_mini_batches": 4,               # ppo_mini_batch_size 32 prompts: 4 updates per step, 1 epoch
    "learning_rate": 1e-6, "weight_decay": 0.1, "max_grad_norm": 1.0,  # AdamW, constant, no warm-up
    "epsilon": 0.2, "epsilon_high": 0.28, "dual_clip": 10.0,  # clip 0.2 / 0.28, clip_ratio_c 10
    "loss_type": "dapo", "beta": 0.0,    # token-mean; no KL loss, no KL in the reward
    "max_prompt_length": 2048, "max_completion_length": 20480,
    "temperature": 1.0, "top_p": 1.0,    # rollout T 1.0, top-p 1.0
    "overlong_buffer_len": 4096, "overlong_penalty_factor": 1.0,  # DAPO's overlong reward shaping, as run_DelTA.sh
    "max_steps": 220,                    # 8B (300 for 14B)
    "torch_dtype": "float32",            # master weights (FSDP2 computes in bf16 under torchrun)
    "delta_impl": "memory_efficient",    # normal would keep h of 2,048 × 20,480 tokens: 687 GB at H = 4,096
    "gradient_checkpointing": True,      # the official run's (with param/optimizer offload, sequence parallel 4)
    "micro_batch_size": 1,               # rows of up to 22,528 tokens per forward (verl: dynamic, by tokens)
}

# One 80 GB GPU, Qwen3-8B-Base: the paper's method and loss at a smaller batch and budget (docs/scaling.md).
ONE_GPU_CHANGES = {
    "use_peft": True, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.0,  # dropout 0 keeps train = eval exact
    "learning_rate": 1e-5,               # LoRA wants about 10x full fine-tuning's (docs/scaling.md)
    "torch_dtype": "auto",               # bf16 base weights on the GPU; peft keeps the adapters in float32
    "use_vllm": True, "vllm_enable_sleep_mode": True,  # vLLM's share: sized by the plan (memory_plan.vllm_share)
    "num_prompts_per_step": 64, "num_generations": 8,
    "max_prompt_length": 1024, "max_completion_length": 4096, "overlong_buffer_len": 1024,
    "micro_batch_size": 2,
}
DELTA_ONE_GPU = {**DELTA_PAPER, **ONE_GPU_CHANGES}

RECIPES = {"toy": {}, "delta_paper": DELTA_PAPER, "delta_one_gpu": DELTA_ONE_GPU}
# What a recipe adds when the run is on GPUs or a dry run plans for them (``on_gpus``): the paper's rollouts came from
# a fast engine (SGLang in DelTA's run_DelTA.sh); ours is a colocated vLLM that sleeps during the update, its share
# sized by the plan. A CPU run of the recipe keeps HF generate (vLLM's CPU backend has no sleep mode). No IS
# correction for the sampler–trainer mismatch (--vllm_importance_sampling_correction stays off): DelTA's code has none.
ON_GPUS = {"delta_paper": {"use_vllm": True, "vllm_enable_sleep_mode": True}}


def on_gpus(cfg) -> bool:
    """The run is on GPUs (CUDA here), or ``--dry_run --gpu_memory_gb`` plans one for them (a real run on this
    machine ignores ``--gpu_memory_gb``'s GPU: it would run on the CPU)."""
    import torch

    return torch.cuda.is_available() or (cfg.dry_run and cfg.gpu_memory_gb is not None)


# What an entry point adds (toy.py's ``register``): ``AUTO_RECIPES``, rules ``rule(model) -> recipe name | None`` for
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
        say(f"[recipe] {name} ({why}): " + ("GRPOConfig's defaults" if name == "toy" else
            f"{len(overrides)} settings from the recipe, {len(given & set(RECIPES[name]))} of its settings given as "
            f"flags (--dry_run lists them)"))
        if "data" in overrides:
            say(f"[data] --data {out.data}: the {name} recipe's default (the shipped MATH training set); the paper "
                f"trains on DeepMath-103K (README: how to fetch it and pass --data)")
    return out


def name_the_recipe(message: str, cfg, given: set[str] | None) -> str:
    """``message`` (a one-line error naming flags) with the flags it names that the recipe set, not the command line:
    ``... (--overlong_buffer_len 4096 is the delta_paper recipe's; a flag given beats it)``."""
    named = dict.fromkeys(re.findall(r"--(\w+)", message))
    table = RECIPES.get(cfg.recipe, {})
    mine = [n for n in named if n in table and given is not None and n not in given]
    return message + (f" ({', '.join(f'--{n} {table[n]}' for n in mine)} {'is' if len(mine) == 1 else 'are'} the "
                      f"{cfg.recipe} recipe's; a flag given beats it)" if mine else "")


def help_text() -> str:
    """The recipes as ``--help`` lists them: each one's name and the flags it sets."""
    def flags(table):
        return " ".join(f"--{k}" if v is True else f"--no-{k}" if v is False else f"--{k} {v}"
                        for k, v in table.items())

    return (f"recipes (--recipe): toy: the defaults above; delta_paper: {flags(DELTA_PAPER)}; delta_one_gpu: "
            f"delta_paper with {flags(ONE_GPU_CHANGES)}")


def describe(cfg, given: set[str] | None, defaults) -> list[str]:
    """The resolved settings that differ from ``defaults`` (a ``GRPOConfig()``), one ``--flag value (source)`` line
    each, the source being ``flag`` or ``recipe``: what ``--dry_run`` prints."""
    recipe = {**RECIPES.get(cfg.recipe, {}), **(ON_GPUS.get(cfg.recipe, {}) if on_gpus(cfg) else {})}
    lines = [f"--recipe {cfg.recipe}"]
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name == "recipe" or value == getattr(defaults, f.name):
            continue
        source = "flag" if given is None or f.name in given else "recipe" if f.name in recipe else \
            "memory plan" if f.name == "vllm_gpu_memory_utilization" else "default"
        lines.append(f"--{f.name} {value} ({source})")
    return lines

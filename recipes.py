"""Recipes: the settings of grpo.py that belong together, as named tables of overrides of ``GRPOConfig``.

A recipe is one short table. ``--recipe auto`` (the default) takes ``toy`` for the toy model (``toy.is_toy_model``:
``--model toy`` or a folder holding the toy's ``toy_info.json``, as the prompt template's ``auto`` decides) and
``delta_paper`` for any other model. A flag given on the command line beats the recipe; config.json records the
recipe and every resolved value, and ``--resume`` compares resolved values (checkpoint.check_resume_config).

* ``toy``: ``GRPOConfig``'s own defaults, unchanged (the quickstart's run).
* ``delta_paper``: the DelTA paper's training recipe (docs/specs/delta.md §4, row by row; the same for every
  ``--credit``, so GRPO/DAPO and CSCR run as its baselines). It needs several GPUs at its size (docs/scaling.md):
  float32 master weights, which torchrun's FSDP2 shards and computes in bfloat16, as verl does (bf16 weights at
  lr 1e-6 round the updates away, policy.build warns).
* ``delta_one_gpu``: the same method scaled to one 80 GB GPU for Qwen3-8B-Base: LoRA, gradient checkpointing,
  DelTA streamed, a colocated vLLM that sleeps during the update, a smaller batch and response budget
  (memory_plan.py shows that it fits, docs/scaling.md the arithmetic).

``preflight`` is the trainer's one call between reading the data and loading the model: the resolved run is
checked there (prompts over ``--max_prompt_length`` left out, the memory plan of memory_plan.py printed, a run that
cannot fit stopped; ``--dry_run`` ends there).

Left out on purpose: recipes for other papers' settings (their rows are flags: README), learning-rate schedules,
and any setting a recipe would change silently: every value it sets is printed by ``--dry_run``.
"""

from __future__ import annotations

import dataclasses
import os
import re

import toy

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


def auto_recipe(model: str) -> str:
    """``toy`` for the toy model (``toy.is_toy_model``), ``delta_paper`` for any other."""
    return "toy" if toy.is_toy_model(model) else "delta_paper"


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
    if name != "toy" and out.data == "toy":
        table = RECIPES[name]
        raise ValueError(f"--data toy under --recipe {name}: the paper's settings (e.g. "
                         f"{table['max_completion_length']}-token responses, lr {table['learning_rate']:g}) do not "
                         f"suit the toy's 20-token task; pass --recipe toy to train this model on the toy task")
    if say and not (name == "toy" and toy.is_toy_model(cfg.model)):
        why = "--recipe" if cfg.recipe != "auto" else "auto: the toy" if name == "toy" else "auto: a real model"
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


# ----------------------------------------------------------------------------------------------------------
# Before any weights load: the trainer's one call (grpo.py train) after it read the data
# ----------------------------------------------------------------------------------------------------------
def _kept_prompts(cfg, rows: list[dict], longest: int, notes: list[str], say) -> tuple[list[dict], int]:
    """Step 1 of ``preflight``: (the rows whose templated prompt fits ``--max_prompt_length``, the longest one's
    tokens); under ``--dry_run`` a tokenizer that is not here (a folder without one, a hub id not in the cache and
    out of reach) is a note and (rows, ``longest``): the plan needs only config.json."""
    import policy
    import rollout

    try:
        tokenizer = policy.load_tokenizer(cfg.model, cfg.trust_remote_code)
    except ValueError as e:
        if not cfg.dry_run:  # a run needs the model anyway: fail now, in seconds
            raise
        notes.append(f"prompts not measured ({e}): planned at {longest} prompt tokens")
        return rows, longest
    kept = rollout.filter_overlong_prompts(rows, tokenizer, rollout.resolve_template(cfg.prompt_template, cfg.model),
                                           cfg.max_prompt_length)
    if kept.dropped:
        say(f"[data] {kept.dropped} of {len(rows)} prompts are longer than --max_prompt_length "
            f"{cfg.max_prompt_length} tokens: left out (verl's filter_overlong_prompts)")
    return kept.rows, kept.longest


def preflight(cfg, rows: list[dict], world: int, notes: list[str], given: set[str] | None, say=print):
    """What grpo.py checks between reading the data and loading the model, in one call.

    1. Prompts longer than ``--max_prompt_length`` tokens (templated and tokenised as the rollout does) are counted
       and left out, with one line (verl's ``filter_overlong_prompts``; ``_kept_prompts``); the tokenizer is loaded
       alone for it. Then DelTA's ``--delta_impl normal`` cache of h_t at its largest is refused above its share
       of host memory (``memory_plan.check_delta_cache``), for the toy too.
    2. The memory plan of the run (``memory_plan.plan``) from the model's config.json and the longest prompt kept:
       printed for any model but the toy (whose output stays as it was), and a run that does not fit stops here
       with one line that gives the shortfall and what fits (``MemoryPlan.verdict``; for ``delta_paper``, whether
       ``delta_one_gpu`` fits).
    3. ``--dry_run``: the resolved settings (``describe``), the plan, ``notes`` (the checks of this machine
       that ``check_config`` turned into notes) and the verdict are printed; returns None.

    Args: ``cfg`` the resolved ``GRPOConfig``; ``rows`` the training problems; ``world`` this run's processes
    (``--plan_processes`` plans for another number); ``given`` the flags given (``describe``).
    Returns the rows to train on, or None (``--dry_run``). Raises SystemExit (one line): it does not fit.
    ValueError: every prompt is too long; the tokenizer or config.json cannot be read (the tokenizer: a note
    under ``--dry_run``).
    """
    import memory_plan
    import policy

    is_toy = toy.is_toy_model(cfg.model)
    quick = is_toy and not cfg.dry_run and not cfg.max_prompt_length  # the toy's run: nothing to filter or print
    longest = cfg.max_prompt_length or 1024  # when the prompts cannot be measured (no tokenizer, --dry_run)
    if not quick:  # the tokenizer first: a hub id that cannot be reached fails in seconds, before the config
        rows, longest = _kept_prompts(cfg, rows, longest, notes, say)
    delta_cache = cfg.credit == "delta" and cfg.delta_impl == "normal" and not cfg.dry_run
    if quick and cfg.use_vllm and cfg.vllm_gpu_memory_utilization is None:  # the toy: vLLM's default share
        cfg.vllm_gpu_memory_utilization = memory_plan.VLLM_DEFAULT_SHARE
    if quick and not delta_cache:
        return rows  # and it prints what it always printed
    model_config = memory_plan.read_model_config(cfg.model, cfg.trust_remote_code)
    shipped = memory_plan.shipped_config(cfg.model)
    if cfg.dry_run and shipped and model_config.get("_name_or_path") == str(shipped):  # the copy in model_configs/
        notes.append(f"config.json of {cfg.model}: the copy in "  # (the cache had none)
                     f"{shipped.relative_to(memory_plan.SHIPPED_CONFIGS.parent).as_posix()}/ (model_configs/README.md)")
    if delta_cache:  # stage 4's h_t cache at its largest
        memory_plan.check_delta_cache(cfg.num_prompts_per_step // world * cfg.num_generations, cfg.max_completion_length,
                                       model_config["hidden_size"])
    if quick:
        return rows
    processes = cfg.plan_processes or world
    the_plan = memory_plan.plan(model_config, cfg, prompt_tokens=longest, processes=processes,
                                gpu_memory_gb=cfg.gpu_memory_gb)
    verdict = the_plan.verdict()
    context = model_config.get("max_position_embeddings")
    if context and longest + cfg.max_completion_length > context:  # RoPE runs on past it, but the model never saw it
        notes.append(f"prompts of up to {longest} tokens + --max_completion_length {cfg.max_completion_length} exceed "
                     f"the model's max_position_embeddings {context}")
    if the_plan.device == "CPU" and not the_plan.fits:
        verdict += "; planned for this machine's host memory (no GPU here: --gpu_memory_gb plans for one)"
    if not the_plan.fits and cfg.recipe == "delta_paper" and given is not None and "recipe" not in given:
        # the paper's recipe is sized for eight GPUs: say whether the one-GPU recipe fits this device
        one = memory_plan.plan(model_config, apply(dataclasses.replace(cfg, recipe="delta_one_gpu"), given),
                               prompt_tokens=min(longest, DELTA_ONE_GPU["max_prompt_length"]), processes=processes,
                               gpu_memory_gb=cfg.gpu_memory_gb)
        verdict += f"; or --recipe delta_one_gpu (LoRA, vLLM: {one.verdict().split(';')[0]})"
    if cfg.use_vllm and cfg.vllm_gpu_memory_utilization is None:  # not given: the plan's share (vllm_share)
        cfg.vllm_gpu_memory_utilization = the_plan.parts["vllm_share"]
    if cfg.dry_run:
        print("[dry_run] resolved settings (those that differ from the toy's defaults):")
        print("\n".join("  " + line for line in describe(cfg, given, type(cfg)())))
        for note in notes:
            print(f"[note] {note}")
        print(the_plan.table().rsplit("\n", 1)[0])  # the table without its last line, the plan's own verdict
        print(verdict)
        return None
    for note in notes:
        say(f"[warn] {note}")
    if not is_toy or not the_plan.fits:
        say(the_plan.table().rsplit("\n", 1)[0])
    if not the_plan.fits:
        raise SystemExit(f"grpo.py: error: {verdict}")
    if not is_toy:
        say(verdict)
    return rows

"""The checks between reading the data and loading the model: grpo.py's one call, ``check``.

Prompts over ``--max_prompt_length`` are left out (templated and tokenised as the rollout does), DelTA's
``--delta_impl normal`` host cache is checked, the memory plan of memory_plan.py is printed and a run that cannot fit
stopped; ``--dry_run`` ends here. A model with its own recipe (``recipes.own_recipe``: the toy) prints no plan.

Left out on purpose: the plan's arithmetic (memory_plan.py, which imports no project module), the recipes
(recipes.py), checks of single flags (grpo_config.py's ``check_config``).
"""

from __future__ import annotations

import dataclasses

import rollout
from trainer import hub, memory_plan, policy, recipes, scale_passes


def _plan_fix(cfg) -> str:
    """What to do when the hub cannot give the config.json of ``--model`` (hub.require_hub's ``fix``): under
    ``--dry_run`` a folder holding config.json alone plans it; a run needs the whole model."""
    folder = cfg.model.split("/")[-1]
    if not cfg.dry_run:
        return ""  # hub.require_hub's own: download the model and pass its folder
    return (
        f"the plan needs only its config.json: --model /path/to/{folder}, a folder holding it, plans it "
        f"(`hf download {cfg.model} config.json --local-dir {folder}` on a machine with network)"
    )


def _kept_prompts(cfg, rows: list[dict], longest: int, notes: list[str], say) -> tuple[list[dict], int]:
    """Step 1 of ``check``: (the rows whose templated prompt fits ``--max_prompt_length``, the longest one's
    tokens); under ``--dry_run`` a tokenizer that is not here (a folder without one, a hub id not in the cache and
    out of reach) is a note and (rows, ``longest``): the plan needs only config.json."""
    try:
        tokenizer = policy.load_tokenizer(cfg.model, cfg.trust_remote_code)
    except ValueError as e:
        if not cfg.dry_run:  # a run needs the model anyway: fail now, in seconds
            raise
        notes.append(f"prompts not measured ({e}): planned at {longest} prompt tokens")
        return rows, longest
    kept = rollout.filter_overlong_prompts(
        rows, tokenizer, rollout.resolve_template(cfg.prompt_template, cfg.model), cfg.max_prompt_length
    )
    if kept.dropped:
        say(
            f"[data] {kept.dropped} of {len(rows)} prompts are longer than --max_prompt_length "
            f"{cfg.max_prompt_length} tokens: left out (verl's filter_overlong_prompts)"
        )
    return kept.rows, kept.longest


def check(cfg, rows: list[dict], world: int, notes: list[str], given: set[str] | None, say=print, traits=None):
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
    (``--plan_processes`` plans for another number); ``given`` the flags given (``describe``); ``traits``: the plan's
    (``memory_plan.plan``).
    Returns the rows to train on, or None (``--dry_run``). Raises SystemExit (one line): it does not fit.
    ValueError: every prompt is too long; the tokenizer or config.json cannot be read (the tokenizer: a note
    under ``--dry_run``).
    """
    is_toy = recipes.own_recipe(cfg.model) is not None  # the toy: its own recipe, no plan printed
    quick = is_toy and not cfg.dry_run and not cfg.max_prompt_length  # the toy's run: nothing to filter or print
    longest = cfg.max_prompt_length or 1024  # when the prompts cannot be measured (no tokenizer, --dry_run)
    if not quick:  # the tokenizer first: a hub id that cannot be reached fails in seconds, before the config
        rows, longest = _kept_prompts(cfg, rows, longest, notes, say)
    delta_cache = cfg.credit == "delta" and cfg.delta_impl == "normal" and not cfg.dry_run
    if quick and cfg.use_vllm and cfg.vllm_gpu_memory_utilization is None:  # the toy: vLLM's default share
        cfg.vllm_gpu_memory_utilization = memory_plan.VLLM_DEFAULT_SHARE
    model_config = memory_plan.read_model_config(
        cfg.model, cfg.trust_remote_code, before_download=lambda: hub.require_hub(cfg.model, fix=_plan_fix(cfg))
    )
    if quick:  # the toy's prompts are not measured here: its context against the response budget alone
        _check_context(cfg, None, model_config.get("max_position_embeddings"), notes)
    if quick and not delta_cache:
        return rows  # and it prints what it always printed
    shipped = memory_plan.shipped_config(cfg.model)
    if (
        cfg.dry_run and shipped and model_config.get("_name_or_path") == str(shipped)
    ):  # the copy in trainer/model_configs/
        notes.append(
            f"config.json of {cfg.model}: the copy in "  # (the cache had none)
            f"{shipped.relative_to(memory_plan.SHIPPED_CONFIGS.parents[1]).as_posix()}/"
            " (trainer/model_configs/README.md)"
        )
    if delta_cache:  # stage 4's h_t cache at its largest
        memory_plan.check_delta_cache(
            cfg.num_prompts_per_step // world * cfg.num_generations,
            cfg.max_completion_length,
            model_config["hidden_size"],
        )
    if quick:
        return rows
    processes = cfg.plan_processes or world
    the_plan = memory_plan.plan(
        model_config, cfg, prompt_tokens=longest, processes=processes, gpu_memory_gb=cfg.gpu_memory_gb, traits=traits
    )
    verdict = the_plan.verdict()
    _check_context(cfg, longest, model_config.get("max_position_embeddings"), notes)
    if the_plan.device == "CPU" and not the_plan.fits:
        verdict += "; planned for this machine's host memory (no GPU here: --gpu_memory_gb plans for one)"
    if not the_plan.fits and cfg.recipe == "delta_paper" and given is not None and "recipe" not in given:
        # the paper's recipe is sized for eight GPUs: say whether the one-GPU recipe fits this device
        one_gpu = recipes.apply(dataclasses.replace(cfg, recipe="delta_one_gpu"), given)
        one = memory_plan.plan(
            model_config,
            one_gpu,
            processes=processes,
            gpu_memory_gb=cfg.gpu_memory_gb,
            prompt_tokens=min(longest, recipes.DELTA_ONE_GPU["max_prompt_length"]),
            traits=traits,
        )
        n = one.parts["vllm_sequences"]
        verdict += f"; or --recipe delta_one_gpu (LoRA and vLLM: {one.verdict().split(';')[0]}" + (
            f", vLLM's KV cache holding {n:,} sequence{'s' * (n != 1)} at once)" if n else ")"
        )
    if cfg.use_vllm and cfg.vllm_gpu_memory_utilization is None:  # not given: the plan's share (vllm_share)
        cfg.vllm_gpu_memory_utilization = the_plan.parts["vllm_share"]
    if cfg.dry_run:
        print("[dry_run] resolved settings (those that differ from the toy's defaults):")
        print("\n".join("  " + line for line in recipes.describe(cfg, given, type(cfg)())))
        for line in scale_passes.paths(cfg, the_plan.parts["fused"]):
            print(f"[path] {line}")
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


def _check_context(cfg, longest: int | None, context: int | None, notes: list[str]) -> None:
    """Refuse (a note under --dry_run) prompts of up to ``longest`` tokens (None: not measured, at least one) +
    --max_completion_length beyond the model's ``context`` (max_position_embeddings; None: not checked): RoPE runs on
    past it, but the model never saw it, and sampling would stop at the model's limit."""
    if not context or (longest or 1) + cfg.max_completion_length <= context:
        return
    prompts = f"prompts of up to {longest} tokens" if longest else "a prompt"
    beyond = (
        f"the model's context is {context} positions (max_position_embeddings); {prompts} + --max_completion_length "
        f"{cfg.max_completion_length} exceed it (lower --max_completion_length or --max_prompt_length)"
    )
    if not cfg.dry_run:
        raise ValueError(beyond)
    notes.append(beyond)



# ----------------------------------------------------------------------------------------------------------
# Before any weights load: the trainer's one call (grpo.py train)
# ----------------------------------------------------------------------------------------------------------
def preflight(cfg, rows: list[dict], world: int, notes: list[str], given: set[str] | None, say=print):
    """What grpo.py checks between reading the data and loading the model, in one call.

    1. Prompts longer than ``--max_prompt_length`` tokens (templated and tokenised as the rollout does) are counted
       and left out, with one line (verl's ``filter_overlong_prompts``); the tokenizer is loaded alone for it.
    2. The memory plan of the run (``plan``) from the model's config.json and the longest prompt kept: printed for
       any model but the toy (whose output stays as it was), and a run that does not fit stops here with one line
       that gives the shortfall and what fits (``MemoryPlan.verdict``).
    3. ``--dry_run``: the resolved settings (``recipes.describe``), the plan, ``notes`` (the checks of this machine
       that ``check_config`` turned into notes) and the verdict are printed; returns None.

    Args: ``cfg`` the resolved ``GRPOConfig``; ``rows`` the training problems; ``world`` this run's processes
    (``--plan_processes`` plans for another number); ``given`` the flags given (``recipes.describe``).
    Returns the rows to train on, or None (``--dry_run``). Raises SystemExit (one line): it does not fit.
    ValueError: every prompt is too long; the tokenizer or config.json cannot be read (the tokenizer: a note
    under ``--dry_run``).
    """
    import evaluate
    import policy
    import recipes
    import rollout
    import toy

    is_toy = toy.is_toy_model(cfg.model)
    if is_toy and not cfg.dry_run and not cfg.max_prompt_length:
        return rows  # the toy's run: nothing to filter, and it prints what it always printed
    longest = cfg.max_prompt_length or 1024  # when the prompts cannot be measured (no tokenizer, --dry_run)
    try:
        tokenizer = policy.load_tokenizer(cfg.model, cfg.trust_remote_code)
    except ValueError as e:
        if not cfg.dry_run:
            raise
        notes.append(f"prompts not measured ({e}): planned at {longest} prompt tokens")
    else:
        template = rollout.resolve_template(cfg.prompt_template, cfg.model)
        kept = evaluate.filter_overlong_prompts(rows, tokenizer, template, cfg.max_prompt_length)
        if kept.dropped:
            say(f"[data] {kept.dropped} of {len(rows)} prompts are longer than --max_prompt_length "
                f"{cfg.max_prompt_length} tokens: left out (verl's filter_overlong_prompts)")
        rows, longest = kept.rows, kept.longest
    processes = cfg.plan_processes or world
    model_config = read_model_config(cfg.model, cfg.trust_remote_code)
    the_plan = plan(model_config, cfg, prompt_tokens=longest, processes=processes, gpu_memory_gb=cfg.gpu_memory_gb)
    if cfg.dry_run:
        print("[dry_run] resolved settings (those that differ from the toy's defaults):")
        print("\n".join("  " + line for line in recipes.describe(cfg, given, type(cfg)())))
        print(the_plan.table())
        for note in notes:
            print(f"[note] {note}")
        print(the_plan.verdict())
        return None
    if not is_toy:
        say(the_plan.table())
    if not the_plan.fits:
        raise SystemExit(f"grpo.py: error: {the_plan.verdict()}")
    return rows

"""The papers' comparisons, beside the methods they are compared with: DelTA's baselines (SAPO, Forking Tokens, FIPO:
sapo.py, forking_tokens.py, fipo.py; their maths in baselines.py), DelTA's ablations and Q2 (delta_ablations.py,
q2.py), CSCR's ablations (cscr_ablations.py). Each replaces a whole function of grpo.py (a policy loss, a credit
function or the loss stage) with one of the same signature, registered from its own file (``register``) and chosen
once from its flags (``credit_name``, ``loss_stage_name``); grpo.py, delta.py and cscr.py name none of them.
Imported by trainer/run_setup.py (``register``, when a run starts) and the tests; the comparisons import the methods
they replace (grpo, delta, cscr) and trainer/ (the model's passes), never tools/ (docs/layout.md).

    flags                                          registry         name
    --loss_type sapo                               POLICY_LOSSES    sapo
    --entropy_top_ratio / --top_entropy_quantile   LOSS_STAGES      forking (forking_micro: --entropy_pool micro)
    --credit fipo                                  CREDIT_FUNCTIONS fipo (grpo's) and LOSS_STAGES fipo
    --credit delta --delta_select top|bottom|...   CREDIT_FUNCTIONS delta/q2, and LOSS_STAGES q2
    --credit delta with any other --delta_* ablation CREDIT_FUNCTIONS delta/ablation
    --credit cscr --cscr_weight upweight|sign_aware CREDIT_FUNCTIONS cscr/ablation
    --credit cscr --cscr_scope group|batch          CREDIT_FUNCTIONS cscr/ablation
"""

import cscr

DELTA_ABLATION_DEFAULTS = {
    "delta_scores": "contrastive",
    "delta_assignment": "soft",
    "delta_gamma": "adaptive",
    "delta_coefficients": "bounded",
    "delta_normalize": True,
    "delta_proxy": "hidden",
}


def register(credit_functions: dict, loss_stages: dict, policy_losses: dict) -> None:
    """Each comparison's functions into grpo.py's registries (imported here, when a run starts: they import grpo). A
    new comparison is its file and its name in this list."""
    from comparisons import cscr_ablations, delta_ablations, fipo, forking_tokens, otb, q2, sapo

    for module in (cscr_ablations, delta_ablations, fipo, forking_tokens, otb, q2, sapo):
        module.register(credit_functions, loss_stages, policy_losses)


def credit_name(cfg) -> str:
    """The key of grpo.CREDIT_FUNCTIONS the flags choose: --credit's, or its variant's ("delta/q2", "delta/ablation",
    "cscr/ablation": the method's own flags choose it; a name with "/" is no --credit value). CSCR's spec §5 maps
    (--cscr_weight exp_abs|inverse) are cscr.py's own options: the method's credit function."""
    if cfg.credit == "delta" and cfg.delta_select != "none":
        return "delta/q2"
    if cfg.credit == "delta" and any(getattr(cfg, flag) != value for flag, value in DELTA_ABLATION_DEFAULTS.items()):
        return "delta/ablation"
    if cfg.credit == "cscr" and (cfg.cscr_weight not in cscr.WEIGHT_MAPS or cfg.cscr_scope != "sequence"):
        return "cscr/ablation"
    return cfg.credit


def loss_stage_name(cfg) -> str:
    """The key of grpo.LOSS_STAGES the flags choose: the paper's ("default"), or a comparison's."""
    if cfg.entropy_top_ratio > 0 or cfg.top_entropy_quantile < 1:
        return "forking_micro" if cfg.entropy_pool == "micro" else "forking"
    if cfg.credit == "fipo":
        return "fipo"
    return "q2" if cfg.credit == "delta" and cfg.delta_select != "none" else "default"


def label(cfg) -> str:
    """The run's rule for the progress bar, from its flags: the loss-side rules (SAPO's gate, Forking Tokens' mask),
    then the credit (DelTA's Q2 selection as ``delta Q2``), e.g. ``grpo``, ``sapo``, ``forking``, ``sapo+delta``.
    (report.py's ``rule_name`` spells a finished run's config out in words.)"""
    loss = (["sapo"] if cfg.loss_type == "sapo" else []) + (
        ["forking"] if cfg.entropy_top_ratio > 0 or cfg.top_entropy_quantile < 1 else []
    )
    credit = "delta Q2" if cfg.credit == "delta" and cfg.delta_select != "none" else cfg.credit
    return "+".join(loss + ([credit] if credit != "grpo" or not loss else []))

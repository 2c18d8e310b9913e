"""verl's Optimal Token Baseline (OTB) beside DelTA and CSCR: ``python -m comparisons --credit otb`` (verl's name
``optimal_token_baseline`` selects it too). One file: the maths (``optimal_token_baseline``), the per-token statistics
it asks of θ_old's pass (``mass_off_argmax``, ``sum_sq_off_argmax``), its credit function (``OTBCredit``) and its
choice (``replace``); grpo.py, delta.py, cscr.py and trainer/ do not name it.

OTB (arXiv 2602.07078; verl 0.9.1 ``verl/trainer/ppo/core_algos.py`` ``compute_optimal_token_baseline_advantage``,
``docs/algo/otb.md``) keeps the outcome reward and replaces GRPO's one baseline per group by one per token position:

    G_t⁽ⁱ⁾ = Σ_{k≥t} r_k⁽ⁱ⁾ m_k            the reward-to-go; an outcome reward sits at the last valid token: G_t = r_i
    w_j = 1 − 2π_j + Σ_v π_v²              ‖s_j‖², π_j = p(y_j) and Σ_v π_v² of softmax(z_j/T) under θ_old
    W_t⁽ⁱ⁾ = Σ_{j≤t} w_j m_j                the "realized energy" of the prefix (× ρ̄_j² with the sampler correction)
    B*_t = Σ_i G_t W_t m_t / (Σ_i W_t m_t + ε)      over the group, ε = 1e-8
    Ã_{i,t} = (G_t⁽ⁱ⁾ − B*_t) m_{i,t}       in reward units, not normalised (verl returns it as is)

Like DelTA it reads θ_old's last layer to decide which tokens carry the update (here w_j from two per-token
statistics of θ_old's pass, the mass and the sum of squares off the argmax, so that w_j cannot cancel where θ_old is
almost certain: ``score_norm_sq``; verl's 1 − 2π_j + Σπ² of float32 numbers does); unlike DelTA it changes the
baseline, not the weight. With
``handle_zero_tail`` (verl's default) the longest response's tokens beyond the group's second-longest get a zero
baseline, so a group whose rewards are all equal still moves there (Ã = r_i on that tail).

Under --mask_truncated_completions a truncated response is off the loss mask, so it leaves the baseline entirely
(m = 0 in B*_t's sums) and gets Ã = 0, while GRPO's Â still counts its reward in the group's mean. A group of one
(--num_generations 1, which GRPO's credit refuses) has no baseline: Ã = r on every valid token, as verl.

Left out: verl's multi-turn variant (``tir_optimal_token_baseline``) and per-token rewards (ours is an outcome reward);
the TRL and verl drop-ins (tools/examples/) take delta and cscr only (in verl, OTB is verl's own ``adv_estimator``).
"""

from __future__ import annotations

import torch

import grpo
from trainer import credit_methods, distributed, policy, sampler_mismatch

NAMES = ("otb", "optimal_token_baseline")  # --credit: ours, verl's ``adv_estimator`` name
MORE_CHOICES = {"credit": {name: "verl's Optimal Token Baseline (comparisons/otb.py)" for name in NAMES}}


def replace(cfg, method: grpo.Method) -> grpo.Method:
    """``method`` with OTB's credit function under --credit otb (or optimal_token_baseline)."""
    return method._replace(credit=OTBCredit, label="otb") if cfg.credit in NAMES else method


def sum_sq_prob(u: torch.Tensor) -> torch.Tensor:
    """Σ_v π_v² ∈ [1/V, 1] of π = softmax(u) over the last dim (u = z/T ``[..., V]``), no grad: verl's statistic,
    ``optimal_token_baseline``'s argument."""
    return torch.softmax(u, dim=-1).square().sum(-1)


def mass_off_argmax(u: torch.Tensor) -> torch.Tensor:
    """1 − π_max = Σ_{v ≠ argmax} π_v of π = softmax(u) over the last dim, summed over the other tokens (no
    cancellation: accurate where π_max is within 1e-7 of 1), no grad: a per-token statistic of θ_old's pass."""
    p = torch.softmax(u, dim=-1)
    return p.scatter(-1, p.argmax(-1, keepdim=True), 0.0).sum(-1)


def sum_sq_off_argmax(u: torch.Tensor) -> torch.Tensor:
    """Σ_{v ≠ argmax} π_v² of π = softmax(u) over the last dim, no grad: a per-token statistic of θ_old's pass."""
    p = torch.softmax(u, dim=-1)
    return p.scatter(-1, p.argmax(-1, keepdim=True), 0.0).square().sum(-1)


def score_norm_sq(old_logp, mass_off_max, sum_sq_off_max) -> torch.Tensor:
    """w_j = ‖s_j‖² = 1 − 2π_j + Σ_v π_v² ``[N, T]`` in a form that cannot cancel: where π_j > 1/2 the sampled token
    is the argmax and w_j = (1 − π_j)² + Σ_{v≠j} π_v² = m² + s (m = Σ_{v ≠ argmax} π_v, s = Σ_{v ≠ argmax} π_v², both
    sums of small positive terms); elsewhere w_j ≥ (1 − π_j)² ≥ 1/4 and verl's form is exact to rounding, with
    Σ_v π_v² = (1 − m)² + s. ``old_logp`` log π_j; ``mass_off_max`` m and ``sum_sq_off_max`` s: θ_old's statistics
    (``mass_off_argmax``, ``sum_sq_off_argmax``). verl's 1 − 2π + Σπ² of float32 statistics cancels to 0 or ±6e-8 at
    π ≳ 0.99999 (a wrong answer's tokens then got Ã ≈ +6)."""
    p = torch.exp(old_logp)
    m = mass_off_max.to(p.dtype)
    s = sum_sq_off_max.to(p.dtype)
    return torch.where(p > 0.5, m * m + s, 1 - 2 * p + (1 - m) ** 2 + s)


def optimal_token_baseline(
    rewards,
    loss_mask,
    old_logp,
    sum_sq_prob,
    num_generations: int,
    sampler_weights=None,
    handle_zero_tail=True,
    eps=1e-8,
    w=None,
) -> torch.Tensor:
    """OTB's token advantages Ã ``[N, T]`` (reward units), verl 0.9.1 ``compute_optimal_token_baseline_advantage``
    read line by line. ``rewards`` r ``[N]`` (each response's outcome reward, placed at its last valid token),
    ``loss_mask`` m ``[N, T]`` 0/1, ``old_logp`` log π_θold(y_t) ``[N, T]`` (nats), ``sum_sq_prob`` Σ_v π_v² ``[N, T]``,
    the rows grouped by prompt ``num_generations`` at a time (grpo.py's batch layout; verl groups by ``index``: the same
    groups); ``sampler_weights`` ρ̄ ``[N, T]`` (verl's ``rollout_is_weights``) or None; ``handle_zero_tail`` and
    ``eps``: verl's arguments and defaults. A group of one response gets no baseline (Ã = G_t), as in verl.
    ``w``: w_j = ‖s_j‖² ``[N, T]`` given (``score_norm_sq``'s, which cannot cancel; ``OTBCredit`` passes it), None:
    verl's 1 − 2π_j + Σπ² of ``old_logp`` and ``sum_sq_prob``. The comments cite core_algos.py of verl 0.9.1 by
    line (the function at l.872)."""
    mask = loss_mask.to(old_logp.dtype)
    N, T = mask.shape
    last = (mask * torch.arange(1, T + 1, dtype=mask.dtype)).argmax(-1)  # each row's last valid token
    at_end = torch.zeros_like(mask).scatter_(1, last[:, None], rewards.to(mask.dtype)[:, None]) * mask
    returns = at_end.flip(-1).cumsum(-1).flip(-1)  # G_t, the reward-to-go (l.924)
    if w is None:  # ‖s_j‖² = 1 − 2π_j + Σπ² (l.928)
        w = 1 - 2 * torch.exp(old_logp) + sum_sq_prob.to(mask.dtype)
    w = w.to(mask.dtype)
    if sampler_weights is not None:  # W scaled by ρ̄², the MSE-optimal baseline under truncated IS (l.933)
        w = w * sampler_weights.to(mask.dtype) ** 2
    energy = (w * mask).cumsum(-1)  # W_t = Σ_{j≤t} w_j m_j (l.937)
    if num_generations < 2:  # a single trajectory has no baseline (l.950)
        return returns * mask
    shape = (N // num_generations, num_generations, T)
    g_ret, g_energy, g_mask = returns.view(shape), energy.view(shape), mask.view(shape)
    numerator = (g_ret * g_energy * g_mask).sum(1)  # Σ_i G_t W_t m_t, [groups, T] (l.964)
    denominator = (g_energy * g_mask).sum(1) + eps  # (l.965)
    baselines = (numerator / denominator)[:, None, :].expand(shape).clone()  # B*_t, the group's, for each response
    if handle_zero_tail:  # the longest response beyond the second-longest: baseline 0, a unique longest only (l.972)
        lengths = g_mask.sum(-1)  # [groups, G]
        ordered = lengths.sort(-1).values
        for g in range(shape[0]):
            longest = (lengths[g] == ordered[g, -1]).nonzero()
            if len(longest) == 1 and ordered[g, -1] > ordered[g, -2]:
                baselines[g, int(longest[0]), int(ordered[g, -2]) :] = 0.0
    return (returns - baselines.view(N, T)) * mask  # Ã = (G_t − B*_t)·m


def credit_share(token_adv, rewards, loss_mask, num_generations: int) -> torch.Tensor:
    """The credit c ``[N, T]`` report.py reads for OTB, whose Ã is no multiple of Â: c = Ã_{i,t} / (r_i − mean_g r)
    (1 on every token where the baseline is the group's mean, as GRPO's Â without its scale) on the rows whose group's
    rewards differ; on a group whose rewards are all equal (Â = 0 there: report.py keeps them apart) c = Ã itself."""
    r = rewards.to(token_adv.dtype).view(-1, num_generations)
    centred = (r - r.mean(-1, keepdim=True)).view(-1)
    spread = (r.max(-1).values > r.min(-1).values).repeat_interleave(num_generations)
    usable = spread & (centred != 0)
    return torch.where(usable[:, None], token_adv / torch.where(usable, centred, 1.0)[:, None], token_adv) * loss_mask


class OTBCredit(credit_methods.GRPOCredit):
    """--credit otb: Ã = ``optimal_token_baseline`` of the step's rewards and θ_old's pass (its log-probs and Σ_v π_v²,
    asked for by name); with --vllm_importance_sampling_correction the sampler weights ρ̄ enter W as verl folds them
    (the update's Ã is then corrected as every credit's is: run_setup.sampler_correction). No state."""

    # θ_old's Σ_{v ≠ argmax} π_v and Σ_{v ≠ argmax} π_v² [N, T], from its pass: w_j without cancellation
    asks = policy.Asked(token_stats={"mass_off_argmax": mass_off_argmax, "sum_sq_off_argmax": sum_sq_off_argmax})
    min_generations = 1  # a group of one has no baseline: Ã = r on every token, as verl

    @torch.no_grad()
    def __call__(self, model, x: credit_methods.CreditInputs) -> credit_methods.CreditResult:
        cfg = self.cfg
        weights = None
        if cfg.vllm_importance_sampling_correction:  # ρ̄ of the correction's own mode and bounds
            bounds = (cfg.vllm_importance_sampling_clip_max, cfg.vllm_importance_sampling_clip_min)
            mode = cfg.vllm_importance_sampling_mode
            weights = sampler_mismatch.importance_weights(
                x.old.logp, x.batch.sampler_logprobs, x.loss_mask, mode, *bounds
            )
        stats = x.old.token_stats
        w = score_norm_sq(x.old.logp, stats["mass_off_argmax"], stats["sum_sq_off_argmax"])
        token_adv = optimal_token_baseline(x.rewards, x.loss_mask, x.old.logp, None, cfg.num_generations, weights, w=w)
        share = credit_share(token_adv, x.rewards, x.loss_mask, cfg.num_generations)
        return credit_methods.CreditResult(token_adv, otb_stats(token_adv, x.adv, x.loss_mask), {"credit_share": share})


def otb_stats(token_adv, adv, loss_mask) -> dict:
    """metrics.jsonl's OTB lines, over every process's tokens: the mean |Ã| over valid tokens, and the share of Σ|Ã| on
    the tokens of groups whose rewards are all equal (Â = 0: the zero tail's credit)."""
    magnitude = token_adv.abs() * loss_mask
    sums = [magnitude.sum(), (magnitude * (adv == 0)[:, None]).sum(), loss_mask.sum()]
    total, equal, tokens = distributed.all_reduce_sum(torch.stack(sums).to(torch.float64)).tolist()
    return {
        "otb/abs_token_adv_mean": total / max(tokens, 1.0),
        "otb/equal_reward_share": equal / total if total > 0 else 0.0,
    }

"""DelTA's Q2 (Sec. 5.2, docs/specs/baselines.md §6): plain DAPO (Ã = Â) on a share of the tokens ranked by DelTA's
λ̄ (--delta_select top|bottom|random, --delta_select_fraction), chosen once per step from the credit's λ̄ (random
with a generator seeded by the step). Two functions: the credit (``Q2Credit``: DelTA's λ̄, with any other --delta_*
ablation, then the selection; Ã = Â) and the loss stage (``q2_backward``: grpo.py's on the selected tokens, the
k3 term over every valid token). Its flags: ``Flags``; chosen once by ``replace`` (python -m comparisons)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

import grpo
from comparisons import baselines, delta_ablations
from trainer import credit_methods, distributed, policy
from trainer.grpo_config import flag


@dataclass
class Flags:
    delta_select: str = flag(
        "none",
        "DelTA Q2 (Sec. 5.2): plain DAPO on the top, a random or the bottom --delta_select_fraction of tokens by λ",
        ["none", "top", "random", "bottom"],
    )
    delta_select_fraction: float = flag(0.5, "share of the valid tokens --delta_select keeps")


def checks(cfg) -> list[tuple[bool, str]]:
    return [
        (not 0 < cfg.delta_select_fraction <= 1, "--delta_select_fraction must be in (0, 1]"),
        (cfg.delta_select != "none" and cfg.credit != "delta", "--delta_select ranks DelTA's λ̄: use --credit delta"),
    ]


def replace(cfg, method: grpo.Method) -> grpo.Method:
    """``method`` with Q2's credit (DelTA's λ̄ ranks the tokens) and loss stage under --delta_select."""
    if cfg.delta_select == "none":
        return method
    return method._replace(credit=Q2Credit, loss_stage=grpo.LossStage(q2_backward), label="delta-q2")


class Q2Credit(delta_ablations.DeltaAblationCredit):
    """DelTA's λ̄ ranks the tokens; the selected ones (``token_values["q2_selected"]`` [N, T] bool) are the loss's."""

    def __call__(self, model, x: credit_methods.CreditInputs) -> credit_methods.CreditResult:
        delta_result = super().__call__(model, x)
        c = self.cfg
        draw = torch.Generator().manual_seed(c.seed * 1_000_003 + x.step * 101 + distributed.rank())
        lam_bar = delta_result.token_values["lam_bar"]
        selected = baselines.select_tokens(lam_bar, x.loss_mask, c.delta_select_fraction, c.delta_select, draw)
        stats = {**delta_result.stats, "delta/selected_frac": float(selected.sum() / x.loss_mask.sum())}
        token_values = {"lam_bar": lam_bar, "q2_selected": selected}
        # Ã = Â on the selected tokens, 0 on the rest (they leave the loss): a selection of only Â = 0 tokens is no
        # signal, and grpo.policy_update takes no AdamW step on it, as on any batch whose Ã is 0 everywhere
        return credit_methods.CreditResult(x.adv[:, None] * x.loss_mask * selected, stats, token_values)


def q2_backward(model, update, rows, cfg):
    """``grpo.minibatch_backward`` with ``q2_loss``: the surrogate on the selected tokens and their count, the k3 term
    over every valid token's. Returns (loss, statistic sums)."""
    valid = update.loss_mask
    mask = valid * update.token_values["q2_selected"]  # the tokens of the surrogate
    scope = grpo.minibatch_scope(mask, rows)._replace(num_valid=grpo.minibatch_scope(valid, rows).num_tokens)
    return grpo.minibatch_backward(model, update, rows, cfg, functools.partial(q2_loss, mask=mask), scope)


def q2_loss(mb, update, scope, mask):
    """``grpo.surrogate_loss`` of micro-batch ``mb`` with ``mask`` ``[N, T]`` (the selected valid tokens) for the loss
    mask and the k3 term over the valid tokens; its factor kept for samples/."""
    policy.keep_loss_factor(update, mb, mb.take(mask))
    selected = dataclasses.replace(update, loss_mask=mask)
    return grpo.surrogate_loss(mb, selected, scope._replace(valid_mask=mb.part(update.loss_mask)))

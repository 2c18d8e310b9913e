"""The credit functions of grpo.py's stage 5 (``grpo.CREDIT_FUNCTIONS``): Â ``[N]`` -> Ã ``[N, T]``, once per rollout
batch, no grad. Each wires a method's pure maths (delta.py, cscr.py) to the model's passes: DelTA's h_t chunks (kept by
stage 4, or recomputed), CSCR's privileged scoring passes, the processes' pooled statistics under torchrun. The
comparisons subclass these (comparisons/delta_ablations.py, cscr_ablations.py, q2.py) or add their own.
Imported by grpo.py and comparisons/; imports the methods (delta, cscr, verify) and trainer/ (the passes).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

import cscr
import delta
import verify
from trainer import distributed, policy
from trainer.grpo_config import GRPOConfig


class CreditInputs(NamedTuple):
    """What a credit function receives: the rollout, Â [N], θ_old's pass (``policy.ThetaOld``: its log-probs, and
    what the function's ``asks`` names: h_t, per-token statistics), each row's reference answer, the step (seeds a
    random draw), the loss mask [N, T] (stage 3's), the rewards r [N] (stage 2's) and the run's passes of the policy
    (``policy.Forward``: for a credit function's own passes)."""

    batch: object
    adv: torch.Tensor
    old: policy.ThetaOld
    answers: list
    step: int
    loss_mask: torch.Tensor
    rewards: torch.Tensor
    forward: policy.Forward


class CreditResult(NamedTuple):
    """What a credit function returns: Ã [N, T], its statistics for metrics.jsonl and its per-token values {name:
    [N, T]} for samples/ (DelTA's λ̄, CSCR's sensitivity s; "credit_share": each token's credit c where Ã is not
    Â·c, run_setup.credit_shares)."""

    token_adv: torch.Tensor
    stats: dict
    token_values: dict


class GRPOCredit:
    """--credit grpo: every token of o_i gets Â_i. The base of a credit function (``grpo.CREDIT_FUNCTIONS``): made once
    from the config, called once per step, no grad; its state (none here) through ``state_dict``."""

    asks = policy.Asked()  # what it reads of θ_old's pass beside log p (h_t, per-token statistics)
    gathers_weights = False  # whether its own passes of the model need the whole weights (FSDP: no fused stage 4)
    token_arrays = 0  # the float32 [N, T] arrays it keeps beside Ã (memory_plan.py counts them)
    min_generations = 2  # the smallest group it is defined on: Â of a group of one is r − mean = 0

    def __init__(self, cfg: GRPOConfig, tokenizer=None):
        self.cfg = cfg
        self.tokenizer = tokenizer

    def __call__(self, model, x: CreditInputs) -> CreditResult:
        return CreditResult(x.adv[:, None] * x.loss_mask, {}, {})

    def state_dict(self) -> dict:  # what a checkpoint keeps of the method (JSON-able)
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class DeltaCredit(GRPOCredit):
    """--credit delta: Ã = Â·λ̄ (delta.py, spec §2.3), λ̄ over θ_old's proxies v (App. F) from h_t kept by stage 4
    (--delta_impl normal: ``delta.delta_coefficients`` on the whole [N, T, H] batch) or recomputed in each of its
    K + 3 passes (memory_efficient: ``delta.delta_coefficients_chunked``; spec §2.5); under torchrun --delta_scope
    global the chunked form sums its statistics over the processes (spec §2.4). ``functions``: the paper's (an
    ablation's: comparisons/delta_ablations.py)."""

    asks = policy.Asked(hidden=True)  # h_t kept by stage 4 (--delta_impl normal); none when streamed
    token_arrays = 1  # λ̄

    def __init__(self, cfg: GRPOConfig, tokenizer=None):
        super().__init__(cfg, tokenizer)
        self.pool = distributed.all_reduce_sum if distributed.is_distributed() and cfg.delta_scope == "global" else None
        if cfg.delta_impl == "memory_efficient":  # h recomputed a micro-batch at a time, in each of its passes
            self.asks = policy.Asked()
        self.functions = delta.DeltaFunctions()  # the paper's steps (an ablation's: comparisons/delta_ablations.py)

    def proxy(self, model):  # v_t (App. F): (h [b, t, H], old_logp, mask, token_ids [b, t]) -> v [b, t, H]
        return lambda hidden, old_logp, mask, token_ids: delta.proxy_vectors(hidden, old_logp, mask)

    def __call__(self, model, x: CreditInputs) -> CreditResult:
        lam_bar, stats = self.lam_bar(model, x)  # λ̄ [N, T]
        return CreditResult(delta.delta_token_advantages(x.adv, lam_bar, x.loss_mask), stats, {"lam_bar": lam_bar})

    def lam_bar(self, model, x: CreditInputs):
        """DelTA's λ̄ ``[N, T]`` and stats: ``delta.delta_coefficients`` on θ_old's kept h (one process, or each its
        own), else ``delta.delta_coefficients_chunked`` over the batch's chunks (h recomputed, or pooled)."""
        cfg = self.cfg
        mask = x.loss_mask
        ids = x.batch.response_ids
        proxy = self.proxy(model)
        if x.old.hidden is not None and self.pool is None:  # the whole batch: v [N, T, H]
            v = proxy(x.old.hidden, x.old.logp, mask, ids)
            result = delta.delta_coefficients(
                v, x.adv, mask, cfg.delta_k, cfg.delta_lam_min, cfg.delta_lam_max, functions=self.functions
            )
            return result.lam_bar, delta.delta_stats(result, x.adv, mask)
        T = mask.shape[1]
        layout = [(slice(None), T)]  # the chunks' rows and widths: h kept by stage 4, one chunk
        if x.old.hidden is None:  # streamed: h recomputed by the run's passes, a micro-batch at a time, at each call
            layout = []
        rows = torch.arange(mask.shape[0])
        asked = policy.Asked(hidden=True)

        def chunks():  # (v [b, t, H], Â [b], mask [b, t]) of each chunk, in order
            if x.old.hidden is not None:
                yield proxy(x.old.hidden, x.old.logp, mask, ids), x.adv, mask
                return
            for j, mb in enumerate(x.forward.micro_batches(model, x.batch, rows, cfg, grad=False, asked=asked)):
                if j == len(layout):  # (the first pass)
                    layout.append((mb.rows, mb.t))
                v = proxy(mb.hidden, mb.take(x.old.logp), mb.take(mask), mb.take(ids))
                yield v, x.adv[mb.rows], mb.take(mask)

        source = chunks if x.old.hidden is None else list(chunks())
        result = delta.delta_coefficients_chunked(
            source, cfg.delta_k, cfg.delta_lam_min, cfg.delta_lam_max, pool=self.pool, functions=self.functions
        )
        lam_bar = torch.zeros(mask.shape, dtype=result.lam_bar[0].dtype)
        for (rows, t), part in zip(layout, result.lam_bar):
            lam_bar[rows, :t] = part.cpu()
        stats = delta.delta_stats(result._replace(lam_bar=lam_bar), x.adv, mask, self.pool)
        return lam_bar, distributed.pool_min_max(stats) if self.pool else stats  # extremes: per process


class CscrCredit(GRPOCredit):
    """--credit cscr (spec §3–§5): the sensitivity s_t of θ_old's log-probs to a privileged note, w_t =
    max(w_min, exp(−α·max(0, s_t − λ))) (or a spec §5 alternative map: --cscr_weight exp_abs|inverse), Ã = Â·w /
    mean_t(w); λ given, or calibrated once (its state). ``functions``: the paper's (an ablation's:
    comparisons/cscr_ablations.py)."""

    gathers_weights = True  # its privileged scoring passes (memory_plan.updates_on_policy)
    token_arrays = 3  # ℓ+, ℓ−, s

    def __init__(self, cfg: GRPOConfig, tokenizer=None):
        super().__init__(cfg, tokenizer)
        self.settings = cscr.Settings(
            alpha=cfg.cscr_alpha, w_min=cfg.cscr_w_min, mode=cfg.cscr_mode, weight=cfg.cscr_weight
        )
        self.functions = cscr.CscrFunctions()
        self.threshold = cfg.cscr_threshold
        self.calibrated = False  # (--cscr_threshold_quantile: λ set from the first batch with credited tokens)
        self.warned = False  # (beyond spec §5's "moderate" band: said once a run)

    def __call__(self, model, x: CreditInputs) -> CreditResult:
        cfg = self.cfg
        mask = x.loss_mask
        old_logp = x.old.logp
        credited = mask.bool() & (x.adv != 0)[:, None]  # the tokens that carry credit: those of the rows with Â ≠ 0
        # spec §3: the two privileged prompts x + c+, x + c− of every response
        pairs = [
            cscr.build_condition_prompts(
                prompt, reference=ref, response_answer=verify.extract_boxed(text) or "", template=cfg.cscr_template
            )
            for prompt, ref, text in zip(x.batch.prompts, x.answers, x.batch.texts)
        ]
        # spec §4: ℓ+, ℓ− of the responses with Â ≠ 0 (no grad, eval mode; prompts tokenised as the rollout's)
        with distributed.gathered_weights(model):  # FSDP2: the whole weights for the scoring passes
            lp_pos, lp_neg = cscr.condition_logprobs(
                model,
                self.tokenizer,
                pairs,
                x.batch.response_ids,
                credited,
                cfg.temperature,
                micro_batch_size=cfg.micro_batch_size or None,
                logprob_fn=x.forward.scoring_logprobs,  # None: cscr.py's plain pass
            )
        s = cscr.sensitivity(old_logp, lp_pos, lp_neg, mask, mode=cfg.cscr_mode)  # s_t = max(|Δ+|, |Δ−|)
        if cfg.cscr_threshold_quantile is not None and not self.calibrated:
            # spec §5: λ = a quantile of s over the credited tokens (every process's) of the first batch that has any
            # (a batch whose every group has equal rewards has none, and no token it would weight), then frozen
            s_all = torch.cat(distributed.all_gather_objects(s[credited].cpu()))[None]
            if s_all.numel():
                self.threshold = cscr.calibrate_threshold(s_all, torch.ones_like(s_all), cfg.cscr_threshold_quantile)
                self.calibrated = True
        # spec §5: w_t = max(w_min, exp(−α·max(0, s_t − λ))) (the map of --cscr_weight), Ã_{i,t} = Â_i·w_t / mean_t(w)
        token_adv, stats = self.reallocate(x.adv, old_logp, lp_pos, lp_neg, mask)
        self.warn_if_strong(stats, x.step)
        return CreditResult(token_adv, {**stats, "cscr/threshold": float(self.threshold)}, {"sensitivity": s})

    def reallocate(self, adv, old_logp, lp_pos, lp_neg, mask):  # spec §5: (Ã [N, T], its statistics)
        token_adv = cscr.cscr_token_advantages(
            adv, old_logp, lp_pos, lp_neg, mask, self.threshold, self.settings, self.functions
        )
        stats = cscr.cscr_stats(adv, old_logp, lp_pos, lp_neg, mask, self.threshold, self.settings, self.functions)
        return token_adv, stats

    def warn_if_strong(self, stats: dict, step: int) -> None:
        """One line, once a run, when the weights leave spec §5's "moderate" band (1/w̄ ≲ 1.3, effective-token
        fraction ≳ 0.85): the budget concentrates on few tokens, the regime the spec links to collapse."""
        inv_w_bar = stats["cscr/inv_w_bar_max"]
        effective = stats["cscr/eff_token_frac"]
        if self.warned or (inv_w_bar <= 1.3 and effective >= 0.85) or effective == 0.0:
            return
        self.warned = True
        if distributed.rank() != 0:  # (this process's statistics; process 0 speaks for the run)
            return
        from tqdm import tqdm

        tqdm.write(
            f"[cscr] step {step + 1}: max 1/w̄ {inv_w_bar:.2f} (spec §5: ≲ 1.3), effective-token fraction "
            f"{effective:.2f} (≳ 0.85): stronger than the spec's moderate down-weighting; a smaller --cscr_alpha or "
            "a larger --cscr_threshold weights less (docs/results.md, CSCR on the toy: s is large almost everywhere)"
        )

    def state_dict(self) -> dict:
        return {"cscr_threshold": float(self.threshold), "cscr_calibrated": self.calibrated}

    def load_state_dict(self, state: dict) -> None:
        self.threshold = state["cscr_threshold"]
        self.calibrated = state["cscr_calibrated"]

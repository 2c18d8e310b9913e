"""GRPO with token-level credit assignment (GRPO, DelTA, CSCR): the trainer and its command line.

One readable loop per step (this file is the only one that imports the others)::

    prompts --rollout.generate--> G responses each --verify--> binary rewards
      --group_advantages--> sequence advantages Â_i            (GRPO, Shao et al. 2024, Eq. 3 / DAPO)
      --credit (--credit grpo|delta|cscr)--> token advantages Â_{i,t}
      --policy_loss--> clipped surrogate, token-mean            (DAPO, Yu et al. 2025, Eq. 8)
      --AdamW step

What is implemented, and what is left out on purpose:

* Old log-probs come from this trainer's own forward pass (θ_old = the weights before the step's first update),
  never from the sampler, so the ratio is exactly 1 at the first update and sampler numerics do not leak in.
* The loss is the PPO clipped surrogate with DAPO's asymmetric clip (``--epsilon``, ``--epsilon_high``), an
  optional dual clip for negative advantages (``--dual_clip``), and an optional k3 KL penalty to a frozen
  reference (``--beta``, off by default as in TRL, verl's DAPO recipe and DelTA).
* ``--loss_type dapo`` (default) is the token-mean over the whole mini-batch: Σ loss·mask / Σ mask. With DelTA's
  normalised coefficients (mean 1) this *is* the paper's self-normalised surrogate Σλℓ / Σλ (DelTA Eq. 8).
* Token credit: ``grpo`` broadcasts Â_i to every token; ``delta`` multiplies by DelTA's λ̄_{i,t} (delta.py);
  ``cscr`` reallocates each response's credit away from counterfactually sensitive tokens (cscr.py).
* No entropy bonus, no reward shaping, no dynamic sampling: rewards are binary (verify.py).
* The loss value itself is not a progress signal (with one update per rollout it is ~0 at θ_old): watch the
  reward and the held-out accuracy in ``metrics.jsonl``.
* Rollouts come from HF ``generate`` or, with ``--use_vllm``, from a colocated vLLM engine (rollout.py); under
  ``torchrun --nproc_per_node N`` the model is sharded with FSDP2 and each process takes whole groups, with the
  loss normalisers and DelTA's statistics summed over processes (see "Many processes" below).

Run ``python grpo.py --help`` for every flag; each is a field of ``GRPOConfig`` below.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import re
import sys
import time
from dataclasses import dataclass, field

import torch

import evaluate
import rollout
import verify

CREDITS = ("grpo", "delta", "cscr")


# ----------------------------------------------------------------------------------------------------------
# Configuration: one dataclass, from which the argparse flags are generated (TRL's flag vocabulary).
# ----------------------------------------------------------------------------------------------------------
def _f(default, help, choices=None):
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass
class GRPOConfig:
    # model and data
    model: str = _f("toy", "'toy' (built-in), a local folder or a Hugging Face hub id")
    data: str = _f("toy", "training problems: a jsonl file of {id, problem, answer} rows, or 'toy'")
    eval_data: str = _f("", "held-out problems for the before/after evaluation (default: toy test split for "
                            "--data toy, none otherwise)")
    prompt_template: str = _f("auto", "prompt template: auto (none for the toy, qwen_math otherwise), "
                                      "none, qwen_math, r1", ["auto", *rollout.PROMPT_TEMPLATES])
    output_dir: str = _f("", "where config.json, metrics.jsonl, samples/ and checkpoints go "
                             "(default runs/<credit>)")
    # model loading, LoRA and memory (see README "Scaling up")
    torch_dtype: str = _f("auto", "weights dtype: auto (bfloat16 on a GPU, float32 on the CPU), bfloat16, float32",
                          ["auto", "bfloat16", "float32"])
    attn_implementation: str = _f("sdpa", "attention kernel: sdpa (PyTorch's), eager, or flash_attention_2 (needs "
                                          "the flash-attn package)")
    trust_remote_code: bool = _f(False, "run model code shipped with a hub repository (off: transformers' own "
                                        "architectures only)")
    use_peft: bool = _f(False, "train LoRA adapters (peft) instead of every weight; with --beta > 0 the reference "
                               "is the same model with the adapter disabled (no second copy)")
    lora_r: int = _f(16, "LoRA rank r")
    lora_alpha: int = _f(32, "LoRA scaling α (the update is (α/r)·B·A)")
    lora_dropout: float = _f(0.05, "dropout on the LoRA branch's input (training passes only)")
    lora_target_modules: str = _f("q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                                  "comma-separated module names that get LoRA adapters (default: every linear layer "
                                  "of attention and MLP), or all-linear")
    gradient_checkpointing: bool = _f(False, "keep only each layer's input and recompute the layer in the backward "
                                             "pass (non-reentrant): far less activation memory, ~1 extra forward")
    ref_on_cpu: bool = _f(False, "full fine-tuning with --beta > 0: keep the frozen reference copy on the CPU "
                                 "(frees a copy of the weights on the GPU; its forward passes are slower)")
    # credit assignment
    credit: str = _f("grpo", "token credit: grpo (broadcast), delta (DelTA), cscr (CSCR)", list(CREDITS))
    delta_k: int = _f(1, "DelTA refinement iterations K (paper default 1)")
    delta_lam_min: float = _f(0.8, "DelTA λ_min")
    delta_lam_max: float = _f(1.2, "DelTA λ_max")
    delta_impl: str = _f("normal", "DelTA statistics: normal (whole batch) or memory_efficient (streamed over "
                                   "micro-batches with sufficient statistics)", ["normal", "memory_efficient"])
    delta_scope: str = _f("global", "with several processes (torchrun): global all-reduces DelTA's sufficient "
                                    "statistics, so λ̄ does not depend on the number of processes; local keeps them "
                                    "per process, as DelTA's official code does", ["global", "local"])
    cscr_template: str = _f("verdict", "CSCR privileged context (cscr.py): verdict, reference, answer, "
                                        "verdict_short")
    cscr_mode: str = _f("max", "CSCR sensitivity: max(|Δ+|,|Δ−|), mean, common", ["max", "mean", "common"])
    cscr_threshold: float = _f(0.2, "CSCR sensitivity threshold λ in nats")
    cscr_threshold_quantile: float | None = _f(None, "if set, calibrate the threshold once as this quantile of "
                                                    "s over the first rollout batch (e.g. 0.8)")
    cscr_alpha: float = _f(1.0, "CSCR decay strength α")
    cscr_w_min: float = _f(0.0, "CSCR weight floor")
    # rollout
    num_generations: int = _f(8, "G, responses per prompt (group size)")
    num_prompts_per_step: int = _f(16, "prompts per step; the rollout batch is num_prompts_per_step × G")
    max_completion_length: int = _f(64, "response budget in tokens (longer responses are truncated)")
    temperature: float = _f(1.0, "sampling temperature; the trainer's log-probs use the same temperature")
    top_p: float = _f(1.0, "nucleus sampling mass")
    use_vllm: bool = _f(False, "sample the rollouts with vLLM, colocated in this process (pip install -r "
                               "requirements-vllm.txt); the weights are pushed to it before every rollout and "
                               "every log-prob still comes from the trainer's forward pass")
    vllm_gpu_memory_utilization: float = _f(0.3, "fraction of the GPU's memory vLLM takes (its weights + KV cache); "
                                                 "the rest is the trainer's")
    vllm_enable_sleep_mode: bool = _f(False, "free vLLM's weights and KV cache during the policy update "
                                             "(llm.sleep(level=2)); they are restored before the next rollout")
    # optimisation
    max_steps: int = _f(60, "training steps (one rollout batch each)")
    learning_rate: float = _f(3e-4, "AdamW learning rate (3e-4 suits the toy; use ~1e-6 for full fine-tuning "
                                    "of a real model, ~1e-5 with LoRA)")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    max_grad_norm: float = _f(1.0, "gradient clipping (0 = off)")
    num_iterations: int = _f(1, "μ: passes over each rollout batch (PPO epochs)")
    num_mini_batches: int = _f(1, "optimizer steps per pass: the rollout batch is split into this many mini-batches")
    micro_batch_size: int = _f(0, "rows per forward/backward (0 = whole mini-batch); gradients are identical")
    epsilon: float = _f(0.2, "lower clip ε_low: ratio ≥ 1−ε for negative advantages")
    epsilon_high: float = _f(0.28, "upper clip ε_high: ratio ≤ 1+ε_high for positive advantages (DAPO)")
    dual_clip: float | None = _f(None, "dual-clip constant c for negative advantages (e.g. 10; off by default)")
    beta: float = _f(0.0, "k3 KL coefficient to a frozen reference (0 = no reference model)")
    loss_type: str = _f("dapo", "loss aggregation: dapo (token-mean over the batch), grpo (per-sequence mean, "
                                "then mean), dr_grpo (sum / (B·max_completion_length))", ["dapo", "grpo", "dr_grpo"])
    scale_rewards: str = _f("group", "advantage: group = (r−mean)/(std+1e-6) per group; none = r−mean (Dr. GRPO)",
                            ["group", "none"])
    mask_truncated_completions: bool = _f(False, "exclude responses that hit max_completion_length from the loss")
    # evaluation, logging, checkpoints
    eval_num_generations: int = _f(8, "k for the held-out avg@k before and after training (0 = skip)")
    eval_steps: int = _f(0, "also evaluate every this many steps (0 = only before and after)")
    logging_steps: int = _f(1, "print a metrics line every this many steps")
    num_samples_to_log: int = _f(2, "groups written to samples/step_*.jsonl each logging step")
    save_steps: int = _f(50, "write a resumable checkpoint-<step>/ every this many steps (weights or adapter, "
                             "optimizer, RNG, data position); final/ is always written at the end")
    resume: bool = _f(False, "continue exactly where the run in --output_dir stopped: from its latest complete "
                             "checkpoint-<step>/ (half-written ones are ignored); starts afresh if there is none")
    seed: int = _f(0, "random seed (data order, sampling, initialisation of the run)")
    num_threads: int = _f(0, "torch CPU threads (0 = 1 for models under 10M parameters, else torch's default)")


def build_parser() -> argparse.ArgumentParser:
    """argparse flags generated from ``GRPOConfig`` (name, type, default, help, choices)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(GRPOConfig):
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        kw = dict(default=f.default, help=f.metadata["help"])
        if kind == "bool":
            ap.add_argument(f"--{f.name}", action=argparse.BooleanOptionalAction, **kw)
            continue
        base = kind.split("|")[0].strip()
        kw["type"] = {"int": int, "float": float, "str": str}[base]
        if f.metadata["choices"]:
            kw["choices"] = f.metadata["choices"]
        ap.add_argument(f"--{f.name}", **kw)
    return ap


def check_config(cfg: GRPOConfig) -> None:
    """Reject settings that cannot work, with a one-line message naming the flag."""
    def bad(msg):
        raise SystemExit(f"grpo.py: error: {msg}")

    if cfg.num_generations < 1:
        bad("--num_generations must be >= 1")
    if cfg.num_generations == 1 and cfg.scale_rewards == "group":
        bad("--num_generations 1 with --scale_rewards group gives every response advantage 0 (a group of one "
            "has no spread); use --num_generations >= 2")
    if (cfg.num_prompts_per_step * cfg.num_generations) % cfg.num_mini_batches:
        bad("--num_mini_batches must divide num_prompts_per_step × num_generations")
    for name in ("num_prompts_per_step", "max_completion_length", "num_iterations", "num_mini_batches"):
        if getattr(cfg, name) < 1:
            bad(f"--{name} must be >= 1")
    if cfg.max_steps < 0 or cfg.micro_batch_size < 0 or cfg.learning_rate <= 0:
        bad("--max_steps and --micro_batch_size must be >= 0 and --learning_rate > 0")
    if not (0 <= cfg.epsilon < 1) or cfg.epsilon_high < 0:
        bad("--epsilon must be in [0, 1) and --epsilon_high >= 0")
    if cfg.dual_clip is not None and cfg.dual_clip <= 1:
        bad("--dual_clip must be > 1 (verl uses 3, DelTA 10)")
    if cfg.delta_lam_min > cfg.delta_lam_max or cfg.delta_lam_min < 0 or cfg.delta_k < 0:
        bad("DelTA needs 0 <= --delta_lam_min <= --delta_lam_max and --delta_k >= 0")
    if cfg.use_peft and (cfg.lora_r < 1 or cfg.lora_alpha <= 0 or not 0 <= cfg.lora_dropout < 1
                         or not cfg.lora_target_modules.strip(",").strip()):
        bad("--use_peft needs --lora_r >= 1, --lora_alpha > 0, 0 <= --lora_dropout < 1 and --lora_target_modules")
    if cfg.save_steps < 0:
        bad("--save_steps must be >= 0")
    if not 0 < cfg.vllm_gpu_memory_utilization <= 1:
        bad("--vllm_gpu_memory_utilization must be in (0, 1]")
    if cfg.vllm_enable_sleep_mode and not cfg.use_vllm:
        bad("--vllm_enable_sleep_mode needs --use_vllm")
    if cfg.vllm_enable_sleep_mode and not torch.cuda.is_available():
        bad("--vllm_enable_sleep_mode needs a GPU (vLLM's CPU backend has no sleep mode)")
    if cfg.use_vllm:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            bad("--use_vllm needs vLLM, which this environment lacks: make a separate virtual environment with "
                "`pip install -r requirements-vllm.txt` and then `pip uninstall -y torchvision torchaudio "
                "torchcodec` (README, \"Fast rollouts with vLLM\")")


# ----------------------------------------------------------------------------------------------------------
# The math: pure functions on tensors
# ----------------------------------------------------------------------------------------------------------
def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "std", eps: float = 1e-6) -> torch.Tensor:
    """GRPO group-normalised advantages Â_i = (r_i − mean_g) / (std_g + eps).

    Args:
        rewards: ``[N]`` rewards ordered group by group (N = num_groups × group_size).
        group_size: G.
        scale: ``"std"`` divides by the unbiased group std (as DelTA's official code and verl do; TRL too);
            ``"none"`` gives r − mean (Dr. GRPO, Liu et al. 2025, which removes the difficulty bias).
        eps: added to the std (1e-6, DelTA's code).
    Returns:
        ``[N]`` float advantages. A group whose rewards are all equal gets exactly 0 (no NaN, and no
        amplified float residue: NeMo-RL #4161); a group of one gets 0.
    Raises:
        ValueError: N not a multiple of ``group_size``, or an unknown ``scale``.
    Source: GRPO (Shao et al. 2024) §4.1.2; DelTA spec §1.
    """
    if group_size < 1 or rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a length divisible by group_size={group_size}, "
                         f"got shape {tuple(rewards.shape)}")
    if scale not in ("std", "none"):
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    r = rewards.float().view(-1, group_size)
    centred = r - r.mean(-1, keepdim=True)
    if scale == "std" and group_size > 1:
        centred = centred / (r.std(-1, keepdim=True, unbiased=True) + eps)
    # exact zeros where the group has no spread (or only one member)
    flat = (r.max(-1, keepdim=True).values - r.min(-1, keepdim=True).values) == 0
    return torch.where(flat, torch.zeros_like(centred), centred).view(-1)


def policy_loss(logp, old_logp, advantages, response_mask, epsilon=0.2, epsilon_high=0.28, dual_clip=None,
                loss_type="dapo", max_completion_length=None, ref_logp=None, beta=0.0, num_tokens=None,
                num_sequences=None):
    """Clipped surrogate loss (to minimise) and its statistics.

    Per token (PPO, Schulman et al. 2017, Eq. 7, with DAPO's asymmetric clip, Yu et al. 2025, Eq. 8)::

        ratio  = exp(clamp(logp − old_logp, −20, 20))
        ℓ      = max(−Â·ratio, −Â·clip(ratio, 1−ε, 1+ε_high))
        ℓ      = min(ℓ, −Â·c)     where Â < 0, if dual_clip=c (Ye et al. 2020; verl's clip_ratio_c)
        ℓ     += β·k3,  k3 = exp(ref − logp) − (ref − logp) − 1   (Schulman's k3 KL estimator, if β > 0)

    Aggregation (``loss_type``):
        ``dapo``: Σ ℓ·mask / Σ mask over the whole batch (token-mean; DelTA and TRL's default);
        ``grpo``: mean over sequences of the per-sequence token-mean (the original GRPO 1/|o_i|);
        ``dr_grpo``: Σ ℓ·mask / (B · max_completion_length) (Dr. GRPO's constant normaliser).

    Args:
        logp, old_logp: ``[B, T]`` log-probs (nats) of the response tokens under the policy and θ_old.
        advantages: ``[B]`` (broadcast to every token) or ``[B, T]`` (token credit, e.g. DelTA's Â·λ̄).
        response_mask: ``[B, T]`` 1 on response tokens (EOS included), 0 on padding.
        ref_logp: ``[B, T]`` reference log-probs, needed when ``beta > 0``.
        num_tokens / num_sequences: the normaliser's counts over the *whole mini-batch* when this call sees only
            a micro-batch (so the gradient does not depend on the micro-batch size); default: this batch's.
    Returns:
        (loss: scalar tensor, stats: dict of floats: ``clip_ratio/low_mean`` (ratio < 1−ε with Â < 0),
        ``clip_ratio/high_mean`` (ratio > 1+ε_high with Â > 0), ``clip_ratio/region_mean`` (either),
        ``clip_ratio/dual_mean`` (dual clip active), ``kl`` (mean k3), ``num_tokens``; fractions are token-means
        over this call's tokens).
    Raises:
        ValueError: shape mismatch, unknown ``loss_type``, ``dr_grpo`` without ``max_completion_length``, or
        ``beta > 0`` without ``ref_logp``.
    """
    mask = response_mask.to(logp.dtype)
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and response_mask "
                         f"{tuple(mask.shape)} must have the same [B, T] shape")
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    if advantages.shape[0] != logp.shape[0] or advantages.shape[1] not in (1, logp.shape[1]):
        raise ValueError(f"advantages must be [B] or [B, T], got {tuple(advantages.shape)} for logp "
                         f"{tuple(logp.shape)}")
    if loss_type not in ("dapo", "grpo", "dr_grpo"):
        raise ValueError(f"loss_type must be dapo, grpo or dr_grpo, got {loss_type!r}")
    if loss_type == "dr_grpo" and not max_completion_length:
        raise ValueError("loss_type='dr_grpo' needs max_completion_length")
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp")
    adv = advantages.to(logp.dtype).expand_as(logp)
    # padded positions may hold anything (e.g. -inf): zero them before exp so no NaN reaches the gradient
    log_ratio = torch.where(mask > 0, logp - old_logp, torch.zeros_like(logp)).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - epsilon, 1.0 + epsilon_high)
    per_token = torch.maximum(loss_unclipped, loss_clipped)
    dual_active = torch.zeros_like(mask, dtype=torch.bool)
    if dual_clip is not None:
        # Dual clip bounds the loss of a negative-advantage token whose ratio exploded: ℓ ≤ −Â·c
        dual_bound = -adv * dual_clip
        dual_active = (adv < 0) & (per_token > dual_bound)
        per_token = torch.where(adv < 0, torch.minimum(per_token, dual_bound), per_token)
    kl = None
    if beta > 0:
        d = torch.where(mask > 0, ref_logp - logp, torch.zeros_like(logp)).clamp(-20.0, 20.0)
        kl = torch.exp(d) - d - 1.0  # k3 ≥ 0, unbiased for KL(π‖π_ref) under samples from π
        per_token = per_token + beta * kl
    per_token = per_token * mask
    if loss_type == "dapo":
        denom = mask.sum() if num_tokens is None else num_tokens
        loss = per_token.sum() / max(float(denom), 1.0)
    elif loss_type == "grpo":
        per_seq = per_token.sum(-1) / mask.sum(-1).clamp(min=1.0)
        loss = per_seq.sum() / float(logp.shape[0] if num_sequences is None else num_sequences)
    else:
        loss = per_token.sum() / (float(logp.shape[0] if num_sequences is None else num_sequences)
                                  * max_completion_length)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        low = ((ratio < 1.0 - epsilon) & (adv < 0)).to(mask.dtype) * mask
        high = ((ratio > 1.0 + epsilon_high) & (adv > 0)).to(mask.dtype) * mask
        stats = {"clip_ratio/low_mean": (low.sum() / n).item(), "clip_ratio/high_mean": (high.sum() / n).item(),
                 "clip_ratio/region_mean": ((low + high).sum() / n).item(),
                 "clip_ratio/dual_mean": ((dual_active.to(mask.dtype) * mask).sum() / n).item(),
                 "kl": ((kl * mask).sum() / n).item() if kl is not None else 0.0,
                 "num_tokens": mask.sum().item()}
    return loss, stats


def _position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    # Left padding shifts every prompt: positions must count real tokens only, as generate() does.
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(model, input_ids, attention_mask, response_mask, temperature=1.0, return_hidden=False):
    """Log-probs (nats) of the response tokens under temperature-scaled logits: ``[B, T]``, 0 on padding.

    ``input_ids``/``attention_mask`` are ``[B, P + T]`` (left-padded prompt, right-padded response) and the
    response occupies the last T positions (T = ``response_mask.shape[1]``). Position ids are recomputed from
    the attention mask, so left padding gives the same log-probs as an unpadded sequence.

    Memory: only the T + 1 last positions are projected to the vocabulary (``logits_to_keep``), and the
    log-softmax is never materialised: log p(y) = z_y − logsumexp(z), computed one row at a time in float32.

    With ``return_hidden=True`` also returns ``[B, T, H]``: the input of the LM head at the position that
    predicts each response token (captured by a forward pre-hook, detached), which DelTA's proxy needs
    (delta.proxy_vectors, DelTA App. F). It comes from the same forward pass: no extra cost.
    """
    T = response_mask.shape[1]
    captured = {}
    handle = None
    if return_hidden:
        head = model.get_output_embeddings()
        handle = head.register_forward_pre_hook(lambda mod, args: captured.__setitem__("h", args[0].detach()))
    try:
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=_position_ids(attention_mask),
                    logits_to_keep=T + 1, use_cache=False)
    finally:
        if handle is not None:
            handle.remove()
    logits = out.logits[:, -(T + 1):-1]  # position p predicts token p+1: [B, T, V]
    targets = input_ids[:, -T:]
    rows = []
    for i in range(logits.shape[0]):  # one row at a time keeps the float32 copy small (V can be 152k)
        z = logits[i].float() / temperature
        rows.append(z.gather(-1, targets[i, :, None]).squeeze(-1) - torch.logsumexp(z, -1))
    logp = torch.stack(rows) * response_mask.to(torch.float32)
    if return_hidden:
        return logp, captured["h"][:, -(T + 1):-1]
    return logp


# ----------------------------------------------------------------------------------------------------------
# Credit assignment: sequence advantages -> token advantages (the --credit hook)
# ----------------------------------------------------------------------------------------------------------
def _micro_slices(n: int, size: int):
    size = size or n
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


class Credit:
    """Turns sequence advantages ``[N]`` into token advantages ``[N, T]``, once per rollout batch.

    Computed under ``torch.no_grad()`` from θ_old and held fixed across every mini-batch and ``num_iterations``
    epoch of the step (DelTA spec §2.4; CSCR spec §4).
    """

    def __init__(self, cfg: GRPOConfig, tokenizer):
        self.cfg, self.tokenizer = cfg, tokenizer
        self.cscr_threshold = cfg.cscr_threshold

    def needs_hidden(self) -> bool:
        return self.cfg.credit == "delta"

    @torch.no_grad()
    def __call__(self, model, batch: rollout.Rollout, adv, old_logp, hidden, problems, answers):
        mask = batch.response_mask
        if self.cfg.credit == "grpo":
            return adv[:, None] * mask, {}
        if self.cfg.credit == "delta":
            return self._delta(adv, old_logp, hidden, mask)
        return self._cscr(model, batch, adv, old_logp, problems, answers)

    def _delta(self, adv, old_logp, hidden, mask):
        import delta

        c = self.cfg
        kw = dict(K=c.delta_k, lam_min=c.delta_lam_min, lam_max=c.delta_lam_max, return_stats=True)
        pooled = _distributed() and c.delta_scope == "global"
        if c.delta_impl == "normal" and not pooled:
            v = delta.proxy_vectors(hidden, old_logp, mask)  # DelTA App. F: v = (1 − p(y_t))·h_t
            lam_bar, stats = delta.delta_coefficients(v, adv, mask, **kw)
        else:
            # streamed sufficient statistics (DelTA spec §2.5), one chunk per micro-batch of hidden states (one
            # chunk for the normal implementation). Every statistic is a sum or a count, so with --delta_scope
            # global summing them over processes gives the λ̄ of the whole batch whatever the number of processes
            # (the official code keeps them per process).
            size = c.micro_batch_size if c.delta_impl == "memory_efficient" else 0
            chunks = [(delta.proxy_vectors(hidden[s], old_logp[s], mask[s]), adv[s], mask[s])
                      for s in _micro_slices(len(adv), size)]
            parts, stats = delta.delta_coefficients_streaming(chunks, reduce_fn=all_reduce_sum if pooled else None,
                                                              **kw)
            lam_bar = torch.cat(parts)
            if pooled:
                for key in [k for k in stats if k.endswith(("_min", "_max"))]:  # per process: pool them too
                    values = [v for v in all_gather_objects(stats[key]) if math.isfinite(v)]
                    stats[key] = (min if key.endswith("_min") else max)(values) if values else float("nan")
        self.last_weights = lam_bar
        return delta.delta_token_advantages(adv, lam_bar, mask), stats

    def _cscr(self, model, batch, adv, old_logp, problems, answers):
        import cscr

        c = self.cfg
        mask = batch.response_mask
        rows = (adv != 0).nonzero().flatten().tolist()  # no scoring for zero-advantage responses
        lp_pos = torch.zeros_like(old_logp)
        lp_neg = torch.zeros_like(old_logp)
        if rows:
            pairs = [cscr.build_condition_prompts(batch.prompts[i], reference=answers[i],
                                                  response_answer=verify.extract_boxed(batch.texts[i]) or "",
                                                  template=c.cscr_template) for i in rows]
            # the prompt texts are tokenised by cscr's rule, tokenizer(prompt), as the rollout tokenised them
            lp_pos[rows], lp_neg[rows] = cscr.condition_logprobs(
                model, self.tokenizer, [p for p, _ in pairs], [q for _, q in pairs], batch.response_ids[rows],
                mask[rows], temperature=c.temperature, micro_batch_size=c.micro_batch_size or None,
                logprob_fn=token_logprobs)
            if c.cscr_threshold_quantile is not None and not getattr(self, "_calibrated", False):
                # spec §5: calibrate λ once, as a quantile of s over the first rollout batch, then freeze
                s = cscr.sensitivity(old_logp[rows], lp_pos[rows], lp_neg[rows], mask[rows], mode=c.cscr_mode)
                # the quantile of every process's valid tokens (one value for all processes)
                s = torch.cat(all_gather_objects(s[mask[rows].bool()].cpu()))[None]
                self.cscr_threshold = cscr.calibrate_threshold(s, torch.ones_like(s), c.cscr_threshold_quantile)
                self._calibrated = True
        token_adv, stats = cscr.cscr_token_advantages(
            adv, old_logp, lp_pos, lp_neg, mask, threshold=self.cscr_threshold, alpha=c.cscr_alpha,
            w_min=c.cscr_w_min, mode=c.cscr_mode, return_stats=True)
        stats["cscr/threshold"] = float(self.cscr_threshold)
        self.last_weights = cscr.sensitivity(old_logp, lp_pos, lp_neg, mask, mode=c.cscr_mode)
        return token_adv, stats


# ----------------------------------------------------------------------------------------------------------
# The training loop
# ----------------------------------------------------------------------------------------------------------
class PromptSampler:
    """Walks the training set in a seeded random order, epoch after epoch; its position is checkpointable."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.position = n, seed, 0
        self._epoch, self._order = None, []  # derived from (seed, epoch); only `position` is checkpointed

    def _order_of(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._order = list(range(self.n))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(self._order)
            self._epoch = epoch
        return self._order

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            epoch, i = divmod(self.position, self.n)
            out.append(self._order_of(epoch)[i])
            self.position += 1
        return out


def _log_eval(res: dict, k: int) -> dict:
    keep = ("greedy", f"avg@{k}", f"pass@{k}", "sample/mean_length", "sample/truncation_rate", "sample/boxed_rate")
    return {f"eval/{key}": res[key] for key in keep if key in res}


def _token_strings(tokenizer, ids):
    return [tokenizer.decode([t]) for t in ids]


def old_logprobs(model, input_ids, attention_mask, response_mask, cfg: GRPOConfig, need_hidden=False,
                 ref_model=None):
    """θ_old log-probs ``[N, T]`` (no grad, eval mode), micro-batched; also the LM-head inputs ``[N, T, H]`` when
    ``need_hidden`` (DelTA, same forward pass) and the reference log-probs when ``ref_model`` is given."""
    device = input_ids.device
    old_parts, hid_parts, ref_parts = [], [], []
    model.eval()
    with torch.no_grad():
        for s in _micro_slices(len(input_ids), cfg.micro_batch_size):
            m = response_mask[s].to(device)
            o = token_logprobs(model, input_ids[s], attention_mask[s], m, cfg.temperature, return_hidden=need_hidden)
            if need_hidden:
                o, h = o
                hid_parts.append(h.float().cpu())
            old_parts.append(o.cpu())
            if ref_model is not None:  # the reference may live elsewhere (--ref_on_cpu)
                rd = _device_of(ref_model)
                ref_parts.append(token_logprobs(ref_model, input_ids[s].to(rd), attention_mask[s].to(rd), m.to(rd),
                                                cfg.temperature).cpu())
    return (torch.cat(old_parts), torch.cat(hid_parts) if hid_parts else None,
            torch.cat(ref_parts) if ref_parts else None)


def backward_minibatch(model, input_ids, attention_mask, response_mask, old_logp, token_adv, ref_logp, mb_idx,
                       cfg: GRPOConfig):
    """Accumulate the gradient of one mini-batch's loss (rows ``mb_idx``), ``cfg.micro_batch_size`` rows at a time.

    The normaliser of ``cfg.loss_type`` (token count for ``dapo``, sequence count for ``grpo``/``dr_grpo``) is
    computed once over the whole mini-batch and passed to every micro-batch, so the summed gradient equals the
    whole-mini-batch gradient whatever the micro-batch size (trl#3021, PR #6024; OpenRLHF's loss_utils). Under
    torchrun the counts are summed over processes, and FSDP sums the gradients (``shard_model``), so the multi-process
    gradient is the single-process gradient of the global mini-batch (trl PR #3231; verl multiplies by dp_size).
    Returns (this process's loss value, token-weighted sums of the ``policy_loss`` statistics with their
    ``num_tokens``).
    """
    device = input_ids.device
    n_tok, n_seq = _global_counts(response_mask[mb_idx])
    loss_total, agg = 0.0, {}
    for s in _micro_slices(len(mb_idx), cfg.micro_batch_size):
        j = mb_idx[s]
        m = response_mask[j].to(device)
        logp = token_logprobs(model, input_ids[j], attention_mask[j], m, cfg.temperature)
        loss, stats = policy_loss(logp, old_logp[j].to(device), token_adv[j].to(device), m, cfg.epsilon,
                                  cfg.epsilon_high, cfg.dual_clip, cfg.loss_type, cfg.max_completion_length,
                                  ref_logp=ref_logp[j].to(device) if ref_logp is not None else None, beta=cfg.beta,
                                  num_tokens=n_tok, num_sequences=n_seq)
        loss.backward()
        loss_total += loss.item()
        _add_token_weighted(agg, stats)
    return loss_total, agg


def _global_counts(response_mask: torch.Tensor) -> tuple[float, int]:
    """(response tokens, sequences) of a ``[B, T]`` mask, summed over processes: the loss normalisers."""
    counts = all_reduce_sum(torch.tensor([response_mask.sum().item(), float(len(response_mask))],
                                         dtype=torch.float64))
    return counts[0].item(), int(counts[1].item())


def _add_token_weighted(agg: dict, stats: dict) -> None:
    """Add ``policy_loss`` statistics to ``agg`` weighted by their token count, so that the step's statistics
    come out as token-means after dividing by the summed ``num_tokens``."""
    for k, v in stats.items():
        agg[k] = agg.get(k, 0.0) + (v * stats["num_tokens"] if k != "num_tokens" else v)


def policy_update(model, optimizer, input_ids, attention_mask, response_mask, old_logp, token_adv, ref_logp,
                  cfg: GRPOConfig, step: int):
    """Step 6 of the loop: ``cfg.num_iterations`` passes × ``cfg.num_mini_batches`` AdamW steps on one rollout batch.

    Each optimizer step accumulates the mini-batch gradient with ``backward_minibatch`` (micro-batched, exact
    whole-mini-batch normaliser), clips it to ``cfg.max_grad_norm`` and applies AdamW. A mini-batch whose loss or
    gradient norm is not finite (NaN/inf) is skipped: its gradient is discarded before it reaches the weights or
    the optimizer's moments, a warning is printed and it is counted. The mini-batch order of pass ``e`` comes from
    a generator seeded with ``(cfg.seed, step, e)``, so a resumed run makes the same updates. The gradients are
    freed (``set_to_none``) before returning, so they do not occupy memory during the next rollout.

    Args:
        input_ids, attention_mask: ``[N, P + T]`` on the model's device; response_mask, old_logp, token_adv
        (``[N, T]``) and ref_logp (``[N, T]`` or None) on any device.
        step: 0-based step index (seeds the mini-batch permutation).
    Returns:
        (sum of the mini-batch losses, list of the applied updates' pre-clip gradient norms, token-weighted
        statistic sums of ``backward_minibatch`` with their ``num_tokens``, number of skipped updates).
    """
    model.train()
    N = input_ids.shape[0]
    mb_size = N // cfg.num_mini_batches
    loss_sum, grad_norms, agg, skipped = 0.0, [], {}, 0
    for epoch in range(cfg.num_iterations):
        perm = torch.randperm(N, generator=torch.Generator().manual_seed(cfg.seed + 7919 * step + epoch))
        for mb in range(cfg.num_mini_batches):
            mb_idx = perm[mb * mb_size:(mb + 1) * mb_size] if cfg.num_mini_batches > 1 else torch.arange(N)
            optimizer.zero_grad(set_to_none=True)
            loss, stats = backward_minibatch(model, input_ids, attention_mask, response_mask, old_logp, token_adv,
                                             ref_logp, mb_idx, cfg)
            loss = all_reduce_sum(torch.tensor(loss, dtype=torch.float64)).item()  # Σ of the processes' parts
            loss_sum += loss
            for k, v in stats.items():
                agg[k] = agg.get(k, 0.0) + v
            grad_norm = _clip_and_step(model, optimizer, loss, cfg, step)
            if grad_norm is None:
                skipped += 1
            else:
                grad_norms.append(grad_norm)
    # free the gradients now: otherwise they stay allocated through the next rollout (16 GB for a full Qwen3-8B)
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norms, agg, skipped


def _clip_and_step(model, optimizer, loss: float, cfg: GRPOConfig, step: int) -> float | None:
    """Clip the accumulated gradient to ``cfg.max_grad_norm`` and apply AdamW; returns the pre-clip norm, or None
    (and discards the gradient, with a warning) when the loss or the norm is not finite."""
    from tqdm import tqdm

    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm or float("inf"))
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: the global norm as a DTensor
        grad_norm = grad_norm.full_tensor()
    if not (math.isfinite(loss) and torch.isfinite(grad_norm)):  # both global: every process agrees
        optimizer.zero_grad(set_to_none=True)  # a non-finite loss or gradient never reaches the weights
        tqdm.write(f"[warn] step {step + 1}: non-finite loss or gradient norm, update skipped")
        return None
    optimizer.step()
    return grad_norm.item()


def on_policy_update(model, optimizer, input_ids, attention_mask, response_mask, credit_fn, need_hidden,
                     cfg: GRPOConfig, step: int):
    """The update when each rollout batch is used once, in one mini-batch and one micro-batch, with no reference
    model (``can_update_on_policy``): one forward pass fewer than ``old_logprobs`` + ``policy_update``.

    θ_old is θ at the only update, so θ_old's log-probs are the training forward's own, detached (the ratio is
    exactly 1 and the gradient is the same; TRL does the same when μ = 1). The token credit is computed from
    them (and, for DelTA, from the LM-head inputs captured by that forward) between the forward and the backward.
    With dropout (e.g. LoRA's), θ_old's log-probs then carry the same dropout mask as the update.

    Args:
        credit_fn: ``(old_logp [N, T], hidden [N, T, H] or None) -> (token advantages [N, T], stats dict)``.
    Returns:
        (loss, [grad norm] or [], token-weighted statistic sums with ``num_tokens``, skipped updates 0/1,
        token advantages, credit stats, old log-probs ``[N, T]``).
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    mask = response_mask.to(input_ids.device)
    out = token_logprobs(model, input_ids, attention_mask, mask, cfg.temperature, return_hidden=need_hidden)
    logp, hidden = out if need_hidden else (out, None)
    old_logp = logp.detach()
    with torch.no_grad():
        token_adv, credit_stats = credit_fn(old_logp.cpu(), hidden.float().cpu() if need_hidden else None)
    n_tok, n_seq = _global_counts(mask)
    loss, stats = policy_loss(logp, old_logp, token_adv.to(logp.device), mask, cfg.epsilon, cfg.epsilon_high,
                              cfg.dual_clip, cfg.loss_type, cfg.max_completion_length, num_tokens=n_tok,
                              num_sequences=n_seq)
    loss.backward()
    loss_value = all_reduce_sum(torch.tensor(loss.item(), dtype=torch.float64)).item()
    grad_norm = _clip_and_step(model, optimizer, loss_value, cfg, step)
    optimizer.zero_grad(set_to_none=True)
    agg = {}
    _add_token_weighted(agg, stats)
    return (loss_value, [] if grad_norm is None else [grad_norm], agg, int(grad_norm is None), token_adv,
            credit_stats, old_logp.cpu())


def can_update_on_policy(cfg: GRPOConfig, num_rows: int, has_reference: bool) -> bool:
    """Whether ``on_policy_update`` applies: ``num_iterations`` 1, one mini-batch, the whole batch in one
    micro-batch, no KL reference, and not CSCR under FSDP (its scoring passes need gathered weights, which cannot
    be taken in the middle of a forward/backward)."""
    return (cfg.num_iterations == 1 and cfg.num_mini_batches == 1 and not has_reference
            and (cfg.micro_batch_size == 0 or cfg.micro_batch_size >= num_rows)
            and not (cfg.credit == "cscr" and _distributed()))


# ----------------------------------------------------------------------------------------------------------
# Scale: LoRA, gradient checkpointing, the reference model, out-of-memory errors
# ----------------------------------------------------------------------------------------------------------
def build_optimizer(params, cfg: GRPOConfig) -> torch.optim.AdamW:
    """AdamW over ``params`` with ``cfg.learning_rate`` and ``cfg.weight_decay``; its moments have the dtype of each
    parameter (bfloat16 weights -> bfloat16 moments). On a GPU the fused kernel is used: one pass, no per-step
    temporary copies of the parameters (torch's default multi-tensor path would allocate up to a copy of every
    trainable weight at each step: 16 GB for a full Qwen3-8B). On the CPU: torch's default implementation.
    """
    params = list(params)
    fused = bool(params) and all(p.device.type == "cuda" for p in params)
    return torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                             **({"fused": True} if fused else {}))


def _device_of(model) -> torch.device:
    return next(model.parameters()).device


class AdapterDisabledReference:
    """The KL reference of a LoRA run: the policy itself, called with its adapter disabled.

    The base weights are frozen, so with the adapter off the model *is* the initial policy: no second copy of the
    weights (TRL does the same). Callable like a model, so ``token_logprobs(ref, ...)`` and ``old_logprobs``
    work unchanged.
    """

    def __init__(self, model):
        self.model = model

    def __call__(self, *args, **kwargs):
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)

    def parameters(self):
        return self.model.parameters()


def prepare_model(model, cfg: GRPOConfig):
    """Turn on gradient checkpointing and wrap the model with LoRA adapters as ``cfg`` asks; returns the policy.

    * ``cfg.gradient_checkpointing``: ``gradient_checkpointing_enable(use_reentrant=False)``: each decoder layer
      keeps only its input and is recomputed in the backward pass (training mode only; generation and the
      no-grad passes are untouched). Non-reentrant checkpointing restores the RNG, so dropout masks match.
    * ``cfg.use_peft``: ``peft.get_peft_model`` with ``LoraConfig(r, lora_alpha, lora_dropout, target_modules)``;
      only the adapters require gradients. With checkpointing, ``enable_input_require_grads`` also makes the
      embeddings' output require grad (as peft and TRL do: reentrant checkpointing of frozen layers would
      otherwise pass no gradient to the adapters; harmless with the non-reentrant kind used here).
    Raises:
        ValueError: no module matches ``cfg.lora_target_modules`` (peft's message).
    """
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not cfg.use_peft:
        return model
    from peft import LoraConfig, get_peft_model

    if cfg.gradient_checkpointing:
        model.enable_input_require_grads()
    targets = cfg.lora_target_modules.strip()
    targets = targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=targets, bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def reference_model(model, cfg: GRPOConfig):
    """The frozen reference for the k3 KL term (``cfg.beta > 0``), or None.

    LoRA: ``AdapterDisabledReference`` (no copy). Full fine-tuning: a frozen copy of the initial policy, on the
    policy's device, or loaded again onto the CPU with ``--ref_on_cpu`` (the copy never touches the GPU).
    Call it before any update (and before loading a checkpoint's weights into the policy).
    """
    if cfg.beta <= 0:
        return None
    if cfg.use_peft:
        return AdapterDisabledReference(model)
    if cfg.ref_on_cpu:
        dtype = str(next(model.parameters()).dtype).replace("torch.", "")
        ref, _ = rollout.load_model_and_tokenizer(cfg.model, dtype=dtype, device="cpu",
                                                  attn_implementation=cfg.attn_implementation,
                                                  trust_remote_code=cfg.trust_remote_code)
        return ref.eval().requires_grad_(False)
    import copy

    return copy.deepcopy(model).eval().requires_grad_(False)


OOM_HINT = ("out of memory during {where} ({err}). Lower the memory of a step with: --micro_batch_size 1 (rows "
            "per forward/backward; the gradient is unchanged), --gradient_checkpointing (recompute activations), "
            "--use_peft (LoRA: no full gradients or AdamW state), a smaller --max_completion_length, or fewer "
            "--num_prompts_per_step / --num_generations; with --beta > 0 and full fine-tuning, --ref_on_cpu")


@contextlib.contextmanager
def oom_guard(where: str):
    """Re-raise an out-of-memory error (``torch.OutOfMemoryError`` or a RuntimeError saying "out of memory") as
    a one-line ``SystemExit`` that names the flags lowering memory; any other error passes through unchanged."""
    try:
        yield
    except RuntimeError as e:
        oom_type = getattr(torch, "OutOfMemoryError", None)
        if (oom_type is not None and isinstance(e, oom_type)) or "out of memory" in str(e).lower():
            raise SystemExit("grpo.py: error: " + OOM_HINT.format(where=where, err=str(e).strip().splitlines()[0]
                                                                  if str(e).strip() else type(e).__name__)) from None
        raise


# ----------------------------------------------------------------------------------------------------------
# Many processes: torchrun + FSDP2 (torch.distributed.fsdp.fully_shard). One process: every helper is a no-op.
# ----------------------------------------------------------------------------------------------------------
def init_distributed() -> tuple[int, int]:
    """Join the process group ``torchrun`` describes in the environment; returns (rank, world_size).

    Without torchrun (no ``WORLD_SIZE``, or 1) nothing happens: (0, 1). Otherwise the backend is NCCL on GPUs
    (process ``LOCAL_RANK`` takes GPU ``LOCAL_RANK``) and gloo on the CPU. Calling it again is harmless.
    """
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size()


def _rank_from_env() -> int:
    return int(os.environ.get("RANK", "0"))


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if _distributed() else 0


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if _distributed() else 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Σ over processes of ``t``, as a new tensor on ``t``'s device (``t`` itself with one process).

    NCCL reduces GPU tensors only and gloo CPU tensors only: ``t`` is copied to the backend's device and back.
    """
    if not _distributed():
        return t
    import torch.distributed as dist

    comm = t.to("cuda" if dist.get_backend() == "nccl" else "cpu", copy=True)
    dist.all_reduce(comm)
    return comm.to(t.device)


def all_gather_objects(obj) -> list:
    """``[obj of process 0, obj of process 1, ...]`` (picklable objects); ``[obj]`` with one process."""
    if not _distributed():
        return [obj]
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def shard_model(model, compute_dtype: torch.dtype | None = None):
    """FSDP2: shard each decoder layer, then the rest (embeddings, final norm, LM head), across the processes.

    Each process keeps 1/world_size of every weight, gradient and AdamW moment; a layer's full weights are gathered
    just before its forward and backward and freed after. Full fine-tuning and LoRA alike (the frozen base weights
    are sharded too; only the adapters get gradients and optimizer state). Gradients are *summed* over processes,
    not averaged: each process's loss is already divided by the global normaliser (``backward_minibatch``), so the
    sum is exactly the single-process gradient of the whole batch. Call it before ``build_optimizer``.

    ``compute_dtype`` (e.g. bfloat16 for float32 weights): FSDP2's mixed precision: the stored shards, gradients
    and AdamW state stay in the weights' dtype (float32 master weights, so small updates are not rounded away),
    the gathered weights used by forward and backward are cast to ``compute_dtype``, gradients are reduced in
    float32. ``train`` uses it for ``--torch_dtype float32`` on GPUs.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mp = {} if compute_dtype is None else \
        {"mp_policy": MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)}

    # the decoder-layer classes: transformers lists them in _no_split_modules (e.g. Qwen3DecoderLayer)
    names = set()
    for m in model.modules():
        names |= set(getattr(m, "_no_split_modules", None) or [])
    for m in [m for m in model.modules() if type(m).__name__ in names]:
        fully_shard(m, **mp)
    # the root is the transformers model: a peft wrapper's generate() calls it directly, bypassing the wrapper
    fully_shard(model.get_base_model() if hasattr(model, "get_base_model") else model, **mp)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # sum, not mean (see above)
            m.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no pre-multiplied sum)
    return model


@contextlib.contextmanager
def gathered_weights(model):
    """Sampling and no-grad scoring under FSDP2: gather every sharded weight once, run any number of forward passes
    with no communication, then free the full weights (a no-op without FSDP).

    Why: with FSDP every layer's forward is a collective, so all processes would have to run exactly the same
    forward passes, but generation stops at different lengths on different processes and CSCR scores only the
    responses with a non-zero advantage. Cost: one full copy of the weights per process while it lasts (as the
    inference engine of TRL's or verl's colocated mode holds). Every process must enter it.
    """
    from torch.distributed.fsdp import FSDPModule

    mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in mods:
        m.unshard()
        m.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for m in mods:
            m.reshard()
            m.set_reshard_after_forward(True, recurse=False)


def _full_state_dicts(model, optimizer):
    """(model, optimizer) state dicts with full, unsharded CPU tensors, keyed by parameter name (torch's
    distributed-checkpoint API: the same format with one process and with FSDP2). Under FSDP2 every process must
    call it; only process 0 gets them (the others get (None, None))."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    if not _distributed():
        return None, get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    sd = _gathered_model_state(model)
    osd = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return (sd, osd) if _rank() == 0 else (None, None)


def _gathered_model_state(model) -> dict:
    """Under FSDP2: the model's full (unsharded) state dict on process 0's CPU ({} on the others); every process
    must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


# ----------------------------------------------------------------------------------------------------------
# Checkpoints: written complete or not at all, resumed exactly
# ----------------------------------------------------------------------------------------------------------
TRAINER_STATE = "trainer_state.json"  # written last into a checkpoint: its presence marks the folder complete
_CKPT_RE = re.compile(r"checkpoint-(\d+)")


def latest_checkpoint(output_dir: str) -> str | None:
    """The complete checkpoint with the highest step in ``output_dir``, or None.

    Only folders named exactly ``checkpoint-<step>`` that hold ``trainer_state.json`` count: a save in progress
    (or killed) lives in ``checkpoint-<step>.tmp-*`` and a folder without the marker was never completed.
    """
    best, best_step = None, -1
    if not os.path.isdir(output_dir):
        return None
    for name in os.listdir(output_dir):
        m = _CKPT_RE.fullmatch(name)
        path = os.path.join(output_dir, name)
        if m and int(m.group(1)) > best_step and os.path.isfile(os.path.join(path, TRAINER_STATE)):
            best, best_step = path, int(m.group(1))
    return best


def _replace_dir(tmp: str, path: str) -> None:
    # os.replace cannot overwrite a non-empty folder: move the old one aside first (its name has .tmp, so it is
    # never taken for a checkpoint), then swap in the new one and delete the old one.
    import shutil

    old = None
    if os.path.exists(path):
        old = f"{path}.tmp-old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def _rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def save_checkpoint(path: str, model, tokenizer, optimizer, state: dict) -> None:
    """Write a resumable checkpoint into ``path`` (e.g. ``<output_dir>/checkpoint-<step>``), atomically.

    Contents: the model (``save_pretrained``, safetensors) or, for a peft model, the adapter only
    (``adapter_model.safetensors`` + ``adapter_config.json``); the tokenizer; ``optimizer.pt`` (AdamW moments
    and step counts); ``rng_state.pt`` (python, torch CPU and every CUDA device); and last ``trainer_state.json``
    (``state``: step, sampler position, metrics.jsonl length, counters, the CSCR threshold). Everything is
    written into a temporary sibling ``<name>.tmp-*`` that is renamed into place when complete, so a crash
    during the save leaves the previous checkpoints intact and no half-written ``checkpoint-<step>``.

    The optimizer state is saved keyed by parameter name with full tensors (``_full_state_dicts``), so a checkpoint
    written by N processes resumes in M. Under torchrun every process must call this (the shards are gathered);
    process 0 writes the files (``--output_dir`` must be on a filesystem every process sees, for ``--resume``).
    """
    import tempfile

    model_sd, optim_sd = _full_state_dicts(model, optimizer)
    if _rank() != 0:
        return
    parent, name = os.path.split(os.path.abspath(path))
    tmp = tempfile.mkdtemp(prefix=name + ".tmp-", dir=parent)
    model.save_pretrained(tmp, **({"state_dict": model_sd} if model_sd is not None else {}))
    tokenizer.save_pretrained(tmp)
    torch.save(optim_sd, os.path.join(tmp, "optimizer.pt"))
    torch.save(_rng_state(), os.path.join(tmp, "rng_state.pt"))
    with open(os.path.join(tmp, TRAINER_STATE), "w") as f:
        json.dump(state, f, indent=1)
    _replace_dir(tmp, path)


def _load_full_weights(model, folder: str) -> None:
    """Copy a ``save_pretrained`` folder's safetensors weights (one file or shards) into ``model`` in place."""
    from safetensors.torch import load_file

    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    own, loaded = model.state_dict(), set()
    for name in files:
        sd = load_file(os.path.join(folder, name))
        unexpected = model.load_state_dict(sd, strict=False).unexpected_keys
        if unexpected:
            raise ValueError(f"checkpoint {folder} has weights the model does not: {unexpected[:3]}")
        loaded |= set(sd)
    # a key save_pretrained left out is fine only if it is tied to a loaded one (e.g. lm_head = embed_tokens)
    ptrs = {own[k].data_ptr() for k in loaded}
    missing = [k for k in own if k not in loaded and own[k].data_ptr() not in ptrs]
    if missing:
        raise ValueError(f"checkpoint {folder} lacks weights: {missing[:3]}")


def load_checkpoint(path: str, model, optimizer, cfg: GRPOConfig) -> dict:
    """Restore a ``save_checkpoint`` folder into ``model`` (weights or adapter) and ``optimizer`` in place, and the
    RNG states; returns its trainer state (the caller restores the sampler, counters and metrics).

    One process only; under torchrun ``train`` calls ``load_checkpoint_weights`` before sharding the model and
    ``load_checkpoint_optimizer`` after building the optimizer.
    Raises:
        ValueError: the checkpoint was written with(out) ``--use_peft`` while this run is not, or its weights do
        not match the model.
    """
    state = load_checkpoint_weights(path, model, cfg)
    load_checkpoint_optimizer(path, model, optimizer)
    return state


def load_checkpoint_weights(path: str, model, cfg: GRPOConfig) -> dict:
    """The weights (or adapter) of a ``save_checkpoint`` folder into the *unsharded* ``model``; returns the trainer
    state. Raises ValueError as ``load_checkpoint``."""
    with open(os.path.join(path, TRAINER_STATE)) as f:
        state = json.load(f)
    if bool(state.get("use_peft")) != cfg.use_peft:
        raise ValueError(f"checkpoint {path} was written {'with' if state.get('use_peft') else 'without'} "
                         f"--use_peft; resume it with the same setting")
    if cfg.use_peft:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        sd = load_file(os.path.join(path, "adapter_model.safetensors"))
        res = set_peft_model_state_dict(model, sd)
        if getattr(res, "unexpected_keys", None):
            raise ValueError(f"adapter in {path} does not match --lora_* settings: {res.unexpected_keys[:3]}")
    else:
        _load_full_weights(model, path)
    return state


def load_checkpoint_optimizer(path: str, model, optimizer) -> None:
    """The AdamW state and RNG states of a ``save_checkpoint`` folder. Under FSDP2 (after ``shard_model``) every
    process calls it: process 0 reads the full state and each process keeps its own shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    many = _distributed()
    osd = {}
    if _rank() == 0:
        osd = torch.load(os.path.join(path, "optimizer.pt"), map_location="cpu", weights_only=True)
    set_optimizer_state_dict(model, optimizer, osd,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=many))
    for group in optimizer.param_groups:  # the state-dict round trip turns AdamW's betas tuple into a list
        if isinstance(group.get("betas"), list):
            group["betas"] = tuple(group["betas"])
    rng = torch.load(os.path.join(path, "rng_state.pt"), weights_only=True)
    random.setstate(tuple(x if not isinstance(x, list) else tuple(x) for x in rng["python"]))
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available() and not many:
        torch.cuda.set_rng_state_all(rng["cuda"])


# Flags that may change between a run and its --resume: when it stops, what it logs and saves, and how it samples
# (vLLM or HF draw different random numbers, but from the same policy). Everything else decides the updates.
RESUME_MAY_CHANGE = {"resume", "max_steps", "save_steps", "logging_steps", "eval_steps", "eval_num_generations",
                     "num_samples_to_log", "num_threads", "output_dir", "use_vllm", "vllm_gpu_memory_utilization",
                     "vllm_enable_sleep_mode", "micro_batch_size", "gradient_checkpointing"}


def _check_resume_config(path: str, cfg: GRPOConfig) -> None:
    """Refuse to resume a run with different training settings (its metrics.jsonl would mix two runs).

    Raises:
        ValueError: naming each changed flag with its old and new value.
    """
    if not os.path.exists(path):
        return
    with open(path) as f:
        old = json.load(f).get("config", {})
    new = dataclasses.asdict(cfg)
    changed = [f"--{k} {old[k]!r} -> {new[k]!r}" for k in sorted(new)
               if k in old and k not in RESUME_MAY_CHANGE and old[k] != new[k]]
    if changed:
        raise ValueError(f"--resume with settings that differ from {path}: {', '.join(changed)}; resume with the "
                         f"same settings, or start a new run in another --output_dir")


def _read_metrics(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().splitlines(keepends=True)


def write_samples(path, tokenizer, batch, rewards, adv, token_adv, weights, credit, groups):
    """samples/step_*.jsonl: prompts, responses, rewards, advantages; with DelTA/CSCR the extreme tokens."""
    G = batch.group_size
    with open(path, "w") as f:
        for g in range(groups):
            for i in range(g * G, (g + 1) * G):
                m = batch.response_mask[i].bool()
                rec = {"prompt": batch.prompts[i], "response": batch.texts[i], "reward": rewards[i].item(),
                       "advantage": adv[i].item(), "finish_reason": batch.finish_reasons[i]}
                if weights is not None and m.any() and adv[i] != 0:
                    toks = _token_strings(tokenizer, batch.response_ids[i][m].tolist())
                    w = weights[i][m].tolist()
                    order = sorted(range(len(w)), key=lambda j: w[j])
                    name = "lambda_bar" if credit == "delta" else "sensitivity"
                    rec[f"highest_{name}"] = [(toks[j], round(w[j], 4)) for j in order[::-1][:5]]
                    rec[f"lowest_{name}"] = [(toks[j], round(w[j], 4)) for j in order[:5]]
                    rec["token_advantages"] = [round(x, 4) for x in token_adv[i][m].tolist()]
                f.write(json.dumps(rec) + "\n")


def train(cfg: GRPOConfig) -> dict:
    """Run GRPO training as configured; returns the final metrics (also written to ``metrics.jsonl``).

    With ``cfg.resume`` it continues from the latest complete checkpoint in the output folder: weights (or
    adapter), AdamW state, RNG states, the data position, the CSCR threshold and the skipped-update counter are
    restored, ``metrics.jsonl`` is cut back to its length at the checkpoint (so no step is logged twice) and then
    appended to, and the "before" evaluation is not run again (it is read back from ``metrics.jsonl``). Every
    source of randomness in a step is seeded from the step index, so the resumed run logs and learns exactly what
    the uninterrupted run would have.

    Under ``torchrun --nproc_per_node N`` (README "Many GPUs"): the model is sharded with FSDP2
    (``shard_model``), each process samples and scores ``num_prompts_per_step / N`` whole groups of the step, the
    loss normalisers and DelTA's statistics are summed over processes (the update equals the single-process one),
    and process 0 alone writes metrics (gathered from every process), samples and checkpoints.
    """
    from tqdm import tqdm

    check_config(cfg)
    rank, world = init_distributed()
    main = rank == 0
    if cfg.num_prompts_per_step % world:
        raise SystemExit(f"grpo.py: error: --num_prompts_per_step {cfg.num_prompts_per_step} must be a multiple of "
                         f"the number of processes ({world}): each process takes whole groups")
    if (cfg.num_prompts_per_step // world * cfg.num_generations) % cfg.num_mini_batches:
        raise SystemExit("grpo.py: error: --num_mini_batches must divide each process's rows "
                         f"(num_prompts_per_step / {world} × num_generations)")
    out_dir = cfg.output_dir or os.path.join("runs", cfg.credit)
    if main:
        os.makedirs(os.path.join(out_dir, "samples"), exist_ok=True)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    say = tqdm.write if main else (lambda *a, **k: None)

    # --- data first: a bad row stops the run before any model is loaded ---
    rows = evaluate.load_problems(cfg.data, split="train")
    eval_source = cfg.eval_data or ("toy" if cfg.data == "toy" else "")
    eval_rows = evaluate.load_problems(eval_source, split="test") if eval_source else []
    resume_from = latest_checkpoint(out_dir) if cfg.resume else None
    if cfg.resume and resume_from is None:
        say(f"[resume] no complete checkpoint in {out_dir}: starting from step 0")
    elif not cfg.resume and latest_checkpoint(out_dir):
        say(f"[note] {out_dir} already holds checkpoints; this run starts from step 0 "
            f"(pass --resume to continue from {latest_checkpoint(out_dir)})")

    device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    model, tokenizer = rollout.load_model_and_tokenizer(cfg.model, dtype=cfg.torch_dtype, device=device,
                                                        attn_implementation=cfg.attn_implementation,
                                                        trust_remote_code=cfg.trust_remote_code)
    n_params = sum(p.numel() for p in model.parameters())
    if cfg.num_threads or n_params < 10_000_000:
        # tiny models: one thread avoids thread-synchronisation overhead that dominates their small matmuls
        torch.set_num_threads(cfg.num_threads or 1)
    template = rollout.resolve_template(cfg.prompt_template, cfg.model)
    stop_ids = rollout.stop_token_ids(tokenizer, template, model)
    model = prepare_model(model, cfg)  # LoRA adapters, gradient checkpointing
    ref_model = reference_model(model, cfg)  # frozen initial policy for --beta > 0 (before any weight changes)
    state = load_checkpoint_weights(resume_from, model, cfg) if resume_from else None
    # float32 weights on several GPUs: float32 master weights and AdamW state (sharded), bfloat16 compute
    compute_dtype = torch.bfloat16 if world > 1 and cfg.torch_dtype == "float32" and device.startswith("cuda") \
        else None
    if world > 1:
        model = shard_model(model, compute_dtype)
        if ref_model is not None and not cfg.use_peft and not cfg.ref_on_cpu:
            shard_model(ref_model, compute_dtype)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(trainable, cfg)
    if any(p.dtype == torch.bfloat16 for p in trainable):
        # bf16 has 8 significant bits: an update below ~2^-9 of a weight rounds to nothing (no master copy here)
        say("[warn] full fine-tuning with bfloat16 weights: AdamW updates smaller than ~0.2-0.4% of a weight "
            "are rounded away (at --learning_rate 1e-6 almost all are); prefer --use_peft (float32 adapters) "
            "or --torch_dtype float32 if memory allows")
    llm = None
    if cfg.use_vllm:  # after the policy is on the GPU: vLLM's memory check then counts the trainer's weights
        import toy

        llm = rollout.create_vllm_engine(toy.ensure_toy_model() if cfg.model == "toy" else cfg.model,
                                         gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                                         enable_sleep_mode=cfg.vllm_enable_sleep_mode, seed=cfg.seed,
                                         dtype=str(compute_dtype or next(model.parameters()).dtype).removeprefix("torch."),
                                         trust_remote_code=cfg.trust_remote_code)
    credit = Credit(cfg, tokenizer)
    sampler = PromptSampler(len(rows), cfg.seed)
    metrics_path = os.path.join(out_dir, "metrics.jsonl")
    start_step, skipped_total = 0, 0
    if resume_from:
        load_checkpoint_optimizer(resume_from, model, optimizer)
        start_step, skipped_total = state["step"], state["skipped_updates_total"]
        sampler.position = state["sampler_position"]
        credit.cscr_threshold = state["cscr_threshold"]
        credit._calibrated = state["cscr_calibrated"]
        lines = _read_metrics(metrics_path)
        if len(lines) < state["metrics_lines"]:
            raise ValueError(f"{metrics_path} has {len(lines)} lines, fewer than the {state['metrics_lines']} "
                             f"recorded by {resume_from}")
        if main:
            with open(metrics_path + ".tmp", "w") as f:  # drop lines logged after the checkpoint: no step twice
                f.writelines(lines[:state["metrics_lines"]])
            os.replace(metrics_path + ".tmp", metrics_path)
        say(f"[resume] from {resume_from}: step {start_step}, {state['metrics_lines']} metrics lines kept")
    if resume_from:
        _check_resume_config(os.path.join(out_dir, "config.json"), cfg)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()  # every process has read the old config.json before process 0 rewrites it
    if main:
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump({"config": dataclasses.asdict(cfg), "prompt_template": template, "num_parameters": n_params,
                       "num_trainable_parameters": sum(p.numel() for p in trainable), "num_processes": world,
                       "resumed_from": resume_from, "versions": evaluate.library_versions()}, f, indent=1)
    # a resumed run appends to the (truncated) log; a run from step 0 starts a new one instead of mixing two runs
    metrics_file = open(metrics_path, "a" if resume_from else "w") if main else None

    def log(record):
        if not main:
            return
        # NaN/inf (e.g. a DelTA side statistic on a batch with no positive responses) become null: strict JSON
        record = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        metrics_file.write(json.dumps(record) + "\n")
        metrics_file.flush()

    def run_eval(step):
        if not eval_rows or not cfg.eval_num_generations:
            return {}
        k = cfg.eval_num_generations
        with oom_guard(f"the evaluation at step {step}"), gathered_weights(model):
            # each process evaluates every world-th problem; the graded responses are pooled
            res = evaluate.evaluate_rows(model, tokenizer, eval_rows[rank::world], template, k, cfg.temperature,
                                         cfg.top_p, cfg.max_completion_length, seed=cfg.seed + 12345)
        if world > 1:
            records = [r for part in all_gather_objects(res["responses"]) for r in part]
            res = evaluate.compute_metrics(records, eval_rows, k, True)
        record = {"step": step, **_log_eval(res, k)}
        log(record)
        say(f"[eval step {step}] " + " ".join(f"{k[5:]}={v:.3f}" for k, v in record.items() if k != "step"))
        return record

    if start_step == 0:
        first_eval = run_eval(0)
    else:  # the "before" evaluation was logged by the interrupted run
        logged = [json.loads(l) for l in _read_metrics(metrics_path) if l.strip()]
        first_eval = next((r for r in logged if r.get("step") == 0 and any(k.startswith("eval/") for k in r)), {})
    last = {}
    bar = tqdm(range(start_step, cfg.max_steps), desc=f"GRPO[{cfg.credit}]", dynamic_ncols=True,
               initial=start_step, total=cfg.max_steps, **({} if main else {"disable": True}))
    try:
        for step in bar:
            with oom_guard(f"step {step + 1}"):
                last = _train_step(step, cfg, model, tokenizer, optimizer, ref_model, credit, sampler, rows,
                                   template, stop_ids, log, out_dir, skipped_total, say, llm)
            skipped_total = last["skipped_updates_total"]
            bar.set_postfix(reward=f"{last['reward']:.3f}", len=f"{last['completions/mean_length']:.1f}")
            if cfg.eval_steps and (step + 1) % cfg.eval_steps == 0 and step + 1 < cfg.max_steps:
                run_eval(step + 1)
            if cfg.save_steps and (step + 1) % cfg.save_steps == 0 and step + 1 < cfg.max_steps:
                if main:
                    metrics_file.flush()
                save_checkpoint(os.path.join(out_dir, f"checkpoint-{step + 1}"), model, tokenizer, optimizer,
                                {"step": step + 1, "sampler_position": sampler.position,
                                 "metrics_lines": len(_read_metrics(metrics_path)) if main else 0,
                                 "skipped_updates_total": skipped_total, "cscr_threshold": float(credit.cscr_threshold),
                                 "cscr_calibrated": bool(getattr(credit, "_calibrated", False)),
                                 "use_peft": cfg.use_peft, "model": cfg.model, "seed": cfg.seed})
        final_eval = run_eval(cfg.max_steps) if cfg.max_steps else first_eval
    finally:
        if main:
            metrics_file.close()
    save_model(model, tokenizer, os.path.join(out_dir, "final"))
    summary = {"before": first_eval, "after": final_eval, "last_step": last}
    if main:
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()  # nobody leaves before process 0 has written final/
    if llm is not None:
        import gc

        del llm  # free the engine before the process group goes (vLLM's shutdown touches it)
        gc.collect()
    return summary


def _train_step(step, cfg, model, tokenizer, optimizer, ref_model, credit, sampler, rows, template, stop_ids, log,
                out_dir, skipped_total, say, llm=None) -> dict:
    """One step of the loop (rollout -> verify -> advantages -> credit -> update -> log); returns its record.

    ``llm``: the vLLM engine of ``--use_vllm`` (None: HF ``generate``)."""
    t0 = time.time()
    G = cfg.num_generations
    rank, world = _rank(), _world_size()
    # 1. rollout: G responses for each of the step's prompts. Every process walks the same prompt order and takes
    #    its own whole groups (group statistics never cross processes).
    per_rank = cfg.num_prompts_per_step // world
    idx = sampler.take(cfg.num_prompts_per_step)[rank * per_rank:(rank + 1) * per_rank]
    problems = [rows[i]["problem"] for i in idx]
    prompts = [rollout.apply_template(p, template) for p in problems]
    answers = [rows[i]["answer"] for i in idx for _ in range(G)]
    device = next(model.parameters()).device
    seed = cfg.seed * 100_003 + step + 1_000_003 * rank
    stop_strings = rollout.template_stop_strings(template)
    if llm is not None:
        # the engine must sample from the current policy: push the weights (changed by the last optimizer step, or
        # by a resume) right before the rollout; it wakes the engine if it sleeps. FSDP2: full fine-tuning gathers
        # one weight at a time (DTensor.full_tensor); LoRA merges its adapters into the gathered base weights.
        with gathered_weights(model) if cfg.use_peft else contextlib.nullcontext():
            rollout.sync_weights(model, llm)
        batch = rollout.generate_vllm(llm, tokenizer, prompts, G, cfg.max_completion_length, cfg.temperature,
                                      cfg.top_p, seed=seed, stop_ids=stop_ids, stop_strings=stop_strings)
        if cfg.vllm_enable_sleep_mode:
            llm.sleep(level=2)  # drop its weights and KV cache for the update: the next sync_weights reloads them
    else:
        with gathered_weights(model):  # FSDP2: sampling runs a different number of forwards on each process
            batch = rollout.generate(model, tokenizer, prompts, G, cfg.max_completion_length, cfg.temperature,
                                     cfg.top_p, seed=seed, stop_ids=stop_ids, stop_strings=stop_strings)
    t_gen = time.time() - t0
    # 2. verify: binary reward, every grader failure counted
    graded = verify.grade_batch(batch.texts, answers)
    rewards = torch.tensor([float(ok) for ok, _ in graded])
    # 3. group advantages (GRPO) ...
    adv = group_advantages(rewards, G, scale="std" if cfg.scale_rewards == "group" else "none")
    mask = batch.response_mask
    if cfg.mask_truncated_completions:
        mask = mask * torch.tensor([r == "stop" for r in batch.finish_reasons], dtype=mask.dtype)[:, None]
        batch.response_mask = mask
    input_ids, attn = batch.input_ids.to(device), batch.attention_mask.to(device)
    if can_update_on_policy(cfg, len(adv), ref_model is not None):
        # 4-6 in one forward: θ_old's log-probs are the training forward's own (on_policy_update says why)
        (loss_sum, grad_norms, agg, skipped, token_adv, credit_stats, old_logp) = on_policy_update(
            model, optimizer, input_ids, attn, mask,
            lambda old, hid: credit(model, batch, adv, old, hid, problems, answers), credit.needs_hidden(), cfg, step)
    else:
        # 4. old log-probs at θ_old (no grad), and the hidden states DelTA needs from the same forward pass (every
        #    process runs the same number of micro-batches, so FSDP's per-layer gathers line up)
        old_logp, hidden, ref_logp = old_logprobs(model, input_ids, attn, mask, cfg, credit.needs_hidden(),
                                                  ref_model)
        # 5. ... and token advantages (the credit hook; CSCR scores only rows with Â ≠ 0, a different number on
        #    each process, hence the gathered weights)
        with gathered_weights(model) if cfg.credit == "cscr" else contextlib.nullcontext():
            token_adv, credit_stats = credit(model, batch, adv, old_logp, hidden, problems, answers)
        # 6. policy update: num_iterations passes × num_mini_batches optimizer steps, micro-batched backward
        loss_sum, grad_norms, agg, skipped = policy_update(model, optimizer, input_ids, attn, mask, old_logp,
                                                           token_adv, ref_logp, cfg, step)
    # 7. log: the batch statistics of every process, pooled
    keys = sorted(agg)
    agg = dict(zip(keys, all_reduce_sum(torch.tensor([agg[k] for k in keys], dtype=torch.float64)).tolist()))
    n_all = max(agg.pop("num_tokens", 1.0), 1.0)
    pooled = all_gather_objects((rewards.tolist(), batch.response_lengths.tolist(), batch.finish_reasons, graded))
    rewards = torch.tensor([r for part in pooled for r in part[0]])
    lengths = torch.tensor([n for part in pooled for n in part[1]], dtype=torch.float)
    finish_reasons = [f for part in pooled for f in part[2]]
    graded_all = [g for part in pooled for g in part[3]]
    N = len(rewards)
    zero_std = (rewards.view(-1, G).max(-1).values == rewards.view(-1, G).min(-1).values).float().mean()
    record = {"step": step + 1, "reward": rewards.mean().item(), "reward_std": rewards.std().item() if N > 1 else 0.0,
              "accuracy": rewards.mean().item(), "frac_reward_zero_std": zero_std.item(),
              "completions/mean_length": lengths.mean().item(),
              "completions/clipped_ratio": finish_reasons.count("length") / N,
              "loss": loss_sum / (cfg.num_iterations * cfg.num_mini_batches),
              "grad_norm": sum(grad_norms) / max(len(grad_norms), 1), "skipped_updates": skipped,
              "skipped_updates_total": skipped_total + skipped,
              **{k: v / n_all for k, v in agg.items()},
              **{f"verify/{k}": v for k, v in verify.summarize(graded_all).items() if k not in ("total", "correct")},
              **credit_stats, "step_time": time.time() - t0, "generation_time": t_gen}
    log(record)
    if rank == 0 and cfg.logging_steps and (step + 1) % cfg.logging_steps == 0:
        write_samples(os.path.join(out_dir, "samples", f"step_{step + 1:06d}.jsonl"), tokenizer, batch,
                      rewards[:len(adv)], adv, token_adv, getattr(credit, "last_weights", None), cfg.credit,
                      min(cfg.num_samples_to_log, per_rank))
    if record["completions/clipped_ratio"] > 0.5 and step < 3:
        say(f"[warn] {record['completions/clipped_ratio']:.0%} of responses hit --max_completion_length "
            f"{cfg.max_completion_length}: they rarely score; raise it")
    return record


def save_model(model, tokenizer, path):
    """``save_pretrained`` (safetensors) of the model (a peft model: its adapter) and tokenizer, written to a
    temporary folder and renamed into place. Under FSDP2 every process calls it and process 0 writes the gathered
    full weights: the folder loads with ``from_pretrained`` (or peft) with no torch.distributed."""
    import shutil

    sd = None
    if _distributed():
        sd = _gathered_model_state(model)
        if _rank() != 0:
            return
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, **({"state_dict": sd} if sd is not None else {}))
    tokenizer.save_pretrained(tmp)
    _replace_dir(tmp, path)


def main(argv=None):
    args = build_parser().parse_args(argv)
    cfg = GRPOConfig(**vars(args))
    try:
        summary = train(cfg)
    except (ValueError, FileNotFoundError) as e:  # bad data file / model name: one clear line, no traceback
        raise SystemExit(f"grpo.py: error: {e}")
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    if _rank_from_env() != 0:
        return
    b, a = summary["before"], summary["after"]
    if b and a:
        k = cfg.eval_num_generations
        print(f"held-out avg@{k}: {b[f'eval/avg@{k}']:.3f} -> {a[f'eval/avg@{k}']:.3f}   "
              f"greedy: {b['eval/greedy']:.3f} -> {a['eval/greedy']:.3f}")


if __name__ == "__main__":
    main()

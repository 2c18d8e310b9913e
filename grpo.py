"""GRPO with token-level credit assignment (GRPO, DelTA, CSCR): the trainer, read top to bottom as the method.

One training step (``train_step``) is seven stages, in the order of the papers::

    1. rollout      G responses o_i for each prompt q             rollout.generate (HF) or vLLM (--use_vllm)
    2. verify       binary reward r_i ∈ {0, 1} (+ overlong shaping) verify.grade_batch; overlong_penalty DAPO §3.4
    3. advantages   Â_i = (r_i − mean_g r) / (std_g r + 1e-6)       group_advantages   GRPO (Shao et al. 2024)
    4. θ_old        log π_θold(o_{i,t}) per token, no grad          old_logprobs       (+ h_t for DelTA, same pass)
    5. credit       token advantages Ã_{i,t} (--credit)             Credit: grpo broadcasts Â_i; delta Â_i·λ̄_{i,t}
                                                                    (delta.py); cscr Â_i·w̃_{i,t} (cscr.py); fipo Â_i
    6. update       clipped surrogate, token-mean, AdamW            policy_loss        DAPO (Yu et al. 2025) §3.1, §3.3
                    (the current policy's masks/weights: FIPO,      backward_minibatch (baselines.py)
                    Forking Tokens; SAPO's gate)
    7. log          metrics.jsonl, samples/                         checkpoint.RunFolder

The file follows that order: config and CLI; the maths (``group_advantages``, ``policy_loss``; log π is
``policy.token_logprobs``); the credit hook (``Credit``); one step (``train_step``, ``old_logprobs``,
``policy_update``); the loop (``train``).

* θ_old's log-probs come from this trainer's own forward pass, never from the sampler, so the ratio is exactly 1 at
  the first update and sampler numerics do not leak in. When the batch is used for one update only, stage 4 takes
  them from the training forward itself (one forward fewer, the same update; ``can_update_on_policy``). Each such
  optimisation checks the model's features when it loads and turns itself off where it would not be exact
  (``policy.exact_optimisations``).
* The loss is PPO's clipped surrogate with DAPO's asymmetric clip, an optional dual clip for negative advantages
  and an optional k3 KL penalty to a frozen reference (off by default, as in TRL, verl's DAPO recipe and DelTA).
  ``--loss_type dapo`` (default) is the token-mean over the mini-batch; with DelTA's normalised λ̄ (mean 1 over the
  rollout batch) it is the paper's self-normalised surrogate Σλℓ / Σλ (DelTA Eq. 8) over the rollout batch; with
  several mini-batches each one is only approximately self-normalised, as in DelTA's official code.
* The papers' comparisons are flag values of the same step (docs/reproduce.md; the maths in baselines.py and
  delta.py): a token weight computed once at θ_old goes through ``Credit`` (DelTA's ablations, its Q2 selection);
  one that needs the current policy is a branch of the loss stage, ``backward_minibatch`` (FIPO's future-KL
  weight, ``--credit fipo``; Forking Tokens' entropy mask, ``--entropy_top_ratio`` / ``--top_entropy_quantile``);
  a surrogate is a branch of ``policy_loss`` (SAPO's soft gate, ``--loss_type sapo``).
* Left out on purpose: entropy bonus, reward shaping beyond DAPO's overlong penalty, dynamic sampling, learning-rate
  schedules. The loss value is no progress signal (≈ 0 at θ_old): watch the reward and the held-out accuracy.
* Infrastructure sits behind one-line calls: recipes (named settings) and the checks made before any weights load
  in recipes.py (the memory plan: memory_plan.py), the policy model (loading, LoRA, KL reference, the shared prompt
  pass) in policy.py, torchrun + FSDP2 in distributed.py, checkpoints and the run folder's logs in checkpoint.py,
  held-out evaluation in evaluate.py. Read next: delta.py and cscr.py (the credit), then rollout.py and verify.py.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.util
import math
import random
import time
from collections import namedtuple
from dataclasses import dataclass, field

import torch

import baselines
import checkpoint
import distributed
import evaluate
import policy
import problems
import recipes
import report
import rollout
import verify

# --- Configuration: one dataclass, from which the argparse flags are generated (TRL's flag vocabulary) --------
def _f(default, help, choices=None):
    return field(default=default, metadata={"help": help, **({"choices": choices} if choices else {})})


@dataclass
class GRPOConfig:
    # recipe, model and data
    recipe: str = _f("auto", "settings that belong together (recipes.py, listed below); auto: toy for the toy, else "
                             "delta_paper; a flag given beats the recipe", ["auto", *recipes.RECIPES])
    model: str = _f("toy", "'toy' (built-in), a local folder or a Hugging Face hub id")
    data: str = _f("toy", "training problems: a jsonl or parquet file, a folder of shards, a name in data/, or 'toy'")
    data_problem_field: str = _f("problem", "the data's problem column (DeepMath-103K: question)")
    data_answer_field: str = _f("answer", "the data's reference-answer column (DeepMath-103K: final_answer)")
    max_prompt_length: int = _f(0, "leave out prompts longer than this many tokens before training (0 = keep all)")
    eval_data: str = _f("", "held-out problems (before/after); empty: the toy's test split with --data toy")
    prompt_template: str = _f("auto", "auto: none for the toy, else qwen_math", ["auto", *rollout.PROMPT_TEMPLATES])
    output_dir: str = _f("", "the run folder (config, metrics, samples, checkpoints); empty: runs/<credit> for the "
                             "toy, runs/<model>-<credit> for another model (e.g. runs/Qwen3-8B-Base-delta)")
    # model loading, LoRA and memory (docs/scaling.md)
    torch_dtype: str = _f("auto", "auto: bfloat16 on a GPU, float32 on the CPU", ["auto", "bfloat16", "float32"])
    attn_implementation: str = _f("sdpa", "attention kernel: sdpa, eager, or flash_attention_2 (needs flash-attn)")
    trust_remote_code: bool = _f(False, "run model code shipped with a hub repository")
    use_peft: bool = _f(False, "train LoRA adapters (peft); the KL reference is the model with its adapter off")
    lora_r: int = _f(16, "LoRA rank r")
    lora_alpha: int = _f(32, "LoRA scaling α (the update is (α/r)·B·A)")
    lora_dropout: float = _f(0.05, "dropout on the LoRA branch's input (training passes only)")
    lora_target_modules: str = _f("q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                                  "comma-separated module names that get LoRA adapters, or all-linear")
    gradient_checkpointing: bool = _f(False, "recompute each layer in the backward pass (less activation memory)")
    ref_on_cpu: bool = _f(False, "full fine-tuning with --beta > 0: keep the frozen reference on the CPU")
    # credit assignment
    credit: str = _f("grpo", "token credit: grpo (broadcast), delta (DelTA), cscr (CSCR), fipo (FIPO's future-KL "
                             "weight, in the loss)", ["grpo", "delta", "cscr", "fipo"])
    delta_k: int = _f(1, "DelTA refinement iterations K")
    delta_lam_min: float = _f(0.8, "DelTA λ_min")
    delta_lam_max: float = _f(1.2, "DelTA λ_max")
    delta_impl: str = _f("normal", "DelTA: keep the batch's h (normal) or stream micro-batches, recomputing h in "
                                   "K + 3 passes (memory_efficient; memory independent of the batch)",
                         ["normal", "memory_efficient"])
    # DelTA's ablations (docs/specs/baselines.md §6; docs/reproduce.md): each one changes one step of delta.py
    delta_scores: str = _f("contrastive", "DelTA margins: contrastive (Sec. 3.2) or within_side (−‖v − μ_own‖²)",
                           ["contrastive", "within_side"])
    delta_assignment: str = _f("soft", "DelTA assignment: soft α = σ(Δ/γ) or hard 1[Δ > 0]", ["soft", "hard"])
    delta_gamma: str = _f("adaptive", "DelTA γ: adaptive (every batch) or frozen (the first batch's γ⁽⁰⁾, kept)",
                          ["adaptive", "frozen"])
    delta_coefficients: str = _f("bounded", "DelTA λ: bounded λ_min + (λ_max − λ_min)·α, raw α, or random in the "
                                            "range", ["bounded", "raw", "random"])
    delta_normalize: bool = _f(True, "DelTA λ̄ = λ·N/Σλ (--no-delta_normalize: λ̄ = λ)")
    delta_proxy: str = _f("hidden", "DelTA proxy v: hidden ((1 − p)·h, App. F) or topk (W_y − Σ p̃ W_j over the "
                                    "old logits' top K)", ["hidden", "topk"])
    delta_proxy_topk: int = _f(20, "K of --delta_proxy topk (K = vocabulary: the exact hidden-state gradient)")
    delta_select: str = _f("none", "DelTA Q2 (Sec. 5.2): plain DAPO on the top, a random or the bottom "
                                   "--delta_select_fraction of tokens by λ", ["none", "top", "random", "bottom"])
    delta_select_fraction: float = _f(0.5, "share of the valid tokens --delta_select keeps")
    delta_scope: str = _f("global", "torchrun: DelTA's statistics summed over processes (global) or per process "
                                    "as in DelTA's code (local)", ["global", "local"])
    cscr_template: str = _f("verdict", "CSCR privileged note: verdict, reference, answer, verdict_short (cscr.py)")
    cscr_mode: str = _f("max", "CSCR sensitivity: max(|Δ+|,|Δ−|), mean, common", ["max", "mean", "common"])
    cscr_threshold: float = _f(0.2, "CSCR sensitivity threshold λ in nats")
    cscr_threshold_quantile: float | None = _f(None, "calibrate λ once: this quantile of s in the first batch")
    cscr_alpha: float = _f(1.0, "CSCR decay strength α")
    cscr_w_min: float = _f(0.0, "CSCR weight floor")
    cscr_weight: str = _f("exp", "CSCR weight map: exp (spec §5), exp_abs, inverse; ablations (spec §9): upweight "
                                 "(sensitive tokens up), sign_aware (RLSD's direction weight)",
                          ["exp", "exp_abs", "inverse", "upweight", "sign_aware"])
    cscr_scope: str = _f("sequence", "CSCR renormalisation: per sequence (spec §5), group or batch (§9)",
                         ["sequence", "group", "batch"])
    cscr_sign_eps: float = _f(0.2, "--cscr_weight sign_aware: clip(exp(sign(Â)·Δ+), 1 ± ε)")
    cscr_sign_mix: float = _f(0.5, "--cscr_weight sign_aware: w = (1 − mix) + mix·clip(...)")
    # rollout
    num_generations: int = _f(8, "G, responses per prompt (group size)")
    num_prompts_per_step: int = _f(16, "prompts per step; the rollout batch is num_prompts_per_step × G")
    max_completion_length: int = _f(64, "response budget in tokens (longer responses are truncated)")
    overlong_buffer_len: int = _f(0, "DAPO's overlong penalty: 0 to -factor over the budget's last N tokens (0 = off)")
    overlong_penalty_factor: float = _f(1.0, "DAPO's overlong penalty at --max_completion_length")
    temperature: float = _f(1.0, "sampling temperature; the trainer's log-probs use the same temperature")
    top_p: float = _f(1.0, "nucleus sampling mass")
    use_vllm: bool = _f(False, "sample with vLLM colocated in this process (requirements-vllm.txt)")
    vllm_gpu_memory_utilization: float = _f(0.3, "fraction of the GPU's memory vLLM takes (weights + KV cache)")
    vllm_enable_sleep_mode: bool = _f(False, "free vLLM's weights and KV cache during the policy update")
    # optimisation
    max_steps: int = _f(60, "training steps (one rollout batch each)")
    learning_rate: float = _f(3e-4, "AdamW learning rate (3e-4 suits the toy; ~1e-6 full fine-tuning, ~1e-5 LoRA)")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    max_grad_norm: float = _f(1.0, "gradient clipping (0 = off)")
    num_iterations: int = _f(1, "μ: passes over each rollout batch (PPO epochs)")
    num_mini_batches: int = _f(1, "optimizer steps per pass (the rollout batch is split into mini-batches)")
    micro_batch_size: int = _f(0, "rows per forward/backward (0 = whole mini-batch); gradients are identical")
    padding_free: bool = _f(True, "micro-batches of similar length, each cut to its own longest row (same loss)")
    shared_prompt: bool = _f(True, "run each group's prompt once, its keys/values read by its G responses (same loss)")
    fuse_old_logprobs: bool = _f(True, "one update per batch: θ_old's log-probs from the training forward (one forward "
                                       "fewer, same update)")
    epsilon: float = _f(0.2, "lower clip ε_low: ratio ≥ 1−ε for negative advantages")
    epsilon_high: float = _f(0.28, "upper clip ε_high: ratio ≤ 1+ε_high for positive advantages (DAPO)")
    dual_clip: float | None = _f(None, "dual-clip constant c for negative advantages (e.g. 10)")
    beta: float = _f(0.0, "k3 KL coefficient to a frozen reference (0 = no reference model)")
    loss_type: str = _f("dapo", "dapo: token-mean over the batch; grpo: per-sequence mean, then mean; dr_grpo: "
                                "sum / (B·max_completion_length); sapo: SAPO's soft gate in place of the clip",
                        ["dapo", "grpo", "dr_grpo", "sapo"])
    sapo_temperature_pos: float = _f(1.0, "SAPO's gate temperature τ for Â > 0")
    sapo_temperature_neg: float = _f(1.05, "SAPO's gate temperature τ for Â < 0")
    sapo_aggregation: str = _f("sequence", "SAPO: per-sequence mean then mean (verl, TRL) or token-mean",
                               ["sequence", "token"])
    # the baselines that weight or mask tokens from the current policy, in the loss (docs/specs/baselines.md)
    entropy_top_ratio: float = _f(0.0, "Forking Tokens (its code): train on the top ⌈ρn⌉ tokens by entropy, the "
                                       "loss their mean (DelTA's row: 0.2; 0 = off)")
    top_entropy_quantile: float = _f(1.0, "Forking Tokens as TRL: tokens with entropy ≥ the (1 − ρ) quantile, the "
                                          "normaliser unchanged (1 = off)")
    entropy_pool: str = _f("minibatch", "the tokens ranked by entropy: the mini-batch (exact under micro-batching; "
                                        "one no-grad forward more) or each micro-batch (Forking Tokens' code)",
                           ["minibatch", "micro"])
    fipo_decay_rate: float = _f(32.0, "FIPO: half-life of the future-KL sum in tokens")
    fipo_clip: float = _f(0.2, "FIPO: the weight is clipped to [1, 1 + this]")
    fipo_safety_threshold: float = _f(10.0, "FIPO: Â < 0 tokens with ratio above this keep a weight in [0.8, 1]")
    scale_rewards: str = _f("group", "group: (r−mean)/(std+1e-6) per group; none: r−mean (Dr. GRPO)",
                            ["group", "none"])
    mask_truncated_completions: bool = _f(False, "exclude responses that hit max_completion_length from the loss")
    # evaluation, logging, checkpoints
    eval_num_generations: int = _f(8, "k of the held-out avg@k before and after training (0 = skip)")
    eval_temperature: float | None = _f(None, "held-out sampling temperature (default: --temperature)")
    eval_top_p: float | None = _f(None, "held-out nucleus mass (default: --top_p)")
    eval_steps: int = _f(0, "also evaluate every this many steps (0 = only before and after)")
    logging_steps: int = _f(1, "write samples/step_*.jsonl every this many steps (metrics.jsonl: every step)")
    num_samples_to_log: int = _f(2, "groups written to each samples/step_*.jsonl")
    save_steps: int = _f(50, "write a resumable checkpoint-<step>/ every this many steps (final/ always)")
    resume: bool = _f(False, "continue from the latest complete checkpoint-<step>/ in --output_dir")
    overwrite_output_dir: bool = _f(False, "delete the earlier run in --output_dir and start again")
    report_to: str = _f("none", "also log every metric to: none, or tensorboard, wandb, trackio (comma-separated)")
    seed: int = _f(0, "random seed (data order, sampling)")
    num_threads: int = _f(0, "torch CPU threads (0: 1 for models under 10M parameters, else torch's default)")
    # the memory plan (memory_plan.py), made from the model's config.json before any weights load
    dry_run: bool = _f(False, "print the resolved settings and the memory plan, then exit without loading weights")
    gpu_memory_gb: float | None = _f(None, "plan for a GPU of this many GB (default: this machine's GPU, else host)")
    plan_processes: int = _f(0, "plan for a torchrun of this many processes (0: this run's)")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, like every other bad input (argparse would print the 45-line usage first)
        raise SystemExit(f"grpo.py: error: {message} (python grpo.py --help lists the flags)")


def build_parser(defaults: bool = True) -> argparse.ArgumentParser:
    """argparse flags generated from ``GRPOConfig`` (name, type, default, help, choices); a bad flag or value stops
    with one line. ``defaults=False``: flags not given are absent from the parsed namespace (``main``)."""
    ap = _Parser(description=__doc__.split("\n")[0], epilog=recipes.help_text())
    for f in dataclasses.fields(GRPOConfig):
        kind = (f.type if isinstance(f.type, str) else f.type.__name__).split("|")[0].strip()  # "float | None"
        kw = dict(default=f.default if defaults else argparse.SUPPRESS, **f.metadata)  # help, choices
        kw["help"] += " (default: %(default)s)" if f.default not in ("", None) else ""  # empty: the help says
        if kind == "bool":
            ap.add_argument(f"--{f.name}", action=argparse.BooleanOptionalAction, **kw)
        else:
            ap.add_argument(f"--{f.name}", type={"int": int, "float": float, "str": str}[kind], **kw)
    return ap


def check_config(cfg: GRPOConfig, world: int = 1, given: set[str] | None = None) -> list[str]:
    """Reject settings that cannot work, with a one-line message naming the flag (and the recipe that set it, for a
    flag not in ``given``) (``SystemExit``). Under ``--dry_run`` the checks of this machine (vLLM installed, a GPU
    present) are returned as notes of the plan."""
    rows = cfg.num_prompts_per_step // max(world, 1) * cfg.num_generations  # one process's rollout rows
    problems = [
        (cfg.num_generations < 1, "--num_generations must be >= 1"),
        (cfg.num_generations == 1 and cfg.scale_rewards == "group", "--num_generations 1 with --scale_rewards "
         "group gives every response advantage 0 (a group of one has no spread); use --num_generations >= 2"),
        *[(getattr(cfg, n) < 1, f"--{n} must be >= 1") for n in
          ("num_prompts_per_step", "max_completion_length", "num_iterations", "num_mini_batches")],
        (cfg.num_prompts_per_step % world, f"--num_prompts_per_step {cfg.num_prompts_per_step} must be a multiple "
         f"of the number of processes ({world}): each process takes whole groups"),
        (cfg.num_mini_batches >= 1 and rows % cfg.num_mini_batches, "--num_mini_batches must divide "
         "num_prompts_per_step × num_generations" + (f" / {world} processes" if world > 1 else "")),
        *[(getattr(cfg, n) < 0, f"--{n} must be >= 0") for n in
          ("max_steps", "micro_batch_size", "save_steps", "max_prompt_length", "plan_processes", "eval_steps",
           "eval_num_generations", "logging_steps", "num_samples_to_log", "max_grad_norm", "weight_decay", "beta",
           "num_threads", "cscr_alpha")],
        (not 0 <= cfg.cscr_w_min <= 1 or cfg.cscr_threshold_quantile is not None
         and not 0 < cfg.cscr_threshold_quantile <= 1, "--cscr_w_min must be in [0, 1] and "
         "--cscr_threshold_quantile in (0, 1]"),
        (cfg.overlong_buffer_len < 0 or 0 < cfg.max_completion_length <= cfg.overlong_buffer_len,
         f"--overlong_buffer_len {cfg.overlong_buffer_len} must be >= 0 and shorter than --max_completion_length "
         f"{cfg.max_completion_length} (verl asserts the same)"),
        (cfg.gpu_memory_gb is not None and cfg.gpu_memory_gb <= 0 or cfg.overlong_penalty_factor < 0,
         "--gpu_memory_gb must be > 0 and --overlong_penalty_factor >= 0"),
        (cfg.plan_processes not in (0, world) and not cfg.dry_run, f"--plan_processes {cfg.plan_processes} plans "
         f"a torchrun of that many: use it with --dry_run (this run has {world} process(es))"),
        *[(not (t > 0 and 0 < p <= 1), f"--{n}temperature must be > 0 and --{n}top_p in (0, 1]") for n, t, p in
          (("", cfg.temperature, cfg.top_p), ("eval_", _or(cfg.eval_temperature, 1), _or(cfg.eval_top_p, 1)))],
        (cfg.learning_rate <= 0, f"--learning_rate must be > 0, got {cfg.learning_rate}"),
        (not (0 <= cfg.epsilon < 1) or cfg.epsilon_high < 0, "--epsilon must be in [0, 1) and --epsilon_high >= 0"),
        (cfg.dual_clip is not None and cfg.dual_clip <= 1, "--dual_clip must be > 1 (verl uses 3, DelTA 10)"),
        (cfg.delta_lam_min > cfg.delta_lam_max or cfg.delta_lam_min < 0 or cfg.delta_k < 0,
         "DelTA needs 0 <= --delta_lam_min <= --delta_lam_max and --delta_k >= 0"),
        (cfg.use_peft and (cfg.lora_r < 1 or cfg.lora_alpha <= 0 or not 0 <= cfg.lora_dropout < 1
                           or not cfg.lora_target_modules.strip(",").strip()),
         "--use_peft needs --lora_r >= 1, --lora_alpha > 0, 0 <= --lora_dropout < 1 and --lora_target_modules"),
        (not 0 < cfg.vllm_gpu_memory_utilization <= 1, "--vllm_gpu_memory_utilization must be in (0, 1]"),
        (cfg.vllm_enable_sleep_mode and not cfg.use_vllm, "--vllm_enable_sleep_mode needs --use_vllm"),
        # the comparison rules (docs/specs/baselines.md)
        (not 0 <= cfg.entropy_top_ratio <= 1 or not 0 < cfg.top_entropy_quantile <= 1, "--entropy_top_ratio must be "
         "in [0, 1] (0 = off) and --top_entropy_quantile in (0, 1] (1 = off)"),
        (cfg.entropy_top_ratio > 0 and cfg.top_entropy_quantile < 1, "--entropy_top_ratio (Forking Tokens' rule) "
         "and --top_entropy_quantile (TRL's) are two readings of one baseline: give one"),
        (min(cfg.sapo_temperature_pos, cfg.sapo_temperature_neg) <= 0,
         "--sapo_temperature_pos and --sapo_temperature_neg must be > 0"),
        (cfg.loss_type == "sapo" and cfg.credit == "fipo", "--credit fipo weights DAPO's clipped surrogate: "
         "use it with --loss_type dapo, not sapo"),
        (cfg.fipo_decay_rate <= 0 or cfg.fipo_clip < 0 or cfg.fipo_safety_threshold <= 0, "--fipo_decay_rate and "
         "--fipo_safety_threshold must be > 0, --fipo_clip >= 0"),
        (not 0 < cfg.delta_select_fraction <= 1 or cfg.delta_proxy_topk < 1, "--delta_select_fraction must be in "
         "(0, 1] and --delta_proxy_topk >= 1"),
        (cfg.delta_select != "none" and (cfg.entropy_top_ratio > 0 or cfg.top_entropy_quantile < 1),
         "--delta_select and the entropy masks each choose the trained tokens: give one"),
        (not 0 < cfg.cscr_sign_mix <= 1 or not 0 <= cfg.cscr_sign_eps < 1, "--cscr_sign_mix must be in (0, 1] and "
         "--cscr_sign_eps in [0, 1)"),
        (cfg.credit != "delta" and any(getattr(cfg, n) != f.default for f in dataclasses.fields(GRPOConfig)
                                       if (n := f.name) in DELTA_ABLATIONS),
         f"--{', --'.join(DELTA_ABLATIONS)} change DelTA's steps: use them with --credit delta")]
    environment = [  # this machine's: notes of the plan under --dry_run
        (cfg.vllm_enable_sleep_mode and not torch.cuda.is_available(),
         "--vllm_enable_sleep_mode needs a GPU (vLLM's CPU backend has no sleep mode)"),
        (cfg.use_vllm and importlib.util.find_spec("vllm") is None, "--use_vllm needs vLLM, which this "
         "environment lacks: make a separate virtual environment with `pip install -r requirements-vllm.txt` and "
         "then `pip uninstall -y torchvision torchaudio torchcodec` (docs/distributed.md)")]
    if cfg.credit == "cscr":  # the privileged note's template: a bad name stops here, not at step 1
        import cscr

        try:
            cscr.build_condition_prompts("q", reference="1", response_answer="1", template=cfg.cscr_template)
        except ValueError as e:
            problems.append((True, f"--cscr_template {cfg.cscr_template!r}: {e}"))
    for failed, message in problems + ([] if cfg.dry_run else environment):
        if failed:
            raise SystemExit(f"grpo.py: error: {recipes.name_the_recipe(message, cfg, given)}")
    return [message for failed, message in environment if failed]


DELTA_ABLATIONS = ("delta_scores", "delta_assignment", "delta_gamma", "delta_coefficients", "delta_normalize",
                   "delta_proxy", "delta_select")


def _or(value, default):  # an optional flag's value, else its default
    return default if value is None else value


# --- The maths: pure functions on tensors ---------------------------------------------------------------------
def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str = "group",
                     eps: float = 1e-6) -> torch.Tensor:
    """GRPO group-normalised advantages Â_i = (r_i − mean_g) / (std_g + eps) (GRPO §4.1.2; DelTA spec §1).

    ``rewards`` ``[N]`` group by group (N = groups × G). ``scale_rewards="group"`` (``--scale_rewards``) divides by
    the unbiased group std (DelTA's code, verl, TRL); ``"none"`` gives r − mean (Dr. GRPO, Liu et al. 2025).
    Returns ``[N]`` float32 (float64 for float64 rewards); a group whose rewards are all equal (or of one member)
    gets exactly 0, no float residue (NeMo-RL #4161).
    Raises ValueError: N not a multiple of ``group_size``, or an unknown ``scale_rewards``.
    """
    if group_size < 1 or rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a length divisible by group_size={group_size}, "
                         f"got shape {tuple(rewards.shape)}")
    if scale_rewards not in ("group", "none"):
        raise ValueError(f"scale_rewards must be 'group' or 'none', got {scale_rewards!r}")
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32)).view(-1, group_size)
    centred = r - r.mean(-1, keepdim=True)
    if scale_rewards == "group" and group_size > 1:
        centred = centred / (r.std(-1, keepdim=True, unbiased=True) + eps)
    # exact zeros where the group has no spread (or only one member)
    flat = (r.max(-1, keepdim=True).values - r.min(-1, keepdim=True).values) == 0
    return torch.where(flat, torch.zeros_like(centred), centred).view(-1)


def overlong_penalty(lengths: torch.Tensor, max_completion_length: int, buffer_len: int, factor=1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, §3.4; verl's ``overlong_buffer``), added to the
    reward: R_length(o) = min(0, ((L_max − L_cache) − |o|) / L_cache · factor), 0 up to L_max − L_cache tokens, then
    a ramp to −factor at L_max = ``max_completion_length`` (DAPO's −1 beyond L_max cannot occur: responses are cut
    there). ``lengths`` ``[N]``: response tokens, EOS included (verl's valid response length); ``buffer_len``
    L_cache tokens, 0 < L_cache < L_max. Returns ``[N]`` float32 (≤ 0)."""
    expected = max_completion_length - buffer_len  # L_max − L_cache
    return torch.clamp((expected - lengths.to(torch.float32)) / buffer_len * factor, max=0.0)


@dataclass(frozen=True)
class LossSettings:
    """The surrogate's settings (``policy_loss``), as the flags of the same names give them
    (``LossSettings.from_config``)."""
    epsilon: float = 0.2
    epsilon_high: float = 0.28
    dual_clip: float | None = None
    loss_type: str = "dapo"
    max_completion_length: int | None = None
    beta: float = 0.0
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    sapo_aggregation: str = "sequence"

    @classmethod
    def from_config(cls, cfg: GRPOConfig) -> LossSettings:
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls)})


def policy_loss(logp, old_logp, adv, response_mask, settings: LossSettings | None = None, *, ref_logp=None,
                num_tokens=None, num_sequences=None, **keywords):
    """Clipped surrogate loss (to minimise) and its statistics.

    Per token (PPO, Schulman et al. 2017, Eq. 7, with DAPO's asymmetric clip, Yu et al. 2025, §3.1 Clip-Higher)::

        ratio  = exp(clamp(logp − old_logp, −20, 20))
        ℓ      = max(−Â·ratio, −Â·clip(ratio, 1−ε, 1+ε_high))
        ℓ      = min(ℓ, −Â·c)     where Â < 0, if dual_clip=c (Ye et al. 2020; verl's clip_ratio_c)
        ℓ     += β·k3,  k3 = exp(ref − logp) − (ref − logp) − 1   (Schulman's k3 KL estimator, if β > 0)

    ``loss_type="sapo"`` (SAPO, Gao et al. 2025; docs/specs/baselines.md §4) puts a soft gate in place of the clip
    and the dual clip: ℓ = −Â·(4/τ)·σ(τ(ratio − 1)), τ = τ_pos for Â > 0, else τ_neg; its gradient at ratio 1 is the
    unclipped policy gradient's, its value 2/τ times DAPO's there.

    Aggregation (``loss_type``):
        ``dapo``: Σ ℓ·mask / Σ mask over the whole batch (token-mean; DelTA and TRL's default);
        ``grpo``: mean over sequences of the per-sequence token-mean (the original GRPO 1/|o_i|);
        ``dr_grpo``: Σ ℓ·mask / (B · max_completion_length) (Dr. GRPO's constant normaliser);
        ``sapo``: ``grpo``'s (``sapo_aggregation="sequence"``: verl forces it, TRL uses it) or ``dapo``'s ("token").

    Args: ``logp``, ``old_logp`` ``[B, T]`` (nats, policy and θ_old); ``adv``: Â_i ``[B]`` (broadcast) or the
    token advantages Ã_{i,t} ``[B, T]`` (e.g. Â·λ̄); ``response_mask`` (EOS included), ``ref_logp`` (β > 0) ``[B, T]``;
    ``settings``: a ``LossSettings``, or its fields as keywords (``epsilon=0.2``, ...); ``num_tokens`` /
    ``num_sequences``: the normaliser's counts over the whole mini-batch when this call sees a micro-batch (the
    gradient then does not depend on the micro-batch size).
    Returns (loss, stats): token-means over this call of ``clip_ratio/low_mean`` (ratio < 1−ε, Â < 0),
    ``clip_ratio/high_mean`` (ratio > 1+ε_high, Â > 0), ``clip_ratio/region_mean``, ``clip_ratio/dual_mean``, ``kl``;
    and ``num_tokens``. Raises ValueError: shapes, ``loss_type``, ``dr_grpo`` without ``max_completion_length``,
    β > 0 without ``ref_logp``.
    """
    if settings is not None and keywords:
        raise ValueError(f"give policy_loss a LossSettings or its fields as keywords, not both: {sorted(keywords)}")
    s = settings or LossSettings(**keywords)  # an unknown keyword: TypeError, naming it
    epsilon, epsilon_high, dual_clip, beta = s.epsilon, s.epsilon_high, s.dual_clip, s.beta
    aggregation = ("grpo" if s.sapo_aggregation == "sequence" else "dapo") if s.loss_type == "sapo" else s.loss_type
    mask = response_mask.to(logp.dtype)
    adv = adv[:, None] if adv.dim() == 1 else adv
    for bad, message in [
            (logp.shape != old_logp.shape or logp.shape != mask.shape, f"logp {tuple(logp.shape)}, old_logp "
             f"{tuple(old_logp.shape)} and response_mask {tuple(mask.shape)} must have the same [B, T] shape"),
            (adv.shape[0] != logp.shape[0] or adv.shape[1] not in (1, logp.shape[-1]),
             f"adv must be [B] or [B, T], got {tuple(adv.shape)} for logp {tuple(logp.shape)}"),
            (s.loss_type not in ("dapo", "grpo", "dr_grpo", "sapo"),
             f"loss_type must be dapo, grpo, dr_grpo or sapo, got {s.loss_type!r}"),
            (s.sapo_aggregation not in ("sequence", "token"), "sapo_aggregation must be 'sequence' or 'token'"),
            (s.loss_type == "dr_grpo" and not s.max_completion_length,
             "loss_type='dr_grpo' needs max_completion_length"),
            (beta > 0 and ref_logp is None, "beta > 0 needs ref_logp")]:
        if bad:
            raise ValueError(message)
    adv = adv.to(logp.dtype).expand_as(logp)
    # padded positions may hold anything (e.g. -inf): zero them before exp so no NaN reaches the gradient
    log_ratio = torch.where(mask > 0, logp - old_logp, torch.zeros_like(logp)).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    dual_active = torch.zeros_like(mask, dtype=torch.bool)
    if s.loss_type == "sapo":  # SAPO (spec §4): the soft gate f(ratio) in place of the clip; no dual clip
        per_token = -adv * baselines.sapo_gate(ratio, adv, s.sapo_temperature_pos, s.sapo_temperature_neg)
    else:
        loss_unclipped = -adv * ratio
        loss_clipped = -adv * ratio.clamp(1.0 - epsilon, 1.0 + epsilon_high)
        per_token = torch.maximum(loss_unclipped, loss_clipped)
    if dual_clip is not None and s.loss_type != "sapo":
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
    if aggregation == "dapo":
        denom = mask.sum() if num_tokens is None else num_tokens
        loss = per_token.sum() / max(float(denom), 1.0)
    elif aggregation == "grpo":
        per_seq = per_token.sum(-1) / mask.sum(-1).clamp(min=1.0)
        loss = per_seq.sum() / float(logp.shape[0] if num_sequences is None else num_sequences)
    else:
        loss = per_token.sum() / (float(logp.shape[0] if num_sequences is None else num_sequences)
                                  * s.max_completion_length)
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


# --- Credit assignment: sequence advantages Â_i -> token advantages Ã_{i,t} (the --credit hook) ---------------
class Credit:
    """Sequence advantages ``[N]`` -> token advantages ``[N, T]``, once per rollout batch, without gradient, from
    θ_old; fixed for every mini-batch and epoch of the step (DelTA spec §2.4; CSCR spec §4). ``token_weights``: the
    last call's per-token weights by name, for the samples log: ``{"lambda_bar": λ̄}`` (DelTA), ``{"sensitivity":
    s}`` (CSCR), ``{}`` (GRPO)."""

    def __init__(self, cfg: GRPOConfig, tokenizer):
        self.cfg, self.tokenizer, self.token_weights = cfg, tokenizer, {}
        self.cscr_threshold, self.cscr_calibrated = cfg.cscr_threshold, False
        self.delta_gamma = None  # --delta_gamma frozen: (γ⁺, γ⁻) of the first batch with both sides, then kept
        # --delta_select: the tokens the loss trains on, [N, T] bool (8.4 MB at 2,048 × 4,096; None: every token)
        self.keep = None

    def needs_hidden(self) -> bool:  # stage 4 keeps the batch's h_t (else DelTA's memory_efficient recomputes them)
        return self.cfg.credit == "delta" and self.cfg.delta_impl == "normal" and self.cfg.delta_coefficients != \
            "random"

    @torch.no_grad()
    def __call__(self, model, batch: rollout.Rollout, adv, old: ThetaOld, answers, step: int = 0):
        """Args: batch (its response_mask ``[N, T]``), adv Â_i ``[N]``, old (stage 4: ``old.logp`` ``[N, T]``, DelTA's
        ``old.hidden`` ``[N, T, H]`` or None), answers (the reference of each row, CSCR), step (seeds DelTA's random
        λ). Returns (token advantages Ã_{i,t} ``[N, T]``, stats)."""
        if self.cfg.credit in ("grpo", "fipo"):  # FIPO weights Â in the loss, from the current policy
            return adv[:, None] * batch.response_mask, {}  # GRPO: every token of o_i gets Â_i
        if self.cfg.credit == "delta":
            return self._delta(model, batch, adv, old, step)
        return self._cscr(model, batch, adv, old.logp, answers)

    def token_credit(self, adv, token_adv):
        """The credit of each token, Ã_{i,t} / Â_i ``[N, T]`` (1 for GRPO, λ̄ for DelTA, w̃ for CSCR), for samples/;
        a row with Â_i = 0 has nothing to divide: λ̄ itself for DelTA (its weights multiply Â), else 1."""
        c = token_adv / torch.where(adv == 0, 1.0, adv).to(token_adv.dtype)[:, None]
        fill = self.token_weights.get("lambda_bar", torch.ones_like(c))
        return torch.where((adv == 0)[:, None], fill.to(c.dtype), c)

    def _delta(self, model, batch, adv, old, step):
        import delta

        c, mask = self.cfg, batch.response_mask
        # the ablations (baselines.md §6) are arguments of the step each one changes; the defaults are the paper's
        kw = dict(K=c.delta_k, lam_min=c.delta_lam_min, lam_max=c.delta_lam_max, return_stats=True,
                  scores=c.delta_scores, assignment=c.delta_assignment, gamma=self.delta_gamma,
                  coefficients=c.delta_coefficients, normalize=c.delta_normalize)
        pooled = distributed.is_distributed() and c.delta_scope == "global"
        # --delta_proxy topk reads the whole LM head (gathered under FSDP2): V × H floats, 2.5 GB for Qwen3-8B
        head = distributed.full_weight(model.get_output_embeddings().weight) if c.delta_proxy == "topk" else None
        if c.delta_coefficients == "random":  # App. F's control: λ uniform in [λ_min, λ_max], fresh every step
            draw = torch.Generator().manual_seed(c.seed * 1_000_003 + step * 101 + distributed.rank())
            lam_bar, stats = delta.random_coefficients(adv, mask, c.delta_lam_min, c.delta_lam_max, generator=draw,
                                                       normalize=c.delta_normalize), {}
        elif old.hidden is not None and not pooled:  # --delta_impl normal: stage 4 kept the batch's h_t [N, T, H]
            v = self._proxies(head, old.hidden, old.logp, batch.response_ids, mask)  # App. F (ThetaOld's bound)
            lam_bar, stats = delta.delta_coefficients(v, adv, mask, **kw)
        else:
            # Streamed sufficient statistics (spec §2.5): every statistic is a sum or a count, so with --delta_scope
            # global summing them over processes gives the whole batch's λ̄. memory_efficient: K + 3 passes, each
            # re-running θ_old's no-grad, eval-mode forward for h, one micro-batch at a time (θ_old's log-probs are
            # stage 4's); normal under torchrun: its kept h as one micro-batch.
            if old.hidden is not None:  # one chunk; --delta_proxy topk: it carries v itself, (v, None, mask, Â)
                layout = [(slice(None), mask.shape[1])]
                micro_batches = [(old.hidden, old.logp, mask, adv) if c.delta_proxy == "hidden" else
                                 (self._proxies(head, old.hidden, old.logp, batch.response_ids, mask), None, mask, adv)]
            else:
                passes = policy.Passes(model, batch, torch.arange(len(adv)), c, grad=False, hidden=True)
                layout = [(rows, t) for rows, _, t in passes.layout]

                def micro_batches():  # one pass: (h [b, t, H], log p [b, t], mask [b, t], Â [b]) of each, in order
                    for mb in passes:  # --delta_proxy topk: (v, None, ...), v from h and the LM head
                        logp = mb.take(old.logp)
                        yield (mb.hidden, logp, mb.take(mask), adv[mb.rows]) if c.delta_proxy == "hidden" else \
                            (self._proxies(head, mb.hidden, logp, mb.take(batch.response_ids), mb.take(mask)), None,
                             mb.take(mask), adv[mb.rows])

            parts, stats = delta.delta_coefficients_streaming(
                micro_batches, reduce_fn=distributed.all_reduce_sum if pooled else None, **kw)
            lam_bar = torch.zeros(mask.shape, dtype=parts[0].dtype)
            for (rows, t), part in zip(layout, parts):
                lam_bar[rows, :t] = part.cpu()
            stats = distributed.pool_min_max(stats) if pooled else stats  # extremes are per process: pool them
        if c.delta_gamma == "frozen" and self.delta_gamma is None and stats.get("delta/fallback") == 0.0:
            self.delta_gamma = (stats["delta/gamma0_pos"], stats["delta/gamma0_neg"])  # "w/o adaptive γ", then kept
        self.token_weights = {"lambda_bar": lam_bar}
        if c.delta_select != "none":  # Q2 (Sec. 5.2): plain DAPO on a share of the tokens chosen by λ (bounded: [N, T])
            draw = torch.Generator().manual_seed(c.seed * 1_000_003 + step * 101 + distributed.rank())
            self.keep = baselines.select_tokens(lam_bar, mask, c.delta_select_fraction, c.delta_select, draw)
            return adv[:, None] * mask, {**stats, "delta/selected_frac": float(self.keep.sum() / mask.sum())}
        return delta.delta_token_advantages(adv, lam_bar, mask), stats  # Ã = Â·λ̄ (spec §2.3 step 7)

    def _proxies(self, weight, hidden, old_logp, token_ids, mask):
        """DelTA's proxy v ``[b, t, H]`` (App. F): (1 − p)·h, or with --delta_proxy topk W_y − Σ_{top K} p̃_j W_j
        (``weight``: the LM head's W ``[V, H]``)."""
        import delta

        if self.cfg.delta_proxy == "hidden":
            return delta.proxy_vectors(hidden, old_logp, mask)
        at = weight.device
        return delta.topk_proxy_vectors(hidden.to(at), token_ids.to(at), mask.to(at), weight, self.cfg.delta_proxy_topk,
                                        self.cfg.temperature).cpu()

    def _cscr(self, model, batch, adv, old_logp, answers):
        import cscr

        c, mask = self.cfg, batch.response_mask
        # spec §3: the two privileged prompts x + c+, x + c− of every response
        pairs = [cscr.build_condition_prompts(prompt, reference=ref, response_answer=verify.extract_boxed(text) or "",
                                              template=c.cscr_template)
                 for prompt, ref, text in zip(batch.prompts, answers, batch.texts)]
        # spec §4: ℓ+, ℓ− of the responses with Â ≠ 0 (no grad, eval mode; prompts tokenised as the rollout's)
        lp_pos, lp_neg = cscr.condition_logprobs(
            model, self.tokenizer, [p for p, _ in pairs], [q for _, q in pairs], batch.response_ids, mask,
            temperature=c.temperature, micro_batch_size=c.micro_batch_size or None, logprob_fn=self._scoring_logprobs,
            adv=adv)
        s = cscr.sensitivity(old_logp, lp_pos, lp_neg, mask, mode=c.cscr_mode)  # s_t = max(|Δ+|, |Δ−|)
        if c.cscr_threshold_quantile is not None and not self.cscr_calibrated:
            # spec §5: λ = a quantile of s over the scored tokens (every process's) of the first batch that has any
            # (a batch whose every group has equal rewards has none, and no token it would weight), then frozen
            s_all = torch.cat(distributed.all_gather_objects(s[mask.bool() & (adv != 0)[:, None]].cpu()))[None]
            if s_all.numel():
                self.cscr_threshold = cscr.calibrate_threshold(s_all, torch.ones_like(s_all),
                                                               c.cscr_threshold_quantile)
                self.cscr_calibrated = True
        # spec §5: w_t = max(w_min, exp(−α·max(0, s_t − λ))), Ã_{i,t} = Â_i·w_t / mean_t(w) (sign and budget kept)
        token_adv, stats = cscr.cscr_token_advantages(
            adv, old_logp, lp_pos, lp_neg, mask, threshold=self.cscr_threshold, alpha=c.cscr_alpha,
            w_min=c.cscr_w_min, mode=c.cscr_mode, weight=c.cscr_weight, scope=c.cscr_scope,
            group_size=c.num_generations, sign_eps=c.cscr_sign_eps, sign_mix=c.cscr_sign_mix, return_stats=True)
        self.token_weights = {"sensitivity": s}
        return token_adv, {**stats, "cscr/threshold": float(self.cscr_threshold)}

    def _scoring_logprobs(self, model, input_ids, attention_mask, response_mask, temperature):
        """CSCR's scoring passes: ``token_logprobs``, each distinct privileged prompt run once (--shared_prompt)."""
        rows = torch.arange(len(input_ids))
        shared = policy.SharedPrompts(model, input_ids, attention_mask, rows, response_mask.shape[1]) \
            if self.cfg.shared_prompt else None
        return policy.token_logprobs(model, input_ids, attention_mask, response_mask, temperature,
                                     shared=(shared, rows) if shared else None)


# --- One step: rollout -> verify -> advantages -> θ_old -> credit -> update -> log ----------------------------
def train_step(step, cfg, model, tokenizer, optimizer, ref_model, credit, sampler, rows, template, stop_ids,
               run: checkpoint.RunFolder, llm=None) -> dict:
    """One step: the seven stages of the module header; returns its metrics record. ``llm``: the vLLM engine of
    ``--use_vllm`` (None: HF ``generate``). Under torchrun each process runs it on its own whole groups."""
    t0 = time.time()
    policy.reset_peak_memory()  # this step's peak host RSS (and GPU memory) go to metrics.jsonl
    G, rank, world = cfg.num_generations, distributed.rank(), distributed.world_size()
    # 1. rollout: G responses per prompt; every process takes its own whole groups of the same prompt order
    per_rank = cfg.num_prompts_per_step // world
    idx = sampler.take(cfg.num_prompts_per_step)[rank * per_rank:(rank + 1) * per_rank]
    prompts = [rollout.apply_template(rows[i]["problem"], template) for i in idx]
    answers = [rows[i]["answer"] for i in idx for _ in range(G)]
    batch = rollout.sample(model, tokenizer, prompts, G, cfg.max_completion_length, cfg.temperature, cfg.top_p,
                           seed=cfg.seed * 100_003 + step + 1_000_003 * rank, stop_ids=stop_ids,
                           stop_strings=rollout.template_stop_strings(template), llm=llm,
                           sleep_after=cfg.vllm_enable_sleep_mode)
    t_gen = time.time() - t0
    # 2. verify: binary reward, every grader failure counted; DAPO's overlong shaping adds R_length ≤ 0 (§3.4)
    graded = verify.grade_batch(batch.texts, answers)
    correct = torch.tensor([float(ok) for ok, _ in graded])
    rewards = correct + overlong_penalty(batch.response_lengths, cfg.max_completion_length, cfg.overlong_buffer_len,
                                         cfg.overlong_penalty_factor) if cfg.overlong_buffer_len else correct
    # 3. group advantages Â_i (GRPO)
    adv = group_advantages(rewards, G, cfg.scale_rewards)
    lengths = batch.response_lengths  # logged as sampled, masked or not
    if cfg.mask_truncated_completions:
        batch.response_mask = batch.response_mask * torch.tensor(
            [r == "stop" for r in batch.finish_reasons], dtype=batch.response_mask.dtype)[:, None]
    # 4. θ_old's log-probs, no grad (+ DelTA's h_t from the same forward, + the reference's for --beta > 0). The
    #    step's one optimisation, chosen here: for one update at θ_old = θ, the training forward, which 6 reuses
    old = old_logprobs(model, batch, cfg, credit.needs_hidden(), ref_model,
                       training_forward=can_update_on_policy(cfg, len(adv), ref_model is not None))
    # 5. token advantages Ã_{i,t} (CSCR scores only rows with Â ≠ 0, a different number on each process: its
    #    scoring passes need the gathered weights under FSDP2)
    with distributed.gathered_weights(model) if cfg.credit == "cscr" else contextlib.nullcontext():
        token_adv, credit_stats = credit(model, batch, adv, old, answers, step)
    # 6. policy update: num_iterations passes × num_mini_batches AdamW steps, micro-batched backward
    # the loss's own factor of each token (FIPO's f, an entropy or Q2 mask) for samples/: [N, T], 34 MB at the papers'
    loss_weights = torch.zeros_like(token_adv) if uses_loss_side_rule(cfg) else None  # 2,048 × 4,096 tokens
    loss_sum, grad_norms, agg, skipped = policy_update(model, optimizer, batch, old, token_adv, cfg, step, credit.keep,
                                                       loss_weights)
    # 7. log: metrics.jsonl (pooled over processes) every step, samples/ every logging_steps
    peaks = distributed.all_gather_objects(policy.peak_memory())  # each process's; the largest is logged
    peak = {k: max(p[k] for p in peaks) for k in peaks[0]}
    record = run.log_step(step + 1, G, rewards, correct if cfg.overlong_buffer_len else None, lengths,
                          batch.finish_reasons, verify.summarize(graded),
                          agg, {"loss": loss_sum / (cfg.num_iterations * cfg.num_mini_batches),
                                "grad_norm": sum(grad_norms) / max(len(grad_norms), 1), "skipped_updates": skipped,
                                **credit_stats, **peak, "step_time": time.time() - t0, "generation_time": t_gen})
    if rank == 0 and cfg.logging_steps and (step + 1) % cfg.logging_steps == 0:
        token_credit = credit.token_credit(adv, token_adv)  # × the loss's own factor, where a rule has one
        run.write_samples(step + 1, tokenizer, batch, rewards, adv, token_adv,
                          token_credit if loss_weights is None else token_credit * loss_weights, credit.token_weights,
                          min(cfg.num_samples_to_log, per_rank))
    return record


# θ_old, as stage 4 leaves it for stages 5 and 6. Kept across micro-batches, at the papers' scale (2,048 responses ×
# 4,096 tokens, H = 4,096, float32 on the host): logp 34 MB; ref_logp (--beta > 0, else None) 34 MB; hidden (DelTA's
# --delta_impl normal, else None) 137 GB, refused by policy.check_delta_cache above a quarter of the host's memory
# (stage 5 adds v, as large: policy.DELTA_NORMAL_HOST_COPIES = 2 in HOST_MEMORY_SHARE = 1/2); training_forward:
# stage 4's training forward when it was that (can_update_on_policy; graphs, on the device), else None.
ThetaOld = namedtuple("ThetaOld", "logp hidden ref_logp training_forward")


def old_logprobs(model, batch, cfg: GRPOConfig, need_hidden=False, ref_model=None, training_forward=False):
    """Stage 4: θ_old's log-probs ``[N, T]`` from a no-grad, eval-mode pass over the batch (``policy.Passes``); the
    LM-head inputs ``[N, T, H]`` from the same pass when ``need_hidden`` (DelTA, --delta_impl normal); the reference
    log-probs when ``ref_model`` is given. ``training_forward``: the training forward instead (train mode, with
    grad, TRL's choice when μ = 1; ``can_update_on_policy``), kept for stage 6 to reuse. Returns a ``ThetaOld``.
    Every process runs as many micro-batches (FSDP's gathers)."""
    N, T = batch.response_mask.shape
    dt = torch.promote_types(next(model.parameters()).dtype, torch.float32)  # float32 (float64 for a float64 model)
    old_logp, hidden = torch.zeros(N, T, dtype=dt), None
    passes = policy.Passes(model, batch, torch.arange(N), cfg, grad=training_forward, hidden=need_hidden,
                           keep=training_forward)
    for mb in passes:
        old_logp[mb.rows, :mb.t] = mb.logp.detach().cpu()
        if need_hidden:  # h_t on the host, bounded (the comment above ThetaOld)
            if hidden is None:
                policy.check_delta_cache(N, T, mb.hidden.shape[-1])
                hidden = torch.zeros(N, T, mb.hidden.shape[-1], dtype=dt)
            hidden[mb.rows, :mb.t] = mb.hidden.to(dt).cpu()
    ref_logp = policy.reference_logprobs(ref_model, batch, passes.layout, cfg.temperature) if ref_model else None
    return ThetaOld(old_logp, hidden, ref_logp, passes if training_forward else None)


def can_update_on_policy(cfg: GRPOConfig, num_rows: int, has_reference: bool) -> bool:
    """Whether stage 4 may take θ_old's log-probs from the training forward: ``--fuse_old_logprobs`` (off by itself
    on models whose training forward is not the eval forward: ``policy.exact_optimisations``), ``num_iterations``
    1, one mini-batch, ``micro_batch_size`` 0 (or ≥ the batch) and no KL reference. Not for CSCR under FSDP (its
    scoring passes need gathered weights, not available inside a forward/backward), nor for an entropy mask ranked in
    each micro-batch (its entropies come from the update's own forward)."""
    return (cfg.fuse_old_logprobs and cfg.num_iterations == 1 and cfg.num_mini_batches == 1 and not has_reference
            and (cfg.micro_batch_size == 0 or cfg.micro_batch_size >= num_rows)
            and not (cfg.credit == "cscr" and distributed.is_distributed())
            and not ((cfg.entropy_top_ratio > 0 or cfg.top_entropy_quantile < 1) and cfg.entropy_pool == "micro"))


def policy_update(model, optimizer, batch, old: ThetaOld, token_adv, cfg: GRPOConfig, step: int, keep=None,
                  loss_weights=None):
    """Stage 6: ``num_iterations`` passes × ``num_mini_batches`` AdamW steps on one rollout batch. Each step
    accumulates the mini-batch's gradient (``backward_minibatch``), clips it and applies AdamW; one whose loss or
    gradient norm is not finite is skipped and counted. Pass ``e`` permutes the rows with a generator seeded by
    ``(seed, step, e)``, so a resumed run makes the same updates. ``token_adv`` Ã_{i,t} ``[N, T]``; ``keep``,
    ``loss_weights``: see ``backward_minibatch``. Returns (Σ mini-batch losses, applied pre-clip gradient norms,
    token-weighted statistic sums, skipped updates).
    """
    model.train()
    N = batch.response_mask.shape[0]
    mb_size = N // cfg.num_mini_batches
    loss_sum, grad_norms, agg, skipped = 0.0, [], {}, 0
    signal = distributed.all_reduce_sum(torch.tensor([float(token_adv.abs().sum())], dtype=torch.float64)).item()
    if signal == 0 and cfg.beta == 0:  # every advantage 0: no gradient, and an AdamW step would still move the
        return 0.0, [], {"no_signal": 1.0}, 0  # weights (decay, momentum): the weights and AdamW's state stay
    for epoch in range(cfg.num_iterations):
        perm = torch.randperm(N, generator=torch.Generator().manual_seed(cfg.seed + 7919 * step + epoch))
        for k in range(cfg.num_mini_batches):
            mb_idx = perm[k * mb_size:(k + 1) * mb_size] if cfg.num_mini_batches > 1 else torch.arange(N)
            optimizer.zero_grad(set_to_none=True)
            loss, stats = backward_minibatch(model, batch, old, token_adv, mb_idx, cfg, keep, loss_weights)
            loss = distributed.all_reduce_sum(torch.tensor(loss, dtype=torch.float64)).item()  # Σ of the parts
            loss_sum += loss
            for name, value in stats.items():
                agg[name] = agg.get(name, 0.0) + value
            grad_norm = policy.clip_and_step(model, optimizer, loss, cfg.max_grad_norm, step)
            if grad_norm is None:
                skipped += 1
            else:
                grad_norms.append(grad_norm)
    # free the gradients now: otherwise they stay allocated through the next rollout (16 GB for a full Qwen3-8B)
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norms, agg, skipped


def backward_minibatch(model, batch, old: ThetaOld, token_adv, mb_idx, cfg: GRPOConfig, keep=None, loss_weights=None):
    """Accumulate the gradient of one mini-batch's loss (rows ``mb_idx``), ``cfg.micro_batch_size`` rows at a time.

    The normaliser of ``cfg.loss_type`` (tokens for ``dapo``, sequences otherwise) is counted once over the whole
    mini-batch (and over processes), so the summed gradient does not depend on the micro-batch size or the number of
    processes (trl#3021; FSDP sums the gradients). The rules that need the current policy are branches of this
    stage (docs/specs/baselines.md): Forking Tokens' entropy mask (§3) and FIPO's future-KL weight (§5).
    ``keep`` ``[N, T]`` bool: the tokens the loss trains on (--delta_select; None: all); ``loss_weights`` ``[N, T]``
    (optional, written): each token's loss-side factor (FIPO's f, the entropy mask) for samples/. Returns (loss,
    token-weighted ``policy_loss`` statistic sums).
    """
    device, loss_total, agg = next(model.parameters()).device, 0.0, {}
    settings, ft_ratio, ft_quantile = LossSettings.from_config(cfg), cfg.entropy_top_ratio, cfg.top_entropy_quantile
    forking = ft_ratio > 0 or ft_quantile < 1
    if forking and cfg.entropy_pool == "minibatch":  # H2 (spec §3): tokens ranked over the mini-batch, current θ
        keep = forking_tokens(model, batch, mb_idx, cfg)
    mask = batch.response_mask if keep is None else batch.response_mask * keep  # the tokens of the loss
    # the normaliser: the kept tokens (Forking Tokens' code, Q2), or all valid ones (TRL's entropy quantile)
    counted = batch.response_mask if ft_quantile < 1 else mask
    counts = distributed.all_reduce_sum(torch.tensor([counted[mb_idx].sum().item(), float(len(mb_idx))],
                                                     dtype=torch.float64))
    n_tok, n_seq = counts[0].item(), int(counts[1].item())
    # the training forward over these rows: stage 4's, when it was this one (its only update), else a new one
    passes = old.training_forward or policy.Passes(model, batch, mb_idx, cfg, grad=True,
                                                   entropy=forking and cfg.entropy_pool == "micro")
    for mb in passes:
        at = lambda x: mb.take(x).to(device) if x is not None else None  # noqa: E731  (this micro-batch's part)
        adv_t, mask_t, n_mb, rule = at(token_adv), at(mask), n_tok, {}
        if forking and cfg.entropy_pool == "micro":  # Forking Tokens' code: ranked in each micro-batch, its loss
            mask_t = at(batch.response_mask) * forking_mask(mb.entropy.to(device), at(batch.response_mask), cfg)
            if ft_quantile == 1:  # the kept tokens' mean, divided by the micro-batches summed (gradient accumulation)
                n_mb = max(float(mask_t.sum()), 1.0) * len(passes.layout) * distributed.world_size()
        if forking:  # the share of the micro-batch's valid tokens the entropy rule keeps
            rule = {"forking/kept_frac": float(mask_t.sum() / at(batch.response_mask).sum().clamp(min=1.0))}
        f = None
        if cfg.credit == "fipo":  # H2 (spec §5): Ã = Â·f, f from the current log-ratio; a dropped response's tokens
            f, mask_t, rule = fipo_weights(mb.logp.detach(), at(old.logp), adv_t, mask_t, cfg)  # leave the numerator
            adv_t = adv_t * f
        if loss_weights is not None:  # what the loss made of each token's credit: its mask, times f
            loss_weights[mb.rows, :mb.t] = (mask_t if f is None else mask_t * f).cpu().to(loss_weights.dtype)
        loss, stats = policy_loss(mb.logp, at(old.logp), adv_t, mask_t, settings, ref_logp=at(old.ref_logp),
                                  num_tokens=n_mb, num_sequences=n_seq)
        stats.update(rule)
        loss.backward()
        loss_total += loss.item()
        for key, v in stats.items():  # token-weighted, so that Σ / Σ num_tokens is the step's token-mean
            agg[key] = agg.get(key, 0.0) + (v * stats["num_tokens"] if key != "num_tokens" else v)
    passes.backward_prompts()  # --shared_prompt: the prompts' share, summed over the responses that read them
    return loss_total, agg


def uses_loss_side_rule(cfg: GRPOConfig) -> bool:
    """Whether the loss masks or weights tokens itself (Forking Tokens, FIPO, DelTA's Q2 selection)."""
    return cfg.entropy_top_ratio > 0 or cfg.top_entropy_quantile < 1 or cfg.credit == "fipo" or \
        cfg.delta_select != "none"


def forking_mask(entropy, mask, cfg: GRPOConfig):
    """Forking Tokens' mask ``[b, T]`` bool over the pool given (spec §3): the top ⌈ρn⌉ valid tokens by entropy
    (--entropy_top_ratio, its code's rule) or those at or above the (1 − ρ) quantile (--top_entropy_quantile, TRL's)."""
    if cfg.entropy_top_ratio > 0:
        return baselines.top_ratio_mask(entropy, mask, cfg.entropy_top_ratio)
    return baselines.quantile_mask(entropy, mask, cfg.top_entropy_quantile)


@torch.no_grad()
def forking_tokens(model, batch, mb_idx, cfg: GRPOConfig):
    """``forking_mask`` over one mini-batch at the current θ: a no-grad pass for the entropies (the micro-batches'
    own forwards come too late: the first one's backward needs the whole pool's ranking). Returns ``[N, T]`` bool,
    False outside ``mb_idx``; the entropies are [N, T] floats (34 MB at 2,048 × 4,096)."""
    dt = torch.promote_types(next(model.parameters()).dtype, torch.float32)  # float32 (float64 for a float64 model)
    mask, entropy = batch.response_mask, torch.zeros(batch.response_mask.shape, dtype=dt)
    for mb in policy.Passes(model, batch, mb_idx, cfg, grad=False, entropy=True):
        entropy[mb.rows, :mb.t] = mb.entropy.to(dt).cpu()
    keep = torch.zeros(mask.shape, dtype=torch.bool)
    keep[mb_idx] = forking_mask(entropy[mb_idx], mask[mb_idx], cfg)
    model.train()
    return keep


def fipo_weights(logp, old_logp, token_adv, mask, cfg: GRPOConfig):
    """FIPO's future-KL weight f ``[b, T]`` and the mask without its dropped responses (spec §5), from the current
    log-ratio; log c is --dual_clip's (10 when unset). The denominator stays the mini-batch's token count (fixed
    before the first micro-batch, so micro-batching stays exact; FIPO's code divides by the micro-batch's)."""
    log_c = math.log(cfg.dual_clip or 10.0)
    sign = torch.sign(token_adv)  # sign(Ã) = sign(Â) on valid tokens
    log_ratio = torch.where(mask > 0, logp - old_logp, torch.zeros_like(logp))
    f = baselines.future_kl_weights(log_ratio, sign, mask, cfg.fipo_decay_rate, cfg.fipo_clip, True,
                                    cfg.fipo_safety_threshold, log_c)
    dropped = baselines.fipo_dropped_rows(log_ratio, sign, mask, log_c)
    kept = mask * (~dropped)[:, None].to(mask.dtype)
    # logged as means over the micro-batch's trained tokens (log_step pools them over the step's)
    return f, kept, {"fipo/f_mean": float((f * kept).sum() / kept.sum().clamp(min=1.0)),
                     "fipo/dropped_frac": float((mask - kept).sum() / mask.sum().clamp(min=1.0))}


# --- The loop -------------------------------------------------------------------------------------------------
def train(cfg: GRPOConfig, given: set[str] | None = None) -> dict | None:
    """Run GRPO training as configured, under its recipe (``recipes.apply``: every setting of the recipe not in
    ``given``, the flags given on the command line); returns the before/after evaluation and the last step's record
    (None for ``--dry_run``). --resume continues exactly (checkpoint.py: every random draw is seeded by the step);
    torchrun: see distributed.py."""
    from tqdm import tqdm

    rank, world = distributed.init_distributed()
    say = tqdm.write if rank == 0 else (lambda *a, **k: None)
    policy.model_path(cfg.model)  # a folder that does not exist: one line before anything else is said
    cfg = recipes.apply(cfg, given, say)
    notes = check_config(cfg, cfg.plan_processes or world if cfg.dry_run else world, given)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    # data first: a bad row stops the run before any model is loaded
    rows = problems.load_problems(cfg.data, split="train", problem_field=cfg.data_problem_field,
                                  answer_field=cfg.data_answer_field)
    eval_source = cfg.eval_data or ("toy" if cfg.data == "toy" else "")  # the toy's held-out split by default
    eval_rows = problems.load_problems(eval_source, split="test") if eval_source else []
    if not eval_rows or not cfg.eval_num_generations:  # said once: the closing line then names no accuracy
        why = "--eval_num_generations 0; pass K >= 1" if eval_rows else \
            "--data is not the toy and --eval_data is empty; pass --eval_data FILE (e.g. data/math500.jsonl)"
        say(f"[eval] off: {why} for a held-out accuracy before and after training")
    run = None if cfg.dry_run else checkpoint.RunFolder(  # an earlier run there: see RunFolder (nothing written yet)
        cfg.output_dir or checkpoint.default_run_folder(cfg.model, cfg.credit), dataclasses.asdict(cfg), rank == 0, say)
    if run is not None and run.finished(cfg.max_steps):  # --resume of a run that ran its --max_steps: nothing to do
        return run.summary()
    # before any weights: prompts over --max_prompt_length left out, DelTA's host cache checked, the memory plan
    rows = recipes.preflight(cfg, rows, world, notes, given, say)
    if rows is None:  # --dry_run: the resolved settings and the plan were printed
        return None
    # the policy (LoRA, checkpointing), the frozen reference (--beta > 0), --resume's weights, sharding, AdamW; then
    # --resume's AdamW and RNG states and its trainer state (None for a new run)
    model, tokenizer, ref_model, optimizer, compute_dtype = policy.build(cfg, say, load_weights=run.load_weights)
    state = run.load_optimizer(model, optimizer)
    optimisations = policy.exact_optimisations(model, cfg, say)  # each default one exact here, or off with a reason
    template = rollout.resolve_template(cfg.prompt_template, cfg.model, say)
    stop_ids = rollout.stop_token_ids(tokenizer, template, model)
    llm = rollout.create_vllm_engine(  # after the policy is on the GPU: vLLM's memory check counts it
        policy.model_path(cfg.model), gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        enable_sleep_mode=cfg.vllm_enable_sleep_mode, seed=cfg.seed, trust_remote_code=cfg.trust_remote_code,
        dtype=str(compute_dtype or next(model.parameters()).dtype).removeprefix("torch.")) if cfg.use_vllm else None
    credit, sampler = Credit(cfg, tokenizer), rollout.PromptSampler(len(rows), cfg.seed)
    start_step = state["step"] if state else 0
    if state:  # --resume: where the data order and CSCR's calibration stood
        sampler.position, credit.cscr_threshold, credit.cscr_calibrated = (state[k] for k in (
            "sampler_position", "cscr_threshold", "cscr_calibrated"))
        credit.delta_gamma = tuple(state["delta_gamma"]) if state.get("delta_gamma") else None
    run.start(model, {"prompt_template": template, "num_processes": world, "optimisations": optimisations})

    def run_eval(step):  # held-out greedy, avg@k, pass@k
        if not eval_rows or not cfg.eval_num_generations:
            return {}
        t, p = _or(cfg.eval_temperature, cfg.temperature), _or(cfg.eval_top_p, cfg.top_p)  # the paper: top-p 0.7
        with policy.oom_guard(f"the evaluation at step {step}"):
            record = {"step": step, **evaluate.heldout(model, tokenizer, eval_rows, template,
                                                       cfg.eval_num_generations, t, p,
                                                       cfg.max_completion_length, seed=cfg.seed + 12345,
                                                       progress=f"eval step {step}")}
        return run.log(record, echo=f"[eval step {step}]")

    def trainer_state():  # what a checkpoint keeps beside the weights: where the data order and the credit stood
        return {"sampler_position": sampler.position, "cscr_threshold": float(credit.cscr_threshold),
                "cscr_calibrated": credit.cscr_calibrated, "delta_gamma": credit.delta_gamma}

    last, started = {}, False
    try:
        first_eval = run_eval(0) if start_step == 0 else run.logged_eval(0)  # a resumed run logged it already
        bar = tqdm(range(start_step, cfg.max_steps), desc=f"GRPO[{cfg.credit}]", dynamic_ncols=True,
                   initial=start_step, total=cfg.max_steps, **({} if rank == 0 else {"disable": True}))
        for step in bar:
            with policy.oom_guard(f"step {step + 1}"):
                last = train_step(step, cfg, model, tokenizer, optimizer, ref_model, credit, sampler, rows,
                                  template, stop_ids, run, llm)
            started = True
            bar.set_postfix(reward=f"{last['reward']:.3f}", len=f"{last['completions/mean_length']:.1f}")
            if last["completions/clipped_ratio"] > 0.5 and step < 3:
                say(f"[warn] {last['completions/clipped_ratio']:.0%} of responses hit --max_completion_length "
                    f"{cfg.max_completion_length}: they rarely score; raise it")
            if cfg.eval_steps and (step + 1) % cfg.eval_steps == 0 and step + 1 < cfg.max_steps:
                run_eval(step + 1)
            if cfg.save_steps and (step + 1) % cfg.save_steps == 0 and step + 1 < cfg.max_steps:
                run.save_checkpoint(step + 1, model, tokenizer, optimizer, trainer_state())
        summary = {"before": first_eval, "after": run_eval(cfg.max_steps) if cfg.max_steps else first_eval,
                   "last_step": last}
    except BaseException:
        if not started and start_step == 0:  # stopped before its first step: leave nothing that blocks the rerun
            run.discard()
        raise
    finally:
        run.close()
    # final/ (save_pretrained, and resumable: AdamW's state and the trainer's) and summary.json
    run.finish(model, tokenizer, summary, optimizer, {"step": cfg.max_steps, **trainer_state()})
    if run.main:  # samples/summary.json: report.py's numbers of this run's logged samples
        report.write_samples_summary(run.path)
    if llm is not None:  # free the engine before the process group goes (vLLM's shutdown touches it)
        del llm
        gc.collect()
    return summary


def main(argv=None):
    cfg = GRPOConfig(**vars(build_parser().parse_args(argv)))
    given = set(vars(build_parser(defaults=False).parse_args(argv)))  # the flags given beat the recipe's values
    try:
        summary = train(cfg, given)
        cfg = recipes.apply(cfg, given)  # the settings it ran with, for the closing line
    except (ValueError, OSError) as e:  # bad data file / model name / folder: one clear line, no traceback
        raise SystemExit(f"grpo.py: error: {e}")
    finally:
        distributed.close()
    if summary is None:  # --dry_run
        return
    b, a, k = summary["before"], summary["after"], cfg.eval_num_generations
    if distributed.rank_from_env() == 0:
        print(f"held-out avg@{k}: {b[f'eval/avg@{k}']:.3f} -> {a[f'eval/avg@{k}']:.3f}   "
              f"greedy: {b['eval/greedy']:.3f} -> {a['eval/greedy']:.3f}" if b and a else
              f"done: {cfg.max_steps} steps in {cfg.output_dir or checkpoint.default_run_folder(cfg.model, cfg.credit)}"
              " (held-out evaluation off)")


if __name__ == "__main__":
    main()

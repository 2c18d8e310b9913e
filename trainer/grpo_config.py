"""grpo.py's settings: ``GRPOConfig`` (every flag, with TRL's names where TRL has the setting), the command line
generated from it (``build_parser``) and the checks of every value (``check_config``), made before the run folder
is created or any weights load, each failing in one line that names the flag (and the recipe that set it).

Held apart from grpo.py so that the trainer opens on the method (TRL keeps ``GRPOConfig`` in its own file too);
grpo.py imports ``GRPOConfig`` and ``build_parser``; ``python -m comparisons`` adds its files' ``Flags`` to the same
class (``comparisons.config_class``), whose ``checks`` run with these. Which settings belong together is
recipes.py's business (``--recipe``), what the values cost in memory memory_plan.py's. Left out on purpose: config
files (YAML/TOML: one flag per setting, and config.json in the run folder records every resolved value),
environment-variable overrides.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
import math
import re
import sys
import textwrap
from dataclasses import dataclass, field

import torch

# The recipes (--recipe; recipes.py applies them), the prompt templates (rollout.py) and the padding-free split
# (policy.py): their data here, so that the settings read no model code
# DelTA paper App. I, Tab. 4-5, and the official run_DelTA.sh (docs/specs/delta.md §4), row by row.
DELTA_PAPER = {
    "data": "math_train",  # the paper trains on DeepMath-103K (README: fetch it, pass --data); MATH ships
    "eval_data": "aime25",  # checkpoints are chosen by AIME25 avg@8, validated every 4 steps (test_freq)
    "eval_num_generations": 8,
    "eval_steps": 4,
    "eval_temperature": 1.0,
    "eval_top_p": 0.7,  # in-training validation: T = 1.0, top-p 0.7
    "num_prompts_per_step": 128,
    "num_generations": 16,  # train_prompt_bsz 128, rollout n 16
    "num_mini_batches": 4,  # ppo_mini_batch_size 32 prompts: 4 updates per step, 1 epoch
    "learning_rate": 1e-6,
    "weight_decay": 0.1,
    "max_grad_norm": 1.0,  # AdamW, constant, no warm-up
    "epsilon": 0.2,
    "epsilon_high": 0.28,
    "dual_clip": 10.0,  # clip 0.2 / 0.28, clip_ratio_c 10
    "loss_type": "dapo",
    "beta": 0.0,  # token-mean; no KL loss, no KL in the reward
    "max_prompt_length": 2048,
    "max_completion_length": 20480,
    "temperature": 1.0,
    "top_p": 1.0,  # rollout T 1.0, top-p 1.0
    "overlong_buffer_len": 4096,
    "overlong_penalty_factor": 1.0,  # DAPO's overlong reward shaping, as run_DelTA.sh
    "max_steps": 220,  # 8B (300 for 14B)
    "torch_dtype": "float32",  # master weights (FSDP2 computes in bf16 under torchrun)
    "delta_impl": "memory_efficient",  # normal would keep h of 2,048 rows × 20,480 tokens: 687 GB at H = 4,096
    "gradient_checkpointing": True,  # the official run's (with param/optimizer offload, sequence parallel 4)
    "micro_batch_size": 1,  # rows of up to 22,528 tokens per forward (verl: dynamic, by tokens)
    # the scale path (trainer/scale_passes.py): each the plain path's numbers to rounding, each off where inexact
    "padding_free": True,
    "shared_prompt": True,
    "chunked_lm_head": True,
    "fuse_old_logprobs": True,
}

# One 80 GB GPU, Qwen3-8B-Base: the paper's method and loss at a smaller batch and budget (docs/scaling.md).
ONE_GPU_CHANGES = {
    "use_peft": True,
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.0,  # dropout 0 keeps train = eval exact
    "learning_rate": 1e-5,  # LoRA wants about 10x full fine-tuning's (docs/scaling.md)
    "torch_dtype": "auto",  # bf16 base weights on the GPU; peft keeps the adapters in float32
    "use_vllm": True,
    "vllm_enable_sleep_mode": True,  # vLLM's share: sized by the plan (memory_plan.vllm_share)
    "num_prompts_per_step": 64,
    "num_generations": 8,
    "max_prompt_length": 1024,
    "max_completion_length": 4096,
    "overlong_buffer_len": 1024,
    "micro_batch_size": 2,
}
DELTA_ONE_GPU = {**DELTA_PAPER, **ONE_GPU_CHANGES}

RECIPES = {"toy": {}, "delta_paper": DELTA_PAPER, "delta_one_gpu": DELTA_ONE_GPU}
# What a recipe adds when the run is on GPUs or a dry run plans for them (recipes.on_gpus): the paper's rollouts came
# from a fast engine (SGLang in DelTA's run_DelTA.sh); ours is a colocated vLLM that sleeps during the update, its
# share sized by the plan. A CPU run of the recipe keeps HF generate (vLLM's CPU backend has no sleep mode). No IS
# correction for the sampler–trainer mismatch (--vllm_importance_sampling_correction stays off): DelTA's code has none.
ON_GPUS = {"delta_paper": {"use_vllm": True, "vllm_enable_sleep_mode": True}}


def name_the_recipe(message: str, cfg, given: set[str] | None) -> str:
    """``message`` (a one-line error naming flags) with the flags it names that the recipe set, not the command line:
    ``... (--overlong_buffer_len 4096 is the delta_paper recipe's; a flag given beats it)``."""
    named = dict.fromkeys(re.findall(r"--(\w+)", message))
    table = RECIPES.get(cfg.recipe, {})
    mine = [n for n in named if n in table and given is not None and n not in given]
    return message + (
        f" ({', '.join(f'--{n} {table[n]}' for n in mine)} {'is' if len(mine) == 1 else 'are'} the "
        f"{cfg.recipe} recipe's; a flag given beats it)"
        if mine
        else ""
    )


def help_text() -> str:
    """The recipes as ``--help`` lists them: each one's name and the flags it sets."""

    def flags(table):
        return " ".join(
            f"--{k}" if v is True else f"--no-{k}" if v is False else f"--{k} {v}" for k, v in table.items()
        )

    return (
        f"recipes (--recipe): toy: the defaults above; delta_paper: {flags(DELTA_PAPER)}, and on GPUs "
        f"{flags(ON_GPUS['delta_paper'])}; delta_one_gpu: delta_paper with {flags(ONE_GPU_CHANGES)}"
    )


QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
PROMPT_TEMPLATES = {
    # The raw problem and a newline (the toy uses this; understand-r1-zero's "no" template).
    "none": ("{problem}\n", [], ["\n\nQuestion:", "\n\nProblem:"]),
    # Qwen2.5-Math "qwen25-math-cot" ChatML written by hand (not the tokenizer's chat template, which adds
    # Qwen3's <think> handling). A base model must stop on <|im_end|> *and* <|endoftext|> (Qwen3#927).
    "qwen_math": (
        "<|im_start|>system\n" + QWEN_MATH_SYSTEM + "<|im_end|>\n<|im_start|>user\n{problem}<|im_end|>\n"
        "<|im_start|>assistant\n",
        ["<|im_end|>", "<|endoftext|>"],
        [],
    ),
    # DeepSeek-R1-Zero's plain conversation; the answer ends with </answer>.
    "r1": (
        "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
        "The Assistant first thinks about the reasoning process in the mind and then provides the User with "
        "the answer. The reasoning process is enclosed within <think> </think> and answer is enclosed within "
        "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer "
        "here </answer>. The final answer is put in \\boxed{}.\nUser: {problem}\nAssistant: <think>",
        [],
        ["</answer>"],
    ),
}

PADDING_FREE_BUCKETS = 8  # micro-batches of similar length a whole (mini-)batch is split into, with --padding_free


# One dataclass, from which the argparse flags are generated (TRL's flag vocabulary)
def flag(default, help, choices=None):
    """A field of ``GRPOConfig`` (or of a comparison's ``Flags``): its default, its --help and its choices."""
    return field(default=default, metadata={"help": help, **({"choices": choices} if choices else {})})


@dataclass
class GRPOConfig:
    # recipe, model and data
    recipe: str = flag(
        "auto",
        "settings that belong together (recipes.py, listed below); auto: toy for the toy, else "
        "delta_paper; a flag given beats the recipe",
        ["auto", *RECIPES],
    )
    model: str = flag("toy", "'toy' (built-in), a local folder or a Hugging Face hub id")
    data: str = flag("toy", "training problems: a jsonl or parquet file, a folder of shards, a name in data/, or 'toy'")
    data_problem_field: str = flag("problem", "the data's problem column (DeepMath-103K: question)")
    data_answer_field: str = flag("answer", "the data's reference-answer column (DeepMath-103K: final_answer)")
    max_prompt_length: int = flag(0, "leave out prompts longer than this many tokens before training (0 = keep all)")
    eval_data: str = flag("", "held-out problems (before/after); empty: the toy's test split with --data toy")
    prompt_template: str = flag("auto", "auto: none for the toy, else qwen_math", ["auto", *PROMPT_TEMPLATES])
    output_dir: str = flag(
        "",
        "the run folder (config, metrics, samples, checkpoints); empty: runs/<credit> for the "
        "toy, runs/<model>-<credit> for another model (e.g. runs/Qwen3-8B-Base-delta)",
    )
    # model loading, LoRA and memory (docs/scaling.md)
    torch_dtype: str = flag("auto", "auto: bfloat16 on a GPU, float32 on the CPU", ["auto", "bfloat16", "float32"])
    attn_implementation: str = flag("sdpa", "attention kernel: sdpa, eager, or flash_attention_2 (needs flash-attn)")
    trust_remote_code: bool = flag(False, "run model code shipped with a hub repository")
    use_peft: bool = flag(False, "train LoRA adapters (peft); the KL reference is the model with its adapter off")
    lora_r: int = flag(16, "LoRA rank r")
    lora_alpha: int = flag(32, "LoRA scaling α (the update is (α/r)·B·A)")
    lora_dropout: float = flag(0.05, "dropout on the LoRA branch's input (training passes only)")
    lora_target_modules: str = flag(
        "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        "comma-separated module names that get LoRA adapters, or all-linear",
    )
    gradient_checkpointing: bool = flag(False, "recompute each layer in the backward pass (less activation memory)")
    ref_on_cpu: bool = flag(False, "full fine-tuning with --beta > 0: keep the frozen reference on the CPU")
    cast_lm_head_to_fp32: bool = flag(
        False,
        "the LM head's weight and matmul in float32, the body in --torch_dtype "
        "(TRL's flag; ScaleRL): float32 logits from a bf16 model; an untied "
        "head, one process",
    )
    # credit assignment
    credit: str = flag(
        "grpo",
        "token credit (grpo.CREDIT_FUNCTIONS): grpo (Â on every token), delta (DelTA), cscr (CSCR); the papers' "
        "comparisons: python -m comparisons --help",
        ["grpo", "delta", "cscr"],
    )
    delta_k: int = flag(1, "DelTA refinement iterations K")
    delta_lam_min: float = flag(0.8, "DelTA λ_min")
    delta_lam_max: float = flag(1.2, "DelTA λ_max")
    delta_impl: str = flag(
        "normal",
        "where DelTA's h comes from: kept from θ_old's pass for the whole batch (normal) or recomputed a "
        "micro-batch at a time in each of K + 3 passes (memory_efficient; memory independent of the batch). "
        "(Not the official code's names: both of ours compute ‖v − μ‖² directly, its 'Normal'; spec §2.5)",
        ["normal", "memory_efficient"],
    )
    delta_scope: str = flag(
        "global",
        "torchrun: DelTA's statistics summed over processes (global) or per process as in DelTA's code (local)",
        ["global", "local"],
    )
    cscr_template: str = flag("verdict", "CSCR privileged note: verdict, reference, answer, verdict_short (cscr.py)")
    cscr_mode: str = flag("max", "CSCR sensitivity: max(|Δ+|,|Δ−|), mean, common", ["max", "mean", "common"])
    cscr_threshold: float = flag(0.2, "CSCR sensitivity threshold λ in nats")
    cscr_threshold_quantile: float | None = flag(None, "calibrate λ once: this quantile of s in the first batch")
    cscr_alpha: float = flag(1.0, "CSCR decay strength α")
    cscr_w_min: float = flag(0.0, "CSCR weight floor")
    cscr_weight: str = flag(
        "exp",
        "CSCR weight map: exp (spec §5), exp_abs, inverse (spec §5's alternatives)",
        ["exp", "exp_abs", "inverse"],
    )
    # rollout
    num_generations: int = flag(8, "G, responses per prompt (group size)")
    num_prompts_per_step: int = flag(16, "prompts per step; the rollout batch is num_prompts_per_step × G")
    max_completion_length: int = flag(64, "response budget in tokens (longer responses are truncated)")
    overlong_buffer_len: int = flag(
        0, "DAPO's overlong penalty: 0 to -factor over the budget's last N tokens (0 = off)"
    )
    overlong_penalty_factor: float = flag(1.0, "DAPO's overlong penalty at --max_completion_length")
    grade_workers: int = flag(1, "worker processes grading a step's responses (verify.py's pool)")
    grade_timeout: float = flag(5.0, "seconds to grade one response; past it the reward is 0 ('timeout')")
    temperature: float = flag(1.0, "sampling temperature; the trainer's log-probs use the same temperature")
    top_p: float = flag(1.0, "nucleus sampling mass")
    use_vllm: bool = flag(False, "sample with vLLM colocated in this process (tools/requirements-vllm.txt)")
    vllm_gpu_memory_utilization: float | None = flag(
        None,
        "fraction of the GPU's memory vLLM takes (weights + KV "
        "cache); default: with --vllm_enable_sleep_mode on a GPU "
        "the memory plan's size (memory_plan.vllm_share), else 0.3",
    )
    vllm_enable_sleep_mode: bool = flag(False, "free vLLM's weights and KV cache during the policy update")
    vllm_kv_cache_dtype: str = flag(
        "auto",
        "vLLM's KV cache: auto (the model's dtype) or fp8 (half the bytes on a "
        "GPU: twice the sequences at once; the sampler drifts further from the "
        "trainer)",
        ["auto", "fp8"],
    )
    # the sampler–trainer mismatch (TRL 1.16's flags and meanings; sampler_mismatch.py): off by default
    vllm_importance_sampling_correction: bool = flag(
        False,
        "--use_vllm: multiply each token's loss by the truncated IS "
        "weight π_θold / π_vLLM (vLLM's processed log-probs)",
    )
    vllm_importance_sampling_mode: str = flag(
        "token_truncate",
        "token_truncate: w_t = min(ratio_t, C_max); token_mask: "
        "0 outside [C_min, C_max]; sequence_*: one ratio per "
        "response, the product of its tokens'",
        ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"],
    )
    vllm_importance_sampling_clip_max: float | None = flag(3.0, "C_max of the IS weight (TRL 1.16's; None: no bound)")
    vllm_importance_sampling_clip_min: float | None = flag(None, "C_min of the IS weight (None: no lower bound)")
    # optimisation
    max_steps: int = flag(60, "training steps (one rollout batch each)")
    learning_rate: float = flag(3e-4, "AdamW learning rate (3e-4 suits the toy; ~1e-6 full fine-tuning, ~1e-5 LoRA)")
    weight_decay: float = flag(0.0, "AdamW weight decay")
    max_grad_norm: float = flag(1.0, "gradient clipping (0 = off)")
    num_iterations: int = flag(1, "μ: passes over each rollout batch (PPO epochs)")
    num_mini_batches: int = flag(1, "optimizer steps per pass (the rollout batch is split into mini-batches)")
    micro_batch_size: int = flag(
        0,
        "rows per forward/backward (0: the whole mini-batch, with --padding_free in "
        f"{PADDING_FREE_BUCKETS} length-sorted parts); gradients are identical",
    )
    fuse_old_logprobs: bool = flag(
        True,
        "θ_old's log-probs from the update's own forward where one update of one micro-batch uses the batch, as TRL "
        "does (one forward fewer, the same update; off where the model has dropout); --no-fuse_old_logprobs: θ_old's "
        "own no-grad forward",
    )
    # the scale path (trainer/scale_passes.py): off for the toy (the plain passes of grpo.py), on in the scale recipes
    padding_free: bool = flag(False, "micro-batches of similar length, each cut to its own longest row (same loss)")
    shared_prompt: bool = flag(
        False, "run each group's prompt once, its keys/values read by its G responses (same loss)"
    )
    chunked_lm_head: bool = flag(False, "the LM head a chunk of positions at a time: no [b, T, V] logits (same loss)")
    epsilon: float = flag(0.2, "lower clip ε_low: ratio ≥ 1−ε for negative advantages")
    epsilon_high: float = flag(0.28, "upper clip ε_high: ratio ≤ 1+ε_high for positive advantages (DAPO)")
    dual_clip: float | None = flag(None, "dual-clip constant c for negative advantages (e.g. 10)")
    beta: float = flag(0.0, "k3 KL coefficient to a frozen reference (0 = no reference model)")
    loss_type: str = flag(
        "dapo",
        "the loss's normaliser (grpo.AGGREGATIONS): dapo, token-mean over the mini-batch; grpo, each response's mean, "
        "then their mean; dr_grpo, sum / (responses·max_completion_length)",
        ["dapo", "grpo", "dr_grpo"],
    )
    scale_rewards: str = flag(
        "group", "group: (r−mean)/(std+1e-6) per group; none: r−mean (Dr. GRPO)", ["group", "none"]
    )
    mask_truncated_completions: bool = flag(False, "exclude responses that hit max_completion_length from the loss")
    # evaluation, logging, checkpoints
    eval_num_generations: int = flag(8, "k of the held-out avg@k before and after training (0 = skip)")
    eval_temperature: float | None = flag(None, "held-out sampling temperature (default: --temperature)")
    eval_top_p: float | None = flag(None, "held-out nucleus mass (default: --top_p)")
    eval_steps: int = flag(0, "also evaluate every this many steps (0 = only before and after)")
    logging_steps: int = flag(1, "write samples/step_*.jsonl every this many steps (metrics.jsonl: every step)")
    num_samples_to_log: int = flag(2, "groups written to each samples/step_*.jsonl")
    save_steps: int = flag(50, "write a resumable checkpoint-<step>/ every this many steps (final/ always)")
    resume: bool = flag(False, "continue from the latest complete checkpoint-<step>/ in --output_dir")
    overwrite_output_dir: bool = flag(False, "delete the earlier run in --output_dir and start again")
    report_to: str = flag("none", "also log every metric to: none, or tensorboard, wandb, trackio (comma-separated)")
    seed: int = flag(0, "random seed (data order, sampling)")
    num_threads: int = flag(0, "torch CPU threads (0: 1 for models under 10M parameters, else torch's default)")
    # the memory plan (memory_plan.py), made from the model's config.json before any weights load
    dry_run: bool = flag(False, "print the resolved settings and the memory plan, then exit without loading weights")
    gpu_memory_gb: float | None = flag(None, "plan for a GPU of this many GB (default: this machine's GPU, else host)")
    plan_processes: int = flag(0, "plan for a torchrun of this many processes (0: this run's)")

    def checks(self) -> list[tuple[bool, str]]:
        """More (failed, message) checks of ``check_config``: none here; a comparison's config adds its flags' own."""
        return []


# --help's groups, as TRL's and verl's configs group their settings: the first flag of each group -> its title (the
# flags follow GRPOConfig's order); a comparison's flags (python -m comparisons) are grouped by their file
HELP_GROUPS = {
    "recipe": "recipe, model, data and prompt template",
    "torch_dtype": "model loading, LoRA and memory",
    "credit": "credit assignment (--credit, then each method's flags)",
    "num_generations": "rollout and its reward (DAPO's overlong shaping, the grader)",
    "vllm_importance_sampling_correction": "the sampler-trainer mismatch (vLLM rollouts)",
    "max_steps": "optimisation",
    "padding_free": "the scale path (trainer/scale_passes.py; on in the scale recipes)",
    "epsilon": "loss: clipped surrogate, KL, advantage",
    "eval_num_generations": "evaluation, logging and checkpoints",
    "dry_run": "the memory plan (--dry_run)",
}
# A negative number in any form (-1, -0.5, -.5, -1e-4, -1E+3): argparse takes only -1 and -0.5 as a flag's value
NEGATIVE_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|-inf")


class _HelpFormatter(argparse.HelpFormatter):
    def _split_lines(self, text, width):  # a long default (a list of module names) is never broken mid-word
        return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    def __init__(self, **kw):  # no prefixes: a mistyped --no-padding_fre is an error, not --no-padding_free
        super().__init__(allow_abbrev=False, formatter_class=_HelpFormatter, **kw)

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, with a negative number after a flag read as its value (``--learning_rate -1e-4`` is
        ``--learning_rate=-1e-4``, then checked by check_config like any value)."""
        words = list(sys.argv[1:] if args is None else args)
        joined = []
        for word in words:
            if joined and NEGATIVE_NUMBER.fullmatch(word) and joined[-1].startswith("--") and "=" not in joined[-1]:
                joined[-1] = f"{joined[-1]}={word}"
            else:
                joined.append(word)
        return super().parse_known_args(joined, namespace)

    def error(self, message):  # one line, like every other bad input (argparse would print the 45-line usage first)
        command = f"python {self.prog}" if self.prog.endswith(".py") else self.prog
        raise SystemExit(f"{self.prog}: error: {message}{self.suggest(message)} ({command} --help lists the flags)")

    def suggest(self, message: str) -> str:
        """``; did you mean --num_generations?`` for each unknown flag of argparse's "unrecognized arguments: ..."
        that is close to a known one (difflib), else ""."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        known = [s for action in self._actions for s in action.option_strings if s.startswith("--")]
        close = [
            (flag, difflib.get_close_matches(flag, known, n=1, cutoff=0.75))
            for flag in (word.split("=")[0] for word in message.split(":", 1)[1].split())
            if flag.startswith("--")
        ]
        return "".join(f"; did you mean {match[0]} (not {flag})?" for flag, match in close if match)


def build_parser(config=None, defaults: bool = True, description: str = "", prog: str = "grpo.py"):
    """argparse flags generated from the dataclass ``config`` (None: ``GRPOConfig``; a comparison's config adds its
    flags, python -m comparisons) (name, type, default, help, choices), in ``HELP_GROUPS``; a bad flag or value stops
    with one line. ``defaults=False``: flags not given are absent from the parsed namespace (``main``)."""
    config = config or GRPOConfig
    about = (
        "GRPO with token-level credit assignment (GRPO, DelTA, CSCR): the trainer, read top to bottom as the method."
    )
    usage = f"{'python ' if prog.endswith('.py') else ''}{prog} [--flag value ...]  (the flags below, by group)"
    ap = _Parser(prog=prog, usage=usage, description=description or about, epilog=help_text())
    own = {f.name for f in dataclasses.fields(GRPOConfig)}
    origin = {  # a comparison's flag -> its file
        f.name: base.__module__.replace(".", "/") + ".py"
        for base in config.__mro__
        if dataclasses.is_dataclass(base) and base is not config and base is not GRPOConfig
        for f in dataclasses.fields(base)
    }
    fields = sorted(dataclasses.fields(config), key=lambda f: f.name not in own)  # grpo.py's, then the comparisons'
    group = ap
    for f in fields:
        title = HELP_GROUPS.get(f.name) if f.name in own else origin.get(f.name)
        if title and title != getattr(group, "title", None):
            group = ap.add_argument_group(title)
        kind = (f.type if isinstance(f.type, str) else f.type.__name__).split("|")[0].strip()  # "float | None"
        kw = dict(default=f.default if defaults else argparse.SUPPRESS, **f.metadata)  # help, choices
        kw["help"] += " (default: %(default)s)" if f.default not in ("", None) else ""  # empty: the help says
        if kind == "bool":
            group.add_argument(f"--{f.name}", action=argparse.BooleanOptionalAction, **kw)
        else:
            group.add_argument(f"--{f.name}", type={"int": int, "float": float, "str": str}[kind], **kw)
    return ap


def check_config(cfg: GRPOConfig, world: int = 1, given: set[str] | None = None, min_generations: int = 2) -> list:
    """Reject settings that cannot work, with a one-line message naming the flag (and the recipe that set it, for a
    flag not in ``given``) (``SystemExit``). Under ``--dry_run`` the checks of this machine (vLLM installed, a GPU
    present) are returned as notes of the plan, unless ``--gpu_memory_gb`` plans for another machine (then none).
    ``min_generations``: the smallest group the run's credit function is defined on (its ``min_generations``; GRPO's
    advantage needs two). A comparison's config (python -m comparisons) adds its own checks (``checks``: functions of
    ``cfg`` returning (failed, message) pairs), run with these."""
    rows = cfg.num_prompts_per_step // max(world, 1) * cfg.num_generations  # one process's rollout rows
    problems = [
        *[  # a GRPOConfig made in code skips the parser's choices: the same check, before anything loads
            (
                getattr(cfg, f.name) not in f.metadata["choices"],
                f"--{f.name} {getattr(cfg, f.name)!r}: one of {', '.join(map(str, f.metadata['choices']))}",
            )
            for f in dataclasses.fields(cfg)
            if "choices" in f.metadata
        ],
        (
            cfg.num_generations < min_generations,
            f"--num_generations must be >= {min_generations} with --credit {cfg.credit}"
            + (": a group of one gives every response advantage 0 (r − mean = 0)" if min_generations > 1 else ""),
        ),
        *[
            (getattr(cfg, n) < 1, f"--{n} must be >= 1")
            for n in ("num_prompts_per_step", "max_completion_length", "num_iterations", "num_mini_batches")
        ],
        (
            cfg.num_prompts_per_step % world,
            f"--num_prompts_per_step {cfg.num_prompts_per_step} must be a multiple "
            f"of the number of processes ({world}): each process takes whole groups",
        ),
        (
            cfg.num_mini_batches >= 1 and rows % cfg.num_mini_batches,
            "--num_mini_batches must divide "
            "num_prompts_per_step × num_generations" + (f" / {world} processes" if world > 1 else ""),
        ),
        *[
            (getattr(cfg, n) < 0, f"--{n} must be >= 0")
            for n in (
                "max_steps",
                "micro_batch_size",
                "save_steps",
                "max_prompt_length",
                "plan_processes",
                "eval_steps",
                "eval_num_generations",
                "logging_steps",
                "num_samples_to_log",
                "max_grad_norm",
                "weight_decay",
                "beta",
                "num_threads",
                "cscr_alpha",
            )
        ],
        (not 0 <= cfg.cscr_w_min <= 1, f"--cscr_w_min {cfg.cscr_w_min} must be in [0, 1]"),
        (
            cfg.cscr_threshold_quantile is not None and not 0 < cfg.cscr_threshold_quantile <= 1,
            f"--cscr_threshold_quantile {cfg.cscr_threshold_quantile} must be in (0, 1]",
        ),
        (
            not -float("inf") < cfg.cscr_threshold < float("inf") or not cfg.cscr_alpha < float("inf"),
            "--cscr_threshold (nats) and --cscr_alpha must be finite numbers",
        ),
        (
            cfg.overlong_buffer_len < 0 or 0 < cfg.max_completion_length <= cfg.overlong_buffer_len,
            f"--overlong_buffer_len {cfg.overlong_buffer_len} must be >= 0 and shorter than --max_completion_length "
            f"{cfg.max_completion_length} (verl asserts the same)",
        ),
        (cfg.gpu_memory_gb is not None and cfg.gpu_memory_gb <= 0, f"--gpu_memory_gb {cfg.gpu_memory_gb} must be > 0"),
        (cfg.overlong_penalty_factor < 0, f"--overlong_penalty_factor {cfg.overlong_penalty_factor} must be >= 0"),
        (cfg.grade_workers < 1, f"--grade_workers {cfg.grade_workers} must be >= 1"),
        (not cfg.grade_timeout > 0, f"--grade_timeout {cfg.grade_timeout} must be > 0 seconds"),
        (
            cfg.plan_processes not in (0, world) and not cfg.dry_run,
            f"--plan_processes {cfg.plan_processes} plans "
            f"a torchrun of that many: use it with --dry_run (this run has {world} process(es))",
        ),
        (not cfg.temperature > 0, f"--temperature {cfg.temperature} must be > 0"),
        (not 0 < cfg.top_p <= 1, f"--top_p {cfg.top_p} must be in (0, 1]"),
        (not _or(cfg.eval_temperature, 1) > 0, f"--eval_temperature {cfg.eval_temperature} must be > 0"),
        (not 0 < _or(cfg.eval_top_p, 1) <= 1, f"--eval_top_p {cfg.eval_top_p} must be in (0, 1]"),
        (cfg.learning_rate <= 0, f"--learning_rate must be > 0, got {cfg.learning_rate}"),
        (not 0 <= cfg.epsilon < 1, f"--epsilon {cfg.epsilon} must be in [0, 1)"),
        (cfg.epsilon_high < 0, f"--epsilon_high {cfg.epsilon_high} must be >= 0"),
        (cfg.dual_clip is not None and cfg.dual_clip <= 1, "--dual_clip must be > 1 (verl uses 3, DelTA 10)"),
        (
            cfg.delta_lam_min > cfg.delta_lam_max or cfg.delta_lam_min < 0 or cfg.delta_k < 0,
            "DelTA needs 0 <= --delta_lam_min <= --delta_lam_max and --delta_k >= 0",
        ),
        (
            cfg.use_peft
            and (
                cfg.lora_r < 1
                or cfg.lora_alpha <= 0
                or not 0 <= cfg.lora_dropout < 1
                or not cfg.lora_target_modules.strip(",").strip()
            ),
            "--use_peft needs --lora_r >= 1, --lora_alpha > 0, 0 <= --lora_dropout < 1 and --lora_target_modules",
        ),
        (
            cfg.cast_lm_head_to_fp32 and world > 1,
            "--cast_lm_head_to_fp32 runs in one process: FSDP2 (torchrun) "
            "shards the LM head with the embeddings and final norm, in one dtype",
        ),
        (
            cfg.cast_lm_head_to_fp32
            and cfg.use_peft
            and "lm_head" in [t.strip() for t in cfg.lora_target_modules.split(",")],
            "--cast_lm_head_to_fp32 with "
            "LoRA on lm_head (--lora_target_modules): the adapter would wrap the float32 head; leave lm_head out (TRL "
            "refuses it too)",
        ),
        (not 0 < _or(cfg.vllm_gpu_memory_utilization, 1) <= 1, "--vllm_gpu_memory_utilization must be in (0, 1]"),
        (cfg.vllm_kv_cache_dtype != "auto" and not cfg.use_vllm, "--vllm_kv_cache_dtype needs --use_vllm"),
        (
            cfg.vllm_importance_sampling_correction and not cfg.use_vllm,
            "--vllm_importance_sampling_correction needs "
            "--use_vllm: HF generate returns no sampler log-probs (its sampler is the trainer's own model)",
        ),
        (
            not 0
            <= _or(cfg.vllm_importance_sampling_clip_min, 0)
            < _or(cfg.vllm_importance_sampling_clip_max, math.inf),
            "--vllm_importance_sampling_clip_min must be >= 0 and below --vllm_importance_sampling_clip_max",
        ),
        (cfg.vllm_enable_sleep_mode and not cfg.use_vllm, "--vllm_enable_sleep_mode needs --use_vllm"),
        *cfg.checks(),  # a comparison's config adds its own (python -m comparisons)
    ]
    elsewhere = cfg.dry_run and cfg.gpu_memory_gb is not None  # a plan for another machine: none of this one's notes
    environment = (
        []
        if elsewhere
        else [  # this machine's: notes of the plan under --dry_run
            (
                cfg.vllm_enable_sleep_mode and not torch.cuda.is_available(),
                "--vllm_enable_sleep_mode needs a GPU (vLLM's CPU backend has no sleep mode)",
            ),
            (
                cfg.use_vllm and importlib.util.find_spec("vllm") is None,
                "--use_vllm needs vLLM, which this "
                "environment lacks: make a separate virtual environment with "
                "`pip install -r tools/requirements-vllm.txt` and "
                "then `pip uninstall -y torchvision torchaudio torchcodec` (docs/distributed.md)",
            ),
        ]
    )
    if cfg.credit == "cscr":  # the privileged note's template: a bad name stops here, not at step 1
        import cscr

        try:
            cscr.condition_notes(cfg.cscr_template)  # the template lookup build_condition_prompts makes
        except ValueError as e:
            problems.append((True, f"--cscr_template {cfg.cscr_template!r}: {e}"))
    for failed, message in problems + ([] if cfg.dry_run else environment):
        if failed:
            raise SystemExit(f"grpo.py: error: {name_the_recipe(message, cfg, given)}")
    return [message for failed, message in environment if failed]


def _or(value, default):  # an optional flag's value, else its default
    return default if value is None else value

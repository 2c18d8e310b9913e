"""The built-in toy: a verifiable arithmetic task and a tiny Qwen3 "base model" (toy/model/), no download needed.

Imported by the entry points alone (grpo.py, evaluate.py, the tools) and the tests, each of which calls
``toy.register()`` (or ``register_data``, the data alone) once before it runs (``register``, below); the generic
code (trainer/, rollout.py) names no toy.

Why a toy? So the whole RLVR pipeline (sample -> verify -> advantage -> credit -> clipped surrogate) runs on a
2-core CPU in minutes, through exactly the code paths a real model uses:

* Problems are short multi-step arithmetic, e.g. ``Compute 37+48-12.``, with an integer answer, in the same
  jsonl schema as ``data/`` (``{id, problem, answer, source}``), generated deterministically from a
  seed, with disjoint train and held-out (``test``) splits.
* A correct response is a short worked solution ending in ``\\boxed{N}``::

      37+48=85. 85-12=73. \\boxed{73}

  so the toy is graded by the same ``verify.py`` as real math.
* The model is a real ``transformers`` ``Qwen3ForCausalLM`` (813,440 parameters, 0.8M) with a character-level
  tokenizer built with the ``tokenizers`` library and wrapped as ``PreTrainedTokenizerFast``.
* A short supervised warm-up on worked solutions *with injected mistakes* (an intermediate result off by a
  few units, carried through to the box) turns it into a "base model" that is right only part of the time
  when sampling at temperature 1.0, so RL has signal to learn from: it must learn to put its probability on
  the correct digits.
* The warmed-up model ships in the repository, in ``toy/model/`` (its ``save_pretrained`` folder: safetensors,
  config, tokenizer, ``toy_info.json``, 3.2 MB), so ``--model toy`` loads it at once with the ordinary
  ``from_pretrained`` path, exactly as a hub id or a local folder is loaded. The recipe that made it is
  ``build_toy_model`` (seed 0, ``WARMUP``, ``MODEL``, one thread; about 7 minutes on one CPU core); a clone without
  ``toy/model/`` builds it once into ``$RLVR_TOY_CACHE`` or ``~/.cache/rlvr-credit/``. Which folder is the toy
  model is decided here only, by ``model_folder``.
* The truth of any sampled response is computable (``response_truth``): its first wrong token (where it is no
  longer a prefix of any correct solution the grammar allows, ``correct_solutions``), the shared prefix before it,
  its result digits. trainer/samples_summary.py measures the token credit against it ("Where the credit lands", in
  samples/summary.json and report.py's page).

Command line: ``python -m toy`` prints the folder ``--model toy`` loads (building it if needed);
``python -m toy --write_data DIR`` writes the two splits as jsonl.

``register`` (and ``register_data``, the data alone, without torch) adds the toy to the generic modules, which name
no toy: ``--model toy`` (policy.py), ``--data toy`` / ``--benchmarks toy`` (problems.py), the ``auto`` prompt template
and recipe (rollout.py, recipes.py), the truth of a logged response (samples_summary.py). Each entry point
(grpo.py, evaluate.py, the tools) calls it once; importing this file loads no torch and no other project file.

Left out on purpose: any other toy task or size, and the check that a rebuild still scores like the shipped model,
which loads and evaluates both: ``tools/bench/toy_rebuild.py``, read next; ``compare_weights`` is its first step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

TOY_VERSION = "v2"  # bump when the task, tokenizer, model or warm-up changes (and rebuild toy/model/)
SHIPPED = Path(__file__).resolve().parent / "model"  # the warmed-up model, built by build_toy_model
SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
# The tokenizer is character level over printable ASCII and newline, so any English text (e.g. CSCR's
# privileged verdict notes) tokenizes without <unk>.
CHARS = [chr(i) for i in range(32, 127)] + ["\n"]

# The task: 1-3 operations (+ or -) on operands in this range, intermediate results kept non-negative.
TASK = dict(num_ops=(1, 2), operand_range=(1, 9))
# Warm-up settings. The mistake rate sets the base model's sampled accuracy (issue target: 20-60%).
WARMUP = dict(steps=1500, batch_size=32, learning_rate=5e-3, mistake_prob=0.2, shortcut_prob=0.3, seed=0)
MODEL = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=128,
)


# ----------------------------------------------------------------------------------------------------------
# The task
# ----------------------------------------------------------------------------------------------------------
def _make_problem(rng: random.Random) -> tuple[str, list[tuple[int, str, int, int]], int]:
    """One problem: ``a op b op c ...`` (``TASK`` sets the size) with non-negative intermediate results.

    Returns (problem text, steps [(left, op, right, result)], answer).
    """
    n_ops = rng.choice(TASK["num_ops"])
    value = rng.randint(*TASK["operand_range"])
    expr, steps = str(value), []
    for _ in range(n_ops):
        operand = rng.randint(*TASK["operand_range"])
        op = "+" if value < operand or rng.random() < 0.5 else "-"
        result = value + operand if op == "+" else value - operand
        steps.append((value, op, operand, result))
        expr += f"{op}{operand}"
        value = result
    return f"Compute {expr}.", steps, value


def make_split(split: str, n: int | None = None, seed: int = 0) -> list[dict]:
    """The toy problems of one split as ``{id, problem, answer, source}`` rows.

    Args:
        split: ``"train"`` (5000 problems by default) or ``"test"`` (200 held-out problems by default).
        n: number of problems (default by split).
        seed: base seed; the same seed always gives the same problems.
    Raises:
        ValueError: unknown split.
    The splits are disjoint: held-out problem texts are removed from the training split.
    """
    if split not in ("train", "test"):
        raise ValueError(f"toy split must be 'train' or 'test', got {split!r}")
    test_rng = random.Random(f"toy-test-{seed}")
    test, seen = [], set()
    while len(test) < (n if split == "test" and n else 200):
        problem, _, answer = _make_problem(test_rng)
        if problem not in seen:
            seen.add(problem)
            test.append({"id": f"toy-test-{len(test)}", "problem": problem, "answer": str(answer), "source": "toy"})
    if split == "test":
        return test
    rng, rows = random.Random(f"toy-train-{seed}"), []
    while len(rows) < (n or 5000):
        problem, _, answer = _make_problem(rng)
        if problem not in seen:  # keep held-out problems out of training
            rows.append({"id": f"toy-train-{len(rows)}", "problem": problem, "answer": str(answer), "source": "toy"})
    return rows


def load_split(split: str) -> list[dict]:
    """``make_split(split)`` with the default size and seed (what ``--data toy`` and ``--benchmarks toy`` use)."""
    return make_split(split)


def worked_solution(
    steps: list[tuple[int, str, int, int]],
    rng: random.Random | None = None,
    mistake_prob: float = 0.0,
    shortcut_prob: float = 0.0,
) -> str:
    """The worked solution text, e.g. ``37+48=85. 85-12=73. \\boxed{73}``.

    With ``mistake_prob > 0`` each step's result is, with that probability, off by 1-10 and the wrong value
    is carried into the next step and the box: a plausible-looking but wrong solution.
    With ``shortcut_prob > 0`` the solution is, with that probability, a bare guess ``\\boxed{N}`` without the
    worked steps, right only one time in five: the base model learns a "guess" habit that RL can unlearn
    (showing the work is what earns reward), besides sharpening its arithmetic.
    """
    if rng is not None and rng.random() < shortcut_prob:
        answer = steps[-1][3]
        guess = answer if rng.random() < 0.2 else answer + rng.choice([-1, 1]) * rng.randint(1, 10)
        return f"\\boxed{{{guess}}}"
    parts, carried = [], None
    for left, op, right, result in steps:
        left = carried if carried is not None else left
        result = left + right if op == "+" else left - right
        if rng is not None and rng.random() < mistake_prob:
            result += rng.choice([-1, 1]) * rng.randint(1, 10)
        parts.append(f"{left}{op}{right}={result}.")
        carried = result
    return " ".join(parts) + f" \\boxed{{{carried}}}"


# ----------------------------------------------------------------------------------------------------------
# The truth of a response: its first wrong token, the shared prefix before it, its result digits
# ----------------------------------------------------------------------------------------------------------
# What report.py's "Where the credit lands" measures the credit against. Pure functions of the problem text and the
# response's tokens as samples/ logs them (each token decoded on its own, EOS as "</s>"); no model, no I/O.
_PROBLEM = re.compile(r"Compute (\d+(?:[+-]\d+)+)\.")
_EOS_CHAR = "\x00"  # stands for the EOS token in the texts compared below (no toy token decodes to it)


class Truth(NamedTuple):
    """What a correct solver would have written, token by token (``response_truth``).

    first_wrong: index of the first token no correct solution writes at that place (None: there is none).
    shared_prefix: indices of the tokens before it (every token when first_wrong is None).
    result_digits: indices of the digit tokens of the results: after each ``=`` and inside each ``\\boxed{...}``.
    """

    first_wrong: int | None
    shared_prefix: list[int]
    result_digits: list[int]


def parse_problem(problem: str) -> tuple[int, list[tuple[str, int]]]:
    """The first operand and the operations ``[(op, operand)]`` of a toy problem: ``Compute 37+48-12.`` gives
    ``(37, [("+", 48), ("-", 12)])``. The last such phrase in ``problem`` counts (a prompt around it is fine).
    Raises ValueError: the text holds no toy problem."""
    found = _PROBLEM.findall(problem)
    if not found:
        raise ValueError(f"not a toy problem ('Compute a+b-c.'): {problem[:60]!r}")
    terms = re.findall(r"[+-]?\d+", found[-1])
    return int(terms[0]), [(t[0], int(t[1:])) for t in terms[1:]]


def correct_solutions(problem: str) -> list[str]:
    """Every response the toy's grammar counts as a correct solution of ``problem`` (without the EOS token).

    The grammar: zero or more *equations*, then the box of the answer, joined by single spaces. Each equation takes
    the running value (at first the problem's first operand) through one or more of the next operations, in the
    problem's order, and writes the new value: ``37+48=85.``, or with steps skipped (merged) ``37+48-12=73.``; the
    equations cover a first part of the operations (all of them, some, or none: the bare ``\\boxed{73}`` of the
    warm-up's shortcut). So ``Compute 37+48-12.`` has four: ``\\boxed{73}``, ``37+48=85. \\boxed{73}``,
    ``37+48=85. 85-12=73. \\boxed{73}`` and ``37+48-12=73. \\boxed{73}``; with n operations, 2**n.
    Why this set: it is what the warm-up teaches (``worked_solution``: every step, or the bare box) widened to every
    text that states nothing false in that format and whose box verify.py grades correct. A response that skips
    or stops writing steps is not blamed for it (the reward does not punish it); a wrong value or a departure from
    the format is.
    """
    first, ops = parse_problem(problem)
    values = [first]
    for op, x in ops:
        values.append(values[-1] + x if op == "+" else values[-1] - x)
    box, out = f"\\boxed{{{values[-1]}}}", []

    def extend(start: int, written: list[str]) -> None:  # the equations so far cover ops[:start]
        out.append(" ".join(written + [box]))
        for end in range(start + 1, len(ops) + 1):
            lhs = str(values[start]) + "".join(f"{op}{x}" for op, x in ops[start:end])
            extend(end, written + [f"{lhs}={values[end]}."])

    extend(0, [])
    return out


def _spans(tokens: list[str], eos: str) -> tuple[str, list[int]]:
    """The response as one text (EOS as ``_EOS_CHAR``) and the end offset of each token in it."""
    ends, text = [], ""
    for tok in tokens:
        text += _EOS_CHAR if tok == eos else tok
        ends.append(len(text))
    return text, ends


def first_wrong_token(problem: str, tokens: list[str], eos: str = SPECIAL_TOKENS["eos_token"]) -> int | None:
    """The index of the first wrong token of a response to a toy problem, or None.

    A token is *wrong* when the response up to and including it is a prefix of no correct solution
    (``correct_solutions``, each followed by the EOS token): the first place where no correct solver could go on
    as this response does. Every token before it is shared with some correct solution. So:
    ``37+48=85. 85-12=72. \\boxed{72}`` -> the ``2`` of ``72`` (a ``3`` was due); ``\\boxed{70}`` -> its ``0``;
    ``37+48=85. 85-12=73.`` followed by EOS -> the EOS (a space and the box were due); a correct solution with text
    after its box -> the first extra character (verify.py may still grade it correct: the report takes correctness
    from the reward, not from this). None: the response is a correct solution, or a prefix of one (a truncated
    response that ran out of tokens before writing anything wrong).
    Multi-character tokens are handled: the wrong token is the one holding the first wrong character.
    """
    text, ends = _spans(tokens, eos)
    shared = max(len(os.path.commonprefix([text, s + _EOS_CHAR])) for s in correct_solutions(problem))
    if shared == len(text):
        return None
    return next(i for i, end in enumerate(ends) if end > shared)


def result_digits(tokens: list[str], eos: str = SPECIAL_TOKENS["eos_token"]) -> list[int]:
    """The indices of the tokens holding a result's digits: the run of digits right after each ``=`` (spaces
    allowed between) and the digits inside each ``\\boxed{...}`` (to its closing brace or the response's end).
    Syntactic: the same for a correct or an incorrect response (the report uses them for correct ones)."""
    text, ends = _spans(tokens, eos)
    chars = set()
    for m in re.finditer(r"=\s*(\d+)", text):
        chars.update(range(m.start(1), m.end(1)))
    for m in re.finditer(r"\\boxed\{([^}]*)", text):
        chars.update(m.start(1) + k for k, ch in enumerate(m.group(1)) if ch.isdigit())
    out, start = [], 0
    for i, end in enumerate(ends):
        if any(start <= c < end for c in chars):
            out.append(i)
        start = end
    return out


def response_truth(problem: str, tokens: list[str], eos: str = SPECIAL_TOKENS["eos_token"]) -> Truth:
    """``first_wrong_token``, the shared prefix before it and ``result_digits`` of one response (see those)."""
    wrong = first_wrong_token(problem, tokens, eos)
    return Truth(wrong, list(range(len(tokens) if wrong is None else wrong)), result_digits(tokens, eos))


# ----------------------------------------------------------------------------------------------------------
# Tokenizer and model
# ----------------------------------------------------------------------------------------------------------
def build_tokenizer():
    """A character-level ``PreTrainedTokenizerFast`` (one token per character, BOS prepended, pad/eos/bos/unk)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = list(SPECIAL_TOKENS.values())
    vocab = {tok: i for i, tok in enumerate(specials + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every char is a token
    tok.decoder = decoders.Fuse()  # join characters back without spaces
    bos = SPECIAL_TOKENS["bos_token"]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, padding_side="left", **SPECIAL_TOKENS)


def build_model(tokenizer, seed: int = 0, **overrides):
    """A randomly initialised float32 ``Qwen3ForCausalLM`` sized for the toy (813,440 parameters)."""
    import torch  # here, not at the top: report.py reads the truth functions without loading torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        **{**MODEL, **overrides},
    )
    return Qwen3ForCausalLM(config).float()


def warm_up(
    model,
    tokenizer,
    steps: int,
    batch_size: int,
    learning_rate: float,
    mistake_prob: float,
    shortcut_prob: float = 0.0,
    seed: int = 0,
    log_every: int = 100,
) -> list[float]:
    """Supervised warm-up on worked solutions with injected mistakes and guesses (see ``worked_solution``);
    returns the loss every ``log_every`` steps.

    The loss is the token-mean cross-entropy (nats) over response tokens (solution + EOS), prompts masked out.
    """
    import torch
    from tqdm import trange

    rng = random.Random(f"toy-warmup-{seed}")
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / steps))
    held_out = {row["problem"] for row in make_split("test")}
    model.train()
    losses = []
    bar = trange(steps, desc="toy warm-up", leave=False, mininterval=2.0)
    for step in bar:
        ids, labels = [], []
        while len(ids) < batch_size:
            problem, chain, _ = _make_problem(rng)
            if problem in held_out:
                continue
            p = tokenizer(problem + "\n")["input_ids"]
            r = tokenizer(worked_solution(chain, rng, mistake_prob, shortcut_prob), add_special_tokens=False)[
                "input_ids"
            ]
            r = r + [tokenizer.eos_token_id]
            ids.append(p + r)
            labels.append([-100] * len(p) + r)
        width = max(map(len, ids))
        input_ids = torch.tensor([x + [tokenizer.pad_token_id] * (width - len(x)) for x in ids])
        label_ids = torch.tensor([x + [-100] * (width - len(x)) for x in labels])
        attn = (label_ids != -100) | (torch.arange(width)[None] < torch.tensor([len(x) for x in ids])[:, None])
        loss = model(input_ids=input_ids, attention_mask=attn.long(), labels=label_ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % log_every == 0 or step == steps - 1:
            losses.append(loss.item())
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return losses


def cache_dir(root: str | os.PathLike | None = None) -> Path:
    """Where a built toy model is cached: ``<root>/toy-<version>``, ``root`` by default ``$RLVR_TOY_CACHE``, else
    ``$XDG_CACHE_HOME/rlvr-credit`` (``~/.cache/rlvr-credit``). The folder need not exist."""
    root = (
        root
        or os.environ.get("RLVR_TOY_CACHE")
        or os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "rlvr-credit")
    )
    return Path(root) / f"toy-{TOY_VERSION}"


def model_folder() -> Path:
    """The folder ``--model toy`` loads, without building anything: the shipped ``toy/model/`` when it holds a model,
    else ``cache_dir()`` (which may not hold one yet: ``ensure_toy_model`` builds it there)."""
    return SHIPPED if (SHIPPED / "config.json").exists() else cache_dir()


def is_toy_model(model: str) -> bool:
    """Whether ``--model`` names the toy: ``"toy"``, a folder holding the toy's ``toy_info.json``, or a trained run's
    folder (``final/``, ``checkpoint-<step>/``) whose ``run_info.json`` names the toy as its base model. What the
    prompt template's ``auto`` (rollout.py) and the recipe's ``auto`` (recipes.py) decide by; no file is loaded but
    these two small JSON files."""
    if model == "toy":
        return True
    folder = Path(os.path.expanduser(model))
    if (folder / "toy_info.json").is_file():
        return True
    info = folder / "run_info.json"
    if not info.is_file():
        return False
    base = json.loads(info.read_text()).get("base_model")
    return bool(base) and base != model and is_toy_model(base)


def build_toy_model(path: str | os.PathLike, warmup_steps: int | None = None, seed: int = 0) -> str:
    """Build, warm up and ``save_pretrained`` the toy model and tokenizer into ``path``; returns the path.

    ``warmup_steps=0`` saves the randomly initialised model (tests use it: fast, same loading path).
    The build runs on one torch thread (restored after): the toy's matmuls are tiny, a second thread gains little on
    an idle 2-core machine but slows the warm-up several-fold when anything else is running, and one thread is what
    the shipped model was built on. The folder is written to a temporary sibling first and renamed into place, so a
    killed build never leaves a half-written model behind.
    """
    import torch

    path = Path(path)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=seed)
    steps = WARMUP["steps"] if warmup_steps is None else warmup_steps
    if steps > 0:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            warm_up(
                model,
                tokenizer,
                steps=steps,
                batch_size=WARMUP["batch_size"],
                learning_rate=WARMUP["learning_rate"],
                mistake_prob=WARMUP["mistake_prob"],
                shortcut_prob=WARMUP["shortcut_prob"],
                seed=seed,
            )
        finally:
            torch.set_num_threads(threads)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".tmp-", dir=path.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "toy_info.json").write_text(
        json.dumps(
            {"version": TOY_VERSION, "warmup_steps": steps, "seed": seed, "warmup": WARMUP, "model": MODEL}, indent=1
        )
    )
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)
    return str(path)


def ensure_toy_model(force: bool = False) -> str:
    """The folder ``--model toy`` loads (``model_folder``): the shipped ``toy/model/``; in a clone without it (or with
    ``force``), the cached build of the same recipe, built once (about seven minutes on a CPU core)."""
    path = cache_dir() if force else model_folder()
    if path == SHIPPED:
        return str(path)
    if force or not (path / "config.json").exists():
        t0 = time.time()
        print(f"[toy] building the toy base model in {path} (supervised warm-up, once) ...", flush=True)
        build_toy_model(path)
        print(f"[toy] done in {time.time() - t0:.0f}s", flush=True)
    return str(path)


def compare_weights(built: str | os.PathLike, shipped: str | os.PathLike = SHIPPED) -> dict:
    """How a built toy model's weights compare with the shipped ones: ``identical`` (every tensor bit-equal) and the
    largest absolute difference ``max_abs_weight_diff``.

    Raises:
        ValueError: the two ``model.safetensors`` hold different tensor names (one line, the first few named).
    """
    import torch
    from safetensors.torch import load_file

    a, b = load_file(Path(built) / "model.safetensors"), load_file(Path(shipped) / "model.safetensors")
    if a.keys() != b.keys():
        raise ValueError(f"{built} and {shipped} hold different tensors: {sorted(a.keys() ^ b.keys())[:3]}")
    return {
        "identical": all(torch.equal(a[k], b[k]) for k in a),
        "max_abs_weight_diff": max((a[k].float() - b[k].float()).abs().max().item() for k in a),
    }


# ----------------------------------------------------------------------------------------------------------
# What the toy adds to the generic modules: each entry point (grpo.py, evaluate.py, the tools) calls ``register``
# ----------------------------------------------------------------------------------------------------------
def logged_truth(prompt: str, tokens: list[str]) -> dict | None:
    """A logged response's truth (``response_truth``) from a samples/ row's prompt and tokens, as samples_summary.py
    reads it (``register_data``): ``{"first_wrong": index | None, "result_digits": [indices]}``; None: the prompt
    holds no toy problem."""
    try:
        truth = response_truth(prompt, tokens)
    except ValueError:
        return None
    return {"first_wrong": truth.first_wrong, "result_digits": truth.result_digits}


def _auto_template(model: str, data: str | None):
    """rollout's ``--prompt_template auto`` for the toy: it was trained on bare "Compute ..." prompts, so a chat
    template is noise to it (``none``); None for any other model."""
    if not is_toy_model(model):
        return None
    return "none", "the toy" if data in (
        None,
        "toy",
    ) else f"the toy model reads bare prompts, so --data {data} is asked without a template"


def _auto_recipe(model: str) -> str | None:
    """recipes' ``--recipe auto`` for the toy model: ``toy`` (GRPOConfig's defaults)."""
    return "toy" if is_toy_model(model) else None


def _check_recipe(name: str, cfg) -> str | None:
    """The paper's recipe on the toy's 20-token task is a mistake: one line, or None."""
    if name == "toy" or cfg.data != "toy":
        return None
    from trainer import recipes

    table = recipes.RECIPES[name]
    return (
        f"--data toy under --recipe {name}: the paper's settings (e.g. {table['max_completion_length']}-token "
        f"responses, lr {table['learning_rate']:g}) do not suit the toy's 20-token task; pass --recipe toy to "
        f"train this model on the toy task"
    )


def register_data() -> None:
    """``--data toy`` / ``--benchmarks toy``: the toy task's splits in problems.py, and the truth of a logged response
    of a toy run in samples_summary.py (``logged_truth``: samples/summary.json, report.py's page); loads no torch."""
    from trainer import problems, samples_summary

    problems.register_source("toy", load_split)
    samples_summary.register_truth("toy", logged_truth)


def register() -> None:
    """The toy in every generic module, once per process (again is harmless): ``--model toy`` (policy.py: the
    folder ``ensure_toy_model`` returns), its data and the truth of its logged responses (``register_data``), its
    prompt template and recipe for ``auto`` (rollout.py, recipes.py)."""
    import rollout
    from trainer import policy, recipes

    register_data()
    policy.register_model("toy", ensure_toy_model)
    rollout.register_auto_template(_auto_template)
    recipes.register(auto=_auto_recipe, check=_check_recipe)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m toy", description=__doc__.split("\n")[0])
    ap.add_argument("--write_data", metavar="DIR", help="write toy_train.jsonl and toy_test.jsonl to DIR")
    args = ap.parse_args(argv)
    if args.write_data:
        out = Path(args.write_data)
        out.mkdir(parents=True, exist_ok=True)
        for split in ("train", "test"):
            with open(out / f"toy_{split}.jsonl", "w") as f:
                f.writelines(json.dumps(row) + "\n" for row in make_split(split))
        print(f"wrote {out}/toy_train.jsonl and {out}/toy_test.jsonl")
        return 0
    print(ensure_toy_model())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

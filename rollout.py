"""Rollouts: which prompts (``PromptSampler``; ``filter_overlong_prompts`` leaves out those over
``--max_prompt_length`` tokens), their templates, and sampling G responses per prompt.

``generate`` samples with Hugging Face ``model.generate`` and returns a ``RolloutBatch``: token ids laid out as
``[left-padded prompt | right-padded response]``, the response mask (which **includes** the EOS token, so the model
is trained to stop; tiny-grpo's pad==eos bug dropped it), each response's finish reason and text. Rows are ordered
group by group: rows ``g*G ... g*G+G-1`` are the G samples of prompt ``g``. ``sample``, a training step's rollout,
calls it, or with ``--use_vllm`` the sampler of trainer/vllm_engine.py (the same ``RolloutBatch``, ``build_rollout``).

Both sample softmax(logits / T) cut to the top-p nucleus (``SamplingSettings``), every setting stated, never the
checkpoint's ``generation_config.json`` (its ``repetition_penalty``, ``top_k`` or ``min_p`` would make every update
off-policy). The trainer scores softmax(logits / T) uncut, recomputing the old log-probs: the sampled distribution at
``--top_p 1`` (the default); below it the update is off-policy on the cut tokens, as TRL's and verl's (a run says so).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from dataclasses import dataclass
from typing import NamedTuple

import torch

# The prompt templates (anchors §C5; grpo_config.py): each gives a problem's text, the special tokens that end a
# response besides EOS, and the stop *strings* (a base model runs on into an invented question: bug case C28).
from trainer.grpo_config import PROMPT_TEMPLATES, QWEN_MATH_SYSTEM  # noqa: F401


class PromptSampler:
    """Walks the training set in a seeded random order, epoch after epoch; ``position`` is all a checkpoint keeps."""

    def __init__(self, n: int, seed: int):
        self.n = n
        self.seed = seed
        self.position = 0
        self._orders = {}

    def take(self, k: int) -> list[int]:
        out = []
        for epoch, i in (divmod(p, self.n) for p in range(self.position, self.position + k)):
            if epoch not in self._orders:  # each epoch's order comes from (seed, epoch) alone
                self._orders = {epoch: list(range(self.n))}
                random.Random(self.seed * 1_000_003 + epoch).shuffle(self._orders[epoch])
            out.append(self._orders[epoch][i])
        self.position += k
        return out


# Rules an entry point adds for ``--prompt_template auto`` (``register_auto_template``): ``rule(model, data)`` gives
# ``(template, why)`` for a model it knows, else None (``toy.register``: the toy reads bare prompts, ``none``).
AUTO_TEMPLATES: list = []


def register_auto_template(rule) -> None:
    """Add ``rule(model_name, data) -> (template, why) | None`` to ``AUTO_TEMPLATES`` (once)."""
    if rule not in AUTO_TEMPLATES:
        AUTO_TEMPLATES.append(rule)


def resolve_template(template: str, model_name: str, say=None, data: str | None = None) -> str:
    """The prompt template to use. ``"auto"``: the one a trained model folder names in its ``run_info.json``
    (grpo.py writes it into ``final/`` and every checkpoint), the first answer of a rule of ``AUTO_TEMPLATES`` (the
    toy's: ``"none"``), ``"qwen_math"`` for any other model; other names pass through. ``say``: a print function
    that is told the template and why (``data``: the training data's name, which a rule may name in its why).
    ValueError for an unknown template name.
    """
    why = "--prompt_template"
    if template == "auto":
        template, why = _auto_template(model_name, data)
    if template not in PROMPT_TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; choose from {sorted(PROMPT_TEMPLATES)} or auto")
    if say:
        say(f"[template] {template} ({why})")
    return template


def _auto_template(model_name: str, data: str | None) -> tuple[str, str]:
    """``--prompt_template auto``'s (template, why): see ``resolve_template``."""
    folder = os.path.expanduser(model_name) if os.path.isdir(os.path.expanduser(model_name)) else ""
    info = os.path.join(folder, "run_info.json")
    if folder and os.path.isfile(info):
        with open(info) as f:
            return json.load(f)["prompt_template"], f"auto: the template it was trained with, {info}"
    if rule := next((hit for r in AUTO_TEMPLATES if (hit := r(model_name, data))), None):  # e.g. the toy's
        return rule[0], f"auto: {rule[1]}"
    return "qwen_math", "auto: a real model"


def apply_template(problem: str, template: str) -> str:
    """The prompt text for ``problem`` under ``template`` (a key of ``PROMPT_TEMPLATES``; ValueError for another)."""
    if template not in PROMPT_TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; choose from {sorted(PROMPT_TEMPLATES)}")
    return PROMPT_TEMPLATES[template][0].replace("{problem}", problem)


class PromptFilter(NamedTuple):
    """filter_overlong_prompts' result: the rows fitting (in order), how many were left out, the longest's tokens."""

    rows: list[dict]
    dropped: int
    longest: int


def filter_overlong_prompts(
    rows: list[dict], tokenizer, template: str, max_prompt_length: int, batch_size: int = 1024
) -> PromptFilter:
    """Leave out the ``{problem, ...}`` rows whose prompt is longer than ``max_prompt_length`` tokens (0 keeps every
    row; verl's ``data.filter_overlong_prompts`` keeps ``len(tokens) <= data.max_prompt_length``; the DelTA recipe:
    2,048). Pure: ``rows`` is not changed. ``template``: a resolved key of ``PROMPT_TEMPLATES``.

    The prompt is ``apply_template(row["problem"], template)`` tokenised as the rollout tokenises it
    (``encode_prompts``: special tokens added as the tokenizer adds them, e.g. a BOS), ``batch_size`` prompts per
    tokenizer call. Every row is tokenised, also with no filter, so that ``longest`` is always known.
    Returns:
        ``PromptFilter(rows, dropped, longest)``: the fitting rows in their order, the number left out, and the token
        count of the longest fitting prompt (0 for no rows).
    Raises:
        ValueError: ``max_prompt_length`` < 0, an unknown template, or every row left out (naming the shortest).
    """
    if max_prompt_length < 0:
        raise ValueError(f"--max_prompt_length must be >= 0 (0 = no limit), got {max_prompt_length}")
    fitting = []
    longest = 0
    shortest = None
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        prompts = [apply_template(row["problem"], template) for row in chunk]
        for row, ids in zip(chunk, tokenizer(prompts, return_attention_mask=False)["input_ids"]):
            shortest = len(ids) if shortest is None else min(shortest, len(ids))
            if max_prompt_length and len(ids) > max_prompt_length:
                continue
            fitting.append(row)
            longest = max(longest, len(ids))
    if rows and not fitting:
        raise ValueError(
            f"--max_prompt_length {max_prompt_length}: all {len(rows)} prompts are longer (the shortest "
            f"has {shortest} tokens under the template {template!r})"
        )
    return PromptFilter(fitting, len(rows) - len(fitting), longest)


def template_stop_strings(template: str) -> list[str]:
    """The stop strings of ``template`` (text after the first one is cut from the response, see ``generate``)."""
    return list(PROMPT_TEMPLATES.get(template, ("", [], []))[2])


def cut_at_stop_strings(
    response_ids: torch.Tensor, response_mask: torch.Tensor, texts: list[str], tokenizer, stop_strings: list[str]
) -> list[bool]:
    """Cut each response after the first stop string it contains (bug case C28), in place.

    The mask is shortened to the fewest tokens whose decoded text contains the stop string (found by bisection),
    the text is cut right after it. Returns, per row, whether a stop string was found.
    """
    found = []
    for i, text in enumerate(texts):
        ends = [text.find(s) + len(s) for s in stop_strings if s and s in text]
        if not ends:
            found.append(False)
            continue
        cut = min(ends)
        ids = response_ids[i][response_mask[i].bool()].tolist()
        lo, hi = 1, len(ids)  # smallest k with len(decode(ids[:k])) >= cut
        while lo < hi:
            mid = (lo + hi) // 2
            if len(tokenizer.decode(ids[:mid], skip_special_tokens=True)) >= cut:
                hi = mid
            else:
                lo = mid + 1
        response_mask[i, lo:] = 0
        texts[i] = text[:cut]
        found.append(True)
    return found


def stop_token_ids(tokenizer, template: str = "none", model=None) -> list[int]:
    """Every token id that ends a response: the tokenizer's EOS, the model's ``generation_config.eos_token_id``
    (base models often list a second EOS there; bug case C26) and the template's stop tokens that exist."""
    ids = []
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for eos in (tokenizer.eos_token_id, gen_eos):
        ids += list(eos) if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else [])
    for text in PROMPT_TEMPLATES.get(template, ("", [], []))[1]:
        tid = tokenizer.convert_tokens_to_ids(text)
        if tid is not None and tid != tokenizer.unk_token_id:
            ids.append(tid)
    if not ids:
        raise ValueError("the tokenizer has no eos_token_id and the template names no stop token")
    return sorted(set(ids))


@dataclass
class RolloutBatch:
    """Sampled responses laid out for the trainer (N = num prompts × G rows, ordered group by group).

    Shapes: ``input_ids``/``attention_mask`` ``[N, P + T]`` (prompt left-padded to P, response right-padded to T);
    ``response_ids``/``response_mask`` ``[N, T]``, the mask 1 on generated tokens up to and including the first stop
    token, 0 on padding."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    prompt_length: int
    finish_reasons: list[str]  # "stop" (ended with a stop token) or "length" (hit max_new_tokens)
    texts: list[str]  # decoded responses, special tokens removed
    prompts: list[str]  # the prompt text of each row
    num_generations: int
    # vLLM's processed log-probs of the sampled tokens [N, T] float32, 0 on padding (N·T·4 bytes: 8.4 MB per process
    # of 256 × 20,480 at the papers' scale); None unless the engine returns them (--vllm_importance_sampling_correction)
    sampler_logprobs: torch.Tensor | None = None

    @property
    def response_lengths(self) -> torch.Tensor:
        """Tokens per response, EOS included: ``[N]`` long."""
        return self.response_mask.sum(-1).long()


def response_mask_from_ids(response_ids: torch.Tensor, stop_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask up to and including the first stop token of each row, and whether a stop token was found: (mask
    ``[N, T]`` float, stopped ``[N]`` bool). Works when the pad token equals EOS (common for base models): only the
    *first* stop token counts."""
    is_stop = torch.isin(response_ids, torch.tensor(stop_ids, device=response_ids.device))
    stopped = is_stop.any(-1)
    no_stop = torch.full_like(stopped, response_ids.shape[1], dtype=torch.long)
    first = torch.where(stopped, is_stop.float().argmax(-1), no_stop)  # the first stop token's index, or T if none
    positions = torch.arange(response_ids.shape[1], device=response_ids.device)[None]
    return (positions <= first[:, None]).float(), stopped


def sampling_config(max_new_tokens: int, temperature: float, top_p: float, stop_ids: list[int], pad_id: int):
    """The ``transformers.GenerationConfig`` every HF rollout and evaluation samples with, built from scratch.

    It states the whole distribution: softmax(logits / T) cut to the top-``top_p`` nucleus (``temperature == 0``:
    greedy); the trainer scores it uncut at the same T (``grpo.token_outputs``): the same distribution at top_p 1. Every
    other field that changes it is neutral: no repetition, n-gram or length penalty, no min-p / typical / epsilon / eta
    / top-h / top-k truncation, no banned, suppressed, biased or forced token, no minimum length (it would forbid EOS),
    no beam search, watermark or classifier-free guidance; unset (None) fields are off, as ``generate`` runs with this
    config alone (``generation_config_set_aside``). A response ends on ``stop_ids`` or after ``max_new_tokens`` tokens,
    only.
    """
    from transformers import GenerationConfig

    sample = temperature > 0
    # sampling-only fields are given only when sampling: transformers warns about them under greedy decoding
    truncation = dict(temperature=temperature, top_p=top_p, top_k=0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0)
    search = dict(do_sample=sample, num_beams=1, num_return_sequences=1, use_cache=True)
    # no min_new_tokens (None, not 0): transformers turns 0 into min_length = the prompt's length and adds a
    # MinLengthLogitsProcessor that never masks but copies the [B, V] logits at every token
    neutral = dict(repetition_penalty=1.0, no_repeat_ngram_size=0, renormalize_logits=False)
    ends = dict(max_new_tokens=max_new_tokens, eos_token_id=list(stop_ids), pad_token_id=pad_id)
    return GenerationConfig(**search, **(truncation if sample else {}), **neutral, remove_invalid_values=False, **ends)


@contextlib.contextmanager
def generation_config_set_aside(model, config):
    """Make ``config`` the model's ``generation_config`` for the duration of the block, then put the checkpoint's back.
    ``generate(generation_config=config)`` alone is not enough: transformers fills every field it leaves None (and
    adds any custom entry) from ``model.generation_config``, the checkpoint's, so a shipped ``min_p``,
    ``bad_words_ids``, ``suppress_tokens``, ``forced_eos_token_id``... would still apply. A PEFT model's
    ``generate`` reads the base model's config."""
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    saved = target.generation_config
    target.generation_config = config
    try:
        yield
    finally:
        target.generation_config = saved


class SamplingSettings(NamedTuple):
    """What a rollout draws: up to ``max_new_tokens`` tokens per response (finish reason ``length`` there) from
    softmax(logits / ``temperature``) cut to the ``top_p`` nucleus (T 0: greedy; 1.0: no cut), seeded by ``seed``; a
    response ends at its first ``stop_ids`` token (default: ``stop_token_ids``) or, cut afterwards, right after its
    first ``stop_strings`` string (``template_stop_strings``)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    stop_ids: list[int] | None = None
    stop_strings: list[str] | None = None


@torch.no_grad()
def generate(
    model, tokenizer, prompts: list[str], num_generations: int, settings: SamplingSettings, batch_size=None, progress=""
) -> RolloutBatch:
    """Sample ``num_generations`` responses for each prompt with Hugging Face ``generate``.

    The distribution is ``sampling_config``'s and nothing else: the checkpoint's ``generation_config``
    (``repetition_penalty``, ``min_p``, suppressed tokens...) is set aside for the call, so a polluted one gives token
    for token the rollout of a clean one with the same seed; only its EOS ids are used (the default ``stop_ids``).

    Args:
        prompts: templated prompt texts (see ``apply_template``); num_generations: G, responses per prompt.
        settings: its seed seeds torch's RNG (the same seed, the same rollout); a stop string ends the mask at the
            token that completes it and the text right after it.
        batch_size: rows per ``generate`` call (default: all at once).
        progress: a description: show a progress bar over the responses (tqdm, cleared when done).
    Returns:
        a ``RolloutBatch`` with N = len(prompts) * num_generations rows.
    Raises:
        ValueError: empty prompts, ``num_generations < 1`` or ``max_new_tokens < 1``.
    """
    if not prompts or num_generations < 1 or settings.max_new_tokens < 1:
        raise ValueError("generate needs prompts, num_generations >= 1 and max_new_tokens >= 1")
    resolved = settings._replace(stop_ids=settings.stop_ids or stop_token_ids(tokenizer, model=model))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else resolved.stop_ids[0]
    rows, enc = encode_prompts(tokenizer, prompts, num_generations)
    config = sampling_config(settings.max_new_tokens, settings.temperature, settings.top_p, resolved.stop_ids, pad_id)
    torch.manual_seed(settings.seed)
    was_training = model.training
    model.eval()
    with generation_config_set_aside(model, config):
        outs = _generate_batches(model, enc, config, batch_size or len(rows), progress)
    model.train(was_training)
    width = max(o.shape[1] for o in outs)
    response_ids = torch.cat([torch.nn.functional.pad(o, (0, width - o.shape[1]), value=pad_id) for o in outs])
    return build_rollout(enc, response_ids, rows, num_generations, tokenizer, resolved, pad_id)


def _generate_batches(model, enc, config, batch_size: int, progress: str) -> list[torch.Tensor]:
    """HF ``generate`` over the encoded rows, ``batch_size`` at a time: each batch's response ids ``[B, T_b]`` (CPU)."""
    from tqdm import tqdm

    device = next(model.parameters()).device
    n_rows = len(enc["input_ids"])
    outs = []
    with tqdm(total=n_rows, desc=progress, unit="resp", leave=False, disable=not progress, dynamic_ncols=True) as bar:
        for i in range(0, n_rows, batch_size):
            ids = enc["input_ids"][i : i + batch_size].to(device)
            mask = enc["attention_mask"][i : i + batch_size].to(device)
            # synced_gpus=False: under FSDP2 the callers gather the weights first (distributed.gathered_weights), so no
            # forward is a collective; HF's default there all-reduces a "finished" flag every token, which hangs when
            # processes make different numbers of generate calls (held-out problems split unevenly)
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config, synced_gpus=False)
            outs.append(out[:, ids.shape[1] :].cpu())
            bar.update(len(ids))
    return outs


def sample(
    model, tokenizer, prompts: list[str], num_generations: int, settings: SamplingSettings, vllm_sampler=None
) -> RolloutBatch:
    """A training step's rollout from the *current* policy: HF ``generate`` on the gathered weights (FSDP2,
    distributed.py), or with ``--use_vllm`` ``vllm_sampler.rollout(model, tokenizer, prompts, num_generations,
    settings)`` (trainer/vllm_engine.py's ``VllmSampler``: it pushes the policy's weights into its engine first)."""
    from trainer import distributed

    if vllm_sampler is not None:
        return vllm_sampler.rollout(model, tokenizer, prompts, num_generations, settings)
    with distributed.gathered_weights(model):  # sampling runs a different number of forwards on each process
        return generate(model, tokenizer, prompts, num_generations, settings)


def encode_prompts(tokenizer, prompts: list[str], num_generations: int):
    """The N = len(prompts) × G prompt rows (group by group) and their left-padded encoding (both backends)."""
    rows = [p for p in prompts for _ in range(num_generations)]
    return rows, tokenizer(rows, return_tensors="pt", padding=True, padding_side="left")  # the tokenizer unchanged


def build_rollout(
    enc, response_ids: torch.Tensor, rows: list[str], G: int, tokenizer, settings: SamplingSettings, pad_id: int
) -> RolloutBatch:
    """The ``RolloutBatch`` of G responses per prompt from the left-padded prompt encoding and the raw response ids
    ``[N, T]`` (long, CPU), right-padded with ``pad_id``; ``settings.stop_ids`` resolved (not None).

    Shared by ``generate`` and ``vllm_engine.generate`` so the two backends cannot drift. A row that ran to the
    budget must be the full width (both samplers guarantee it), so padding never counts as a stop token even when
    ``pad_id`` is a stop id. The mask runs up to and including the first stop token (bug case C23: EOS is trained),
    everything after it becomes ``pad_id``, the text is decoded with skip_special_tokens, and ``settings``' stop
    strings cut mask and text (C28)."""
    response_mask, stopped = response_mask_from_ids(response_ids, settings.stop_ids)
    response_ids = torch.where(response_mask.bool(), response_ids, torch.full_like(response_ids, pad_id))
    texts = tokenizer.batch_decode([r[m.bool()] for r, m in zip(response_ids, response_mask)], skip_special_tokens=True)
    if settings.stop_strings:
        cut = cut_at_stop_strings(response_ids, response_mask, texts, tokenizer, settings.stop_strings)
        stopped = stopped | torch.tensor(cut, dtype=torch.bool)
        response_ids = torch.where(response_mask.bool(), response_ids, torch.full_like(response_ids, pad_id))
    return RolloutBatch(
        input_ids=torch.cat([enc["input_ids"], response_ids], 1),
        attention_mask=torch.cat([enc["attention_mask"], response_mask.long()], 1),
        response_ids=response_ids,
        response_mask=response_mask,
        prompt_length=enc["input_ids"].shape[1],
        finish_reasons=["stop" if s else "length" for s in stopped.tolist()],
        texts=texts,
        prompts=rows,
        num_generations=G,
    )

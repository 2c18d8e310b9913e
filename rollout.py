"""Rollouts: prompt templates and sampling G responses per prompt.

``generate`` samples with Hugging Face ``model.generate`` (left padding, KV cache, seeded sampling) and returns a
``Rollout``: prompt and response token ids laid out as ``[left-padded prompt | right-padded response]``, the
response mask (which **includes** the EOS token, so the model is trained to stop; tiny-grpo's pad==eos bug
dropped it), the finish reason of each response and the decoded text.

Responses are ordered group by group: rows ``g*G ... g*G+G-1`` are the G samples of prompt ``g``.

Old log-probs are *not* taken from the sampler: the trainer recomputes them with its own forward pass, so the
importance ratio is exactly 1 at the first update (sampler and trainer numerics always differ a little).
"""

from __future__ import annotations

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


def resolve_template(template: str, model_name: str) -> str:
    """``"auto"`` means ``"none"`` for the toy and ``"qwen_math"`` for any other model; other names pass through."""
    if template == "auto":
        return "none" if model_name == "toy" else "qwen_math"
    if template not in PROMPT_TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; choose from {sorted(PROMPT_TEMPLATES)} or auto")
    return template


def apply_template(problem: str, template: str) -> str:
    """The prompt text for ``problem`` under ``template`` (a key of ``PROMPT_TEMPLATES``).

    Raises:
        ValueError: unknown template name.
    """
    if template not in PROMPT_TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; choose from {sorted(PROMPT_TEMPLATES)}")
    return PROMPT_TEMPLATES[template][0].replace("{problem}", problem)


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


def load_model_and_tokenizer(name: str, dtype: str = "auto", device: str | None = None,
                              attn_implementation: str | None = None, trust_remote_code: bool = False):
    """Load a causal LM and its tokenizer with ``from_pretrained``: ``"toy"``, a local folder or a hub id.

    ``"toy"`` resolves to the cached warmed-up toy model (built on first use, see toy.py), then goes through
    exactly the same ``from_pretrained`` path. The tokenizer pads on the left (generation) and gets a pad token
    (EOS) if it has none.

    Args:
        dtype: ``"auto"`` (bfloat16 on a GPU, float32 on the CPU), ``"bfloat16"`` or ``"float32"``
            (``"float16"`` is accepted too).
        device: ``"cuda"``, ``"cuda:1"``, ``"cpu"``...; default: CUDA when available. On a GPU the weights are
            loaded straight onto it (``device_map``), never materialised in CPU memory first.
        attn_implementation: ``"sdpa"``, ``"eager"``, ``"flash_attention_2"``...; None: transformers' default.
        trust_remote_code: allow a hub repository's own model code.
    Raises:
        ValueError: an unknown dtype, flash attention without the flash-attn package (or on the CPU), or a name
        that is neither a folder nor a loadable hub id (one line, not a deep traceback).
    """
    import importlib.util
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = name
    if name == "toy":
        import toy

        path = toy.ensure_toy_model()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    if dtype not in ("bfloat16", "float32", "float16"):
        raise ValueError(f"dtype (--torch_dtype) must be auto, bfloat16 or float32, got {dtype!r}")
    if attn_implementation and attn_implementation.startswith("flash_attention"):
        pkg = "flash_attn_interface" if attn_implementation == "flash_attention_3" else "flash_attn"
        if importlib.util.find_spec(pkg) is None:
            raise ValueError(f"--attn_implementation {attn_implementation} needs the {pkg} package "
                             f"(pip install flash-attn); use --attn_implementation sdpa")
        if not device.startswith("cuda"):
            raise ValueError(f"--attn_implementation {attn_implementation} runs on a GPU only; use sdpa on the CPU")
    kwargs = dict(dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code)
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if device.startswith("cuda"):
        kwargs["device_map"] = device  # load shard by shard onto the GPU
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        if not device.startswith("cuda"):
            model = model.to(device)
    except OSError as e:  # missing folder / unknown hub id / no network
        where = "local folder" if os.path.isdir(path) else "hub id (or folder that does not exist)"
        raise ValueError(f"cannot load model {name!r} as a {where}: {str(e).splitlines()[0]}") from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


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


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], num_generations: int, max_new_tokens: int,
             temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, stop_ids: list[int] | None = None,
             batch_size: int | None = None, stop_strings: list[str] | None = None) -> Rollout:
    """Sample ``num_generations`` responses for each prompt with Hugging Face ``generate``.

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
    rows = [p for p in prompts for _ in range(num_generations)]
    tokenizer.padding_side = "left"
    enc = tokenizer(rows, return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    sample = temperature > 0
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=sample, eos_token_id=stop_ids, pad_token_id=pad_id,
                  use_cache=True, top_k=0)
    if sample:
        kwargs.update(temperature=temperature, top_p=top_p)
    else:  # silence generation_config sampling defaults when decoding greedily
        kwargs.update(temperature=None, top_p=None, top_k=None)
    was_training = model.training
    model.eval()
    outs, bs = [], batch_size or len(rows)
    for i in range(0, len(rows), bs):
        ids = enc["input_ids"][i:i + bs].to(device)
        out = model.generate(input_ids=ids, attention_mask=enc["attention_mask"][i:i + bs].to(device), **kwargs)
        outs.append(out[:, ids.shape[1]:].cpu())
    model.train(was_training)
    width = max(o.shape[1] for o in outs)
    response_ids = torch.cat([torch.nn.functional.pad(o, (0, width - o.shape[1]), value=pad_id) for o in outs])
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

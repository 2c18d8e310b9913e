"""rollout.py's HF sampler draws from exactly the distribution the trainer scores, whatever the checkpoint's
``generation_config`` holds (issue #18).

A rigged tiny Qwen3 whose next-token distribution is the same at every position (attention and MLP outputs
zeroed, every embedding equal, so the last hidden state is a constant vector and the LM head alone sets the
logits): token "a" has probability 0.6 at T = 1, EOS 0.05. The sampled frequency of "a" is softmax(logits / T)'s,
and a field written into ``model.generation_config`` (``repetition_penalty``, ``min_p``, ``no_repeat_ngram_size``...;
instruct and math checkpoints ship such fields) changes not a single token: the rollout equals the clean-config
rollout with the same seed. The vLLM counterpart and the weight-sync tests (a fake engine; no vLLM needed for
those) are in tests/test_vllm.py.
"""

import copy
import math

import pytest
import torch

import rollout

P_A, P_EOS = 0.6, 0.05  # the rigged model's next-token probabilities of "a" and of EOS at T = 1
MAX_NEW = 24
PROMPTS = ["compute 1+2\n", "x=3\n", "solve 4-1\n", "7+8=\n"]


def rigged_model(tiny):
    """A copy of conftest's tiny Qwen3 whose next-token distribution is fixed: p("a") = P_A, p(EOS) = P_EOS,
    the rest spread evenly over the ordinary tokens, 0 for pad/BOS/unk. Returns (model, tokenizer, id of "a")."""
    model, tok = tiny
    model = copy.deepcopy(model)
    a = tok.convert_tokens_to_ids("a")
    special = {tok.pad_token_id, tok.bos_token_id, tok.unk_token_id, tok.eos_token_id}
    rest = [i for i in range(model.config.vocab_size) if i not in special | {a}]
    p = torch.zeros(model.config.vocab_size)
    p[a], p[tok.eos_token_id], p[rest] = P_A, P_EOS, (1 - P_A - P_EOS) / len(rest)
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream is the embedding alone
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.fill_(1.0)  # every token the same: final hidden state = norm(1) = 1
        model.model.norm.weight.fill_(1.0)
        # logits = W·1 = log p (ordinary tokens), -1e4 for the special ones
        logits = torch.where(p > 0, p.clamp_min(1e-30).log(), torch.tensor(-1e4))
        model.lm_head.weight.copy_(logits[:, None].expand_as(model.lm_head.weight) / model.config.hidden_size)
    return model.eval(), tok, a


@pytest.fixture(scope="module")
def rigged(tiny):
    return rigged_model(tiny)


def _sample(model, tok, seed=0, num_generations=4, **kw):
    settings = rollout.SamplingSettings(MAX_NEW, seed=seed, stop_ids=[tok.eos_token_id], **kw)
    return rollout.generate(model, tok, PROMPTS, num_generations, settings)


def _frequency(ro, token):
    """Share of the sampled response tokens (EOS included) equal to ``token``."""
    ids = ro.response_ids[ro.response_mask.bool()]
    return (ids == token).float().mean().item()


def _polluted(model, fields):
    """A copy of ``model`` whose checkpoint generation_config holds ``fields`` (as a generation_config.json would)."""
    model = copy.deepcopy(model)
    for key, value in fields.items():
        setattr(model.generation_config, key, value)
    return model


def test_rigged_model_has_the_stated_next_token_distribution(rigged):
    model, tok, a = rigged
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        p = model(**enc).logits.softmax(-1)
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(p[..., a][real], torch.full((int(real.sum()),), P_A), atol=1e-5, rtol=0)
    torch.testing.assert_close(p[..., tok.eos_token_id][real], torch.full((int(real.sum()),), P_EOS), atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sampled_frequency_is_softmax_of_logits_over_temperature(rigged, temperature):
    model, tok, a = rigged
    ro = _sample(model, tok, num_generations=16, temperature=temperature)
    # independent formula: p_T(a) = p_a^(1/T) / Σ_v p_v^(1/T) (the distribution the trainer scores)
    n_rest = model.config.vocab_size - 5
    weights = [P_A, P_EOS] + [(1 - P_A - P_EOS) / n_rest] * n_rest
    expected = P_A ** (1 / temperature) / sum(w ** (1 / temperature) for w in weights)
    n = int(ro.response_mask.sum())
    assert n > 500
    # fixed seed: deterministic; 4 standard errors of a frequency over n tokens
    assert abs(_frequency(ro, a) - expected) < 4 * math.sqrt(expected * (1 - expected) / n)


# Fields a checkpoint's generation_config.json may hold that change what HF generate samples (transformers 5.19);
# before issue #18 each of the first 19 changed the rigged model's rollout (or, num_return_sequences, broke it).
POLLUTION = [
    dict(repetition_penalty=100.0),
    dict(min_p=0.5),
    dict(no_repeat_ngram_size=1),
    dict(typical_p=0.2),
    dict(epsilon_cutoff=0.05),
    dict(eta_cutoff=0.05),
    dict(top_h=0.3),
    dict(bad_words_ids=[[21]]),
    dict(suppress_tokens=[21]),
    dict(begin_suppress_tokens=[21]),
    dict(sequence_bias={(21,): -100.0}),
    dict(min_new_tokens=MAX_NEW),
    dict(min_length=100),
    dict(exponential_decay_length_penalty=(1, 3.0)),
    dict(forced_eos_token_id=2),
    dict(num_beams=2),
    dict(max_time=0.0),
    dict(watermarking_config=dict(greenlist_ratio=0.25, bias=5.0)),
    dict(num_return_sequences=2),
    # no effect on this rigged model, or set explicitly by the project already before #18; kept so they stay so
    dict(top_k=1),
    dict(temperature=0.3, top_p=0.5, do_sample=False),
    dict(renormalize_logits=True, guidance_scale=3.0, max_length=10),
]


def _all_pollution():
    fields = {}
    for case in POLLUTION:
        fields.update(case)
    fields.pop("max_time")  # with every other field it would stop before the first token: tested on its own
    return fields


MODES = (dict(temperature=1.0), dict(temperature=0.7, top_p=0.9), dict(temperature=0.0))


@pytest.fixture(scope="module")
def clean_rollouts(rigged):
    """The rigged model's rollouts with its clean generation_config, seed 3, one per sampling mode of MODES."""
    model, tok, _ = rigged
    return [_sample(model, tok, seed=3, **kw) for kw in MODES]


@pytest.mark.parametrize("fields", POLLUTION + [_all_pollution()], ids=lambda f: ",".join(f) if len(f) < 5 else "all")
def test_polluted_generation_config_samples_token_for_token_the_clean_rollout(rigged, clean_rollouts, fields):
    model, tok, _ = rigged
    assert tok.convert_ids_to_tokens(21) == "a" and tok.eos_token_id == 2  # the ids written in POLLUTION
    dirty = _polluted(model, fields)
    checkpoint_config = dirty.generation_config
    for kw, clean_ro in zip(MODES, clean_rollouts):
        dirty_ro = _sample(dirty, tok, seed=3, **kw)
        assert torch.equal(dirty_ro.response_ids, clean_ro.response_ids), kw
        assert torch.equal(dirty_ro.response_mask, clean_ro.response_mask)
        assert dirty_ro.finish_reasons == clean_ro.finish_reasons
    # the checkpoint's config is back in place, unchanged
    assert dirty.generation_config is checkpoint_config
    assert all(getattr(checkpoint_config, k) == v for k, v in fields.items() if k != "watermarking_config")


def test_polluted_generation_config_of_a_peft_model(rigged):
    peft = pytest.importorskip("peft")
    model, tok, _ = rigged
    cfg = dict(r=2, lora_alpha=4, target_modules=["q_proj"], init_lora_weights=True)  # B = 0: same policy
    clean = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(**cfg))
    dirty = peft.get_peft_model(_polluted(model, _all_pollution()), peft.LoraConfig(**cfg))
    assert dirty.generation_config.repetition_penalty == 100.0  # what PeftModel.generate hands to the base model
    assert torch.equal(_sample(dirty, tok).response_ids, _sample(clean, tok).response_ids)


def test_plain_sampling_runs_no_logits_processor(rigged, monkeypatch):
    # softmax(logits) at T = 1, top-p 1: HF generate needs no logits processor, and is given none (TRL's HF path
    # runs none either); a neutral field that still built one (min_new_tokens=0 did: MinLengthLogitsProcessor, a
    # copy of the [B, V] logits at every token) shows up here. T = 0.7, top-p 0.9: those two, nothing else.
    from transformers.generation import logits_process

    seen = []
    call = logits_process.LogitsProcessorList.__call__

    def recording(self, input_ids, scores, **kwargs):
        seen.append(tuple(type(p).__name__ for p in self))
        return call(self, input_ids, scores, **kwargs)

    monkeypatch.setattr(logits_process.LogitsProcessorList, "__call__", recording)
    model, tok, _ = rigged
    _sample(model, tok)
    assert seen and set(seen) == {()}
    seen.clear()
    _sample(model, tok, temperature=0.7, top_p=0.9)
    assert set(seen) == {("TemperatureLogitsWarper", "TopPLogitsWarper")}


def test_sampling_config_states_the_distribution():
    sample = rollout.sampling_config(7, 0.8, 0.95, [2, 5], 0)
    assert (sample.do_sample, sample.temperature, sample.top_p, sample.top_k, sample.num_beams) == (
        True,
        0.8,
        0.95,
        0,
        1,
    )
    assert (sample.repetition_penalty, sample.no_repeat_ngram_size) == (1.0, 0)
    assert (sample.max_new_tokens, sample.eos_token_id, sample.pad_token_id) == (7, [2, 5], 0)
    off = [
        "min_length",
        "min_new_tokens",  # 0 would become min_length = the prompt's length: a logits processor at every token
        "min_p",
        "top_h",
        "bad_words_ids",
        "suppress_tokens",
        "begin_suppress_tokens",
        "sequence_bias",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "exponential_decay_length_penalty",
        "watermarking_config",
        "guidance_scale",
        "stop_strings",
        "max_time",
    ]
    assert all(getattr(sample, k) is None for k in off)
    greedy = rollout.sampling_config(7, 0.0, 0.95, [2], 0)
    assert greedy.do_sample is False and greedy.num_beams == 1


def test_prompts_are_left_padded_and_the_tokenizer_is_left_as_it_was(tiny):
    """Both backends' prompt rows: group by group, left-padded (the response follows the prompt's last token), without
    changing the caller's tokenizer (its ``padding_side`` stays what it was)."""
    _, tokenizer = tiny
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.padding_side = "right"
    rows, enc = rollout.encode_prompts(tokenizer, ["1+1=", "12+13="], 2)
    assert rows == ["1+1=", "1+1=", "12+13=", "12+13="]
    assert tokenizer.padding_side == "right"
    assert enc["attention_mask"][:, -1].all() and not enc["attention_mask"][0, 0]  # the pad on the left

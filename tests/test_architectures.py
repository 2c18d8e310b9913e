"""Every optimisation of the scale path is exact on every architecture the trainer accepts, or turns itself off.

One update (stage 4 θ_old, stage 5 DelTA's λ̄, stage 6 the gradient of the token-mean loss) of tiny random models of
several architectures, on the scale path (--padding_free --shared_prompt --chunked_lm_head --fuse_old_logprobs, after
``scale_passes.exact_optimisations`` has turned off what the model cannot take) and on the plain path (grpo.py's padded
update, every optimisation off): the same old log-probs, λ̄, token advantages, loss and gradient, in float64 to 1e-10
relative (conftest.float64_model runs HF's float32 islands in float64 too; without that the bound would be float32's,
since Qwen3, Llama, Mistral and Gemma-3 all compute their RMSNorm in float32 whatever the model's dtype). Where a model
lacks a feature, the test also shows what the refusal prevents: forcing the optimisation on changes the log-probs.
"""

import pytest
import torch
from conftest import backward, stages_4_and_5

import grpo
import rollout
from trainer import policy, scale_passes

TOL = 1e-10
WINDOW = 6  # a sliding window shorter than the prompts: where sliding-window attention differs from full attention
OFF = dict(padding_free=False, shared_prompt=False, chunked_lm_head=False, fuse_old_logprobs=False)  # the plain path
SCALE = dict(padding_free=True, shared_prompt=True, chunked_lm_head=True, fuse_old_logprobs=True)  # the scale path


def _config(name, vocab):
    import transformers as tf

    common = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.2,
    )
    return {
        "qwen3": lambda: tf.Qwen3Config(head_dim=8, **common),
        "qwen3_sliding": lambda: tf.Qwen3Config(
            head_dim=8, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=0, **common
        ),
        "llama": lambda: tf.LlamaConfig(**common),
        "mistral": lambda: tf.MistralConfig(sliding_window=WINDOW, **common),
        "gemma3": lambda: tf.Gemma3TextConfig(
            head_dim=8,
            sliding_window=WINDOW,
            query_pre_attn_scalar=8,
            layer_types=["sliding_attention", "full_attention"],
            **common,
        ),
        "tied": lambda: tf.Qwen3Config(head_dim=8, tie_word_embeddings=True, **common),
    }[name]()


ARCHITECTURES = {  # name: (config, LoRA dropout or None for full fine-tuning, the optimisations it must refuse)
    "qwen3": ("qwen3", None, set()),
    "qwen3_sliding": ("qwen3_sliding", None, {"shared_prompt"}),
    "llama": ("llama", None, set()),
    "mistral": ("mistral", None, {"shared_prompt"}),
    "gemma3": ("gemma3", None, {"shared_prompt"}),
    "tied_embeddings": ("tied", None, set()),
    "lora": ("qwen3", 0.0, set()),
    "lora_dropout": ("qwen3", 0.5, {"padding_free", "shared_prompt", "fuse_old_logprobs"}),
}


@pytest.fixture(scope="module")
def tokenizer(toy_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(toy_model_path)


def _batch(tok, G=3):
    """A rollout batch by hand: 3 prompts of different lengths (longer than WINDOW), G responses each of different
    lengths (random tokens, the last one EOS), laid out as rollout.py does: [left-padded prompt | right-padded
    response]."""
    gen = torch.Generator().manual_seed(0)
    prompts = ["Compute 7+5-3.\n", "Compute 12+30-4+1.\n", "Compute 1+2.\n"]
    p_ids = [tok(p)["input_ids"] for p in prompts]
    lengths = [3, 9, 6, 12, 4, 7, 10, 5, 8][: G * len(prompts)]
    r_ids = [torch.randint(3, len(tok), (n - 1,), generator=gen).tolist() + [tok.eos_token_id] for n in lengths]
    P, T, N = max(map(len, p_ids)), max(lengths), len(lengths)
    ids, attn = torch.zeros(N, P + T, dtype=torch.long), torch.zeros(N, P + T, dtype=torch.long)
    for i, r in enumerate(r_ids):
        p = p_ids[i // G]
        ids[i, P - len(p) : P + len(r)] = torch.tensor(p + r)
        attn[i, P - len(p) : P + len(r)] = 1
    mask = attn[:, P:].double()
    return rollout.RolloutBatch(
        input_ids=ids,
        attention_mask=attn,
        response_ids=ids[:, P:],
        response_mask=mask,
        prompt_length=P,
        finish_reasons=["stop"] * N,
        texts=[""] * N,
        prompts=[p for p in prompts for _ in range(G)],
        num_generations=G,
    )


def _model(name, lora_dropout, vocab, float64_model):
    import transformers as tf

    torch.manual_seed(0)
    model = float64_model(tf.AutoModelForCausalLM.from_config(_config(name, vocab)))
    if lora_dropout is not None:
        model = policy.prepare_model(model, grpo.GRPOConfig(use_peft=True, lora_dropout=lora_dropout))
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():  # B = 0 at initialisation: make every adapter (and its dropout) matter
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def _one_update(model, tok, batch, **flags):
    """Stages 4-6 of ``grpo.py --credit delta`` with ``GRPOConfig(**flags)`` after ``exact_optimisations``: (old
    log-probs, λ̄, token advantages, loss, gradient, what exact_optimisations decided)."""
    cfg = grpo.GRPOConfig(credit="delta", max_completion_length=batch.response_mask.shape[1], **flags)
    plan = scale_passes.exact_optimisations(model, cfg, say=lambda *a: None)
    N = len(batch.response_mask)
    adv = grpo.group_advantages(
        torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0], dtype=torch.float64), batch.num_generations
    )
    torch.manual_seed(3)  # the same dropout masks where the two runs make the same computation
    parts, _, theta_old, result = stages_4_and_5(model, tok, batch, cfg, adv)
    model.zero_grad(set_to_none=True)
    loss, _, _ = backward(model, batch, theta_old, result.token_adv, torch.arange(N), cfg, forward=parts.forward)
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return theta_old.logp, result.token_values.get("lam_bar"), result.token_adv, loss, grad, plan


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_the_scale_path_gives_the_plain_padded_update(arch, tokenizer, float64_model):
    name, lora_dropout, refused = ARCHITECTURES[arch]
    model, batch = _model(name, lora_dropout, len(tokenizer), float64_model), _batch(tokenizer)
    *default, plan = _one_update(model, tokenizer, batch, **SCALE)
    *plain, _ = _one_update(model, tokenizer, batch, **OFF)
    assert {flag for flag, state in plan.items() if state != "on"} == refused, plan
    old0, lam0, adv0, loss0, g0 = plain
    old1, lam1, adv1, loss1, g1 = default
    assert old0.dtype == lam0.dtype == g0.dtype == torch.float64
    assert not torch.allclose(lam0, batch.response_mask)  # λ̄ is not the guard's ≡ 1
    for a, b in ((old1, old0), (lam1, lam0), (adv1, adv0)):
        torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)
    assert loss1 == pytest.approx(loss0, rel=TOL, abs=TOL) and g0.abs().sum() > 0
    assert (g1 - g0).norm() <= TOL * g0.norm()


@pytest.mark.parametrize("arch", ["qwen3_sliding", "mistral", "gemma3"])
def test_sliding_window_models_refuse_the_shared_prompt_and_keep_padding_free(arch, tokenizer, float64_model):
    """What the refusal prevents: with prompts longer than the window, the shared prompt pass (the cache of a
    sliding-window layer keeps only the window's tokens) changes the log-probs. Padding-free micro-batches stay
    exact there: a window's mask depends on the distance between two tokens, which left padding does not change."""
    name, _, _ = ARCHITECTURES[arch]
    model, batch = _model(name, None, len(tokenizer), float64_model), _batch(tokenizer)
    said = []
    cfg = grpo.GRPOConfig(credit="delta", **SCALE)
    scale_passes.exact_optimisations(model, cfg, said.append)
    assert any("--shared_prompt off" in s and "sliding_attention" in s for s in said), said
    N, T = batch.response_mask.shape
    logp = {}
    for forced in ("padding_free", "shared_prompt", None):
        flags = {**OFF, **({forced: True} if forced else {})}
        passes = scale_passes.Passes(model, batch, torch.arange(N), grpo.GRPOConfig(**flags), grad=False)
        out = torch.zeros(N, T, dtype=torch.float64)
        for mb in passes:
            out[mb.rows, : mb.t] = mb.logp
        logp[forced] = out
    assert (logp["shared_prompt"] - logp[None]).abs().max() > 1e-3
    torch.testing.assert_close(logp["padding_free"], logp[None], rtol=TOL, atol=TOL)

"""The LM head in chunks of positions (chunked_head.ChunkedLMHead, used by scale_passes.token_logprobs above
``LOGITS_CHUNK_BYTES``) gives the unchunked computation: in float64 to 1e-10, values and gradients (the model body's
included), on the six architectures of tests/test_architectures.py (Gemma-3 with its final soft-capping), through
every pass that runs it: the training loss (grpo.LOSS_STAGES), θ_old's pass with h (DelTA), DelTA's streamed
passes, CSCR's scoring passes, the Forking Tokens entropy. Budgets of a few positions force many chunks, the last one
ragged. Models whose logits are not the head's output (Cohere's logit scale), or whose head is not a plain Linear
(LoRA on lm_head), are refused by ``chunked_head.lm_head`` and keep the unchunked path. The memory it holds: the live
bytes
of the CPU allocator against memory_plan's chunk terms."""

import pytest
import torch
from conftest import backward, comparison_config
from test_architectures import _batch, _config

import comparisons
import grpo
from trainer import chunked_head, credit_methods, grpo_config, memory_plan, policy, scale_passes

TOL = 1e-10
ARCHS = ["qwen3", "qwen3_sliding", "llama", "mistral", "gemma3", "tied"]


@pytest.fixture(scope="module")
def tokenizer(toy_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(toy_model_path)


def _model(name, vocab, float64_model):
    import transformers as tf

    config = _config(name, vocab)
    if name == "gemma3":  # its own post-processing, applied per chunk: a cap that bends these logits
        config.final_logit_softcapping = 0.8
    torch.manual_seed(0)
    return float64_model(tf.AutoModelForCausalLM.from_config(config))


def _budget(vocab, positions):
    """A chunk budget of ``positions`` positions of float32 logits."""
    return positions * vocab * 4


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_token_logprobs_chunked_equals_unchunked(arch, tokenizer, float64_model):
    """log p, h, H and the gradient of Σ c_t·log p_t (every weight: head, body, embeddings) at budgets of 1, 5 and 7
    positions (a batch of 9 rows × 12: 108 positions, 5 and 7 leave a ragged last chunk), temperature 0.7, against
    ``chunk_bytes=0`` (the micro-batch at once)."""
    V = len(tokenizer)
    model, batch = _model(arch, V, float64_model), _batch(tokenizer)
    assert not isinstance(chunked_head.lm_head(model), str)
    B, T = batch.response_mask.shape
    weights = torch.randn(B, T, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    runs = {}
    for positions in (0, 1, 5, 7):
        model.zero_grad(set_to_none=True)
        lp, h, ent, *_ = scale_passes.token_outputs(
            model,
            batch.input_ids,
            batch.attention_mask,
            batch.response_mask,
            0.7,
            asked=policy.Asked(hidden=True, entropy=True),
            chunk_bytes=_budget(V, positions),
        )
        (weights * lp).sum().backward()
        runs[positions] = (lp.detach(), h, ent, _grads(model))
    lp0, h0, ent0, g0 = runs[0]
    assert lp0.dtype == torch.float64 and (lp0 < 0).sum() == batch.response_mask.sum() and g0.abs().sum() > 0
    assert len(g0) == sum(p.numel() for p in model.parameters())  # the body's weights have gradients too
    for positions in (1, 5, 7):
        lp, h, ent, g = runs[positions]
        _close(lp, lp0)
        _close(h, h0)
        _close(ent, ent0)
        assert (g - g0).norm() <= TOL * g0.norm()


def test_gemma_soft_capping_is_applied_per_chunk(tokenizer, float64_model):
    """Without the cap the log-probs differ: the test above would notice a chunk that skipped it."""
    V = len(tokenizer)
    model, batch = _model("gemma3", V, float64_model), _batch(tokenizer)
    capped = scale_passes.token_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.response_mask, chunk_bytes=_budget(V, 5)
    )
    model.config.final_logit_softcapping = None
    plain = scale_passes.token_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.response_mask, chunk_bytes=_budget(V, 5)
    )
    assert (capped - plain).abs().max() > 1e-2


def test_shared_prompt_pass_chunked(tokenizer, float64_model):
    """``--shared_prompt``'s forward (the responses on top of each group's cached prompt) through the chunked head:
    the same log-probs and gradient (the prompt pass's share included) as unchunked."""
    V = len(tokenizer)
    model, batch = _model("qwen3", V, float64_model), _batch(tokenizer)
    rows = torch.arange(len(batch.input_ids))
    runs = []
    for positions in (0, 4):
        model.zero_grad(set_to_none=True)
        shared = scale_passes.SharedPrompts(
            model, batch.input_ids, batch.attention_mask, rows, batch.response_mask.shape[1]
        )
        lp = scale_passes.token_logprobs(
            model,
            batch.input_ids,
            batch.attention_mask,
            batch.response_mask,
            shared=(shared, rows),
            chunk_bytes=_budget(V, positions),
        )
        lp.sum().backward()
        shared.backward()
        runs.append((lp.detach(), _grads(model)))
    _close(runs[1][0], runs[0][0])
    assert (runs[1][1] - runs[0][1]).norm() <= TOL * runs[0][1].norm()


# (credit, GRPOConfig overrides): the passes each one runs through the LM head
UPDATES = {
    "grpo": ("grpo", {}),  # θ_old's no-grad pass, the update's training forward
    "grpo_fused": ("grpo", {"fuse_old_logprobs": True}),  # stage 4's training forward kept for the update
    "delta": ("delta", {}),  # θ_old's pass with h (DelTA normal)
    "delta_memory_efficient": ("delta", {"delta_impl": "memory_efficient", "micro_batch_size": 4}),  # streamed h
    "cscr": ("cscr", {}),  # CSCR's two scoring passes
    "forking_minibatch": ("grpo", {"entropy_top_ratio": 0.5}),  # H_t from a no-grad pass over the mini-batch
    "forking_micro": ("grpo", {"entropy_top_ratio": 0.5, "entropy_pool": "micro", "micro_batch_size": 4}),
    "seq_mean_loss": ("grpo", {"loss_type": "grpo", "micro_batch_size": 3}),
    "dr_grpo_loss": ("grpo", {"loss_type": "dr_grpo"}),
    "sapo_loss": ("grpo", {"loss_type": "sapo"}),
    "kl_reference": ("grpo", {"beta": 0.1}),  # the frozen reference's passes (scale_passes.reference_logprobs)
    "fipo": ("fipo", {}),
}


def _update(model, tok, batch, credit, flags):
    """Stages 4-6 (θ_old and the reference, the credit, one mini-batch's backward) as grpo.py runs them: (θ_old's
    log-probs, token advantages, loss, gradient)."""
    N = len(batch.response_mask)
    cfg = comparison_config(
        credit=credit, max_completion_length=batch.response_mask.shape[1], **{"chunked_lm_head": True, **flags}
    )
    adv = grpo.group_advantages(
        torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0], dtype=torch.float64), batch.num_generations
    )
    credit_fn = comparisons.method(cfg).credit(cfg, tok)
    ref = policy.reference_model(model, cfg)
    forward = scale_passes.forward(cfg, False)  # the scale path, with --chunked_lm_head
    old = forward.old_logprobs(model, batch, cfg, credit_fn.asks, ref)
    inputs = credit_methods.CreditInputs(batch, adv, old, ["5"] * N, 0, batch.response_mask, adv, forward)
    token_adv = credit_fn(model, inputs).token_adv
    model.zero_grad(set_to_none=True)
    loss, _, _ = backward(model, batch, old, token_adv, torch.arange(N), cfg, forward=forward)
    return old.logp, token_adv, loss, _grads(model)


@pytest.mark.parametrize("case", list(UPDATES))
def test_every_pass_of_a_step_chunked(case, tokenizer, float64_model, monkeypatch):
    """One step's θ_old log-probs, token advantages (DelTA's λ̄ from h, CSCR's ℓ± from its scoring passes, Forking
    Tokens' entropy mask), loss and gradient with ``scale_passes.LOGITS_CHUNK_BYTES`` at 3 positions (every pass
    chunked,
    ragged) equal those at 0 (every pass unchunked)."""
    credit, flags = UPDATES[case]
    V = len(tokenizer)
    model, batch = _model("qwen3", V, float64_model), _batch(tokenizer)
    runs = []
    for budget in (0, _budget(V, 3)):
        monkeypatch.setattr(scale_passes, "LOGITS_CHUNK_BYTES", budget)
        runs.append(_update(model, tokenizer, batch, credit, flags))
    (old0, adv0, loss0, g0), (old1, adv1, loss1, g1) = runs
    assert g0.abs().sum() > 0
    if credit in ("delta", "cscr"):  # λ̄ (from h) or w̃ (from ℓ±): the tokens of a row get different credit
        assert ((adv0 != adv0[:, :1]) & batch.response_mask.bool()).any()
    _close(old1, old0)
    _close(adv1, adv0)
    assert loss1 == pytest.approx(loss0, rel=TOL, abs=TOL)
    assert (g1 - g0).norm() <= TOL * g0.norm()


def test_chunks_really_run(tokenizer, float64_model, monkeypatch):
    """The tests above compare something: at a small budget the training forward goes through ChunkedLMHead, in
    chunks of the budget's positions (the last ragged), and at 0 it never does."""
    V = len(tokenizer)
    model, batch = _model("qwen3", V, float64_model), _batch(tokenizer)
    seen = []
    apply = chunked_head.ChunkedLMHead.apply
    monkeypatch.setattr(chunked_head.ChunkedLMHead, "apply", lambda h, *a: seen.append((len(h), a[4])) or apply(h, *a))
    for positions in (0, 5):
        scale_passes.token_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.response_mask, chunk_bytes=_budget(V, positions)
        ).sum().backward()
    assert seen == [(batch.response_mask.numel(), 5)] and batch.response_mask.numel() % 5
    seen.clear()  # the default budget: the toy's micro-batches (and these) fit in one chunk, the path of before
    scale_passes.token_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
    assert seen == []


def test_models_whose_logits_are_not_the_heads_output_keep_the_unchunked_path(tokenizer, float64_model):
    """Cohere multiplies its logits by ``logit_scale``: lm_head's check forward sees it, says why, and
    token_logprobs stays exact (the unchunked path); exact_optimisations logs one line. LoRA on lm_head: the head
    is not a plain Linear."""
    import transformers as tf

    V = len(tokenizer)
    torch.manual_seed(0)
    cohere = float64_model(
        tf.CohereForCausalLM(
            tf.CohereConfig(
                vocab_size=V,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=4,
                num_key_value_heads=2,
                logit_scale=0.25,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
            )
        )
    )
    why = chunked_head.lm_head(cohere)
    assert isinstance(why, str) and "CohereForCausalLM's logits are not its LM head's output" in why
    said = []
    cfg = grpo.GRPOConfig(chunked_lm_head=True)
    plan = scale_passes.exact_optimisations(cohere, cfg, said.append)
    assert plan["chunked_lm_head"] == f"off: {why}" and said == [f"[exact] --chunked_lm_head off: {why}"]
    assert not cfg.chunked_lm_head
    batch = _batch(tokenizer)
    small = scale_passes.token_logprobs(
        cohere, batch.input_ids, batch.attention_mask, batch.response_mask, chunk_bytes=1
    )
    whole = scale_passes.token_logprobs(
        cohere, batch.input_ids, batch.attention_mask, batch.response_mask, chunk_bytes=0
    )
    assert torch.equal(small, whole)

    lora = policy.prepare_model(
        _model("qwen3", V, float64_model), grpo.GRPOConfig(use_peft=True, lora_target_modules="q_proj,lm_head")
    )
    assert "not a bias-free nn.Linear" in chunked_head.lm_head(lora)
    plain = policy.prepare_model(_model("qwen3", V, float64_model), grpo.GRPOConfig(use_peft=True))
    assert (
        scale_passes.exact_optimisations(plain, grpo.GRPOConfig(use_peft=True, chunked_lm_head=True), lambda *a: None)[
            "chunked_lm_head"
        ]
        == "on"
    )


def _live_peak(fn):
    from test_memory_plan import _live_peak as peak

    return peak(fn)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("chunk", [50, 5])
def test_chunk_memory_against_the_plans_terms(dtype, chunk):
    """ChunkedLMHead over n = 240 positions in chunks of 50 (5) at V = 20,000, H = 64: the forward's live-byte peak
    above what it is given, and the backward's, against memory_plan.chunked_head_bytes (within 10%); both far below
    one micro-batch's float32 logits n·V·4. At H = 64 W's gradient is as large as a chunk's working set: bf16's
    float32 sum V·H·4 (5.1 MB), beside the chunk (chunks of 50: 6 MB) or beside its bf16 cast V·H·2 at the end
    (chunks of 5: the larger), is half the backward's peak or more, which a plan without it would miss."""
    n, V, H = 240, 20_000, 64
    dt = getattr(torch, dtype)
    c = torch.finfo(dt).bits // 8
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(V, H, dtype=dt, generator=gen).requires_grad_()
    h = torch.randn(n, H, dtype=dt, generator=gen).requires_grad_()
    y = torch.randint(0, V, (n,), generator=gen)
    box = {}
    fwd = _live_peak(
        lambda: box.setdefault("lp", chunked_head.ChunkedLMHead.apply(h, W, y, 0.7, None, chunk, False)[0])
    )
    bwd = _live_peak(lambda: box.pop("lp").sum().backward())
    plan = memory_plan.chunked_head_bytes(chunk, V, H, c, trained=True)
    assert fwd == pytest.approx(plan["forward"] + 2 * 4 * n, rel=0.1)  # + log p and logsumexp [n] float32
    assert bwd == pytest.approx(plan["backward"] + c * n * H, rel=0.1)  # + dh [n, H]
    assert max(fwd, bwd - max(c, 4) * V * H) < 0.5 * n * V * 4  # beside W's gradient, summed in float32


def test_bf16_head_gradient_as_close_to_exact_as_the_unchunked_heads():
    """W's gradient over one 20,480-token row of bf16 h and W in chunks of 441 positions (Qwen3's at V = 151,936:
    47 chunks; a small V and H keep it to seconds), every token of the row weighted by its one advantage / T (as
    the loss does): its relative error against the same computation in float64 (the float64 head, from the same
    bf16 values) is at most 1.25 × the unchunked head's (the model's own bf16 matmul, autograd). Why 1.25, not a
    tuned number: issue #43 asks the chunked head to be as accurate as the one it replaces, 1.25 leaving room for
    the difference of where each rounds (dz kept in float32 here, rounded to bf16 by autograd there), not for a
    per-chunk rounding: summed in bf16, 47 roundings of a growing sum measured 3.3×; summed in float32 the 47
    additions add ≲ 47·2^-24 relative, against bf16's 2^-9 of the one final rounding both share (measured 0.99×)."""
    n, V, H, chunk = 20_480, 256, 32, 441
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(V, H, generator=gen).to(torch.bfloat16)
    h = torch.randn(n, H, generator=gen).to(torch.bfloat16)
    y = torch.randint(0, V, (n,), generator=gen)

    def grad_w(logp, weight):  # ∂/∂W of Σ_t (1/n)·log p_t, in float64
        weight = weight.clone().requires_grad_()
        (logp(weight) / n).sum().backward()
        return weight.grad.double()

    def unchunked(weight):  # token_logprobs' path for logits that fit: the model's head, then float32
        z = torch.nn.functional.linear(h.to(weight.dtype), weight)
        return chunked_head.log_softmax_at(z.to(torch.promote_types(z.dtype, torch.float32)), y)[0]

    def chunked(weight):
        return chunked_head.ChunkedLMHead.apply(h, weight, y, 1.0, None, chunk, False)[0]

    exact = grad_w(unchunked, W.double())
    error = {
        name: (grad_w(fn, W) - exact).norm() / exact.norm()
        for name, fn in (("unchunked", unchunked), ("chunked", chunked))
    }
    assert -(-n // chunk) == 47 and error["unchunked"] > 1e-4  # bf16's rounding is there to compare
    assert error["chunked"] <= 1.25 * error["unchunked"]


def test_a_head_in_a_wider_dtype_than_its_input():
    """h in float32, W in float64 (as --cast_lm_head_to_fp32's bf16 h and float32 W): h goes to W's dtype, and the
    log-probs, entropy and gradients in chunks of 7 equal the whole computation in float64 (1e-10)."""
    n, V, H = 40, 30, 8
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(V, H, dtype=torch.float64, generator=gen)
    h = torch.randn(n, H, generator=gen)
    y = torch.randint(0, V, (n,), generator=gen)
    c = torch.randn(n, dtype=torch.float64, generator=gen)
    runs = []
    for chunk in (n, 7):
        w, x = W.clone().requires_grad_(), h.clone().requires_grad_()
        lp, ent, _ = chunked_head.ChunkedLMHead.apply(x, w, y, 0.7, 2.0, chunk, True)
        (c * lp).sum().backward()
        runs.append((lp.detach(), ent, w.grad, x.grad))
    assert runs[0][0].dtype == runs[0][2].dtype == torch.float64 and runs[0][3].dtype == torch.float32
    whole = torch.nn.functional.linear(h.double(), W)
    assert torch.equal(runs[0][0], chunked_head.log_softmax_at((whole / 2).tanh() * 2 / 0.7, y)[0])
    for a, b in zip(runs[0][:3], runs[1][:3]):
        _close(b, a)
    torch.testing.assert_close(runs[1][3], runs[0][3], rtol=2**-23, atol=0)  # dh rounded once to h's float32


def _granite(V, scale):
    import transformers as tf

    torch.manual_seed(0)
    return tf.GraniteForCausalLM(
        tf.GraniteConfig(
            vocab_size=V,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            logits_scaling=scale,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
    )


def _cohere(V, scale):
    import transformers as tf

    torch.manual_seed(0)
    return tf.CohereForCausalLM(
        tf.CohereConfig(
            vocab_size=V,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            logit_scale=scale,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
    )


@pytest.mark.parametrize("build,scale", [(_granite, 8.0), (_cohere, 0.125)])
def test_the_heads_check_is_per_config_not_per_class(build, scale, tokenizer, float64_model, monkeypatch):
    """Granite divides its logits by ``logits_scaling``, Cohere multiplies them by ``logit_scale``: a first model
    of the class with scale 1.0 passes lm_head's check (x/1 and x·1 are x), a second one built in the same process
    with 8.0 (0.125) must not inherit it: it is checked again, refused, and its log-probs and gradient at a budget
    of 5 positions equal the unchunked ones (float64, 1e-10). Keyed on the class alone, the second took the
    chunked path without its scale."""
    monkeypatch.setattr(chunked_head, "_HEAD_CHECKS", {})  # this process's earlier models of the class: not this test's
    V = len(tokenizer)
    batch = _batch(tokenizer)
    assert not isinstance(chunked_head.lm_head(float64_model(build(V, 1.0))), str)
    model = float64_model(build(V, scale))
    why = chunked_head.lm_head(model)
    assert isinstance(why, str) and "logits are not its LM head's output" in why
    runs = []
    for positions in (0, 5):
        model.zero_grad(set_to_none=True)
        lp = scale_passes.token_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.response_mask, 0.7, chunk_bytes=_budget(V, positions)
        )
        lp.sum().backward()
        runs.append((lp.detach(), _grads(model)))
    _close(runs[1][0], runs[0][0])
    assert (runs[1][1] - runs[0][1]).norm() <= TOL * runs[0][1].norm()


def test_cast_lm_head_to_fp32(tokenizer):
    """--cast_lm_head_to_fp32 on a bf16 model: the head's weight is float32 (the bf16 values, exactly), the body's
    stay bf16, the logits are the float32 matmul of the body's bf16 output (bit for bit), lm_head's check accepts
    the head, and a chunked pass and its backward run (W's gradient float32, the body's bf16); the reference copy
    keeps the float32 head. Off: every weight and the logits stay bf16, the logits those of the unprepared model.
    Refused in one line: a tied head, LoRA on lm_head, torchrun."""
    import copy

    import transformers as tf

    V = len(tokenizer)
    torch.manual_seed(0)
    bf16 = tf.AutoModelForCausalLM.from_config(_config("qwen3", V)).to(torch.bfloat16)
    batch = _batch(tokenizer)
    ids = batch.input_ids[:, -4:]
    before = bf16(input_ids=ids).logits
    off = policy.prepare_model(copy.deepcopy(bf16), grpo.GRPOConfig())
    assert {p.dtype for p in off.parameters()} == {torch.bfloat16} and torch.equal(off(input_ids=ids).logits, before)

    cfg = grpo.GRPOConfig(cast_lm_head_to_fp32=True, beta=0.1)
    on = policy.prepare_model(copy.deepcopy(bf16), cfg)
    head = on.get_output_embeddings()
    assert head.weight.dtype == torch.float32 and torch.equal(head.weight, bf16.get_output_embeddings().weight.float())
    assert {p.dtype for p in on.parameters() if p is not head.weight} == {torch.bfloat16}
    seen = {}
    hook = chunked_head.model_body(on).register_forward_hook(lambda m, a, out: seen.update(h=out[0]))
    logits = on(input_ids=ids).logits
    hook.remove()
    assert seen["h"].dtype == torch.bfloat16 and logits.dtype == torch.float32
    assert torch.equal(logits, torch.nn.functional.linear(seen["h"].float(), head.weight))
    assert not torch.equal(logits, before.float())  # not the bf16 logits made float32 after the matmul
    assert not isinstance(chunked_head.lm_head(on), str)
    lp = scale_passes.token_logprobs(
        on, batch.input_ids, batch.attention_mask, batch.response_mask, chunk_bytes=_budget(V, 5)
    )
    lp.sum().backward()
    assert lp.dtype == torch.float32 and head.weight.grad.dtype == torch.float32
    assert chunked_head.model_body(on).layers[0].mlp.down_proj.weight.grad.dtype == torch.bfloat16
    ref = policy.reference_model(on, cfg)
    assert torch.equal(ref(input_ids=ids).logits, logits)

    tied = tf.AutoModelForCausalLM.from_config(_config("tied", V)).to(torch.bfloat16)
    with pytest.raises(ValueError, match="--cast_lm_head_to_fp32 needs an LM head of its own"):
        policy.prepare_model(tied, cfg)
    lora = grpo.GRPOConfig(cast_lm_head_to_fp32=True, use_peft=True, lora_target_modules="q_proj, lm_head")
    with pytest.raises(SystemExit, match="--cast_lm_head_to_fp32 with LoRA on lm_head"):
        grpo_config.check_config(lora)
    with pytest.raises(SystemExit, match="--cast_lm_head_to_fp32 runs in one process"):
        grpo_config.check_config(grpo.GRPOConfig(cast_lm_head_to_fp32=True), world=2)


def test_plan_and_policy_share_the_chunk_budget():
    assert memory_plan.LOGITS_CHUNK_BYTES == scale_passes.LOGITS_CHUNK_BYTES

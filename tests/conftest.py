"""Shared fixtures: the toy model (warmed up, cached) and a tiny random toy model (fast)."""

import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

torch.set_num_threads(1)  # tiny models: threads cost more than they give, and keep CI predictable


@pytest.fixture(scope="session", autouse=True)
def toy_registered():
    """The toy in the generic modules, as every entry point registers it (``toy.register``): ``"toy"`` as a model,
    a data source, its prompt template and recipe for ``auto``, its truth in samples/."""
    import toy

    toy.register()


@pytest.fixture(scope="session")
def toy_model_path():
    """The warmed-up toy base model that ships in toy/model/ (toy.py)."""
    import toy

    return toy.ensure_toy_model()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A randomly initialised toy-architecture model saved with save_pretrained (no warm-up)."""
    import toy

    return toy.build_toy_model(tmp_path_factory.mktemp("tiny") / "model", warmup_steps=0)


@pytest.fixture(scope="session")
def tiny():
    """A tiny random Qwen3 (hidden 16, 2 layers) with a character tokenizer that adds no BOS: (model, tokenizer)."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models

    chars = list("0123456789 +-=.:\n") + [chr(c) for c in range(97, 123)]
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + chars)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tk.decoder = decoders.Fuse()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    cfg = transformers.Qwen3Config(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=512,
        initializer_range=0.3,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    return model, tok


@pytest.fixture
def float64_model(monkeypatch):
    """``float64_model(model)``: a float64 copy of ``model`` whose forward computes in float64 throughout.

    Tests that two computations are "the same computation" (padding-free vs padded, the shared prompt pass vs the
    full forward, micro-batch sizes, stage 4's fused branch) compare in float64, so that a wrong position, mask or
    gradient path (an order-1 difference) cannot hide in rounding, and the bound holds on any CPU. HF's models keep
    float32 islands whatever their dtype: RMSNorm computes ``x.to(torch.float32)`` (Llama, Qwen3, Mistral) or
    ``x.float()`` (Gemma), for bfloat16's sake. Inside this test, ``.float()`` and ``.to(torch.float32)`` of a
    float64 tensor keep float64, and so does eager attention's ``softmax(..., dtype=torch.float32)``, so each island
    computes its formula in float64 too (the function is unchanged).
    Bound: two orders of the same float64 sums differ by ~n·2^-53 relative (n ≲ 10^3 terms here), amplified by at
    most ~10^2 in DelTA's σ(Δ/γ) (measured in float32: h 2e-7 -> Ã 2e-5): ≲ 10^-11, so tests assert 1e-10.
    Without the islands a single float32 rounding flipped by a 1e-16 difference moves a value by ~6e-8: 1e-10
    would then fail on some machines and some draws."""
    import copy

    to, flt, softmax = torch.Tensor.to, torch.Tensor.float, torch.nn.functional.softmax

    def to64(self, *args, **kwargs):
        if self.dtype == torch.float64:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kwargs.get("dtype") is torch.float32:
                kwargs["dtype"] = torch.float64
        return to(self, *args, **kwargs)

    def softmax64(x, *args, dtype=None, **kwargs):
        return softmax(
            x, *args, dtype=torch.float64 if x.dtype == torch.float64 and dtype is not None else dtype, **kwargs
        )

    monkeypatch.setattr(torch.Tensor, "to", to64)
    monkeypatch.setattr(torch.nn.functional, "softmax", softmax64)
    monkeypatch.setattr(
        torch.Tensor, "float", lambda self, *a, **k: self if self.dtype == torch.float64 else flt(self, *a, **k)
    )
    return lambda model: copy.deepcopy(model).double()


class _LogProbPolicy(torch.nn.Module):
    """A policy whose log π of each response token is its one parameter ``logp`` [N, T] and whose entropy is the
    buffer ``entropy`` [N, T]: a loss stage's gradient w.r.t. log π is ``logp.grad``."""

    def __init__(self, logp, entropy):
        super().__init__()
        self.logp = torch.nn.Parameter(logp.clone())
        self.register_buffer("entropy", entropy)


def _logprob_micro_batches(model, batch, rows, cfg, grad, asked=None):
    """grpo.py's ``micro_batches`` over a ``_LogProbPolicy``: the layout of the run's flags (the scale path's
    padding-free one with --padding_free, else the plain rows.split), each micro-batch's log π a slice of the
    parameter (a graph to it under ``grad``), its entropy the buffer's."""
    from trainer import policy, scale_passes

    T = batch.response_mask.shape[1]
    layout = scale_passes.micro_batches(rows, batch.attention_mask, cfg.micro_batch_size, T, cfg.padding_free)
    for j, _, t in layout:
        with torch.set_grad_enabled(grad):
            logp = model.logp[j, :t] * 1.0
        yield policy.MicroBatch(j, t, logp, None, model.entropy[j, :t], None, len(layout))


def method_of(cfg):
    """The ``grpo.Method`` of ``cfg``: a comparison's config's (``comparisons.method``), or grpo.py's (GRPOConfig)."""
    import comparisons
    import grpo

    return comparisons.method(cfg) if hasattr(cfg, "fipo") else grpo.paper_method(cfg)


def run_forward(cfg):
    """The passes a run of ``cfg`` takes: the scale path's where ``cfg`` turns it on (θ_old not fused), else plain."""
    import grpo
    from trainer import policy, scale_passes

    return (
        scale_passes.forward(cfg, False)
        if scale_passes.chosen(cfg)
        else policy.Forward(grpo.old_logprobs, grpo.micro_batches)
    )


def step_parts(cfg, forward=None):
    """The ``run_setup.StepParts`` of ``cfg`` (a GRPOConfig, or a comparison's config): its method's loss stage and
    surrogate settings, ``forward`` (None: the run's, ``run_forward``)."""
    from trainer import run_setup

    method = method_of(cfg)
    forward = forward or run_forward(cfg)
    return run_setup.StepParts(forward, method.loss_stage, method.loss_settings.from_config(cfg), None)


def comparison_config(**flags):
    """A config of ``python -m comparisons`` (grpo.py's flags and the comparisons') with ``flags``."""
    import comparisons

    return comparisons.config_class()(**flags)


@pytest.fixture
def loss_stage():
    """``loss_stage(logp, delta, adv, entropy=None, mask=None, ref_logp=None, keep=None, **flags)``: one mini-batch
    (every row) of the trainer's loss stage (its method's, from the flags: ``comparisons.method``), on a policy whose
    log π ``logp`` [N, T] you set (float64): θ_old's log π = ``logp − delta``, Ã = Â ``adv`` [N] on every valid token
    of ``mask`` (default: all) or the token advantages ``adv`` [N, T], the entropies ``entropy`` [N, T] (default 0),
    ``keep`` [N, T] bool the tokens a rule's ``select`` chose (DelTA's Q2; None: all), the flags those of ``python -m
    comparisons`` (max_completion_length T). Returns (loss, ∂loss/∂log π [N, T], the stage's statistic sums, the loss
    weights [N, T])."""
    import dataclasses

    import grpo
    import rollout
    from trainer import policy

    def run(logp, delta, adv, entropy=None, mask=None, ref_logp=None, keep=None, **flags):
        N, T = logp.shape
        mask = torch.ones(N, T, dtype=logp.dtype) if mask is None else mask.to(logp.dtype)
        batch = rollout.RolloutBatch(
            input_ids=torch.ones(N, T + 1, dtype=torch.long),
            attention_mask=torch.cat([torch.ones(N, 1), mask], 1).long(),
            response_ids=torch.ones(N, T, dtype=torch.long),
            response_mask=mask,
            prompt_length=1,
            finish_reasons=["stop"] * N,
            texts=[""] * N,
            prompts=[""] * N,
            num_generations=N,
        )
        model = _LogProbPolicy(logp, torch.zeros(N, T, dtype=logp.dtype) if entropy is None else entropy)
        cfg = comparison_config(**{"max_completion_length": T, **flags})
        if keep is not None:  # DelTA's Q2: its loss stage on the selected tokens
            cfg = dataclasses.replace(cfg, credit="delta", delta_select="top")
        old = policy.ThetaOld(logp - delta, None, ref_logp, {})
        token_adv = (adv[:, None] if adv.dim() == 1 else adv) * mask
        values = {} if keep is None else {"q2_selected": keep}
        parts = step_parts(cfg, policy.Forward(None, _logprob_micro_batches))
        update = grpo.Update(batch, old, token_adv, mask, values, parts)
        loss, stats = parts.loss_stage.backward(model, update, torch.arange(N), cfg)
        weights = mask.clone() if update.loss_factor is None else update.loss_factor  # the default: 1 on each token
        return loss, model.logp.grad, stats, weights

    return run


def backward(model, batch, old, token_adv, rows, cfg, selected=None, forward=None):
    """One mini-batch of the trainer's loss stage of ``cfg`` (its method's, ``comparisons.method``) on ``rows``:
    (loss, statistic sums, each token's loss factor [N, T] (the loss mask where the stage has none)). ``selected``:
    DelTA's Q2 tokens (its credit's ``q2_selected``); ``forward``: the run's passes (None: the plain path's, or the
    scale path's where ``cfg`` turns it on)."""
    import grpo

    values = {} if selected is None else {"q2_selected": selected}
    update = grpo.Update(batch, old, token_adv, batch.response_mask, values, step_parts(cfg, forward))
    loss, stats = update.parts.loss_stage.backward(model, update, rows, cfg)
    return loss, stats, batch.response_mask.clone() if update.loss_factor is None else update.loss_factor


@pytest.fixture(scope="session")
def fipo_by_hand():
    """``fipo_by_hand(delta, adv, mask, decay_rate=32, clip=0.2, safety=10, c=10)``: FIPO's weight f and kept mask
    [B, T] (float64; f = 1 on padding, kept = mask without the dropped responses), docs/specs/baselines.md §5 read
    literally, one token at a time in Python floats (not baselines.py's scan): Δ_t = clamp(Δ, ±20),
    F_t = Σ_{k ≥ t} γ^{k−t} m_k 1[Δ_k ≤ log c] Δ_k with γ = 2^{−1/decay_rate}, f_t = clip(exp F_t, 1, 1 + clip),
    then clip(f_t, 0.8, 1) where Â_i < 0 and r_t = exp Δ_t > safety; a response with more than one valid token with
    Â_i < 0 and r_t > c (the dual clip active) is dropped. ``adv``: Â [B] or Ã [B, T] (its sign per row)."""

    def by_hand(delta, adv, mask, decay_rate=32.0, clip=0.2, safety=10.0, c=10.0):
        gamma = 2.0 ** (-1.0 / decay_rate)
        B, T = delta.shape
        f = torch.ones(B, T, dtype=torch.float64)
        kept = torch.as_tensor(mask, dtype=torch.float64).clone()
        for i in range(B):
            row = adv[i] if adv.dim() == 1 else adv[i][mask[i] > 0]  # Â, or Ã on the valid tokens (Â's sign)
            a = float(row.reshape(-1)[0]) if row.numel() else 0.0
            d = [min(max(float(delta[i, t]), -20.0), 20.0) for t in range(T)]
            valid = [bool(mask[i, t]) for t in range(T)]
            for t in range(T):
                F = sum(gamma ** (k - t) * d[k] for k in range(t, T) if valid[k] and d[k] <= math.log(c))
                w = min(max(math.exp(F), 1.0), 1.0 + clip)
                if a < 0 and math.exp(d[t]) > safety:
                    w = min(max(w, 0.8), 1.0)
                f[i, t] = w if valid[t] else 1.0
            if sum(valid[t] and a < 0 and math.exp(d[t]) > c for t in range(T)) > 1:
                kept[i] = 0.0
        return f, kept

    return by_hand


def stages_4_and_5(model, tok, batch, cfg, adv, answers=None):
    """Stages 4 and 5 of ``grpo.train_step`` under ``cfg`` (a GRPOConfig or a comparison's config): the run's parts
    (``run_setup.step_parts``: the plain passes, or the scale path's where ``cfg`` turns it on), its credit function,
    θ_old's pass and the credit's result. Returns (parts, credit, old, result)."""
    import grpo
    from trainer import credit_methods, policy, run_setup

    method = method_of(cfg)
    credit = method.credit(cfg, tok)
    parts = run_setup.step_parts(cfg, credit, method, policy.Forward(grpo.old_logprobs, grpo.micro_batches))
    old = parts.forward.old_logprobs(model, batch, cfg, credit.asks, None)
    N = batch.response_mask.shape[0]
    answers = answers or [""] * N
    inputs = credit_methods.CreditInputs(batch, adv, old, answers, 0, batch.response_mask, adv, parts.forward)
    return parts, credit, old, credit(model, inputs)

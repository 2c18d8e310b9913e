"""The comparison rules on the trainer's loss stage (docs/specs/baselines.md): SAPO as a branch of ``policy_loss``,
FIPO's future-KL weight and Forking Tokens' entropy mask as their own loss stages (``grpo.LOSS_STAGES``), DelTA's
Q2 selection through its credit and loss stage; the spec's float64 worked examples (Example A, delta.md §7) and the
invariances."""

import math

import pytest
import torch
from conftest import backward, comparison_config

import comparisons
import comparisons.forking_tokens
import grpo
import rollout
import toy
from comparisons import baselines, sapo
from trainer import credit_methods, grpo_config, policy, run_setup

D = torch.float64
# Example A (docs/specs/delta.md §7; baselines.md §1): θ_old's log-probs, Δlog π, Â, the mask
OLD = torch.tensor([[-0.6802696706, -0.1605099803, -1.3091684070], [-0.7099775478, -0.4944093649, 0.0]], dtype=D)
DLOGP = torch.tensor([[0.1, -0.3, 0.05], [0.2, -0.1, 0.0]], dtype=D)
ADV = torch.tensor([0.7071057812, -0.7071057812], dtype=D)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=D)
TOL = 1e-9  # the spec prints 10 digits


def test_sapo_example_a_both_aggregations():
    """§4: seq-mean-token-mean 0.0004341173 (verl's and TRL's), token-mean −0.2777146712."""
    seq, stats = grpo.policy_loss(OLD + DLOGP, OLD, ADV, MASK, sapo.SapoSettings())
    tok, _ = grpo.policy_loss(OLD + DLOGP, OLD, ADV, MASK, sapo.SapoSettings(sapo_aggregation="token"))
    assert float(seq) == pytest.approx(0.0004341173, abs=TOL) and float(tok) == pytest.approx(-0.2777146712, abs=TOL)
    assert stats["clip_ratio/dual_mean"] == 0.0  # no dual clip under SAPO, whatever --dual_clip says
    seq_dual, _ = grpo.policy_loss(OLD + DLOGP, OLD, ADV, MASK, sapo.SapoSettings(dual_clip=1.01))
    assert float(seq_dual) == float(seq)


@pytest.mark.parametrize("aggregation,dapo_like", [("sequence", "grpo"), ("token", "dapo")])
def test_sapo_gradient_is_the_policy_gradient_at_ratio_one(aggregation, dapo_like):
    """§4: at r ≡ 1 SAPO's loss is 2/τ times the clipped surrogate's (τ = 1 on Â > 0, 1.05 on Â < 0) and its
    gradient is the same, under the same aggregation."""
    logp = OLD.clone().requires_grad_(True)
    gated, _ = grpo.policy_loss(logp, OLD, ADV, MASK, sapo.SapoSettings(sapo_aggregation=aggregation))
    (g_sapo,) = torch.autograd.grad(gated, logp)
    logp = OLD.clone().requires_grad_(True)
    dapo, _ = grpo.policy_loss(logp, OLD, ADV, MASK, grpo.LossSettings(loss_type=dapo_like))
    (g_dapo,) = torch.autograd.grad(dapo, logp)
    torch.testing.assert_close(g_sapo, g_dapo, rtol=1e-12, atol=1e-15)
    # the values: per token −Â·2/τ against −Â, so the row means scale by 2/τ of the row's sign
    per_row = torch.tensor([2.0, 2.0 / 1.05], dtype=D)
    rows = -ADV * MASK.sum(1) if dapo_like == "dapo" else -ADV
    expected = (per_row * rows).sum() / (MASK.sum() if dapo_like == "dapo" else 2)
    gated, dapo = float(gated.detach()), float(dapo.detach())
    assert gated == pytest.approx(float(expected), abs=1e-12) and abs(gated - dapo) > 1e-3


def test_sapo_gradient_is_the_gate_derivative():
    """§4: ∂ℓ/∂log π = −Â·w, w = 4s(1 − s)·r with s = σ(τ(r − 1)) (token-mean: divided by N)."""
    logp = (OLD + DLOGP).requires_grad_(True)
    loss, _ = grpo.policy_loss(logp, OLD, ADV, MASK, sapo.SapoSettings(sapo_aggregation="token"))
    (g,) = torch.autograd.grad(loss, logp)
    r = torch.exp(DLOGP)
    tau = torch.tensor([1.0, 1.05], dtype=D)[:, None]  # τ_pos for Â > 0 (row 0), τ_neg for Â < 0
    s = torch.sigmoid(tau * (r - 1))
    torch.testing.assert_close(g, -ADV[:, None] * 4 * s * (1 - s) * r * MASK / MASK.sum(), rtol=1e-12, atol=1e-15)


def test_loss_settings_are_one_object():
    """policy_loss takes its settings as one LossSettings (or the loss's subclass); its fields are the flags'."""
    s = grpo.LossSettings(epsilon=0.05, epsilon_high=0.05, loss_type="grpo")  # clips e^0.1 (Â > 0), e^-0.1 (Â < 0)
    a, sa = grpo.policy_loss(OLD + DLOGP, OLD, ADV, MASK, s)
    b, sb = grpo.policy_loss(OLD + DLOGP, OLD, ADV, MASK, grpo.LossSettings(loss_type="grpo"))  # ε 0.2, 0.28: none
    assert float(a) != float(b) and sa["clip_ratio/region_mean"] > 0 == sb["clip_ratio/region_mean"]  # ε is read
    assert float(grpo.policy_loss(OLD + DLOGP, OLD, ADV, MASK)[0]) == float(
        grpo.policy_loss(OLD + DLOGP, OLD, ADV, MASK, grpo.LossSettings())[0]
    )  # None: the defaults
    assert grpo.LossSettings.from_config(grpo.GRPOConfig(loss_type="grpo")).loss_type == "grpo"
    assert grpo.LossSettings(loss_type="grpo").aggregation == "seq-mean-token-mean"  # the loss's own normaliser
    with pytest.raises(TypeError):
        grpo.policy_loss(OLD, OLD, ADV, MASK, epsilon=0.2)  # a field is the settings', not the function's
    with pytest.raises(TypeError):
        grpo.LossSettings(epsilonn=0.2)


def _fipo_loss(logp, old, adv, mask, num_tokens):
    cfg = comparison_config(fipo=True, dual_clip=10.0)
    token_adv = adv[:, None] * mask
    f, kept = baselines.fipo_weights(
        logp - old,
        token_adv,
        mask,
        cfg.fipo_decay_rate,
        cfg.fipo_clip,
        cfg.fipo_safety_threshold,
        math.log(cfg.dual_clip),
    )
    loss, _ = grpo.policy_loss(
        logp, old, token_adv * f, kept, grpo.LossSettings(dual_clip=10.0), scope=grpo.LossScope(num_tokens)
    )
    return float(loss), f, kept, {"fipo/dropped_frac": float((mask - kept).sum() / mask.sum())}


def test_fipo_example_a_and_its_first_mini_batch(fipo_by_hand):
    """§5: token-mean −0.0980852254 with f = [[1, 1, 1.0512710964], [1.1075416105, 1]]; at Δ ≡ 0, f ≡ 1 and the loss
    is DAPO's at r = 1, −0.1414211562. conftest's ``fipo_by_hand`` gives the spec's f too."""
    loss, f, kept, _ = _fipo_loss(OLD + DLOGP, OLD, ADV, MASK, 5)
    assert loss == pytest.approx(-0.0980852254, abs=TOL)
    spec_f = torch.tensor([[1, 1, 1.0512710964], [1.1075416105, 1, 0]], dtype=D)
    torch.testing.assert_close(f * MASK, spec_f, rtol=0, atol=1e-9)
    assert torch.equal(kept, MASK)
    f_hand, kept_hand = fipo_by_hand(DLOGP, ADV, MASK)
    torch.testing.assert_close(f_hand * MASK, spec_f, rtol=0, atol=1e-9)
    assert torch.equal(kept_hand, MASK)
    loss0, f0, _, _ = _fipo_loss(OLD, OLD, ADV, MASK, 5)
    assert torch.equal(f0 * MASK, MASK) and loss0 == pytest.approx(-0.1414211562, abs=TOL)


def test_fipo_safety_and_sequence_drop(loss_stage, fipo_by_hand):
    """§5: Â = −1, log-ratios [log 12, 0.3, 0.1]: f = [1.0 (safety), 1.2, 1.1051709181], losses [10 (dual clip),
    1.6198305691, 1.2214027582], mean 4.2804111091; with [log 12, log 12, 0.1] the response is dropped: loss 0;
    beside a kept response the trainer's stage removes it from the numerator and the denominator."""
    old, adv, mask = torch.zeros(1, 3, dtype=D), torch.tensor([-1.0], dtype=D), torch.ones(1, 3, dtype=D)
    loss, f, kept, _ = _fipo_loss(torch.tensor([[math.log(12), 0.3, 0.1]], dtype=D), old, adv, mask, 3)
    torch.testing.assert_close(f, torch.tensor([[1.0, 1.2, 1.1051709181]], dtype=D), rtol=0, atol=1e-9)
    f_hand, kept_hand = fipo_by_hand(torch.tensor([[math.log(12), 0.3, 0.1]], dtype=D), adv, mask)
    torch.testing.assert_close(f_hand, torch.tensor([[1.0, 1.2, 1.1051709181]], dtype=D), rtol=0, atol=1e-9)
    assert torch.equal(kept_hand, mask)
    assert fipo_by_hand(torch.tensor([[math.log(12), math.log(12), 0.1]], dtype=D), adv, mask)[1].sum() == 0
    assert loss == pytest.approx(4.2804111091, abs=TOL)
    loss, _, kept, stats = _fipo_loss(torch.tensor([[math.log(12), math.log(12), 0.1]], dtype=D), old, adv, mask, 3)
    assert loss == 0.0 and kept.sum() == 0 and stats["fipo/dropped_frac"] == 1.0
    # beside a kept response: the kept one's mean over its own 3 tokens (spec §5; policy_loss alone, given the
    # mini-batch's 6 tokens, would halve it: fipo_backward rescales once the drop is known)
    two = torch.tensor([[math.log(12), math.log(12), 0.1], [math.log(12), 0.3, 0.1]], dtype=D)
    loss, _, _, _ = loss_stage(
        torch.zeros(2, 3, dtype=D),
        two,
        torch.tensor([-1.0, -1.0], dtype=D),
        credit="fipo",
        micro_batch_size=1,
        padding_free=False,
    )
    assert loss == pytest.approx(4.2804111091, abs=TOL)


def fipo_batch():
    """6 responses of up to 7 tokens (float64): log π, Δ = log π − log π_old (|Δ| ~ 0.3), Â of each sign and 0, the
    mask; ratios r = 12 (Δ = log 12 > log c, c = 10) on: response 1 (Â < 0) twice, dropped; response 3 (Â < 0)
    once, kept and dual-clipped; response 0 (Â > 0) twice, kept (the drop needs Â < 0); response 4
    (Â < 0) once on a valid token (safety-clipped) and once on padding, kept. Every such token is left out of F."""
    g = torch.Generator().manual_seed(10)
    logp = -torch.rand(6, 7, generator=g, dtype=D) - 0.1
    delta = 0.3 * torch.randn(6, 7, generator=g, dtype=D)
    for i, t in ((1, 1), (1, 4), (3, 2), (0, 0), (0, 5), (4, 1), (4, 6)):
        delta[i, t] = math.log(12.0)
    adv = torch.tensor([0.9, -1.1, 0.4, -0.6, -1.3, 0.0], dtype=D)
    mask = (torch.arange(7)[None] < torch.tensor([7, 6, 4, 7, 5, 3])[:, None]).to(D)
    return logp, delta, adv, mask


def test_fipo_weights_and_drops_equal_the_formula_by_hand(fipo_by_hand):
    """baselines.fipo_weights' f and kept mask against spec §5 computed token by token (conftest ``fipo_by_hand``):
    the discounted future sum with the high-ratio tokens left out, the clip to [1, 1.2], the safety clip and the
    drop of a response with two dual-clipped tokens. Bound: F sums at most 7 terms γʲ·Δ, Σ|γʲΔ| ≤ 7·log 10 < 17, in
    another order than the scan and with γʲ as a power, not a product (j ≤ 6 roundings): |δF| ≤ 2·7·2⁻⁵³·17 < 3e-14;
    f = clip(exp F) ≤ 1.2 moves by at most 1.2·(|δF| + 2⁻⁵³) < 4e-14: 1e-13."""
    _, delta, adv, mask = fipo_batch()
    f, kept = baselines.fipo_weights(delta, adv, mask)
    f_hand, kept_hand = fipo_by_hand(delta, adv, mask)
    assert kept_hand.sum(1).tolist() == [7.0, 0.0, 4.0, 7.0, 5.0, 3.0]  # response 1 dropped, and only it
    assert torch.equal(kept, kept_hand)
    torch.testing.assert_close(f * mask, f_hand * mask, rtol=0, atol=1e-13)
    # the branches taken: the cap 1.2 (4, 0); the safety clip (4, 1), whose exp F > 1.2; an up-weight inside (2, 1)
    assert float(f_hand[4, 0]) == 1.2 and float(f_hand[4, 1]) == 1.0 and 1.0 < float(f_hand[2, 1]) < 1.2
    f2, kept2 = baselines.fipo_weights(delta, adv[:, None] * mask, mask)  # Ã [B, T]: the same
    assert torch.equal(f2, f) and torch.equal(kept2, kept)


def test_fipo_stage_is_the_dual_clip_loss_on_the_hand_weights(loss_stage, fipo_by_hand):
    """The trainer's loss stage with --credit fipo (c = 10, ε 0.2 / 0.28, DAPO's token-mean) at micro-batch sizes 1
    and 6: value and gradient w.r.t. log π of Σ_kept ℓ(Â·f, r) / Σ kept, f and kept by hand (spec §5), ℓ the dual-clip
    surrogate, the dropped response out of both sums. Bound: each |ℓ| ≤ c·|Â|·f ≤ 10·1.3·1.2 < 16 moves by at most
    16·4e-14/1.2 through f (the bound above) and the mean of 32 terms adds 32·2⁻⁵³·16: below 1e-12."""
    logp, delta, adv, mask = fipo_batch()
    f, kept = fipo_by_hand(delta, adv, mask)
    leaf = logp.clone().requires_grad_(True)
    r = torch.exp(leaf - (logp - delta))
    token_adv = adv[:, None] * f
    ell = torch.maximum(-token_adv * r, -token_adv * r.clamp(0.8, 1.28))
    ell = torch.where(token_adv < 0, torch.minimum(ell, -token_adv * 10.0), ell)
    want = (ell * kept).sum() / kept.sum()
    want.backward()
    for size in (1, 6):
        loss, grad, _, _ = loss_stage(
            logp, delta, adv, mask=mask, credit="fipo", micro_batch_size=size, padding_free=False
        )
        assert float(loss) == pytest.approx(float(want.detach()), abs=1e-12)
        torch.testing.assert_close(grad * mask, leaf.grad * mask, rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------ on the trainer's stages
@pytest.fixture(scope="module")
def toy_batch(toy_model_path):
    torch.manual_seed(0)
    model, tok = policy.load_model_and_tokenizer(toy_model_path)
    rows = toy.make_split("train")[:4]
    batch = rollout.generate(model, tok, [r["problem"] + "\n" for r in rows], 4, rollout.SamplingSettings(40, seed=5))
    return model, tok, batch


def _credit(model, tok, batch, adv, rewards, **flags):
    """Stages 4 and 5 as grpo.train_step runs them with the flags' method and passes (``python -m comparisons``'
    flags): (cfg, the step's parts, θ_old, the credit's result)."""
    N = batch.response_mask.shape[0]
    cfg = comparison_config(max_completion_length=40, **flags)
    method = comparisons.method(cfg)
    credit = method.credit(cfg, tok)
    parts = run_setup.step_parts(cfg, credit, method, policy.Forward(grpo.old_logprobs, grpo.micro_batches))
    old = parts.forward.old_logprobs(model, batch, cfg, credit.asks, None)
    inputs = credit_methods.CreditInputs(batch, adv, old, [""] * N, 0, batch.response_mask, rewards, parts.forward)
    return cfg, parts, old, credit(model, inputs)


def _update(model, tok, batch, **flags):
    """θ_old, the credit and one mini-batch's backward, as grpo.train_step runs them with the flags' method and
    passes (``python -m comparisons``' flags): (loss, gradient, the credit's token values, loss weights, stats)."""
    N = batch.response_mask.shape[0]
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0] * (N // 4), dtype=next(model.parameters()).dtype), 4)
    cfg, parts, old, result = _credit(model, tok, batch, adv, adv, **{"dual_clip": 10.0, **flags})
    model.zero_grad(set_to_none=True)
    update = grpo.Update(batch, old, result.token_adv, batch.response_mask, result.token_values, parts)
    loss, stats = parts.loss_stage.backward(model, update, torch.arange(N), cfg)
    weights = batch.response_mask.clone() if update.loss_factor is None else update.loss_factor
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return loss, grad, result.token_values, weights, stats


@pytest.mark.parametrize("flag", [{"entropy_top_ratio": 0.2}, {"top_entropy_quantile": 0.2}])
def test_a_statistic_is_a_mean_over_its_own_tokens_at_every_micro_batch_size(toy_batch, float64_model, flag):
    """minibatch_backward weighs each statistic by the tokens it is a mean over (``"n:" + name``, else the loss's
    tokens) and log_step divides by the same sum, so a mini-batch's statistic does not depend on how its rows are
    split: Forking Tokens' kept share is over the valid tokens, which its loss mask (the picked ones) does not count
    (weighted by the picked tokens, a micro-batch with fewer of them counted less). Float64 model, the shares from
    exact counts: 1e-10 relative, as above."""
    model, tok, batch = toy_batch
    model = float64_model(model)
    means = []
    for mbs in (0, 3):
        *_, sums = _update(model, tok, batch, micro_batch_size=mbs, **flag)
        counts = {key[2:]: sums[key] for key in sums if key.startswith("n:")}
        means.append({k: v / max(counts.get(k, sums["num_tokens"]), 1.0) for k, v in sums.items() if k[:2] != "n:"})
    valid = batch.response_mask.bool()
    assert sums["n:forking/kept_frac"] == int(valid.sum())
    for key in means[0]:
        assert means[1][key] == pytest.approx(means[0][key], rel=1e-10, abs=1e-14), key


def test_fipo_is_dapo_on_the_first_mini_batch(toy_batch, float64_model):
    """At θ = θ_old (the fused training forward: the ratio is exactly 1) FIPO's weight is 1 and its update DAPO's."""
    model, tok, batch = toy_batch
    model = float64_model(model)
    loss_f, g_f, _, w, stats = _update(model, tok, batch, fipo=True, fuse_old_logprobs=True)
    loss_d, g_d, _, _, _ = _update(model, tok, batch, credit="grpo", fuse_old_logprobs=True)
    assert loss_f == loss_d and torch.equal(g_f, g_d) and g_d.abs().sum() > 0
    assert torch.equal(w, batch.response_mask.to(w.dtype)) and stats["fipo/dropped_frac"] == 0.0


@pytest.mark.parametrize(
    "flag",
    [{"entropy_top_ratio": 0.2}, {"top_entropy_quantile": 0.2}, {"top_entropy_quantile": 0.2, "loss_type": "grpo"}],
)
def test_forking_tokens_do_not_depend_on_micro_batching(toy_batch, float64_model, flag):
    """The mini-batch pool: one ranking over the mini-batch, so --micro_batch_size and --padding_free leave the loss
    and the gradient unchanged (float64, 1e-10 relative); the official rule keeps ⌈ρn⌉ tokens."""
    model, tok, batch = toy_batch
    model = float64_model(model)
    runs = [
        _update(model, tok, batch, micro_batch_size=mbs, padding_free=pf, **flag)
        for mbs, pf in ((0, True), (3, True), (2, False))
    ]
    (l0, g0, _, w0, _) = runs[0]
    for l1, g1, _, w1, _ in runs[1:]:
        assert l1 == pytest.approx(l0, rel=1e-10, abs=1e-12)
        assert (g1 - g0).norm() <= 1e-10 * g0.norm() and torch.equal(w1, w0)
    n = int(batch.response_mask.sum())
    if "entropy_top_ratio" in flag:
        assert int(w0.sum()) == max(1, math.ceil(0.2 * n - 1e-9))
    else:
        assert int(w0.sum()) >= math.floor(0.2 * n)


def test_forking_tokens_keep_the_highest_entropies(toy_batch, float64_model):
    """The kept tokens are the top ⌈ρn⌉ by the entropy of softmax(z/T) computed here from the full logits."""
    model, tok, batch = toy_batch
    model = float64_model(model).eval()
    _, _, _, w, _ = _update(model, tok, batch, entropy_top_ratio=0.25)
    T = batch.response_mask.shape[1]
    with torch.no_grad():
        pos = (batch.attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        z = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=pos).logits
        p = torch.softmax(z[:, -T - 1 : -1].double(), -1)
        ent = -(p * torch.log(p.clamp(min=1e-300))).sum(-1)
    valid = batch.response_mask.bool()
    kept, rest = ent[valid & (w > 0)], ent[valid & (w == 0)]
    assert len(kept) == math.ceil(0.25 * int(valid.sum()) - 1e-9) and kept.min() >= rest.max() - 1e-9


@pytest.mark.parametrize("which", ["top", "bottom", "random"])
def test_delta_q2_selection_trains_on_half_the_tokens_by_lambda(toy_batch, which):
    model, tok, batch = toy_batch
    loss, _, token_values, w, _ = _update(model, tok, batch, credit="delta", delta_select=which)
    valid = batch.response_mask.bool()
    lam = token_values["lam_bar"]
    kept = w > 0  # the loss's tokens (Q2Selection's keep)
    assert int(kept.sum()) == math.ceil(0.5 * int(valid.sum()) - 1e-9) and not (kept & ~valid).any()
    if which == "top":
        assert lam[kept].min() >= lam[valid & ~kept].max()
    if which == "bottom":
        assert lam[kept].max() <= lam[valid & ~kept].min()


def test_delta_q2_credits_only_the_selected_tokens_and_no_signal_takes_no_step(toy_batch):
    """Q2's Ã is Â on its selected tokens and 0 on the rest; where every selected token has Â = 0 (the bottom of the
    ranking: DelTA gives the Â = 0 responses' tokens λ_min) the update sees no signal and takes no AdamW step."""
    model, tok, batch = toy_batch
    N = batch.response_mask.shape[0]
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0] * (N // 8))  # every other group has Â = 0
    adv = grpo.group_advantages(rewards, 4)
    flags = dict(credit="delta", delta_select="bottom", delta_select_fraction=0.1)
    cfg, parts, old, result = _credit(model, tok, batch, adv, rewards, **flags)
    selected = result.token_values["q2_selected"]
    assert selected.any() and (adv[:, None].expand_as(selected)[selected] == 0).all()  # the bottom: Â = 0 tokens
    torch.testing.assert_close(result.token_adv, adv[:, None] * batch.response_mask * selected, rtol=0, atol=0)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    update = grpo.Update(batch, old, result.token_adv, batch.response_mask, result.token_values, parts)
    loss_sum, grad_norms, sums, skipped = grpo.policy_update(model, optimizer, update, cfg, step=0)
    assert sums["no_signal"] == 1.0 and grad_norms == [] and loss_sum == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize(
    "flags",
    [
        {"delta_scores": "within_side"},
        {"delta_assignment": "hard"},
        {"delta_coefficients": "raw"},
        {"delta_normalize": False},
        {"delta_proxy": "topk", "delta_proxy_topk": 7},
        {"delta_k": 2},
    ],
)
def test_delta_variants_give_one_lambda_under_both_implementations(toy_batch, float64_model, flags):
    """Every DelTA ablation through the trainer: --delta_impl normal (the batch's h kept) and memory_efficient (h
    recomputed, K + 3 streamed passes) give the same λ̄ (float64, 1e-10); the invariants hold."""
    model, tok, batch = toy_batch
    model = float64_model(model)
    N, mask = batch.response_mask.shape[0], batch.response_mask
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0] * (N // 4), dtype=D), 4)
    lam = {}
    for impl in ("normal", "memory_efficient"):
        cfg = comparison_config(credit="delta", delta_impl=impl, **flags)
        credit = comparisons.method(cfg).credit(cfg, tok)
        old = grpo.old_logprobs(model, batch, cfg, credit.asks)
        forward = policy.Forward(grpo.old_logprobs, grpo.micro_batches)
        result = credit(model, credit_methods.CreditInputs(batch, adv, old, [""] * N, 0, mask, adv, forward))
        token_adv = result.token_adv
        lam[impl] = result.token_values["lam_bar"]
        valid = mask.bool() & (adv != 0)[:, None]
        assert (torch.sign(token_adv[valid]) == torch.sign(adv[:, None].expand_as(mask)[valid])).all()
    torch.testing.assert_close(lam["memory_efficient"], lam["normal"], rtol=1e-10, atol=1e-10)
    total = float((lam["normal"] * mask).sum())
    if flags.get("delta_normalize", True):  # Σ λ̄·mask = N
        assert total == pytest.approx(float(mask.sum()), rel=1e-12)
    else:
        assert abs(total - float(mask.sum())) > 1e-6


@pytest.mark.parametrize("flag", [{"entropy_top_ratio": 0.3}, {"top_entropy_quantile": 0.3}])
def test_entropy_pools_agree_on_one_micro_batch(toy_batch, float64_model, flag):
    """--entropy_pool micro ranks each micro-batch (Forking Tokens' code) and divides by the kept tokens summed
    over micro-batches; with the mini-batch as one micro-batch it is the mini-batch pool (float64, 1e-10)."""
    model, tok, batch = toy_batch
    model = float64_model(model)
    one = dict(micro_batch_size=0, padding_free=False, **flag)
    l_mini, g_mini, _, w_mini, _ = _update(model, tok, batch, entropy_pool="minibatch", **one)
    l_micro, g_micro, _, w_micro, _ = _update(model, tok, batch, entropy_pool="micro", **one)
    assert l_micro == pytest.approx(l_mini, rel=1e-10) and torch.equal(w_micro, w_mini)
    assert (g_micro - g_mini).norm() <= 1e-10 * g_mini.norm()
    # several micro-batches: each ranks its own rows, so the kept set differs from the mini-batch's ranking
    _, _, _, w_split, _ = _update(model, tok, batch, entropy_pool="micro", micro_batch_size=4, **flag)
    assert not torch.equal(w_split, w_mini)


def test_policy_loss_on_example_b_dapo_and_delta():
    """baselines.md §1 Example B through the trainer's loss (ε 0.2 / 0.28, dual clip 10): DAPO's token-mean
    −0.0546432602 and, with Ã = Â·λ̄ of delta.py's default call on its proxy vectors, DelTA's −0.0774846123 (§6)."""
    import delta

    v = torch.tensor(
        [
            [[0.5, 0.2], [0.1, 0.9], [-0.3, 0.4], [0.8, -0.1]],
            [[0.4, 0.3], [-0.6, 0.2], [0.2, -0.5], [0.0, 0.0]],
            [[0.0, 0.7], [0.3, 0.1], [-0.2, -0.4], [0.6, 0.6]],
        ],
        dtype=D,
    )
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=D)
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0], dtype=D), 3)
    torch.testing.assert_close(
        adv, torch.tensor([1.1546985384, -0.5773492692, -0.5773492692], dtype=D), rtol=0, atol=1e-9
    )
    dlogp = torch.tensor([[0.1, -0.2, 0.3, 0.0], [0.05, -0.1, 0.2, 0.0], [-0.3, 0.1, 0.0, 0.25]], dtype=D)
    old = torch.zeros(3, 4, dtype=D)
    dapo, _ = grpo.policy_loss(old + dlogp, old, adv, mask, grpo.LossSettings(dual_clip=10.0))
    lam_bar = delta.delta_coefficients(v, adv, mask).lam_bar
    ours, _ = grpo.policy_loss(
        old + dlogp, old, delta.delta_token_advantages(adv, lam_bar, mask), mask, grpo.LossSettings(dual_clip=10.0)
    )
    assert float(dapo) == pytest.approx(-0.0546432602, abs=TOL) and float(ours) == pytest.approx(-0.0774846123, abs=TOL)


# ------------------------------------------- the authors' minimal cases through the loss stage (issue #38, 1 and 2)
@pytest.mark.parametrize("pool", ["minibatch", "micro"])
@pytest.mark.parametrize("loss_type,value", [("grpo", -0.5), ("sapo", -1.0), ("dapo", -0.5), ("dr_grpo", -0.5)])
def test_entropy_quantile_keeps_every_token_in_the_normaliser(loss_stage, pool, loss_type, value):
    """Issue #38 item 1, TRL's numbers: one response of two tokens, Â = +1, entropies [1, 0], quantile 0.5, at
    θ_old: TRL multiplies ℓ by the mask [1, 0] and divides by both tokens: loss −0.5 (SAPO −1.0: its gate is 2 at
    r = 1), ∂/∂log π [−0.5, 0] (SAPO's gradient is the policy gradient's at r = 1). The old stage divided a
    per-sequence loss by the kept token only: −1.0 (SAPO −2.0), [−1, 0]."""
    logp = torch.full((1, 2), math.log(0.5), dtype=D)
    loss, grad, stats, w = loss_stage(
        logp,
        torch.zeros(1, 2, dtype=D),
        torch.tensor([1.0], dtype=D),
        torch.tensor([[1.0, 0.0]], dtype=D),
        top_entropy_quantile=0.5,
        entropy_pool=pool,
        loss_type=loss_type,
    )
    assert loss == pytest.approx(value, abs=1e-15)
    torch.testing.assert_close(grad, torch.tensor([[-0.5, 0.0]], dtype=D), rtol=0, atol=1e-15)
    assert torch.equal(w, torch.tensor([[1.0, 0.0]], dtype=D))
    assert stats["forking/kept_frac"] / stats["n:forking/kept_frac"] == 0.5  # Σ mean·count over Σ its count


@pytest.mark.parametrize("loss_type", ["grpo", "sapo", "dapo"])
def test_entropy_quantile_micro_batch_size_and_pools(loss_stage, loss_type):
    """Three responses off θ_old (|o| 3, 2, 3 tokens: the normaliser is each one's length, not its kept tokens), the
    mini-batch pool at micro_batch_size 1 and the whole mini-batch give one loss and gradient (float64); so does the
    micro pool where each row ranks as the pool does (each row's own 0.5 quantile picks what the pool's does). Hand
    value: policy_loss with Ã × mask over every valid token, TRL's ℓ × mask / |o_i|."""
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 3, generator=g, dtype=D)
    delta = 0.3 * torch.randn(3, 3, generator=g, dtype=D)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=D)
    entropy = torch.tensor([[2.0, 1.0, 0.0], [1.0, 0.0, 0.0], [2.0, 1.0, 0.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=D)
    runs = []
    for pool, mbs in (("minibatch", 0), ("minibatch", 1), ("micro", 1), ("micro", 0)):
        loss, grad, _, w = loss_stage(
            logp,
            delta,
            adv,
            entropy,
            mask,
            top_entropy_quantile=0.5,
            entropy_pool=pool,
            micro_batch_size=mbs,
            loss_type=loss_type,
            padding_free=False,
        )
        runs.append((loss, grad.clone(), w))
    for loss, grad, w in runs[1:]:
        assert loss == pytest.approx(runs[0][0], rel=1e-13, abs=1e-15) and torch.equal(w, runs[0][2])
        torch.testing.assert_close(grad, runs[0][1], rtol=1e-13, atol=1e-15)
    picked = (entropy >= 1.0).to(D) * mask  # the 0.5 quantile of [0, 0, 0, 1, 1, 1, 2, 2] is 1
    assert torch.equal(runs[0][2], picked)
    want, _ = grpo.policy_loss(
        logp,
        logp - delta,
        adv[:, None] * picked,
        mask,
        comparisons.method(comparison_config(loss_type=loss_type)).loss_settings(
            loss_type=loss_type, max_completion_length=3
        ),
    )  # Ã·m over every valid token: TRL's ℓ·m / |o_i|
    assert runs[0][0] == pytest.approx(float(want), rel=1e-13)


DROP = torch.tensor([[0.0, 0.0], [math.log(12), math.log(12)]], dtype=D)  # issue #38 item 2's log-ratios


@pytest.mark.parametrize("dual_clip", [None, 10.0])
@pytest.mark.parametrize("micro_batch_size", [0, 1])
def test_fipo_drop_leaves_the_denominator(loss_stage, dual_clip, micro_batch_size):
    """Issue #38 item 2, FIPO's numbers: Δ = [[0, 0], [log 12, log 12]], Â = [+1, −1], c = 10: the second response
    has two dual-clipped tokens and is dropped from the numerator and the denominator: loss −1.0, ∂/∂log π
    [[−0.5, −0.5], [0, 0]] (the old stage kept its tokens in the denominator: −0.5, [[−0.25, −0.25], [0, 0]]), at
    micro_batch_size 1 (the drop is seen after the first row's backward) and the whole mini-batch; c = 10 without
    --dual_clip (FIPO's code)."""
    logp = torch.full((2, 2), math.log(0.5), dtype=D)
    loss, grad, stats, w = loss_stage(
        logp,
        DROP,
        torch.tensor([1.0, -1.0], dtype=D),
        credit="fipo",
        dual_clip=dual_clip,
        micro_batch_size=micro_batch_size,
        padding_free=False,
    )
    assert loss == pytest.approx(-1.0, abs=1e-15)
    torch.testing.assert_close(grad, torch.tensor([[-0.5, -0.5], [0.0, 0.0]], dtype=D), rtol=0, atol=1e-15)
    assert torch.equal(w, torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=D))  # the dropped response trains on nothing


def test_fipo_applies_its_dual_clip_without_the_flag(loss_stage):
    """FIPO's code always applies its dual clip (clip_ratio_c 10): one negative token at r = 12 (not dropped: one
    dual-clipped token) loses min(12, 10) = 10, with or without --dual_clip 10; plain DAPO's loss is 12."""
    delta = torch.tensor([[math.log(12), 0.0]], dtype=D)
    logp = torch.full((1, 2), math.log(0.5), dtype=D)
    adv = torch.tensor([-1.0], dtype=D)
    # f ≡ 1 (F = 0: token 0's Δ > log c is left out of the sum; its safety clip keeps 1); token 1: r = 1, ℓ = 1
    for flags in ({}, {"dual_clip": 10.0}):
        loss, _, stats, _ = loss_stage(logp, delta, adv, fipo=True, **flags)
        assert loss == pytest.approx((10.0 + 1.0) / 2, abs=1e-12) and stats["fipo/dropped_frac"] == 0.0
    loss, _, _, _ = loss_stage(logp, delta, adv)
    assert loss == pytest.approx((12.0 + 1.0) / 2, abs=1e-12)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_fipo_drop_is_exact_at_every_micro_batch_size(toy_batch, float64_model, loss_type):
    """FIPO's drop on the toy (float64): θ_old moved so that one negative response has two tokens at r = 12 and the
    rest Δ ~ 0.05: micro_batch_size 1, 3 and the whole mini-batch give one loss and gradient (1e-10: the drop is
    seen only by its own micro-batch's forward, the gradient rescaled after the last one); under dapo they equal the
    same update with that response left out of the batch (``keep``), where nothing is dropped (grpo: divided by one
    sequence fewer)."""
    model, tok, batch = toy_batch
    model = float64_model(model)
    N, mask = batch.response_mask.shape[0], batch.response_mask.to(D)
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0] * (N // 4), dtype=D), 4)
    theta = grpo.old_logprobs(model, batch, grpo.GRPOConfig(max_completion_length=40))
    delta = 0.05 * torch.randn(mask.shape, generator=torch.Generator().manual_seed(1), dtype=D) * mask
    row = int(((adv < 0) & (mask.sum(1) >= 2)).nonzero()[0])
    delta[row, :2] = math.log(12)
    old = theta._replace(logp=theta.logp - delta)
    token_adv = adv[:, None] * mask

    def update(**flags):
        cfg = comparison_config(fipo=True, loss_type=loss_type, max_completion_length=40, **flags)
        model.zero_grad(set_to_none=True)
        loss, _, weights = backward(model, batch, old, token_adv, torch.arange(N), cfg)
        return loss, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]), weights

    runs = [update(micro_batch_size=mbs, padding_free=pf) for mbs, pf in ((0, True), (1, False), (3, True))]
    l0, g0, w0 = runs[0]
    assert w0[row].sum() == 0 and (w0.sum(1) > 0).sum() == (mask.sum(1) > 0).sum() - 1  # that one response, dropped
    for loss, grad, _ in runs[1:]:
        assert loss == pytest.approx(l0, rel=1e-10) and (grad - g0).norm() <= 1e-10 * g0.norm()


@pytest.mark.parametrize("pool", ["minibatch", "micro"])
@pytest.mark.parametrize("rho,official,trl", [(0.2, -0.7433598698, -0.1486719740), (0.5, -0.2203905546, -0.1322343328)])
def test_forking_tokens_example_a_through_the_loss_stage(loss_stage, pool, rho, official, trl):
    """baselines.md §3's worked example through its loss stage (Example A's entropies H, Δ and Â): Forking
    Tokens' code (``--entropy_top_ratio``: the top ⌈ρn⌉ tokens, their mean) and TRL's reading
    (``--top_entropy_quantile``: ℓ × the mask over all N = 5 tokens), the same mask at both ρ; one micro-batch, so
    both pools rank the same tokens."""
    H = torch.tensor([[1.0201913367, 0.4983717768, 1.0883583966], [1.0376992061, 0.8280477897, 0.0]], dtype=D)
    for flags, value in (({"entropy_top_ratio": rho}, official), ({"top_entropy_quantile": rho}, trl)):
        loss, _, _, w = loss_stage(OLD + DLOGP, DLOGP, ADV, H, MASK, entropy_pool=pool, padding_free=False, **flags)
        assert loss == pytest.approx(value, abs=TOL) and int(w.sum()) == (1 if rho == 0.2 else 3)


# ------------------------------------------------------------------- the KL term beside a token rule (issue #43, 9)
def _k3_term(logp, ref, mask, loss_type):
    """The default loss's k3 term (β = 1) over every valid token, by hand: k3 = e^d − d − 1, d = ref − log π, reduced
    as the loss reduces: Σ / Σmask (dapo), the mean of the rows' token-means (grpo), Σ / (N·T) (dr_grpo); and its
    gradient, (1 − e^d)·mask over the same normaliser. Returns (value, ∂/∂log π [N, T])."""
    d = ref - logp
    k3 = (torch.exp(d) - d - 1) * mask
    grad = (1 - torch.exp(d)) * mask
    N, T = mask.shape
    if loss_type == "dapo":
        return float(k3.sum() / mask.sum()), grad / mask.sum()
    if loss_type == "grpo":
        return float((k3.sum(1) / mask.sum(1)).sum() / N), grad / mask.sum(1, keepdim=True) / N
    return float(k3.sum() / (N * T)), grad / (N * T)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
@pytest.mark.parametrize(
    "flags",
    [
        {},
        {"entropy_top_ratio": 0.4},
        {"top_entropy_quantile": 0.4},
        {"entropy_top_ratio": 0.4, "entropy_pool": "micro", "micro_batch_size": 1},
        {"delta_select": "top"},
    ],
    ids=["default", "forking", "forking_trl", "forking_micro", "delta_q2"],
)
def test_the_kl_term_covers_every_valid_token_beside_a_token_rule(loss_stage, flags, loss_type):
    """With β > 0 a rule that keeps some tokens (Forking Tokens, DelTA's Q2) leaves the k3 term the default loss's:
    over every valid token with the default's normaliser, as Forking Tokens' and FIPO's code add verl's
    kl_loss = agg_loss(k3, response_mask) to the masked policy loss. Float64: the loss at β minus the loss at β = 0
    is β × the hand k3 term, value and gradient w.r.t. log π (1e-12; before, the k3 term covered the kept tokens
    only, divided by their count)."""
    g = torch.Generator().manual_seed(3)
    N, T, beta = 4, 5, 0.04
    logp = -torch.rand(N, T, generator=g, dtype=D) - 0.1
    delta = 0.4 * torch.randn(N, T, generator=g, dtype=D)
    ref = logp + 0.3 * torch.randn(N, T, generator=g, dtype=D)
    adv = torch.tensor([1.0, -0.5, 0.75, -1.25], dtype=D)
    mask = (torch.arange(T)[None] < torch.tensor([5, 2, 4, 3])[:, None]).to(D)
    entropy = torch.randperm(N * T, generator=g).reshape(N, T).to(D) / 8
    keep = (torch.rand(N, T, generator=g) < 0.5) & mask.bool() if "delta_select" in flags else None
    common = dict(loss_type=loss_type, padding_free=False, keep=keep, **flags)
    loss, grad, stats, w = loss_stage(logp, delta, adv, entropy, mask, ref, beta=beta, **common)
    loss0, grad0, _, w0 = loss_stage(logp, delta, adv, entropy, mask, **common)
    assert torch.equal(w, w0) and (0 < (w > 0).sum() < mask.sum() if flags else torch.equal(w, mask))
    k3, k3_grad = _k3_term(logp, ref, mask, loss_type)
    assert loss == pytest.approx(loss0 + beta * k3, rel=1e-12, abs=1e-14)
    torch.testing.assert_close(grad, grad0 + beta * k3_grad, rtol=1e-12, atol=1e-14)
    d = ref - logp  # the logged kl: k3's mean over the valid tokens, at every micro-batch size (its count "n:kl")
    assert stats["kl"] / stats["n:kl"] == pytest.approx(
        float(((torch.exp(d) - d - 1) * mask).sum() / mask.sum()), rel=1e-12
    )


def test_fipo_with_a_kl_term_is_refused_in_one_line():
    """FIPO's sequence drop rescales the whole accumulated gradient after the last micro-batch (fipo_rescale), which
    would rescale the k3 term too: check_config refuses the pair before any model loads."""
    with pytest.raises(SystemExit, match=r"^grpo.py: error: --fipo with --beta > 0: [^\n]*--beta 0[^\n]*$"):
        grpo_config.check_config(comparison_config(fipo=True, beta=0.01))
    with pytest.raises(SystemExit, match=r"^grpo.py: error: --fipo with --beta > 0"):
        grpo_config.check_config(comparison_config(credit="fipo", beta=0.01))  # the old spelling
    grpo_config.check_config(comparison_config(fipo=True))
    grpo_config.check_config(comparison_config(entropy_top_ratio=0.2, beta=0.01))


@pytest.mark.parametrize(
    "flags",
    [
        {"entropy_top_ratio": 1.0},  # Forking Tokens keeping every valid token (⌈1.0·n⌉ = n), its code's mean
        {"credit": "delta", "delta_select": "top", "delta_select_fraction": 1.0},  # Q2 selecting every token
        {"credit": "delta", "delta_select": "random", "delta_select_fraction": 1.0},
    ],
)
def test_a_comparison_at_its_neutral_setting_is_the_papers_loss_stage(toy_batch, float64_model, flags):
    """A comparison's whole function, at the setting where its rule changes nothing, gives the paper's loss stage
    (``grpo.minibatch_backward``, --credit grpo): the same loss and gradient in float64. Bound: the two sum the
    same terms in other orders and groupings (a masked sum, a count); float64 reorderings of n ≲ 10^3 terms stay
    within ~n·2^-53 ≈ 1e-13 relative, so 1e-11 cannot hide an order-1 difference (a token left out or counted
    twice moves them by ≥ 1/n)."""
    model, tok, batch = toy_batch
    model = float64_model(model)
    own = comparisons.method(comparison_config(**flags)).loss_stage.backward
    assert own is not grpo.minibatch_backward  # the comparison's own stage runs
    loss_c, g_c, _, _, _ = _update(model, tok, batch, **flags)
    loss_p, g_p, _, _, _ = _update(model, tok, batch, credit="grpo")
    assert g_p.abs().sum() > 0
    assert loss_c == pytest.approx(loss_p, rel=1e-11, abs=1e-14)
    torch.testing.assert_close(g_c, g_p, rtol=1e-11, atol=1e-14)


def test_forking_tokens_quantile_one_is_the_papers_loss_stage(toy_batch, float64_model):
    """TRL's reading at ρ = 1 (entropy ≥ its 0-quantile: every valid token kept, the normaliser unchanged) through
    Forking Tokens' loss stage itself: the paper's loss and gradient (float64, the bound above)."""
    model, tok, batch = toy_batch
    model = float64_model(model)
    N = batch.response_mask.shape[0]
    cfg = comparison_config(dual_clip=10.0, max_completion_length=40, top_entropy_quantile=1.0)
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0] * (N // 4), dtype=torch.float64), 4)
    old = grpo.old_logprobs(model, batch, cfg)
    token_adv = adv[:, None] * batch.response_mask.to(adv.dtype)
    results = []
    forking = comparisons.forking_tokens.forking_backward
    plain = policy.Forward(grpo.old_logprobs, grpo.micro_batches)
    for backward_of in (forking, grpo.minibatch_backward):
        model.zero_grad(set_to_none=True)
        parts = run_setup.StepParts(plain, grpo.LossStage(backward_of), grpo.LossSettings.from_config(cfg), None)
        update = grpo.Update(batch, old, token_adv, batch.response_mask, {}, parts)
        loss, _ = backward_of(model, update, torch.arange(N), cfg)
        results.append((loss, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])))
    (loss_f, g_f), (loss_d, g_d) = results
    assert g_d.abs().sum() > 0
    assert loss_f == pytest.approx(loss_d, rel=1e-11, abs=1e-14)
    torch.testing.assert_close(g_f, g_d, rtol=1e-11, atol=1e-14)

"""Tests for baselines.py against docs/specs/baselines.md §3–§6 (Example A) and independent formulas, in float64.

The losses are computed here with a small reference of verl's dual-clip token loss (spec §1), not with grpo.py.
"""

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from comparisons import baselines  # noqa: E402
from trainer import chunked_head  # noqa:E402

F64 = torch.float64
TOL = dict(rtol=0, atol=1e-9)


def close(actual, expected):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=F64), torch.as_tensor(expected, dtype=F64), **TOL)


# ---- Example A (delta.md §7, baselines.md §1) ---------------------------------------------------------------------
W = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.5]], dtype=F64)
H_IN = torch.tensor([[[0.5, 1.0], [1.5, -0.5], [0.2, 0.3]], [[0.4, 0.9], [-1.0, 0.8], [0.0, 0.0]]], dtype=F64)
Y = torch.tensor([[1, 0, 2], [1, 2, 0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])
ADV = torch.tensor([0.7071057812, -0.7071057812], dtype=F64)  # (r − 0.5)/(std_unbiased + 1e-6), rewards [1, 0]
DLOGP = torch.tensor([[0.1, -0.3, 0.05], [0.2, -0.1, 0.0]], dtype=F64)  # logπ_new − logπ_old (padding: 0)
LAM_BAR = torch.tensor(
    [[1.0054452327, 1.0738334961, 1.0217617913], [0.8541369371, 1.0448225428, 0.0]], dtype=F64
)  # DelTA's λ̄ of Example A (delta.md §7, K = 1)
DAPO_LOSS = [[-0.7814727454, -0.5238368467, -0.7433598698], [0.8636609515, 0.6398157693, 0.0]]
GAMMA = 2.0 ** (-1.0 / 32.0)


def dual_clip_loss(ratio, token_adv, lo=0.2, hi=0.28, c=10.0):
    """verl's per-token loss (spec §1): ℓ = max(−Ã r, −Ã clip(r, 1 − lo, 1 + hi)), then min(ℓ, −Ã c) where Ã < 0."""
    loss = torch.maximum(-token_adv * ratio, -token_adv * ratio.clamp(1 - lo, 1 + hi))
    return torch.where(token_adv < 0, torch.minimum(loss, -token_adv * c), loss)


def masked_mean(x, keep):
    return (x * keep).sum() / keep.sum()


def logits_example_a():
    return H_IN @ W.T  # z = h·Wᵀ, [2, 3, 3]


def ratio_example_a():
    return torch.exp(DLOGP)


def test_dapo_reference_reproduces_example_a():
    """The test's own dual-clip reference gives the spec's DAPO per-token loss and token-mean (spec §1)."""
    loss = dual_clip_loss(ratio_example_a(), ADV[:, None].expand(2, 3))
    close(torch.where(MASK, loss, 0.0), DAPO_LOSS)
    close(masked_mean(loss, MASK), -0.1090385482)


# ---- §3 Forking Tokens ---------------------------------------------------------------------------------------------
H_A = [[1.0201913367, 0.4983717768, 1.0883583966], [1.0376992061, 0.8280477897]]


def entropy_example_a():
    H = chunked_head.entropy_from_logits(logits_example_a())
    return torch.where(MASK, H, 0.0)


def test_entropy_example_a_and_direct_formula():
    H = chunked_head.entropy_from_logits(logits_example_a())
    assert H.dtype == F64 and H.shape == (2, 3)
    close(H[0], H_A[0])
    close(H[1, :2], H_A[1])
    # independent: −Σ p log p of softmax(z/T), here at T = 0.7
    z = logits_example_a() / 0.7
    p = torch.softmax(z, -1)
    close(chunked_head.entropy_from_logits(logits_example_a(), 0.7), -(p * torch.log(p)).sum(-1))


def test_entropy_chunks_dtypes_no_grad_and_views(monkeypatch):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 7, 11, generator=g, dtype=F64) * 3
    p = torch.softmax(z, -1)
    ref = -(p * torch.log(p)).sum(-1)
    monkeypatch.setattr(chunked_head, "_ENTROPY_CHUNK", 2)  # several chunks per row, the last one partial
    close(chunked_head.entropy_from_logits(z), ref)
    close(chunked_head.entropy_from_logits(z[:, 2:6]), ref[:, 2:6])  # a non-contiguous slice of the logits
    close(chunked_head.entropy_from_logits(z[0]), ref[0])  # [T, V]
    close(chunked_head.entropy_from_logits(z[0, 0]), ref[0, 0])  # [V]
    zg = z.clone().requires_grad_(True)
    assert not chunked_head.entropy_from_logits(zg).requires_grad
    for dt in (torch.float32, torch.bfloat16):
        out = chunked_head.entropy_from_logits(z.to(dt))
        assert out.dtype == torch.float32
        # against the exact entropy of the rounded logits; float32 bound: logsumexp and the V-term sum E_p[z]
        # each add at most ~V rounding errors of size eps·max|z| (softmax's own relative error included)
        zr = z.to(dt).double()
        pr = torch.softmax(zr, -1)
        bound = (2 * z.shape[-1] + 4) * torch.finfo(torch.float32).eps * zr.abs().amax(-1)
        assert ((out.double() - (-(pr * torch.log(pr)).sum(-1))).abs() <= bound).all()
    # a −inf logit (a masked vocabulary entry) contributes 0, not NaN
    zi = torch.tensor([0.0, 0.0, -math.inf], dtype=F64)
    close(chunked_head.entropy_from_logits(zi), math.log(2.0))
    with pytest.raises(ValueError, match="temperature"):
        chunked_head.entropy_from_logits(z, 0.0)


@pytest.mark.parametrize(
    "rho, keep, official, trl, threshold",
    [
        (0.2, [[0, 0, 1], [0, 0, 0]], -0.7433598698, -0.1486719740, 1.0478310442),
        (0.5, [[1, 0, 1], [1, 0, 0]], -0.2203905546, -0.1322343328, 1.0201913367),
    ],
)
def test_forking_tokens_example_a(rho, keep, official, trl, threshold):
    """Spec §3 worked example: both masks, the official (kept-mean) and TRL-style (kept-sum / N) losses."""
    H = entropy_example_a()
    keep = torch.tensor(keep, dtype=torch.bool)
    top = baselines.top_ratio_mask(H, MASK, rho)
    assert top.dtype == torch.bool and torch.equal(top, keep)
    loss = torch.where(MASK, dual_clip_loss(ratio_example_a(), ADV[:, None].expand(2, 3)), 0.0)
    close(masked_mean(loss, top), official)
    close((loss * top).sum() / MASK.sum(), trl)
    # TRL's rule: H >= quantile(valid H, 1 − ρ); the spec's threshold, and the same mask
    close(torch.quantile(H[MASK], 1 - rho), threshold)
    assert torch.equal(baselines.quantile_mask(H, MASK, rho), (H >= threshold - 1e-9) & MASK)
    assert torch.equal(baselines.quantile_mask(H, MASK, rho), keep)


def test_ties_padding_and_index_order():
    """Constant H, n = 5, ρ = 0.2: top-ratio keeps 1 (the first in index order), the quantile rule keeps all 5."""
    H = torch.where(MASK, torch.ones(2, 3, dtype=F64), torch.full((2, 3), 7.0, dtype=F64))  # padding scores 7
    assert torch.equal(baselines.top_ratio_mask(H, MASK, 0.2), torch.tensor([[1, 0, 0], [0, 0, 0]]).bool())
    assert torch.equal(baselines.quantile_mask(H, MASK, 0.2), MASK)
    # ties broken by the row-major index, the padding's high score never kept: k = int(5·0.4 + 0.9999) = 2
    H = torch.tensor([[1.0, 2.0, 0.5], [2.0, 2.0, 9.0]], dtype=F64)
    assert torch.equal(baselines.top_ratio_mask(H, MASK, 0.4), torch.tensor([[0, 1, 0], [1, 0, 0]]).bool())
    assert torch.equal(baselines.quantile_mask(H, MASK, 0.4), torch.tensor([[0, 1, 0], [1, 1, 0]]).bool())


def test_ties_by_index_order_in_a_large_pool():
    """Many ties (3 score levels, 200 valid tokens): the kept tokens are the first k of the order (−score, row-major
    index); an unstable sort or topk would pick other tied tokens."""
    g = torch.Generator().manual_seed(7)
    scores = torch.randint(0, 3, (10, 24), generator=g).double()
    mask = torch.arange(24)[None] < torch.randint(15, 25, (10, 1), generator=g)
    flat = [(-float(scores[i, t]), i * 24 + t) for i in range(10) for t in range(24) if mask[i, t]]
    for rho, sign in ((0.3, 1), (0.5, -1)):
        k = max(1, int(len(flat) * rho + 0.9999))
        chosen = sorted((sign * a, j) for a, j in flat)[:k]
        expected = torch.zeros(240, dtype=torch.bool)
        expected[[j for _, j in chosen]] = True
        which = "top" if sign == 1 else "bottom"
        assert torch.equal(baselines.select_tokens(scores, mask, rho, which), expected.reshape(10, 24))


@pytest.mark.parametrize("seed", range(4))
def test_masks_on_random_pools(seed):
    """Counts k = max(1, int(n·ρ + 0.9999)), kept >= dropped, no padding; quantile = torch.quantile's rule."""
    g = torch.Generator().manual_seed(seed)
    B, T = 5, 13
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None] < lengths[:, None]
    scores = torch.randn(B, T, generator=g, dtype=F64)
    scores = torch.where(mask, scores, torch.full_like(scores, 1e9))  # padding would win every ranking
    n = int(mask.sum())
    for rho in (0.01, 0.2, 0.25, 0.5, 0.9, 1.0):
        k = max(1, int(n * rho + 0.9999)) if n else 0
        top = baselines.top_ratio_mask(scores, mask, rho)
        assert int(top.sum()) == k and not (top & ~mask).any()
        if 0 < k < n:
            assert scores[top].min() >= scores[mask & ~top].max()
        q = baselines.quantile_mask(scores, mask, rho)
        expected = (scores >= torch.quantile(scores[mask], 1 - rho)) & mask if n else mask
        assert torch.equal(q, expected)
        for which in ("top", "bottom", "random"):
            sel = baselines.select_tokens(scores, mask, rho, which, torch.Generator().manual_seed(seed))
            assert int(sel.sum()) == k and not (sel & ~mask).any()
        bottom = baselines.select_tokens(scores, mask, rho, "bottom")
        if 0 < k < n:
            assert scores[bottom].max() <= scores[mask & ~bottom].min()


def test_empty_pool_and_errors():
    none = torch.zeros(2, 3, dtype=torch.bool)
    H = torch.ones(2, 3, dtype=F64)
    assert not baselines.top_ratio_mask(H, none, 0.2).any()
    assert not baselines.quantile_mask(H, none, 0.2).any()
    assert not baselines.select_tokens(H, none, 0.5, "random").any()
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="ratio"):
            baselines.top_ratio_mask(H, MASK, bad)
        with pytest.raises(ValueError, match="fraction"):
            baselines.select_tokens(H, MASK, bad, "random")
    with pytest.raises(ValueError, match="quantile"):
        baselines.quantile_mask(H, MASK, 1.5)
    with pytest.raises(ValueError, match="shape"):
        baselines.top_ratio_mask(H, MASK[:, :2], 0.2)
    with pytest.raises(ValueError, match="NaN"):
        baselines.top_ratio_mask(torch.full((2, 3), math.nan, dtype=F64), MASK, 0.2)
    with pytest.raises(ValueError, match="which"):
        baselines.select_tokens(H, MASK, 0.5, "middle")


# ---- §4 SAPO -------------------------------------------------------------------------------------------------------
SAPO_F = [[2.1050740846, 1.7422594224, 2.0512598679], [2.1251729047, 1.8096784203]]
SAPO_W = [[1.1021204907, 0.7285150440, 1.0505805232], [1.2050480035, 0.9025826632]]


def seq_mean_token_mean(x, mask):
    return ((x * mask).sum(1) / mask.sum(1)).mean()


def test_sapo_gate_and_losses_example_a():
    f = baselines.sapo_gate(ratio_example_a(), ADV)
    close(f[0], SAPO_F[0])
    close(f[1, :2], SAPO_F[1])
    # independent: (4/τ)σ(τ(r − 1)) with τ = 1 for the positive row, 1.05 for the negative one
    tau = torch.tensor([[1.0], [1.05]], dtype=F64)
    close(f, 4 / tau / (1 + torch.exp(-tau * (ratio_example_a() - 1))))
    loss = torch.where(MASK, -f * ADV[:, None], 0.0)
    close(loss[0], [-1.4885100550, -1.2319617099, -1.4504577113])
    close(loss[1, :2], [1.5027220469, 1.2796340731])
    close(seq_mean_token_mean(loss, MASK), 0.0004341173)
    close(masked_mean(loss, MASK), -0.2777146712)
    close(baselines.sapo_gate(ratio_example_a(), ADV[:, None].expand(2, 3)), f)  # [B, T] advantages broadcast


def sapo_grad(dlogp):
    """d(Σ m·f(r)·Â)/d logπ_new at logπ_new − logπ_old = dlogp."""
    logp_old = torch.zeros(2, 3, dtype=F64)
    logp_new = (logp_old + dlogp).requires_grad_(True)
    f = baselines.sapo_gate(torch.exp(logp_new - logp_old), ADV)
    (f * ADV[:, None] * MASK).sum().backward()
    return logp_new.grad


def test_sapo_gradient_is_adv_times_w():
    """Autograd of Σ f(r)·Â w.r.t. logπ equals Â·w, w = 4s(1 − s)r (spec §4 values and the formula)."""
    grad = sapo_grad(DLOGP)
    w = grad / ADV[:, None]
    close(w[0], SAPO_W[0])
    close(w[1, :2], SAPO_W[1])
    r = ratio_example_a()
    s = torch.sigmoid(torch.tensor([[1.0], [1.05]], dtype=F64) * (r - 1))
    close(torch.where(MASK, w, 0.0), torch.where(MASK, 4 * s * (1 - s) * r, 0.0))
    assert (grad[~MASK] == 0).all()


def test_sapo_at_ratio_one_equals_the_unclipped_policy_gradient():
    """At r ≡ 1: f = 2 (τ = 1) or 1.9047619048 (τ = 1.05), w ≡ 1, and the gradient of the SAPO loss under
    seq-mean-token-mean is that of the unclipped surrogate −r·Â under the same aggregation (spec §4, §8 item 3)."""
    ones = torch.ones(2, 3, dtype=F64)
    f = baselines.sapo_gate(ones, ADV)
    close(f, [[2.0] * 3, [1.9047619048] * 3])
    close(torch.where(MASK, sapo_grad(torch.zeros(2, 3, dtype=F64)) / ADV[:, None], 0.0), MASK.double())
    logp = torch.zeros(2, 3, dtype=F64, requires_grad=True)
    seq_mean_token_mean(-baselines.sapo_gate(torch.exp(logp), ADV) * ADV[:, None], MASK).backward()
    logp_pg = torch.zeros(2, 3, dtype=F64, requires_grad=True)
    seq_mean_token_mean(-torch.exp(logp_pg) * ADV[:, None], MASK).backward()
    close(logp.grad, logp_pg.grad)


def test_sapo_zero_advantage_and_errors():
    f = baselines.sapo_gate(torch.ones(1, 2, dtype=F64), torch.zeros(1, dtype=F64))
    close(f, [[4 / 1.05 / 2] * 2])  # Â = 0 takes τ_neg, as verl's torch.where(adv > 0, τ_pos, τ_neg)
    with pytest.raises(ValueError, match="tau"):
        baselines.sapo_gate(torch.ones(1, 2), torch.ones(1), tau_neg=0.0)
    with pytest.raises(ValueError, match="adv"):
        baselines.sapo_gate(torch.ones(1, 2), torch.ones(3))


# ---- §5 FIPO -------------------------------------------------------------------------------------------------------


def official_future_sum(x, gamma, chunk):
    """The official block matmul: F[:, s:e] = x[:, s:] @ D[s:, s:e], D[k, t] = γ^(k−t)·1[k >= t] (B·T² MAC)."""
    T = x.shape[1]
    k = torch.arange(T, dtype=x.dtype)
    lag = k[:, None] - k[None, :]
    D = torch.where(lag >= 0, gamma ** lag.clamp(min=0), torch.zeros((), dtype=x.dtype))
    return torch.cat([x[:, s:] @ D[s:, s : s + chunk] for s in range(0, T, chunk)], dim=1)


def fipo_reference(dlogp, adv, mask, clip=0.2, clip_high_only=True):
    """f of spec §5 from the official form: F, clip, safety clip, 1 on padding."""
    d = dlogp.clamp(-20, 20)
    F = official_future_sum(torch.where(mask & (d <= math.log(10.0)), d, 0.0), GAMMA, 128)
    f = torch.exp(F).clamp(1.0 if clip_high_only else 1 - clip, 1 + clip) if clip else torch.exp(F).clamp(max=10)
    f = torch.where((adv[:, None] < 0) & (torch.exp(d) > 10.0), f.clamp(0.8, 1.0), f)
    return torch.where(mask, f, 1.0), F


def test_fipo_example_a():
    x = torch.where(MASK, DLOGP, 0.0)
    F = baselines._discounted_future_sum(x, GAMMA)
    close(F[0], [-0.1456914546, -0.2510713969, 0.05])
    close(F[1, :2], [0.1021427938, -0.1])
    f = baselines.future_kl_weights(DLOGP, ADV, MASK)
    close(f, [[1.0, 1.0, 1.0512710964], [1.1075416105, 1.0, 1.0]])  # 1 on padding
    assert not f.requires_grad and f.dtype == F64
    loss = dual_clip_loss(ratio_example_a(), ADV[:, None] * f)
    close(
        torch.where(MASK, loss, 0.0), [[-0.7814727454, -0.5238368467, -0.7814727454], [0.9565404411, 0.6398157693, 0.0]]
    )
    close(masked_mean(loss, MASK), -0.0980852254)
    # two-sided clip [0.8, 1.2]
    f2 = baselines.future_kl_weights(DLOGP, ADV, MASK, clip_high_only=False)
    close(torch.where(MASK, f2, 0.0), [[0.8644243762, 0.8, 1.0512710964], [1.1075416105, 0.9048374180, 0.0]])
    close(masked_mean(dual_clip_loss(ratio_example_a(), ADV[:, None] * f2), MASK), -0.0681193247)


def test_fipo_at_theta_old_is_dapo():
    """Δ ≡ 0 ⇒ f ≡ 1 and the loss is DAPO's at r = 1 (spec §5)."""
    zero = torch.zeros(2, 3, dtype=F64)
    for high_only in (True, False):
        f = baselines.future_kl_weights(zero, ADV, MASK, clip_high_only=high_only)
        assert torch.equal(f, torch.ones(2, 3, dtype=F64))
    close(masked_mean(dual_clip_loss(torch.ones(2, 3, dtype=F64), ADV[:, None] * f), MASK), -0.1414211562)


def test_fipo_safety_and_sequence_drop():
    """Â = −1, log-ratios [log 12, 0.3, 0.1]: f = [1.0 (safety), 1.2, 1.1051709181], mean loss 4.2804111091;
    [log 12, log 12, 0.1]: two dual-clipped tokens, the response is dropped, loss 0 (spec §5)."""
    adv = torch.tensor([-1.0], dtype=F64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    d = torch.tensor([[math.log(12.0), 0.3, 0.1]], dtype=F64)
    close(
        baselines._discounted_future_sum(torch.where(d <= math.log(10.0), d, 0.0), GAMMA),
        [[0.3893319467, 0.3978572062, 0.1]],
    )
    f = baselines.future_kl_weights(d, adv, mask)
    close(f, [[1.0, 1.2, 1.1051709181]])
    loss = dual_clip_loss(torch.exp(d), adv[:, None] * f)
    close(loss, [[10.0, 1.6198305691, 1.2214027582]])
    close(loss.mean(), 4.2804111091)
    assert not baselines.fipo_dropped_rows(d, adv, mask).any()  # one dual-clipped token: kept

    d2 = torch.tensor([[math.log(12.0), math.log(12.0), 0.1]], dtype=F64)
    dropped = baselines.fipo_dropped_rows(d2, adv, mask)
    assert dropped.tolist() == [True]
    keep = mask & ~dropped[:, None]
    loss2 = dual_clip_loss(torch.exp(d2), adv[:, None] * baselines.future_kl_weights(d2, adv, mask))
    assert float((loss2 * keep).sum() / (keep.sum() + 1e-8)) == 0.0  # verl's masked mean (+1e-8)
    # the same ratios with Â > 0 (no dual clip), or on padding, drop nothing
    assert not baselines.fipo_dropped_rows(d2, -adv, mask).any()
    assert not baselines.fipo_dropped_rows(d2, adv, torch.tensor([[True, False, True]])).any()
    assert baselines.fipo_dropped_rows(d2, adv[:, None].expand(1, 3), mask).tolist() == [True]  # [B, T] Â


@pytest.mark.parametrize("chunk", [1, 2, 128])
def test_fipo_scan_equals_the_official_block_matmul(chunk):
    """The reverse scan (any block size) equals the official chunked block matmul, for chunk ∈ {1, 2, 128}."""
    g = torch.Generator().manual_seed(chunk)
    B, T = 3, 300  # T not a multiple of the block: a partial first block
    x = torch.randn(B, T, generator=g, dtype=F64) * 0.3
    ref = official_future_sum(x, GAMMA, chunk)
    close(official_future_sum(x, GAMMA, T), ref)  # the official form does not depend on its chunk
    for block in (1, 2, 7, 128, 512):
        close(baselines._discounted_future_sum(x, GAMMA, block), ref)
    # the public function: random log-ratios (some above log 10), padding, both signs of Â
    d = torch.randn(B, T, generator=g, dtype=F64) * 0.05
    d[0, 5], d[2, 17] = 2.5, 3.0  # r > 10: left out of F; the negative row gets the safety clip
    mask = torch.arange(T)[None] < torch.tensor([[T], [250], [123]])
    adv = torch.tensor([0.5, 1.0, -0.7], dtype=F64)
    for clip, high_only in ((0.2, True), (0.2, False), (0.0, True)):
        f_ref, _ = fipo_reference(d, adv, mask, clip, high_only)
        close(baselines.future_kl_weights(d, adv, mask, clip=clip, clip_high_only=high_only), f_ref)


def test_fipo_clip_zero_caps_at_ten():
    """clip = 0: f = min(exp F, 10), no lower bound."""
    d = torch.tensor([[2.0, 1.0, 0.5], [-0.5, -0.2, 0.0]], dtype=F64)
    mask = torch.ones(2, 3, dtype=torch.bool)
    f = baselines.future_kl_weights(d, torch.ones(2, dtype=F64), mask, clip=0.0)
    F0 = 2.0 + GAMMA * 1.0 + GAMMA**2 * 0.5  # exp = 31.9 > 10
    close(f, [[10.0, math.exp(1.0 + GAMMA * 0.5), math.exp(0.5)], [math.exp(-0.5 - 0.2 * GAMMA), math.exp(-0.2), 1.0]])
    assert math.exp(F0) > 10


def test_fipo_errors():
    with pytest.raises(ValueError, match="decay_rate"):
        baselines.future_kl_weights(DLOGP, ADV, MASK, decay_rate=0.0)
    with pytest.raises(ValueError, match="clip"):
        baselines.future_kl_weights(DLOGP, ADV, MASK, clip=-0.1)
    with pytest.raises(ValueError, match="shape"):
        baselines.future_kl_weights(DLOGP, ADV, MASK[:, :2])
    with pytest.raises(ValueError, match="adv"):
        baselines.fipo_dropped_rows(DLOGP, ADV[:1], MASK)


# ---- §6 Q2 selection -----------------------------------------------------------------------------------------------


def test_q2_selection_example_a():
    """Top 50% by λ̄: [[0,1,1],[0,1,0]], kept-mean DAPO loss −0.2091269824; bottom 50%: the other end."""
    top = baselines.select_tokens(LAM_BAR, MASK, 0.5, "top")
    assert torch.equal(top, torch.tensor([[0, 1, 1], [0, 1, 0]]).bool())
    loss = dual_clip_loss(ratio_example_a(), ADV[:, None].expand(2, 3))
    close(masked_mean(loss, top), -0.2091269824)
    bottom = baselines.select_tokens(LAM_BAR, MASK, 0.5, "bottom")
    assert torch.equal(bottom, torch.tensor([[1, 0, 1], [1, 0, 0]]).bool())  # 0.854, 1.005, 1.022


def test_q2_random_selection_is_uniform_and_reproducible():
    sel = [baselines.select_tokens(LAM_BAR, MASK, 0.5, "random", torch.Generator().manual_seed(s)) for s in range(2)]
    again = baselines.select_tokens(LAM_BAR, MASK, 0.5, "random", torch.Generator().manual_seed(0))
    assert torch.equal(sel[0], again)
    g = torch.Generator().manual_seed(123)
    draws = torch.stack([baselines.select_tokens(LAM_BAR, MASK, 0.5, "random", g) for _ in range(4000)])
    assert (draws.sum((1, 2)) == 3).all() and not draws[:, ~MASK].any()
    freq = draws.double().mean(0)[MASK]  # each valid token kept with probability 3/5 (std 0.008 over 4000 draws)
    assert ((freq - 0.6).abs() < 0.04).all()

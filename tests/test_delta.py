"""Tests for delta.py (DelTA, arXiv 2605.21467), against docs/specs/delta.md §7 and independent formulas."""

import math
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from frozen import frozen_sha256, load_frozen  # noqa: E402  tests/frozen/ (pytest puts tests/ on sys.path)

import delta  # noqa: E402
from comparisons import delta_ablations  # noqa: E402
from delta import (  # noqa: E402
    delta_coefficients,
    delta_coefficients_chunked,
    delta_token_advantages,
    proxy_vectors,
)

F64 = torch.float64


# ----------------------------------------------------------------------------------------------------
# Independent helpers (written here, not imported from delta.py)
# ----------------------------------------------------------------------------------------------------
def grpo_advantages(rewards, group_ids, eps=1e-6):
    """GRPO: Â = (r − mean_group) / (unbiased std_group + ε); a group of one gets mean 0, std 1."""
    r = torch.as_tensor(rewards, dtype=F64)
    g = torch.as_tensor(group_ids)
    out = torch.zeros_like(r)
    for gid in torch.unique(g):
        idx = (g == gid).nonzero().flatten()
        rg = r[idx]
        mean, std = (0.0, 1.0) if len(idx) == 1 else (rg.mean(), rg.std(unbiased=True))
        out[idx] = (rg - mean) / (std + eps)
    return out


def ppo_dual_clip_token_loss(logp_new, logp_old, adv_tok, mask, clip_low=0.2, clip_high=0.28, clip_c=10.0):
    """verl vanilla dual-clip PPO, per token, and its token-mean (spec §2.3 step 7)."""
    ratio = torch.exp(torch.clamp(logp_new - logp_old, -20.0, 20.0))
    l1 = -adv_tok * ratio
    l2 = -adv_tok * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    lc = torch.maximum(l1, l2)
    per_tok = torch.where(adv_tok < 0, torch.minimum(lc, -adv_tok * clip_c), lc)
    return (per_tok * mask).sum() / mask.sum(), per_tok, ratio


def np_reference(v, adv, mask, K=1, lam_min=0.8, lam_max=1.2, eps=1e-8):
    """The spec's Appendix A numpy reference (independent of delta.py), returns λ̄ [B, T]."""
    sig = lambda x: 1.0 / (1.0 + np.exp(-x))  # noqa: E731

    def side_std(mm, sel):
        c = max(sel.sum(), 1.0)
        mu = (mm * sel).sum() / c
        return np.sqrt(max((mm * mm * sel).sum() / c - mu**2, eps))

    ps = (adv > 0).astype(float)[:, None]
    ns = (adv < 0).astype(float)[:, None]
    zs = 1 - ps - ns
    pos, neg = ps * mask, ns * mask
    ap, an = np.clip(adv, 0, None)[:, None], np.clip(-adv, 0, None)[:, None]
    cen = lambda w: (w[..., None] * v).sum((0, 1)) / max(w.sum(), eps)  # noqa: E731

    def margins(mp, mn):
        dp = ((v - mp) ** 2).sum(-1)
        dn = ((v - mn) ** 2).sum(-1)
        return dn - dp, dp - dn

    mu_p, mu_n = cen(ap * mask), cen(an * mask)
    Mp, Mn = margins(mu_p, mu_n)
    g_p, g_n = side_std(Mp, pos), side_std(Mn, neg)
    for _ in range(K):
        Mp, Mn = margins(mu_p, mu_n)
        new_p = cen(sig(Mp / g_p) * ap * pos)
        new_n = cen(sig(Mn / g_n) * an * neg)
        g_p, g_n = side_std(Mp, pos), side_std(Mn, neg)
        mu_p, mu_n = new_p, new_n
    Mp, Mn = margins(mu_p, mu_n)
    lam = (
        (lam_min + (lam_max - lam_min) * sig(Mp / g_p)) * ps
        + (lam_min + (lam_max - lam_min) * sig(Mn / g_n)) * ns
        + lam_min * zs
    ) * mask
    return lam * mask.sum() / max(lam.sum(), eps)


def random_batch(seed, B=12, T=9, H=6, dtype=F64, group=4, zero_groups=1):
    """Random v, GRPO advantages (some all-equal groups -> Â = 0) and right-padded masks."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(B, T, H, generator=g, dtype=F64) * torch.rand(B, T, 1, generator=g, dtype=F64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(F64)
    rewards = torch.randint(0, 2, (B,), generator=g).to(F64)
    n_groups = B // group
    for gi in range(n_groups):  # make every group mixed, except `zero_groups` all-equal ones
        sl = slice(gi * group, (gi + 1) * group)
        if gi < zero_groups:
            rewards[sl] = 1.0
        else:
            rewards[sl.start] = 1.0
            rewards[sl.start + 1] = 0.0
    adv = grpo_advantages(rewards, torch.arange(B) // group)
    v = v.masked_fill(mask[..., None] == 0, 1e3)  # garbage on padding: must be ignored
    return v.to(dtype), adv.to(dtype), mask.to(dtype)


def float32_bound(v, adv, mask, K, lam_min=0.8, lam_max=1.2):
    """A first-order bound on |λ̄ computed in float32 − λ̄ exact|, from the conditioning of λ̄ (tests where float32
    is the point; "the same computation" is compared in float64 instead).

    A float32 sum of n terms is the exact sum of inputs perturbed by ≤ n·u relative (u = 2^-24; Higham, Accuracy
    and Stability of Numerical Algorithms, §3.1); the longest sums here are the centroids' (n = B·T tokens) and the
    distances' (H features). Treating each of the K + 3 rounds of sums (centroids, margins, γ, refinements, final
    margins) as such a perturbation of v gives |δλ̄_j| ≤ (K + 3)·n·u·Σ_i |∂λ̄_j/∂v_i|·|v_i|, the derivatives taken
    by central differences in float64 (step 1e-7 relative). It is a worst case: float32 lands about 500× inside it
    here, and an order-1 error (a wrong side, margin or normaliser) lands far outside it."""
    B, T, H = v.shape
    f = lambda x: lam_bar_of(x.view(B, T, H), adv, mask, K=K, lam_min=lam_min, lam_max=lam_max)  # noqa: E731
    flat, sens = v.reshape(-1).double(), torch.zeros(B, T, dtype=F64)
    for i in flat.nonzero().flatten().tolist():
        d = 1e-7 * abs(float(flat[i]))
        up, down = flat.clone(), flat.clone()
        up[i] += d
        down[i] -= d
        sens += ((f(up) - f(down)) / (2 * d)).abs() * abs(float(flat[i]))
    return (K + 3) * max(H, B * T) * 2.0**-24 * float(sens.max())


def centroid_condition(v, adv, mask):
    """κ = Σ w·‖v‖ / ‖Σ w·v‖ of each side's centroid sum (w = |Â|·mask): how much it cancels; the larger of two."""
    out = []
    for side in (adv > 0, adv < 0):
        w = (adv.abs() * side)[:, None] * mask
        out.append(float((w * v.norm(dim=-1)).sum() / (w[..., None] * v).sum((0, 1)).norm()))
    return max(out)


def lam_bar_of(v, adv, mask, **kw):
    """delta.py's λ̄ [B, T] of the whole batch (``delta_coefficients(...).lam_bar``)."""
    return delta_coefficients(v, adv, mask, **kw).lam_bar


def chunk(v, adv, mask):
    """A streamed micro-batch ``(v, advantages, response_mask)`` (the proxy is tested on its own, and streamed from
    real h and log p in ``test_example_lambda_bar``)."""
    return v, adv, mask


def with_stats(v, adv, mask, **kw):
    """λ̄ [B, T] and the logged statistics (``delta.delta_stats``) of the whole batch (v, Â, mask)."""
    result = delta_coefficients(v, adv, mask, **kw)
    return result.lam_bar, delta.delta_stats(result, adv, mask)


def chunks_with_stats(chunks, **kw):
    """λ̄ [b, t] of each chunk (``delta_coefficients_chunked``) and the logged statistics of the batch the chunks
    make (their λ̄, Â and masks laid end to end, padded to the longest chunk; ``pool`` as given)."""
    result = delta_coefficients_chunked(chunks, **kw)
    parts = list(chunks() if callable(chunks) else chunks)
    T = max(part[2].shape[1] for part in parts)
    adv = torch.cat([part[1] for part in parts])
    mask = unsplit([torch.as_tensor(part[2]).to(result.lam_bar[0].dtype) for part in parts], T)
    batch = result._replace(lam_bar=unsplit(result.lam_bar, T))
    return result.lam_bar, delta.delta_stats(batch, adv, mask, kw.get("pool"))


def split_chunks(v, adv, mask, sizes, trim=True):
    """Uneven micro-batches (``chunk``); with trim, each chunk is cut to its own max length (T differs per chunk)."""
    out, s = [], 0
    for n in sizes:
        vc, ac, mc = v[s : s + n], adv[s : s + n], mask[s : s + n]
        if trim:
            L = int(mc.sum(1).max())
            vc, mc = vc[:, :L], mc[:, :L]
        out.append(chunk(vc, ac, mc))
        s += n
    assert s == v.shape[0]
    return out


def unsplit(lams, T):
    return torch.cat([torch.nn.functional.pad(l, (0, T - l.shape[1])) for l in lams])


# ----------------------------------------------------------------------------------------------------
# Spec §7 worked example
# ----------------------------------------------------------------------------------------------------
W_EX = [[1.0, 0.0], [0.0, 1.0], [-1.0, 0.5]]
H_EX = [[[0.5, 1.0], [1.5, -0.5], [0.2, 0.3]], [[0.4, 0.9], [-1.0, 0.8], [0.0, 0.0]]]
Y_EX = [[1, 0, 2], [1, 2, 0]]
MASK_EX = [[1, 1, 1], [1, 1, 0]]

LAMBAR_EX = {
    0: [[0.9702569388, 1.0812579089, 1.0042710500], [0.8968367927, 1.0473773096, 0.0]],
    1: [[1.0054452327, 1.0738334961, 1.0217617913], [0.8541369371, 1.0448225428, 0.0]],
    2: [[1.0247200607, 1.0725422126, 1.0269497875], [0.8519526633, 1.0238352759, 0.0]],
}


def example1():
    W = torch.tensor(W_EX, dtype=F64)
    h = torch.tensor(H_EX, dtype=F64)
    y = torch.tensor(Y_EX)
    mask = torch.tensor(MASK_EX, dtype=F64)
    logp = torch.log_softmax(h @ W.T, dim=-1).gather(-1, y[..., None]).squeeze(-1)
    v = proxy_vectors(h, logp, mask)
    adv = grpo_advantages([1.0, 0.0], [0, 0])
    return h, W, y, mask, logp, v, adv


def test_example_inputs_and_proxy():
    h, W, y, mask, logp, v, adv = example1()
    assert torch.allclose(adv, torch.tensor([0.7071057812, -0.7071057812], dtype=F64), atol=1e-9)
    p = torch.exp(logp)
    exp_p = torch.tensor([[0.5064803911, 0.8517093232, 0.2700445302], [0.4916552361, 0.6099310476, 0]], dtype=F64)
    exp_logp = torch.tensor(
        [[-0.6802696706, -0.1605099803, -1.3091684070], [-0.7099775478, -0.4944093649, 0]], dtype=F64
    )
    valid = mask.bool()
    assert torch.allclose(p[valid], exp_p[valid], atol=1e-9)
    assert torch.allclose(logp[valid], exp_logp[valid], atol=1e-9)
    exp_v = torch.tensor(
        [
            [[0.2467598045, 0.4935196089], [0.2224360152, -0.0741453384], [0.1459910940, 0.2189866409]],
            [[0.2033379056, 0.4575102875], [-0.3900689524, 0.3120551619], [0, 0]],
        ],
        dtype=F64,
    )
    assert v.dtype == F64
    assert torch.allclose(v, exp_v, atol=1e-9)


@pytest.mark.parametrize("K", [0, 1, 2])
def test_example_lambda_bar(K):
    *_, mask, logp, v, adv = example1()
    lb = lam_bar_of(v, adv, mask, K=K)
    exp = torch.tensor(LAMBAR_EX[K], dtype=F64)
    assert lb.dtype == F64
    assert torch.allclose(lb, exp, atol=1e-9, rtol=0)
    # the streamed path reproduces the printed numbers too (one response per micro-batch)
    ls = delta_coefficients_chunked(split_chunks(v, adv, mask, [1, 1], trim=False), K=K).lam_bar
    assert torch.allclose(torch.cat(ls), exp, atol=1e-9, rtol=0)
    # and from the example's own h and log p, which the stream turns into v chunk by chunk
    h = example1()[0]
    ls = delta_coefficients_chunked(
        [
            (proxy_vectors(h[i : i + 1], logp[i : i + 1], mask[i : i + 1]), adv[i : i + 1], mask[i : i + 1])
            for i in range(2)
        ],
        K=K,
    ).lam_bar
    assert torch.allclose(torch.cat(ls), exp, atol=1e-9, rtol=0)
    # the default is K = 1
    if K == 1:
        assert torch.equal(lam_bar_of(v, adv, mask), lb)


def test_example_intermediates_via_stats():
    *_, mask, logp, v, adv = example1()
    mu_p0 = torch.tensor([0.2050623045, 0.2127869705], dtype=F64)
    mu_n0 = torch.tensor([-0.0933655234, 0.3847827247], dtype=F64)
    mu_p1 = torch.tensor([0.2049678748, 0.1757909071], dtype=F64)
    mu_n1 = torch.tensor([-0.1869744353, 0.3618374287], dtype=F64)
    g_p0, g_n0 = 0.07838580517602996, 0.15207145569132172

    def cos(a, b):
        return float(a @ b / (a.norm() * b.norm()))

    # K = 0: final centroids are μ⁽⁰⁾, final temperatures γ⁽⁰⁾
    _, s0 = with_stats(v, adv, mask, K=0)
    assert s0["delta/gamma_pos"] == pytest.approx(g_p0, abs=1e-12)
    assert s0["delta/gamma_neg"] == pytest.approx(g_n0, abs=1e-12)
    assert s0["delta/mu_pos_norm"] == pytest.approx(float(mu_p0.norm()), abs=1e-9)
    assert s0["delta/mu_neg_norm"] == pytest.approx(float(mu_n0.norm()), abs=1e-9)
    assert s0["delta/cos_mu"] == pytest.approx(cos(mu_p0, mu_n0), abs=1e-8)

    # K = 1: centroids μ⁽¹⁾, temperature lagged: γ⁽¹⁾ == γ⁽⁰⁾ exactly
    lb1, s1 = with_stats(v, adv, mask, K=1)
    assert s1["delta/gamma_pos"] == pytest.approx(g_p0, abs=1e-12)
    assert s1["delta/gamma_neg"] == pytest.approx(g_n0, abs=1e-12)
    assert s1["delta/mu_pos_norm"] == pytest.approx(float(mu_p1.norm()), abs=1e-9)
    assert s1["delta/mu_neg_norm"] == pytest.approx(float(mu_n1.norm()), abs=1e-9)
    assert s1["delta/cos_mu"] == pytest.approx(cos(mu_p1, mu_n1), abs=1e-8)
    assert s1["delta/scale"] == pytest.approx(0.901683678526647, abs=1e-12)  # N/Z
    lam = lb1 / s1["delta/scale"]
    exp_lam = torch.tensor([[1.1150753381, 1.1909204099, 1.1331709951], [0.9472689342, 1.1587462075, 0]], dtype=F64)
    assert torch.allclose(lam, exp_lam, atol=1e-9, rtol=0)
    assert float(lam.sum()) == pytest.approx(5.54518188481576, abs=1e-12)  # Z
    assert (s1["delta/n_pos"], s1["delta/n_neg"], s1["delta/n_zero"]) == (3.0, 2.0, 0.0)

    # K = 2: γ⁽²⁾ is the population std of the margins at μ⁽¹⁾, i.e. of the K = 1 final margins Δ(*)
    d_pos_star = np.array([0.1027674940, 0.2949246275, 0.1259282592])
    d_neg_star = np.array([-0.0821285533, 0.3289111159])
    _, s2 = with_stats(v, adv, mask, K=2)
    assert s2["delta/gamma_pos"] == pytest.approx(float(d_pos_star.std()), abs=1e-9)
    assert s2["delta/gamma_neg"] == pytest.approx(float(d_neg_star.std()), abs=1e-9)


def test_example_weighted_adv_and_loss():
    *_, mask, logp_old, v, adv = example1()
    lb = lam_bar_of(v, adv, mask, K=1)
    a_tok = delta_token_advantages(adv, lb, mask)
    exp_adv = torch.tensor([[0.7109561367, 0.7593138731, 0.7224936696], [-0.6039651662, -0.7388000604, 0]], dtype=F64)
    assert torch.allclose(a_tok, exp_adv, atol=1e-9, rtol=0)

    delta_lp = torch.tensor([[0.1, -0.3, 0.05], [0.2, -0.1, 0.0]], dtype=F64)
    logp_new = (logp_old + delta_lp).clone().requires_grad_(True)
    dapo_adv = adv[:, None] * mask
    loss_delta, tok_delta, ratio = ppo_dual_clip_token_loss(logp_new, logp_old, a_tok, mask)
    loss_dapo, tok_dapo, _ = ppo_dual_clip_token_loss(logp_new, logp_old, dapo_adv, mask)

    valid = mask.bool()
    exp_ratio = torch.tensor([[1.1051709181, 0.7408182207, 1.0512710964], [1.2214027582, 0.9048374180, 1]], dtype=F64)
    assert torch.allclose(ratio.detach()[valid], exp_ratio[valid], atol=1e-9)
    exp_tok = torch.tensor([[-0.7857280463, -0.5625135524, -0.7595367122], [0.7376847198, 0.6684939391, 0]], dtype=F64)
    assert torch.allclose(tok_delta.detach()[valid], exp_tok[valid], atol=1e-9)
    assert loss_delta.item() == pytest.approx(-0.14031993040642649, abs=1e-12)
    assert loss_dapo.item() == pytest.approx(-0.1090385482172839, abs=1e-12)
    # per-token DelTA loss / DAPO loss == λ̄ (every clip branch unchanged)
    assert torch.allclose(tok_delta.detach()[valid] / tok_dapo.detach()[valid], lb[valid], atol=1e-12)
    # Eq. 8: token-mean DelTA loss == Σ λ ℓ_DAPO / Σ λ with the pre-normalisation λ
    lam = torch.tensor([[1.1150753381, 1.1909204099, 1.1331709951], [0.9472689342, 1.1587462075, 0]], dtype=F64)
    self_norm = float((lam * tok_dapo.detach() * mask).sum() / (lam * mask).sum())
    assert loss_delta.item() == pytest.approx(self_norm, abs=1e-9)
    # the gradient flows only through logp_new: dL_delta/dlogp = λ̄ · dL_dapo/dlogp
    (g_delta,) = torch.autograd.grad(loss_delta, logp_new, retain_graph=True)
    (g_dapo,) = torch.autograd.grad(loss_dapo, logp_new)
    assert torch.allclose(g_delta, lb * g_dapo, atol=1e-14)
    assert not lb.requires_grad and not a_tok.requires_grad


def test_example2_zero_advantage_group():
    h1, W, y1, mask1, _, _, _ = example1()
    pad = 7.0  # arbitrary values in padded slots must not matter
    h2 = torch.tensor([[[0.3, -0.2], [0.7, 0.7], [pad, pad]], [[1.0, 1.0], [pad, pad], [pad, pad]]], dtype=F64)
    y2 = torch.tensor([[0, 1, 0], [2, 0, 0]])
    mask2 = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=F64)
    h, y, mask = torch.cat([h1, h2]), torch.cat([y1, y2]), torch.cat([mask1, mask2])
    logp = torch.log_softmax(h @ W.T, dim=-1).gather(-1, y[..., None]).squeeze(-1)
    v = proxy_vectors(h, logp, mask)
    adv = grpo_advantages([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
    assert torch.equal(adv[2:], torch.zeros(2, dtype=F64))

    lb, st = with_stats(v, adv, mask, K=1)
    exp = torch.tensor(
        [
            [1.1227688471, 1.1991372152, 1.1409893559],
            [0.9538046559, 1.1667410255, 0],
            [0.8055196335, 0.8055196335, 0],
            [0.8055196335, 0, 0],
        ],
        dtype=F64,
    )
    assert torch.allclose(lb, exp, atol=1e-9, rtol=0)
    assert st["delta/scale"] == pytest.approx(1.0068995418832392, abs=1e-12)
    assert st["delta/n_zero"] == 3.0
    # group-1 centroids / temperatures unchanged by the zero-advantage group
    _, st1 = with_stats(v[:2], adv[:2], mask[:2], K=1)
    for key in ("delta/gamma_pos", "delta/gamma_neg", "delta/cos_mu", "delta/mu_pos_norm"):
        assert st[key] == pytest.approx(st1[key], abs=1e-12)
    a_tok = delta_token_advantages(adv, lb, mask)
    exp_adv = torch.tensor(
        [[0.7939163427, 0.8479168573, 0.8068001698], [-0.6744407863, -0.8250093243, 0], [0, 0, 0], [0, 0, 0]], dtype=F64
    )
    assert torch.allclose(a_tok, exp_adv, atol=1e-9, rtol=0)
    ls = delta_coefficients_chunked(split_chunks(v, adv, mask, [3, 1]), K=1).lam_bar
    assert torch.allclose(unsplit(ls, 3), exp, atol=1e-9, rtol=0)


# ----------------------------------------------------------------------------------------------------
# Properties on random data
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("K", [0, 1, 3])
def test_matches_numpy_reference_and_normalises(seed, K):
    v, adv, mask = random_batch(seed)
    lb, st = with_stats(v, adv, mask, K=K)
    ref = np_reference(np.where(mask.numpy()[..., None] > 0, v.numpy(), 0.0), adv.numpy(), mask.numpy(), K=K)
    assert np.allclose(lb.numpy(), ref, atol=1e-12, rtol=0)
    # Σ λ̄·mask = Σ mask, λ̄ = 0 on padding, λ̄ > 0 on valid tokens
    assert float((lb * mask).sum()) == pytest.approx(float(mask.sum()), abs=1e-10)
    assert torch.all(lb[mask == 0] == 0)
    assert torch.all(lb[mask == 1] > 0)
    # pre-normalisation λ in [λ_min, λ_max]; Â = 0 tokens exactly λ_min
    lam = lb / st["delta/scale"]
    valid = mask == 1
    assert torch.all(lam[valid] >= 0.8 - 1e-12) and torch.all(lam[valid] <= 1.2 + 1e-12)
    zero_tok = valid & (adv == 0)[:, None]
    assert zero_tok.any()
    assert torch.allclose(lam[zero_tok], torch.full_like(lam[zero_tok], 0.8), atol=1e-12)
    # stats agree with a direct computation from λ̄
    for side, sel in (("pos", valid & (adv > 0)[:, None]), ("neg", valid & (adv < 0)[:, None])):
        x = lb[sel]
        assert st[f"delta/lam_{side}_mean"] == pytest.approx(float(x.mean()), abs=1e-12)
        assert st[f"delta/lam_{side}_std"] == pytest.approx(float(x.std(unbiased=False)), abs=1e-9)
        assert st[f"delta/lam_{side}_min"] == pytest.approx(float(x.min()), abs=1e-12)
        assert st[f"delta/lam_{side}_max"] == pytest.approx(float(x.max()), abs=1e-12)
        assert st[f"delta/n_{side}"] == float(sel.sum())
    assert set(st) == set(delta.STAT_KEYS)
    assert all(type(x) is float for x in st.values())


def test_float32_path_and_custom_range():
    v, adv, mask = random_batch(5)
    lb32 = lam_bar_of(v.float(), adv.float(), mask.bool(), K=1, lam_min=0.5, lam_max=1.5)
    lb64 = lam_bar_of(v, adv, mask, K=1, lam_min=0.5, lam_max=1.5)
    assert lb32.dtype == torch.float32
    assert (lb32.double() - lb64).abs().max() <= float32_bound(v, adv, mask, 1, 0.5, 1.5)
    ref = np_reference(
        np.where(mask.numpy()[..., None] > 0, v.numpy(), 0.0), adv.numpy(), mask.numpy(), K=1, lam_min=0.5, lam_max=1.5
    )
    assert np.allclose(lb64.numpy(), ref, atol=1e-12)
    assert not np.allclose(
        ref,
        np_reference(np.where(mask.numpy()[..., None] > 0, v.numpy(), 0.0), adv.numpy(), mask.numpy(), K=1),
        atol=1e-3,
    )


def test_scale_invariance_of_v():
    # margins and γ both scale with c², so α, λ, λ̄ do not change (why the 1/temperature factor can be dropped)
    v, adv, mask = random_batch(6)
    assert torch.allclose(lam_bar_of(v * 0.37, adv, mask), lam_bar_of(v, adv, mask), atol=1e-12)


def test_all_zero_advantages_gives_ones():
    v, _, mask = random_batch(7)
    adv = torch.zeros(v.shape[0], dtype=F64)
    lb, st = with_stats(v, adv, mask)
    assert torch.equal(lb, mask)
    assert st["delta/fallback"] == 1.0 and st["delta/n_zero"] == float(mask.sum())
    ls = delta_coefficients_chunked(split_chunks(v, adv, mask, [5, 7])).lam_bar
    assert torch.equal(unsplit(ls, v.shape[1]), mask)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_one_side_empty_gives_ones(sign):
    v, adv, mask = random_batch(8)
    adv = torch.where(adv * sign > 0, adv, torch.zeros_like(adv))  # only one side (plus zeros) left
    assert (adv != 0).any()
    lb, st = with_stats(v, adv, mask, K=1)
    assert torch.equal(lb, mask)
    assert st["delta/fallback"] == 1.0
    assert math.isnan(st["delta/gamma_pos"]) and math.isnan(st["delta/cos_mu"])
    side = "pos" if sign > 0 else "neg"
    assert st[f"delta/lam_{side}_mean"] == 1.0
    # a side present only through fully padded responses counts as empty
    adv2 = adv.clone()
    v2, mask2 = v.clone(), mask.clone()
    mask2[-1] = 0
    adv2[-1] = -sign
    assert torch.equal(lam_bar_of(v2, adv2, mask2), mask2)
    ls = delta_coefficients_chunked(split_chunks(v, adv, mask, [4, 4, 4]), K=1).lam_bar
    assert torch.equal(unsplit(ls, v.shape[1]), mask)


def test_padding_garbage_is_ignored():
    v, adv, mask = random_batch(9)
    v_nan = v.masked_fill(mask[..., None] == 0, float("nan"))
    lb = lam_bar_of(v, adv, mask)
    assert torch.equal(lam_bar_of(v_nan, adv, mask), lb)
    assert torch.all(lb[mask == 0] == 0)


@pytest.mark.parametrize("H", [6, 33])
def test_squared_distances_in_row_blocks_equal_the_whole_batch_formula(H, monkeypatch):
    """‖v − μ‖² a block of rows at a time (delta.py's working memory) is (v − μ)² summed over H for the whole batch,
    exactly in float64: each token's sum is the same reduction in any block. Block sizes that divide N = 7 and ones
    that do not, one row, and more rows than N."""
    g = torch.Generator().manual_seed(40)
    v, mu = torch.randn(7, 5, H, generator=g, dtype=F64), torch.randn(H, generator=g, dtype=F64)
    whole = (v - mu).pow(2).sum(-1)
    assert whole.shape == (7, 5)
    assert torch.equal(delta.squared_distance(v, mu), whole)  # the default block (all 7 rows here)
    for rows in (1, 2, 3, 4, 6, 7, 50):
        monkeypatch.setattr(delta, "ROW_BLOCK_BYTES", rows * 5 * H * 8)
        assert delta._row_blocks(v)[0] == slice(0, rows)
        assert torch.equal(delta.squared_distance(v, mu), whole), rows
        assert torch.equal(delta.squared_distance(v, -mu), (v + mu).pow(2).sum(-1)), rows


@pytest.mark.parametrize("K", [0, 1, 2])
def test_lambda_does_not_depend_on_the_row_block(K, monkeypatch):
    """delta_coefficients' λ̄ and statistics are the same, bit for bit in float64, whatever the rows per block
    (ROW_BLOCK_BYTES: 1, 2, 5, 7 of N = 12 rows, all of them, more), with +0.0 on padding (v read as given) and
    with garbage there (the masked copy)."""
    v, adv, mask = random_batch(41)
    row_bytes = v.shape[1] * v.shape[2] * v.element_size()
    v_zero = v.masked_fill(mask[..., None] == 0, 0.0)
    ref = {name: with_stats(x, adv, mask, K=K) for name, x in (("zero", v_zero), ("garbage", v))}
    assert torch.equal(ref["zero"][0], ref["garbage"][0])
    for rows in (1, 2, 5, 7, 12, 100):
        monkeypatch.setattr(delta, "ROW_BLOCK_BYTES", rows * row_bytes)
        assert delta._row_blocks(v)[0] == slice(0, rows)
        for name, x in (("zero", v_zero), ("garbage", v)):
            lam_bar, stats = with_stats(x, adv, mask, K=K)
            assert torch.equal(lam_bar, ref[name][0]), (rows, name)
            assert stats == ref[name][1], (rows, name)


def test_prepare_copies_v_only_when_its_padding_is_not_plus_zero(monkeypatch):
    """The whole-batch path reads proxy_vectors' v as it is (+0.0 on padding: a masked copy would be the same
    bits, and it is [B, T, H]); −0.0 or NaN on padding, or another dtype, give one masked copy, +0.0 there."""
    monkeypatch.setattr(delta, "ROW_BLOCK_BYTES", 1)  # one row per block: the check runs block by block
    v, adv, mask = random_batch(42)
    h = v.masked_fill(mask[..., None] == 0, float("nan"))
    pv = proxy_vectors(h, torch.log(torch.rand(mask.shape, dtype=F64)), mask)
    pad = (mask == 0)[..., None].expand_as(pv)
    assert torch.all(pv[pad] == 0) and not torch.signbit(pv[pad]).any()  # +0.0, even under NaN
    assert delta._prepare(pv, adv, mask, F64)[0].data_ptr() == pv.data_ptr()
    last = int(mask[-1].sum())  # the last row's first padded token (the last block)
    assert last < mask.shape[1]
    for bad in (-0.0, float("nan")):
        x = pv.clone()
        x[-1, last, 0] = bad
        out = delta._prepare(x, adv, mask, F64)[0]
        assert out.data_ptr() != x.data_ptr() and torch.equal(out, pv) and not torch.signbit(out[pad]).any()
        assert x[-1, last, 0].isnan() or torch.signbit(x[-1, last, 0])  # the caller's v untouched
    out = delta._prepare(h.float(), adv, mask, dtype=F64)[0]  # converted: masked in place on the new copy
    assert out.dtype == F64 and torch.all(out[pad] == 0) and torch.equal(out[~pad], h.float().double()[~pad])


def test_proxy_vectors_padding_dtype_and_no_grad():
    h = torch.randn(2, 4, 3, dtype=torch.bfloat16, requires_grad=True)
    lp = torch.log(torch.rand(2, 4)).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    lp_nan = lp.detach().clone()
    lp_nan[~mask] = float("nan")
    v = proxy_vectors(h, lp_nan, mask)
    assert v.dtype == torch.float32 and not v.requires_grad
    assert torch.all(v[~mask] == 0)
    exp = (1 - torch.exp(lp.detach()))[..., None] * h.detach().float()
    assert torch.allclose(v[mask], exp[mask], atol=1e-6)
    assert proxy_vectors(h.detach().double(), lp.detach().double(), mask).dtype == F64
    assert not proxy_vectors(h, lp, mask).requires_grad


def test_no_gradient_into_lambda():
    v, adv, mask = random_batch(10)
    v = v.masked_fill(mask[..., None] == 0, 0.0).requires_grad_(True)
    lb = lam_bar_of(v, adv, mask)
    assert not lb.requires_grad and lb.grad_fn is None
    ls = delta_coefficients_chunked(split_chunks(v, adv, mask, [5, 7], trim=False)).lam_bar
    assert all(not x.requires_grad for x in ls)
    # using λ̄ in a loss leaves v without a gradient path
    loss = (lb * (v**2).sum(-1)).sum()
    loss.backward()
    assert torch.allclose(v.grad, 2 * lb[..., None] * v.detach())


# ----------------------------------------------------------------------------------------------------
# Streaming path
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("K", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_streaming_equals_whole_batch(K, dtype):
    """The same λ̄ and statistics: in float64 to 1e-12 (two algebras of the same sums); in float32 each path within
    the derived ``float32_bound`` of the exact (float64) λ̄, so within twice that of each other."""
    for seed, sizes in ((11, [5, 1, 6]), (12, [1, 1, 10]), (13, [12])):
        v, adv, mask = random_batch(seed, dtype=dtype)
        v64, adv64 = v.double(), adv.double()
        tol = 1e-12 if dtype == F64 else 2 * float32_bound(v64, adv64, mask.double(), K)
        # the other statistics (μ norms and cosine, γ, counts): n·u per round of sums, times the condition number
        # κ = Σ|Â|·‖v‖ / ‖Σ|Â|·v‖ of the centroid sums (their cancellation), relative; absolute for the cosine
        rel = (
            1e-10
            if dtype == F64
            else (K + 3) * v.shape[0] * v.shape[1] * 2.0**-24 * centroid_condition(v64, adv64, mask.double())
        )
        lb, st = with_stats(v, adv, mask, K=K)
        ls, st_s = chunks_with_stats(split_chunks(v, adv, mask, sizes), K=K)
        assert all(x.dtype == dtype for x in ls)
        assert torch.allclose(unsplit(ls, v.shape[1]), lb, atol=tol, rtol=0)
        for key in delta.STAT_KEYS:
            assert st_s[key] == pytest.approx(st[key], rel=rel, abs=tol if "lam" in key else rel), key


@pytest.mark.parametrize("K", [0, 1, 2])
def test_chunked_form_equals_the_whole_batch_in_float64(K):
    """delta_coefficients_chunked (uneven chunks, each cut to its own length, from a callable that yields them afresh,
    with a pool that returns the sum) gives delta_coefficients' λ̄ and statistics, float64 to 1e-12 relative: random
    batches with Â = 0 rows and padding, one with a side empty (the guard: λ̄ ≡ 1 on valid tokens), and spec §7's
    example (its printed λ̄ to 1e-9)."""
    v_one, adv_one, mask_one = random_batch(62)
    *_, mask_ex, _, v_ex, adv_ex = example1()
    batches = [random_batch(60) + ([5, 1, 6],), random_batch(61) + ([2, 10],)]
    batches += [(v_one, adv_one.clamp(min=0), mask_one, [7, 5]), (v_ex, adv_ex, mask_ex, [1, 1])]
    for v, adv, mask, sizes in batches:
        lam_bar, stats = with_stats(v, adv, mask, K=K)
        parts = split_chunks(v, adv, mask, sizes)
        chunked, chunked_stats = chunks_with_stats(lambda: iter(parts), K=K, pool=lambda flat: flat + 0.0)
        torch.testing.assert_close(unsplit(chunked, v.shape[1]), lam_bar, rtol=1e-12, atol=0)
        for key in delta.STAT_KEYS:
            assert chunked_stats[key] == pytest.approx(stats[key], rel=1e-12, abs=1e-15, nan_ok=True), key
        if (adv > 0).any() and (adv < 0).any():
            assert stats["delta/fallback"] == 0.0
        else:  # the guard
            assert torch.equal(lam_bar, mask) and stats["delta/fallback"] == 1.0
    assert torch.allclose(lam_bar, torch.tensor(LAMBAR_EX[K], dtype=F64), atol=1e-9, rtol=0)  # spec §7, by hand


@pytest.mark.parametrize("K,expected_passes", [(0, 2), (1, 4), (2, 5), (3, 6)])
def test_streaming_callable_passes_and_recompute(K, expected_passes):
    v, adv, mask = random_batch(14)
    chunks = split_chunks(v, adv, mask, [3, 4, 5])
    calls = []

    def make():
        calls.append(1)
        # a fresh generator each call, as when h is recomputed by re-running the forward pass
        return ((c[0].clone(), *c[1:]) for c in chunks)

    ls = delta_coefficients_chunked(make, K=K).lam_bar
    assert len(calls) == expected_passes
    assert torch.allclose(unsplit(ls, v.shape[1]), lam_bar_of(v, adv, mask, K=K), atol=1e-12)


def test_streaming_rejects_bad_chunks():
    v, adv, mask = random_batch(15)
    chunks = split_chunks(v, adv, mask, [6, 6])
    with pytest.raises(ValueError, match="one-shot"):
        delta_coefficients_chunked(iter(chunks))
    with pytest.raises(ValueError, match="yielded 0 chunks, expected at least one"):
        delta_coefficients_chunked([])
    state = {"n": 0}

    def changing():  # advantages differ between passes
        state["n"] += 1
        return [(c[0], c[1] * state["n"], c[2]) for c in chunks]

    with pytest.raises(ValueError, match="changed between passes"):
        delta_coefficients_chunked(changing)
    with pytest.raises(ValueError, match="expected 2"):
        state2 = {"n": 0}

        def shrinking():
            state2["n"] += 1
            return chunks if state2["n"] == 1 else chunks[:1]

        delta_coefficients_chunked(shrinking)
    with pytest.raises(ValueError, match=r"^adv in chunks\[0\] must be a tensor of shape \[2\]"):
        delta_coefficients_chunked([chunk(v[:2], adv[:3], mask[:2])])
    with pytest.raises(ValueError, match=r"^adv must be a tensor of shape \[2\]"):  # the whole batch: no chunk named
        delta_coefficients(v[:2], adv[:3], mask[:2])
    with pytest.raises(ValueError, match=r"^adv in chunks\[1\] must be a tensor of shape \[2\]"):
        delta_coefficients_chunked([chunk(v[:2], adv[:2], mask[:2]), chunk(v[2:4], adv[2:5], mask[2:4])])
    with pytest.raises(ValueError, match=r"\(v, adv, loss_mask\) tuple"):
        delta_coefficients_chunked([(v, torch.zeros(mask.shape, dtype=F64), mask, adv)])  # (h, log p, mask, Â)
    with pytest.raises(ValueError, match=r"chunks\[0\] must be a \(v, adv, loss_mask\) tuple"):
        delta_coefficients_chunked(v)  # a [B, T, H] tensor is one chunk of delta_coefficients, not a list of chunks
    with pytest.raises(ValueError, match="v must be a 3-dim tensor"):
        delta_coefficients(chunks, adv, mask)  # chunks go to delta_coefficients_chunked


class FakeAllReduce:
    """all-reduce(SUM) between `n` threads: each rank deposits its tensor, all read the same sum."""

    def __init__(self, n):
        self.n = n
        self.slots = [None] * n
        self.barrier = threading.Barrier(n, timeout=60)
        self.calls = [0] * n

    def for_rank(self, rank):
        def reduce_fn(t):
            self.calls[rank] += 1
            self.slots[rank] = t.clone()
            self.barrier.wait()
            total = self.slots[0].clone()
            for s in self.slots[1:]:
                total += s
            self.barrier.wait()  # nobody overwrites a slot before everyone has summed
            t.copy_(total)  # in place, like torch.distributed.all_reduce, and returns None

        return reduce_fn


def run_ranks(rank_chunks, K, use_reduce=True):
    fake = FakeAllReduce(len(rank_chunks))
    results, errors = [None] * len(rank_chunks), []

    def work(r):
        try:
            results[r] = chunks_with_stats(rank_chunks[r], K=K, pool=fake.for_rank(r) if use_reduce else None)
        except Exception as e:  # pragma: no cover - surfaced below
            errors.append(e)
            fake.barrier.abort()

    threads = [threading.Thread(target=work, args=(r,)) for r in range(len(rank_chunks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results, fake


@pytest.mark.parametrize("K", [0, 1, 2])
def test_streaming_reduce_fn_two_ranks_equals_union(K):
    v, adv, mask = random_batch(16, B=16, T=7, group=4, zero_groups=1)
    # rank 0 holds rows 0..6, rank 1 rows 7..15 (a group split across ranks, uneven micro-batches)
    rank_chunks = [split_chunks(v[:7], adv[:7], mask[:7], [3, 4]), split_chunks(v[7:], adv[7:], mask[7:], [2, 5, 2])]
    (res0, st0), (res1, st1) = run_ranks(rank_chunks, K)[0]
    lb, st = with_stats(v, adv, mask, K=K)
    union = torch.cat([unsplit(res0, 7), unsplit(res1, 7)])
    assert torch.allclose(union, lb, atol=1e-12, rtol=0)
    for key in delta.STAT_KEYS:
        if key.endswith(("_min", "_max")):
            continue  # local per rank by design
        assert st0[key] == pytest.approx(st[key], abs=1e-10)
        assert st1[key] == pytest.approx(st[key], abs=1e-10)
    assert min(st0["delta/lam_pos_min"], st1["delta/lam_pos_min"]) == pytest.approx(st["delta/lam_pos_min"], abs=1e-12)
    assert max(st0["delta/lam_neg_max"], st1["delta/lam_neg_max"]) == pytest.approx(st["delta/lam_neg_max"], abs=1e-12)
    # without the reduction each rank uses its own statistics (official code) and gets a different λ̄
    (loc0, _), (loc1, _) = run_ranks(rank_chunks, K, use_reduce=False)[0]
    assert not torch.allclose(torch.cat([unsplit(loc0, 7), unsplit(loc1, 7)]), lb, atol=1e-4)


def test_streaming_reduce_fn_guard_is_global():
    # rank 1 alone has only negative responses: locally it would fall back to λ̄ ≡ 1, globally it must not
    v, adv, mask = random_batch(17, B=8, T=6, group=4, zero_groups=0)
    order = torch.argsort(-adv)  # positives first, negatives last
    v, adv, mask = v[order], adv[order], mask[order]
    assert (adv[4:] < 0).all() and (adv[:4] > 0).any()
    rank_chunks = [[chunk(v[:4], adv[:4], mask[:4])], [chunk(v[4:], adv[4:], mask[4:])]]
    results, fake = run_ranks(rank_chunks, K=1)
    (res0, st0), (res1, st1) = results
    assert fake.calls[0] == fake.calls[1]
    assert st0["delta/fallback"] == st1["delta/fallback"] == 0.0
    lb = lam_bar_of(v, adv, mask, K=1)
    assert torch.allclose(torch.cat([res0[0], res1[0]]), lb, atol=1e-12)
    assert not torch.allclose(res1[0], mask[4:], atol=1e-3)


# ----------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------
def test_validation_errors():
    v, adv, mask = random_batch(18)
    with pytest.raises(ValueError, match="v must"):
        delta_coefficients(v[0], adv, mask)
    with pytest.raises(ValueError, match="adv"):
        delta_coefficients(v, adv[:-1], mask)
    with pytest.raises(ValueError, match="adv"):
        delta_coefficients(v, adv[:, None].expand(-1, v.shape[1]), mask)
    with pytest.raises(ValueError, match="loss_mask"):
        delta_coefficients(v, adv, mask[:, :-1])
    with pytest.raises(ValueError, match="loss_mask"):
        delta_coefficients(v, adv, mask * 0.5)
    with pytest.raises(ValueError, match="K"):
        delta_coefficients(v, adv, mask, K=-1)
    with pytest.raises(ValueError, match="K"):
        delta_coefficients(v, adv, mask, K=1.0)
    with pytest.raises(ValueError, match="lam_min"):
        delta_coefficients(v, adv, mask, lam_min=1.3, lam_max=1.2)
    with pytest.raises(ValueError, match="lam_min"):
        delta_coefficients_chunked([chunk(v, adv, mask)], lam_min=1.3, lam_max=1.2)
    with pytest.raises(ValueError, match="old_logp"):
        proxy_vectors(v, adv, mask)
    with pytest.raises(ValueError, match="hidden"):
        proxy_vectors(v[0], mask, mask)
    with pytest.raises(ValueError, match="lam_bar"):
        delta_token_advantages(adv, v, mask)
    bad = adv.clone()
    bad[0] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        delta_coefficients(v, bad, mask)


def test_delta_token_advantages():
    adv = torch.tensor([1.5, -0.5, 0.0], dtype=F64)
    lb = torch.tensor([[1.1, 0.9], [0.7, 0.0], [0.8, 0.8]], dtype=F64)
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]], dtype=torch.bool)
    exp = torch.tensor([[1.65, 1.35], [-0.35, 0.0], [0.0, 0.0]], dtype=F64)
    assert torch.allclose(delta_token_advantages(adv, lb, mask), exp, atol=1e-15)
    lb_pad = lb.clone()
    lb_pad[1, 1] = 5.0  # masked out regardless of λ̄ there
    assert torch.allclose(delta_token_advantages(adv, lb_pad, mask), exp, atol=1e-15)


# ----------------------------------------------------------------------------------------------------
# App. F: the proxy is the gradient of log p(y_t) w.r.t. the sampled token's lm_head row
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_proxy_is_lm_head_row_gradient_on_tiny_qwen3(temperature):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=11,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(cfg).to(F64).eval()
    W = model.lm_head.weight
    assert model.model.embed_tokens.weight.data_ptr() != W.data_ptr()  # untied

    P, L = 3, 4
    ids = torch.randint(0, 11, (1, P + L))
    captured = []
    hook = model.lm_head.register_forward_pre_hook(lambda mod, args: captured.append(args[0]))
    out = model(input_ids=ids, output_hidden_states=True)
    hook.remove()
    h_all = out.hidden_states[-1]
    assert torch.equal(h_all, captured[0])  # post final-norm state == lm_head input

    h = h_all[:, -L - 1 : -1]  # position that predicts response token t
    y = ids[:, -L:]
    logp = torch.log_softmax(out.logits[:, -L - 1 : -1] / temperature, dim=-1).gather(-1, y[..., None]).squeeze(-1)
    mask = torch.ones(1, L, dtype=torch.bool)
    v = proxy_vectors(h, logp, mask)
    for t in range(L):
        model.zero_grad(set_to_none=True)
        logp[0, t].backward(retain_graph=True)
        g_row = W.grad[y[0, t]]
        assert torch.allclose(g_row * temperature, v[0, t], atol=1e-12, rtol=1e-10)
        other = [j for j in range(11) if j != int(y[0, t])][0]
        assert not torch.allclose(W.grad[other], v[0, t])


# ----------------------------------------------------------------------------------------------------
# The usage example that ends delta.py's header runs as written (so it cannot rot), and `python delta.py` runs it
# ----------------------------------------------------------------------------------------------------
def header_example():
    """The indented block after "Example" that ends delta.py's header, dedented."""
    _, marker, example = delta.__doc__.partition("\nExample")
    assert marker  # the header ends with the example
    lines = [line for line in example.split("\n") if line.startswith("    ") or not line.strip()]
    return textwrap.dedent("\n".join(lines)).strip("\n") + "\n"


def test_python_delta_py_runs_the_header_example():
    """``python delta.py`` runs the header's example, line for line (the lines after its tiny Qwen3 is built), and
    prints λ̄, Ã and the statistics."""
    import ast

    source = (Path(__file__).resolve().parents[1] / "delta.py").read_text(encoding="utf-8")
    main = [n for n in ast.parse(source).body if isinstance(n, ast.If)]
    assert len(main) == 1 and ast.unparse(main[0].test) == "__name__ == '__main__'"
    body = textwrap.dedent("\n".join(source.splitlines()[main[0].body[0].lineno - 1 : main[0].end_lineno]))
    assert header_example() in body  # verbatim: the example is what the script runs
    out = subprocess.run([sys.executable, "delta.py"], cwd=Path(delta.__file__).parent, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "lam_bar" in out.stdout and "token_adv" in out.stdout and "'delta/fallback': 0.0" in out.stdout


def test_header_example_runs_on_tiny_qwen3(float64_model):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    code = header_example()
    assert "delta.delta_coefficients(" in code and "delta.delta_token_advantages(" in code

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
    )
    model = float64_model(Qwen3ForCausalLM(cfg)).eval()  # compared with an independent pass: float64, 1e-10
    B, P, T = 4, 3, 5
    input_ids = torch.randint(0, 64, (B, P + T))
    loss_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]).bool()
    advantages = torch.tensor([0.9, -0.9, 0.5, 0.0], dtype=F64)
    # independently: h from a forward pre-hook on lm_head, log p(y_t) from the full log-softmax
    captured = []
    hook = model.lm_head.register_forward_pre_hook(lambda mod, args: captured.append(args[0]))
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits
    hook.remove()
    h = captured[0][:, P - 1 : -1]  # the position that predicts response token t
    logp = torch.log_softmax(logits[:, P - 1 : -1], -1).gather(-1, input_ids[:, P:, None]).squeeze(-1)
    ns = {
        "torch": torch,
        "delta": delta,
        "model": model,
        "input_ids": input_ids,
        "attention_mask": torch.ones(B, P + T, dtype=torch.long),
        "loss_mask": loss_mask,
        "adv": advantages,
    }
    exec(compile(code, "delta.__doc__ example", "exec"), ns)
    lam_bar = ns["result"].lam_bar
    token_adv = ns["token_adv"]
    assert "delta._" not in code  # public names only
    assert ns["stats"] == delta.delta_stats(ns["result"], advantages, loss_mask)

    # the example's ℓ0 line (its .float() keeps float64 under float64_model) against the full log-softmax
    assert ns["old_logp"].dtype == F64 and torch.allclose(ns["old_logp"], logp, atol=1e-10)
    v = (1 - logp.exp())[..., None] * h * loss_mask[..., None]
    assert ns["v"].dtype == F64 and torch.allclose(ns["v"], v, atol=1e-10)
    assert torch.allclose(lam_bar, lam_bar_of(v, advantages, loss_mask), atol=1e-10)
    assert lam_bar.shape == (B, T) and torch.all(lam_bar[~loss_mask] == 0)
    assert float(lam_bar[loss_mask].mean()) == pytest.approx(1.0, abs=1e-12)
    assert not torch.allclose(lam_bar[loss_mask], torch.ones(int(loss_mask.sum()), dtype=F64))  # not the guard
    assert torch.allclose(token_adv, advantages[:, None] * lam_bar * loss_mask, atol=1e-12)


# ----------------------------------------------------------------------------------------------------
# The formulas README's reading order names, each against hand values
# ----------------------------------------------------------------------------------------------------
def test_adaptive_temperature_is_the_population_std_of_the_margins():
    d = torch.tensor([1.0, 2.0, 4.0], dtype=F64)  # mean 7/3, E[Δ²] = 7: variance 7 − 49/9 = 14/9
    sums = delta.MarginSums(d.sum(), (d * d).sum(), torch.tensor(3.0, dtype=F64))
    gamma = delta.adaptive_temperature(sums, sums)[0]
    # Σ = 7, Σ² = 21, 21/3 = 7 are exact in float64 (u = 2⁻⁵³); E[Δ] = fl(7/3) errs by u, E[Δ]² by 3u of 49/9, and
    # 7 − E[Δ]² cancels down to 14/9: 3u·(49/9)/(14/9) + u = 11.5u relative; the square root halves it, + u: 6.75u.
    # torch's two-pass std has its own error of the same size: twice the bound.
    bound = 6.75 * 2.0**-53
    assert float(gamma) == pytest.approx(math.sqrt(14 / 9), rel=bound)
    assert float(gamma) == pytest.approx(float(d.std(unbiased=False)), rel=2 * bound)
    one = torch.tensor(5.0, dtype=F64)  # one token: variance 0, floored at ε
    single = delta.MarginSums(one, one * one, torch.tensor(1.0, dtype=F64))
    assert [float(gamma) for gamma in delta.adaptive_temperature(single, sums)] == pytest.approx([1e-4, float(gamma)])


def test_soft_assignment_uses_each_tokens_own_side():
    ln3 = math.log(3.0)  # σ(ln 3) = 3/4
    margin = torch.tensor([[0.0, 2 * ln3], [ln3, 0.0]], dtype=F64)  # Δ⁺ on the first response, Δ⁻ on the second
    assign = delta.soft_assignment(margin, torch.tensor(2.0), torch.tensor(1.0), torch.tensor([0.7, -0.7], dtype=F64))
    # γ₊ = 2 on the first (Â > 0), γ₋ = 1 on the second. σ of an argument within one rounding of ln 3 or 0: a few
    # ulp of 0.75 (2⁻⁵³ each), below 1e-15
    torch.testing.assert_close(assign, torch.tensor([[0.5, 0.75], [0.75, 0.5]], dtype=F64), rtol=0, atol=1e-15)


def test_bounded_coefficients_map_alpha_into_the_range():
    assign = torch.tensor([[0.5, 0.75, 0.3], [0.9, 0.9, 0.9]], dtype=F64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=F64)
    lam = delta.bounded_coefficients(assign, torch.tensor([1.0, 0.0], dtype=F64), mask, 0.8, 1.2)
    # λ = 0.8 + 0.4·α; the Â = 0 row gets λ_min; padding 0. Two roundings of values ≤ 1.2 (ulp 2.2e-16): 1e-15
    torch.testing.assert_close(lam, torch.tensor([[1.0, 1.1, 0.0], [0.8, 0.8, 0.8]], dtype=F64), rtol=1e-15, atol=1e-15)


# ----------------------------------------------------------------------------------------------------
# One implementation: the in-memory call is the one-chunk case, bit for bit as the former in-memory code
# ----------------------------------------------------------------------------------------------------
# The former code is run here, on this machine's kernels: tests/frozen/delta_71d7a89.py is delta.py at commit 71d7a89
# byte for byte (tests/frozen/README.md), before its two implementations were merged. Bits recorded on another CPU
# would not do: torch's kernel sets (ATEN_CPU_CAPABILITY) round float32 sums differently, by an ulp here and there.
OLD_DELTA = load_frozen("delta_71d7a89")


def float32_inputs():
    """8 responses (two groups of 4, GRPO's Â in float32), 6 positions, H = 5, a vocabulary of 11: θ_old's h with
    NaN on padding, log-probs, the mask, an LM head W and token ids."""
    g = torch.Generator().manual_seed(43)
    mask = torch.arange(6)[None] < torch.tensor([6, 4, 5, 2, 6, 3, 6, 1])[:, None]
    h = torch.randn(8, 6, 5, generator=g, dtype=F64).float()
    h[~mask] = math.nan  # garbage on padding
    logp = (-8 * torch.rand(8, 6, generator=g, dtype=F64)).float()
    adv = grpo_advantages([1, 0, 0, 1, 1, 1, 0, 1], [0] * 4 + [1] * 4).float()
    return {
        "h": h,
        "logp": logp,
        "mask": mask,
        "adv": adv,
        "W": torch.randn(11, 5, generator=g, dtype=F64).float(),
        "ids": torch.randint(11, (8, 6), generator=g),
    }


# each case: the former call's keywords (delta.py at 71d7a89); "garbage_padding" and "topk_proxy" change v
OLD_CASES = {
    "default": {},
    "K=0": {"K": 0},
    "K=2": {"K": 2},
    "garbage_padding": {},
    "lam_0.5_1.5": {"lam_min": 0.5, "lam_max": 1.5},
    "within_side": {"scores": "within_side"},
    "hard": {"assignment": "hard"},
    "hard_K=2": {"assignment": "hard", "K": 2},
    "fixed_gamma0_K=2": {"gamma": "gamma0", "K": 2},
    "fixed_gamma": {"gamma": (0.05, 0.2)},
    "raw": {"coefficients": "raw"},
    "no_normalize": {"normalize": False},
    "topk_proxy": {},
}


def former_functions(kw):
    """The former call's keywords (delta.py at 71d7a89) as today's call: K and the λ range as they were, each
    ablation keyword as the function delta_ablations.py passes in its place (``functions``)."""
    swaps = {
        "scores": ("score", delta_ablations.within_side_scores),
        "assignment": ("assignment", delta_ablations.hard_assignment),
        "coefficients": ("coefficients", delta_ablations.raw_coefficients),
        "normalize": ("normalize", delta_ablations.no_normalization),
    }
    functions = dict(swaps[key] for key in kw if key in swaps)
    if "gamma" in kw:
        functions["gamma"] = delta_ablations.FrozenTemperature(kw["gamma"])
    given = {key: kw[key] for key in ("K", "lam_min", "lam_max") if key in kw}
    return {**given, "functions": delta.DeltaFunctions(**functions)} if functions else given  # none: the paper's


def test_the_frozen_delta_is_the_commits_file():
    """tests/frozen/delta_71d7a89.py is `git show 71d7a89:delta.py`, unedited (its SHA-256 as README.md states)."""
    assert frozen_sha256("delta_71d7a89") == "21f1b5ad12206a763ba7ae8d0b9f025513eb3ea356db25bb16a33a9262d00248"


@pytest.mark.parametrize("how", ["tensor", "one-chunk list", "one-chunk callable"])
@pytest.mark.parametrize("case", list(OLD_CASES))
def test_float32_lambda_bar_is_bit_identical_to_the_former_code(case, how):
    """float32 λ̄ and every statistic (what metrics.jsonl logs) equal, bit for bit, what the in-memory
    delta_coefficients of 71d7a89 returns on the same inputs, run here, for the default, K = 0 and 2, garbage on
    padding, a λ range, each ablation and the top-K proxy; as a [B, T, H] tensor and as one chunk (a list, a
    callable)."""
    x = float32_inputs()
    h, logp, mask, adv = x["h"], x["logp"], x["mask"], x["adv"]
    v = proxy_vectors(h, logp, mask)
    assert torch.equal(v, OLD_DELTA.proxy_vectors(h, logp, mask))
    v = {
        "garbage_padding": torch.where(mask[..., None], v, torch.full_like(v, 3.0)),
        "topk_proxy": delta_ablations.topk_proxy_vectors(torch.nan_to_num(h), x["ids"], mask, x["W"], 3),
    }.get(case, v)
    if case == "topk_proxy":
        assert torch.equal(v, OLD_DELTA.topk_proxy_vectors(torch.nan_to_num(h), x["ids"], mask, x["W"], 3))
    old_kw = dict(OLD_CASES[case])
    if old_kw.get("gamma") == "gamma0":  # this batch's own γ⁽⁰⁾, frozen
        _, old_stats = OLD_DELTA.delta_coefficients(v, adv, mask, return_stats=True)
        old_kw["gamma"] = (old_stats["delta/gamma0_pos"], old_stats["delta/gamma0_neg"])
    want, want_stats = OLD_DELTA.delta_coefficients(v, adv, mask, return_stats=True, **old_kw)
    kw = former_functions(old_kw)
    if how == "tensor":
        lam_bar, stats = with_stats(v, adv, mask, **kw)
    else:
        chunks = [(v, adv, mask)]
        (lam_bar,), stats = chunks_with_stats(chunks if how == "one-chunk list" else (lambda: iter(chunks)), **kw)
    assert lam_bar.dtype == torch.float32 and torch.equal(lam_bar, want)
    assert {k: s for k, s in stats.items() if s == s} == {k: s for k, s in want_stats.items() if s == s}
    assert {k for k, s in stats.items() if s != s} == {k for k, s in want_stats.items() if s != s}  # NaNs


def test_random_coefficients_float32_bit_identical_to_the_former_draw():
    x = float32_inputs()
    lam_bar = delta_ablations.random_coefficients(x["adv"], x["mask"], generator=torch.Generator().manual_seed(5))
    want = OLD_DELTA.random_coefficients(x["adv"], x["mask"], generator=torch.Generator().manual_seed(5))
    assert lam_bar.dtype == torch.float32 and torch.equal(lam_bar, want)


def test_delta_py_budgets_and_imports():
    """delta.py is read in one sitting and copied alone (issue #44's budgets): within 420 lines (as ruff formats it
    at 120), no function over 60, no public function with more than 8 parameters, at most 2 assignments that pack
    several values into a tuple, no call at import time (module level: constants, imports, defs, classes whose
    fields are plain defaults), imports torch and the standard library's typing and math only (its script block,
    ``if __name__ == "__main__":``, transformers and itself)."""
    import ast

    source = (Path(__file__).resolve().parents[1] / "delta.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    assert len(source.splitlines()) <= 420
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            assert node.end_lineno - node.lineno + 1 <= 60, node.name
            a = node.args
            if not node.name.startswith("_"):
                assert len(a.posonlyargs + a.args + a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg) <= 8, node.name
            assert not [d for d in a.defaults + a.kw_defaults if isinstance(d, ast.Call)], node.name  # import time
    packed = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        and isinstance(n.value, (ast.Tuple, ast.List))
        and any(isinstance(t, (ast.Tuple, ast.List)) for t in n.targets)
    ]
    assert len(packed) <= 2, [n.lineno for n in packed]
    top = [n.value for n in tree.body if isinstance(n, (ast.Assign, ast.Expr))]
    top += [n.value for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body if isinstance(n, ast.AnnAssign)]
    assert not [n for value in top if value is not None for n in ast.walk(value) if isinstance(n, ast.Call)]
    module_level = [n for n in tree.body if not isinstance(n, ast.If)]  # the script block aside
    script = [n for n in tree.body if isinstance(n, ast.If)]
    for nodes, allowed in ((module_level, {"torch", "typing", "math"}), (script, {"transformers", "delta"})):
        found = [n for node in nodes for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
        imported = {alias.name.split(".")[0] for n in found if isinstance(n, ast.Import) for alias in n.names}
        imported |= {n.module.split(".")[0] for n in found if isinstance(n, ast.ImportFrom)}
        assert imported <= allowed, imported

"""Tests for DelTA's ablations (docs/specs/baselines.md §6, "spec §6"): delta_ablations.py's functions, each passed
to delta.delta_coefficients and delta_coefficients_chunked in its field of ``functions``, random_coefficients and
topk_proxy_vectors.

Values: spec §6's table on its Example B (spec §1), its top-K values on delta.md §7's Example A; the loss column
is recomputed here by an independent dual-clip DAPO token-mean (not grpo.py's); random data is checked against an
independent numpy reference of every variant (written here from spec §6, not from delta.py). All float64.
"""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import delta  # noqa: E402
from comparisons import delta_ablations  # noqa: E402
from comparisons.delta_ablations import random_coefficients, topk_proxy_vectors  # noqa: E402
from trainer import credit_methods  # noqa: E402

F64 = torch.float64
TOL = 1e-9  # spec values are printed to 10 digits


# ----------------------------------------------------------------------------------------------------
# Independent helpers (written here, not imported from delta.py or grpo.py)
# ----------------------------------------------------------------------------------------------------
def grpo_advantages(rewards, eps=1e-6):
    """One group: Â = (r − mean) / (unbiased std + ε) (spec §1)."""
    r = torch.tensor(rewards, dtype=F64)
    return (r - r.mean()) / (r.std(unbiased=True) + eps)


def dapo_token_mean(token_adv, dlogp, mask, clip_low=0.2, clip_high=0.28, clip_c=10.0):
    """verl's dual-clip PPO token loss with DAPO's asymmetric clip, token-mean over valid tokens (spec §1)."""
    ratio = torch.exp(torch.clamp(dlogp, -20.0, 20.0))
    lc = torch.maximum(-token_adv * ratio, -token_adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high))
    per_tok = torch.where(token_adv < 0, torch.minimum(lc, -token_adv * clip_c), lc)
    return float((per_tok * mask).sum() / mask.sum())


def np_reference(
    v,
    adv,
    mask,
    K=1,
    lam_min=0.8,
    lam_max=1.2,
    scores="contrastive",
    assignment="soft",
    gamma=None,
    coefficients="bounded",
    normalize=True,
    eps=1e-8,
):
    """λ̄ of every spec §6 variant, numpy float64, loops over tokens' own sides by explicit P / Nn masks."""
    v, adv, mask = (np.asarray(x, dtype=float) for x in (v, adv, mask))
    P, Nn = (adv > 0)[:, None] * mask, (adv < 0)[:, None] * mask
    if P.sum() == 0 or Nn.sum() == 0:
        return mask.copy()
    wp, wn = np.clip(adv, 0, None)[:, None] * mask, np.clip(-adv, 0, None)[:, None] * mask

    def cen(w):
        return (w[..., None] * v).sum((0, 1)) / max(w.sum(), eps)

    def score(mp, mn):  # the token's own-side score, [B, T]
        dp, dn = ((v - mp) ** 2).sum(-1), ((v - mn) ** 2).sum(-1)
        if scores == "within_side":
            return np.where(P > 0, -dp, -dn)
        return np.where(P > 0, dn - dp, dp - dn)

    def stds(s):
        return tuple(np.sqrt(max((s * s * m).sum() / m.sum() - ((s * m).sum() / m.sum()) ** 2, eps)) for m in (P, Nn))

    def alpha(s, g):
        if assignment == "hard":
            return (s > 0).astype(float)
        sig = lambda x: 0.5 * (1.0 + np.tanh(0.5 * x))  # noqa: E731 - σ without overflow on padding's scores
        return np.where(P > 0, sig(s / g[0]), sig(s / g[1]))

    mp, mn = cen(wp), cen(wn)
    s = score(mp, mn)
    g = stds(s) if gamma is None else gamma
    for _ in range(K):
        a = alpha(s, g)
        new_p, new_n = cen(a * wp), cen(a * wn)
        if assignment == "hard":  # spec §6: a side with no Δ > 0 keeps its centroid
            new_p = new_p if (a * wp).sum() > 0 else mp
            new_n = new_n if (a * wn).sum() > 0 else mn
        g = stds(s) if gamma is None else gamma  # lagged
        mp, mn = new_p, new_n
        s = score(mp, mn)
    a = alpha(s, g)
    lo, hi = (0.0, 1.0) if coefficients == "raw" else (lam_min, lam_max)
    lam = np.where(adv[:, None] == 0, lo, lo + (hi - lo) * a) * mask
    return lam * mask.sum() / max(lam.sum(), eps) if normalize else lam


def with_functions(kw):
    """The reference's keywords (spec §6's names) as delta_coefficients' call: K and the λ range as they are, each
    ablation as the function delta_ablations.py passes in its field (``gamma``: a ``FrozenTemperature`` holding it)."""
    swaps = {
        ("scores", "within_side"): ("score", delta_ablations.within_side_scores),
        ("assignment", "hard"): ("assignment", delta_ablations.hard_assignment),
        ("coefficients", "raw"): ("coefficients", delta_ablations.raw_coefficients),
        ("normalize", False): ("normalize", delta_ablations.no_normalization),
    }
    functions = dict(swaps[key, value] for key, value in kw.items() if (key, value) in swaps)
    if kw.get("gamma") is not None:
        functions["gamma"] = delta_ablations.FrozenTemperature(kw["gamma"])
    rest = {key: value for key, value in kw.items() if key in ("K", "lam_min", "lam_max")}
    return {**rest, "functions": delta.DeltaFunctions(**functions)}


def coefficients(v, adv, mask, **kw):
    """λ̄ [B, T] of the whole batch (``delta.delta_coefficients``)."""
    return delta.delta_coefficients(v, adv, mask, **kw).lam_bar


def with_stats(v, adv, mask, **kw):
    """λ̄ [B, T] and the logged statistics (``delta.delta_stats``) of the whole batch (v, Â, mask)."""
    result = delta.delta_coefficients(v, adv, mask, **kw)
    return result.lam_bar, delta.delta_stats(result, adv, mask)


def stream(v, adv, mask, sizes, **kw):
    """delta_coefficients_chunked on row chunks (v, Â, mask) of ``sizes`` (each cut to its own length); λ̄ re-padded
    to [B, T] (and, with ``return_stats``, the statistics)."""
    chunks, s = [], 0
    for n in sizes:
        L = max(int(mask[s : s + n].sum(1).max()), 1)
        chunks.append((v[s : s + n, :L], adv[s : s + n], mask[s : s + n, :L]))
        s += n
    assert s == v.shape[0]
    result = delta.delta_coefficients_chunked(chunks, **with_functions(kw))
    lam = torch.cat([torch.nn.functional.pad(x, (0, v.shape[1] - x.shape[1])) for x in result.lam_bar])
    return (lam, delta.delta_stats(result._replace(lam_bar=lam), adv, mask)) if kw.get("return_stats") else lam


def random_batch(seed, B=12, T=8, H=5, group=4):
    """Random v (garbage on padding), right-padded masks, GRPO Â of 3 groups: one all-equal (Â = 0), two mixed."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(B, T, H, generator=g, dtype=F64)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(F64)
    rewards = torch.randint(0, 2, (B,), generator=g).to(F64)
    rewards[:group] = 1.0
    for s in range(group, B, group):
        rewards[s], rewards[s + 1] = 1.0, 0.0
    adv = torch.cat([grpo_advantages(rewards[s : s + group].tolist()) for s in range(0, B, group)])
    adv[:group] = 0.0  # the all-equal group (NaN-free: its std is 0)
    return v.masked_fill(mask[..., None] == 0, 1e3), adv, mask


# ----------------------------------------------------------------------------------------------------
# Example B (spec §1) and spec §6's table
# ----------------------------------------------------------------------------------------------------
V_B = [
    [[0.5, 0.2], [0.1, 0.9], [-0.3, 0.4], [0.8, -0.1]],
    [[0.4, 0.3], [-0.6, 0.2], [0.2, -0.5], [0.0, 0.0]],  # last: padding
    [[0.0, 0.7], [0.3, 0.1], [-0.2, -0.4], [0.6, 0.6]],
]
MASK_B = [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]]
DLOGP_B = [[0.1, -0.2, 0.3, 0.0], [0.05, -0.1, 0.2, 0.0], [-0.3, 0.1, 0.0, 0.25]]
GAMMA_B = (0.1231199173, 0.2432273375)  # default γ±⁽⁰⁾
GAMMA_B_WITHIN = (0.1460468675, 0.1620007147)

# flag: (keyword arguments, λ̄ rows (None on padding), loss)
TABLE_B = {
    "delta": (
        {},
        [
            [1.0985491049, 1.1428667940, 0.8455375423, 1.0879153147],
            [0.8698839773, 1.1101566035, 1.1094178099, None],
            [0.8588903015, 0.9517633914, 1.1305136578, 0.7945055027],
        ],
        -0.0774846123,
    ),
    "within_side": (
        {"scores": "within_side"},
        [
            [1.1181388040, 0.9511656529, 0.9480562160, 0.9499831966],
            [1.1209801047, 0.9275062863, 0.9467933263, None],
            [0.9750141425, 1.1441008559, 0.9391212310, 0.9791401838],
        ],
        -0.0493918966,
    ),
    "hard": (
        {"assignment": "hard"},
        [
            [1.1785714286, 1.1785714286, 0.7857142857, 1.1785714286],
            [0.7857142857, 1.1785714286, 1.1785714286, None],
            [0.7857142857, 0.7857142857, 1.1785714286, 0.7857142857],
        ],
        -0.0990515796,
    ),
    "no_lamnorm": (
        {"normalize": False},
        [
            [1.1471261027, 1.1934034859, 0.8829265630, 1.1360220944],
            [0.9083495787, 1.1592468758, 1.1584754134, None],
            [0.8968697709, 0.9938496376, 1.1805041035, 0.8296379258],
        ],
        -0.0809109224,
    ),
    "raw_alpha": (
        {"coefficients": "raw"},
        [
            [1.4213708717, 1.6108620223, 0.3395578733, 1.3759034932],
            [0.4436570284, 1.4710015789, 1.4678426859, None],
            [0.3966508704, 0.7937525479, 1.5580431581, 0.1213578700],
        ],
        -0.1523070642,
    ),
    "K=0": (
        {"K": 0},
        [
            [1.0359093951, 1.1134390762, 0.8888329652, 1.0222623982],
            [0.9301034634, 1.0728609483, 1.0756429695, None],
            [0.9203720331, 0.9765079566, 1.0997166021, 0.8643521924],
        ],
        -0.0601200708,
    ),
    "K=2": (
        {"K": 2},
        [
            [1.0869451462, 1.1294230597, 0.8878665360, 1.0890888708],
            [0.8934983588, 1.0796815472, 1.0637450790, None],
            [0.8956663375, 0.9457519218, 1.0991760913, 0.8291570517],
        ],
        -0.0819799926,
    ),
    "K=3": (
        {"K": 3},
        [
            [1.0604842776, 1.1057531375, 0.9064041775, 1.0639560657],
            [0.9206065619, 1.0645293241, 1.0489214408, None],
            [0.9235451122, 0.9600962253, 1.0813162155, 0.8643874618],
        ],
        -0.0734630238,
    ),
    "lam 0.5,1.2": (
        {"lam_min": 0.5, "lam_max": 1.2},
        [
            [1.1941882656, 1.2815150371, 0.6956360306, 1.1732346782],
            [0.7436100026, 1.2170605180, 1.2156047459, None],
            [0.7219472705, 0.9049511068, 1.2571735264, 0.5950788183],
        ],
        -0.0996515082,
    ),
    "lam 0.8,1.5": (
        {"lam_min": 0.8, "lam_max": 1.5},
        [
            [1.1467243130, 1.2127064696, 0.7700293879, 1.1308922507],
            [0.8062774488, 1.1640060757, 1.1629061268, None],
            [0.7899095726, 0.9281831808, 1.1943145682, 0.6940506059],
        ],
        -0.0886504864,
    ),
    "lam 0.5,1.5": (
        {"lam_min": 0.5, "lam_max": 1.5},
        [
            [1.2316578465, 1.3358347482, 0.6369075057, 1.2066611614],
            [0.6941382915, 1.2589434126, 1.2572067421, None],
            [0.6682956288, 0.8866109553, 1.3067964232, 0.5169472847],
        ],
        -0.1083360710,
    ),
    "fixed_gamma=(0.5,0.5)": (
        {"gamma": (0.5, 0.5)},
        [
            [1.0126847301, 1.0537496709, 0.9578991411, 1.0065415555],
            [0.9491317109, 1.0558759373, 1.0599030124, None],
            [0.9410691664, 0.9826709335, 1.0817723956, 0.8987017463],
        ],
        -0.0580916583,
    ),
}
U_B = [[0.1, 0.9, 0.5, 0.3], [0.7, 0.2, 0.6, 0.0], [0.4, 0.8, 0.05, 0.35]]
RANDOM_B = (
    [
        [0.8587360595, 1.1858736059, 1.0223048327, 0.9405204461],
        [1.1040892193, 0.8996282528, 1.0631970260, None],
        [0.9814126394, 1.1449814126, 0.8382899628, 0.9609665428],
    ],
    -0.0494437723,
)
# spec §6 fixed_gamma: K = 2 with γ frozen at γ⁽⁰⁾ (first row and loss given there)
K2_FROZEN_ROW0, K2_FROZEN_LOSS = [1.1305667960, 1.1474965893, 0.8307952616, 1.1318852898], -0.0879996934
# Every variant of delta_coefficients (the table's keyword sets, and some combinations), for the invariants.
VARIANTS = [kw for kw, _, _ in TABLE_B.values()] + [
    {"scores": "within_side", "K": 2},
    {"assignment": "hard", "K": 3},
    {"coefficients": "raw", "normalize": False},
    {"gamma": (0.3, 0.7), "K": 2},
    {"scores": "within_side", "coefficients": "raw"},
]


def example_b():
    v, mask = torch.tensor(V_B, dtype=F64), torch.tensor(MASK_B, dtype=F64)
    return v, grpo_advantages([1.0, 0.0, 0.0]), mask


def expected(rows):
    return torch.tensor([[0.0 if x is None else x for x in r] for r in rows], dtype=F64)


def coefficients_of(impl, v, adv, mask, **kw):
    if impl == "batch":
        if kw.get("return_stats"):
            return with_stats(v, adv, mask, **with_functions(kw))
        return coefficients(v, adv, mask, **with_functions(kw))
    return stream(v, adv, mask, [1, v.shape[0] - 1], **kw)


def test_example_b_inputs_and_plain_dapo():
    v, adv, mask = example_b()
    assert adv.tolist() == pytest.approx([1.1546985384, -0.5773492692, -0.5773492692], abs=1e-10)
    assert mask.sum() == 11
    dlogp = torch.tensor(DLOGP_B, dtype=F64)
    assert dapo_token_mean(adv[:, None] * mask, dlogp, mask) == pytest.approx(-0.0546432602, abs=TOL)


@pytest.mark.parametrize("impl", ["batch", "stream"])
@pytest.mark.parametrize("flag", list(TABLE_B))
def test_spec_table_example_b(flag, impl):
    kw, rows, loss = TABLE_B[flag]
    v, adv, mask = example_b()
    lb = coefficients_of(impl, v, adv, mask, **kw)
    assert lb.dtype == F64
    torch.testing.assert_close(lb, expected(rows), atol=TOL, rtol=0)
    dlogp = torch.tensor(DLOGP_B, dtype=F64)
    assert dapo_token_mean(adv[:, None] * lb * mask, dlogp, mask) == pytest.approx(loss, abs=TOL)
    if kw.get("normalize", True):
        assert float((lb * mask).sum()) == pytest.approx(11.0, abs=1e-12)


@pytest.mark.parametrize("impl", ["batch", "stream"])
def test_example_b_temperatures_in_stats(impl):
    v, adv, mask = example_b()
    for kw, gammas in (({}, GAMMA_B), ({"scores": "within_side"}, GAMMA_B_WITHIN)):
        _, st = coefficients_of(impl, v, adv, mask, return_stats=True, **kw)
        assert set(st) == set(delta.STAT_KEYS)
        assert (st["delta/gamma0_pos"], st["delta/gamma0_neg"]) == pytest.approx(gammas, abs=1e-10)
        assert (st["delta/gamma_pos"], st["delta/gamma_neg"]) == pytest.approx(gammas, abs=1e-10)  # lagged, K = 1
    _, st = coefficients_of(impl, v, adv, mask, return_stats=True, gamma=(0.5, 0.5))
    assert (st["delta/gamma_pos"], st["delta/gamma_neg"]) == (0.5, 0.5)  # the temperatures used
    assert (st["delta/gamma0_pos"], st["delta/gamma0_neg"]) == pytest.approx(GAMMA_B, abs=1e-10)  # measured
    _, st = coefficients_of(impl, v, adv, mask, return_stats=True, normalize=False)
    assert st["delta/scale"] == 1.0


@pytest.mark.parametrize("impl", ["batch", "stream"])
def test_fixed_gamma_at_this_batchs_gamma0_is_the_default_at_k1(impl):
    """Spec §6: the lag makes γ⁽¹⁾ = γ⁽⁰⁾, so γ frozen at this batch's γ⁽⁰⁾ is a no-op at K = 1 (bit for bit),
    and differs at K = 2 (the value spec §6 gives)."""
    for v, adv, mask in (random_batch(3), example_b()):
        lb, st = coefficients_of(impl, v, adv, mask, return_stats=True)
        g0 = (st["delta/gamma0_pos"], st["delta/gamma0_neg"])
        assert torch.equal(coefficients_of(impl, v, adv, mask, gamma=g0), lb)
    lb2 = coefficients_of(impl, v, adv, mask, K=2, gamma=g0)  # Example B's γ⁽⁰⁾ in full precision
    assert lb2[0].tolist() == pytest.approx(K2_FROZEN_ROW0, abs=TOL)
    dlogp = torch.tensor(DLOGP_B, dtype=F64)
    assert dapo_token_mean(adv[:, None] * lb2 * mask, dlogp, mask) == pytest.approx(K2_FROZEN_LOSS, abs=TOL)
    assert not torch.allclose(lb2, coefficients_of(impl, v, adv, mask, K=2), atol=1e-3)


@pytest.mark.parametrize("normalize", [True, False])
def test_random_coefficients_example_b(normalize):
    v, adv, mask = example_b()
    u = torch.tensor(U_B, dtype=F64)
    lb = random_coefficients(adv, mask, u=u, normalize=normalize)
    lam = (0.8 + 0.4 * u) * mask  # spec §6: λ = λ_min + (λ_max − λ_min)·u, no Â = 0 token here
    if normalize:
        torch.testing.assert_close(lb, expected(RANDOM_B[0]), atol=TOL, rtol=0)
        dlogp = torch.tensor(DLOGP_B, dtype=F64)
        assert dapo_token_mean(adv[:, None] * lb * mask, dlogp, mask) == pytest.approx(RANDOM_B[1], abs=TOL)
        torch.testing.assert_close(lb, lam * 11 / lam.sum(), atol=1e-12, rtol=0)
    else:
        torch.testing.assert_close(lb, lam, atol=1e-15, rtol=0)


def test_random_coefficients_zero_advantage_rows_draws_and_range():
    v, adv, mask = random_batch(5)
    u = torch.rand(mask.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    lam = random_coefficients(adv, mask, u=u, normalize=False)
    zero = (adv == 0)[:, None] & (mask > 0)
    assert bool((lam[zero] == 0.8).all())  # λ_min on Â = 0 responses
    side = (adv != 0)[:, None] & (mask > 0)
    torch.testing.assert_close(lam[side], 0.8 + 0.4 * u[side], atol=1e-15, rtol=0)
    assert bool((lam[mask == 0] == 0).all())
    lb = random_coefficients(adv, mask, u=u)
    N, Z = float(mask.sum()), float(lam.sum())
    assert float(lb.sum()) == pytest.approx(N, abs=1e-12)
    valid = mask > 0
    assert bool((lb[valid] >= 0.8 * N / Z - 1e-12).all()) and bool((lb[valid] <= 1.2 * N / Z + 1e-12).all())
    # drawn with the generator: reproducible, different for another seed, float32 by default
    a = random_coefficients(adv.float(), mask, generator=torch.Generator().manual_seed(7))
    b = random_coefficients(adv.float(), mask, generator=torch.Generator().manual_seed(7))
    c = random_coefficients(adv.float(), mask, generator=torch.Generator().manual_seed(8))
    assert a.dtype == torch.float32 and torch.equal(a, b) and not torch.equal(a, c)
    assert float(a.double().sum()) == pytest.approx(N, rel=1e-6)
    with pytest.raises(ValueError, match="u must"):
        random_coefficients(adv, mask, u=u + 1.5)
    with pytest.raises(ValueError, match="u must"):
        random_coefficients(adv, mask, u=u[:, :-1])
    with pytest.raises(ValueError, match="adv"):
        random_coefficients(adv[:-1], mask)
    with pytest.raises(ValueError, match="lam_min"):
        random_coefficients(adv, mask, lam_min=1.3)


# ----------------------------------------------------------------------------------------------------
# Every variant: invariants, independent reference, streaming, guards
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "delta")
@pytest.mark.parametrize("seed", [0, 1])
def test_variants_match_reference_stream_and_invariants(kw, seed):
    v, adv, mask = random_batch(seed)
    lb = coefficients(v, adv, mask, **with_functions(kw))
    ref = torch.tensor(np_reference(v.numpy(), adv.numpy(), mask.numpy(), **kw), dtype=F64)
    torch.testing.assert_close(lb, ref, atol=1e-10, rtol=0)
    for sizes in ([5, 7], [4, 1, 3, 4]):  # uneven chunks, each cut to its own length
        torch.testing.assert_close(stream(v, adv, mask, sizes, **kw), lb, atol=1e-10, rtol=0)
    assert bool((lb[mask == 0] == 0).all())  # padding
    if kw.get("normalize", True):
        assert float((lb * mask).sum()) == pytest.approx(float(mask.sum()), abs=1e-10)
    side = (adv != 0)[:, None] & (mask > 0)
    token_adv = delta.delta_token_advantages(adv, lb, mask)
    assert torch.equal(torch.sign(token_adv[side]), torch.sign(adv[:, None].expand_as(mask)[side]))  # λ̄ > 0 there
    assert bool((token_adv[mask > 0][~side[mask > 0]] == 0).all())


@pytest.mark.parametrize("kw", VARIANTS[:8], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "delta")
def test_variants_stream_from_hidden_and_old_logp(kw):
    """The (h, log p) chunks of the trainer give the same λ̄ as v = proxy_vectors(h, log p) for each ablation."""
    v, adv, mask = random_batch(9)
    logp = -torch.rand(mask.shape, generator=torch.Generator().manual_seed(2), dtype=F64) * 3

    def chunks():  # v made afresh in each pass, as the trainer does
        return ((delta.proxy_vectors(v[s], logp[s], mask[s]), adv[s], mask[s]) for s in (slice(0, 6), slice(6, None)))

    lb = torch.cat(delta.delta_coefficients_chunked(chunks, **with_functions(kw)).lam_bar)
    torch.testing.assert_close(
        lb, coefficients(delta.proxy_vectors(v, logp, mask), adv, mask, **with_functions(kw)), atol=1e-10, rtol=0
    )


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "delta")
@pytest.mark.parametrize("case", ["no_negative", "no_positive", "all_zero"])
def test_one_side_empty_gives_ones_for_every_variant(kw, case):
    v, adv, mask = random_batch(4)
    adv = {"no_negative": adv.clamp(min=0), "no_positive": adv.clamp(max=0), "all_zero": adv * 0}[case]
    lb, st = with_stats(v, adv, mask, **with_functions(kw))
    assert torch.equal(lb, mask) and st["delta/fallback"] == 1.0
    assert math.isnan(st["delta/gamma0_pos"]) and math.isnan(st["delta/gamma0_neg"])
    assert torch.equal(stream(v, adv, mask, [6, 6], **kw), mask)
    assert torch.equal(random_coefficients(adv, mask, u=torch.full(mask.shape, 0.3, dtype=F64)), mask)


@pytest.mark.parametrize("impl", ["batch", "stream"])
def test_hard_assignment_keeps_a_centroid_without_positive_scores(impl):
    """Spec §6 hard: a side with no token of Δ > 0 keeps μ⁽ᵏ⁾ (its weights |Â|·α sum to 0). Both responses have
    the same v, so μ₊ = μ₋, every margin is 0 and α ≡ 0 on both sides: λ = λ_min everywhere (λ̄ ≡ 1) and the
    reported centroids are μ⁽⁰⁾ (without the guard they would be the zero vector)."""
    v = torch.tensor([[[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]]], dtype=F64).expand(2, -1, -1).contiguous()
    adv, mask = torch.tensor([1.0, -1.0], dtype=F64), torch.ones(2, 3, dtype=F64)
    mu0 = float(v[0].mean(0).norm())
    for kw in ({"assignment": "hard", "K": 2}, {"assignment": "hard", "scores": "within_side"}):
        lb, st = coefficients_of(impl, v, adv, mask, return_stats=True, **kw)
        torch.testing.assert_close(lb, mask, atol=1e-12, rtol=0)
        assert st["delta/mu_pos_norm"] == pytest.approx(mu0, abs=1e-12)
        assert st["delta/mu_neg_norm"] == pytest.approx(mu0, abs=1e-12)


def test_the_default_functions_are_the_papers_and_an_ablations_function_is_used():
    """``functions`` None and ``DeltaFunctions()`` (the paper's) give delta.py's λ̄ and statistics bit for bit, in
    float32 and float64, for K = 0, 1, 2, the whole batch and chunks (a list, a callable, a pool), a batch with one
    side only (the guard); a function in a field is the one called, as often as the paper's (1 + K temperatures)."""
    for seed, dtype, K in ((6, torch.float32, 0), (6, torch.float32, 1), (8, F64, 1), (9, F64, 2)):
        v, adv, mask = (x.to(dtype) for x in random_batch(seed))
        for batch in ((v, adv, mask), (v, adv.clamp(min=0), mask)):
            want = delta.delta_coefficients(*batch, K)
            got = delta.delta_coefficients(*batch, K, functions=delta.DeltaFunctions())
            assert torch.equal(got.lam_bar, want.lam_bar) and got.lam_bar.dtype == dtype
            assert str(delta.delta_stats(got, *batch[1:])) == str(delta.delta_stats(want, *batch[1:]))
        streamed = [(v[:5], adv[:5], mask[:5]), (v[5:], adv[5:], mask[5:])]
        for chunks in ([(v, adv, mask)], streamed, lambda: iter(streamed)):
            for pool in (None, lambda t: t):
                want = delta.delta_coefficients_chunked(chunks, K, pool=pool)
                got = delta.delta_coefficients_chunked(chunks, K, pool=pool, functions=delta.DeltaFunctions())
                assert all(torch.equal(x, y) for x, y in zip(got.lam_bar, want.lam_bar))
    calls = []

    def counted(margins_pos, margins_neg):  # the paper's temperature, counted
        calls.append(1)
        return delta.adaptive_temperature(margins_pos, margins_neg)

    v, adv, mask = random_batch(10)
    for K in (0, 2):
        functions = delta.DeltaFunctions(gamma=counted, assignment=delta_ablations.hard_assignment)
        calls.clear()
        got = delta.delta_coefficients(v, adv, mask, K, functions=functions).lam_bar
        assert len(calls) == 1 + K
        ref = np_reference(v.numpy(), adv.numpy(), mask.numpy(), K=K, assignment="hard")
        torch.testing.assert_close(got, torch.tensor(ref, dtype=F64), atol=1e-10, rtol=0)
        calls.clear()
        chunked = delta.delta_coefficients_chunked(
            [(v[:7], adv[:7], mask[:7]), (v[7:], adv[7:], mask[7:])], K, functions=functions
        )
        assert len(calls) == 1 + K
        torch.testing.assert_close(torch.cat(chunked.lam_bar), got, atol=1e-10, rtol=0)


def test_ablation_validation_errors():
    v, adv, mask = random_batch(7)
    for gamma in (0.5, (0.5,), (0.5, -1.0), (0.5, float("nan")), ("a", "b")):
        with pytest.raises(ValueError, match="gamma"):
            delta_ablations.FrozenTemperature(gamma)
    with pytest.raises(ValueError, match=r"\(v, adv, loss_mask\) tuple"):  # the former (v, None, mask, Â) chunk
        delta.delta_coefficients_chunked([(v[:6], None, mask[:6], adv[:6])])


# ----------------------------------------------------------------------------------------------------
# Top-K hidden-gradient proxy (App. F; spec §6) on delta.md §7's Example A
# ----------------------------------------------------------------------------------------------------
W_A = [[1.0, 0.0], [0.0, 1.0], [-1.0, 0.5]]
H_A = [[[0.5, 1.0], [1.5, -0.5], [0.2, 0.3]], [[0.4, 0.9], [-1.0, 0.8], [0.0, 0.0]]]
Y_A, MASK_A = [[1, 0, 2], [1, 2, 0]], [[1, 1, 1], [1, 1, 0]]
DLOGP_A = [[0.1, -0.3, 0.05], [0.2, -0.1, 0.0]]
TOPK_A = {  # K: (v rows, λ̄ rows, loss), spec §6
    2: (
        [
            [[-0.3775406688, 0.3775406688], [0.1192029220, -0.1192029220], [-1.4750208125, -0.0249791875]],
            [[-0.3775406688, 0.3775406688], [-0.3543436938, -0.1771718469], [0.0, 0.0]],
        ],
        [[0.8615144800, 0.7791493091, 1.1081024804], [1.1256168652, 1.1256168652, None]],
        -0.0425554730,
    ),
    3: (
        [
            [[-0.1208721625, 0.4003577473], [0.1813150311, -0.1317784996], [-1.0766995102, -0.0182336945]],
            [[-0.0880631854, 0.4032743693], [-0.4454006487, -0.1397027799], [0.0, 0.0]],
        ],
        [[0.8388125788, 0.8373298082, 1.2407416552], [1.2401428589, 0.8429730989, None]],
        -0.0812080974,
    ),
}


def example_a():
    return (
        torch.tensor(H_A, dtype=F64),
        torch.tensor(Y_A),
        torch.tensor(MASK_A, dtype=F64),
        torch.tensor(W_A, dtype=F64),
        grpo_advantages([1.0, 0.0]),
    )


def exact_hidden_gradient(h, y, W, temperature=1.0):
    """∇_h log softmax(hWᵀ/T)_y · T = W_y − Σ_j p_j W_j, by autograd (the full vocabulary; independent formula)."""
    h = h.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(h @ W.T / temperature, -1).gather(-1, y[..., None]).sum()
    (g,) = torch.autograd.grad(logp, h)
    return g * temperature


@pytest.mark.parametrize("K", [2, 3])
def test_topk_proxy_example_a(K):
    h, y, mask, W, adv = example_a()
    v_rows, lb_rows, loss = TOPK_A[K]
    v = topk_proxy_vectors(h, y, mask, W, K)
    assert v.dtype == F64
    torch.testing.assert_close(v, torch.tensor(v_rows, dtype=F64), atol=TOL, rtol=0)
    for impl in ("batch", "stream"):
        lb = coefficients_of(impl, v, adv, mask)
        torch.testing.assert_close(lb, expected(lb_rows), atol=TOL, rtol=0)
        dlogp = torch.tensor(DLOGP_A, dtype=F64)
        assert dapo_token_mean(adv[:, None] * lb * mask, dlogp, mask) == pytest.approx(loss, abs=TOL)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_topk_proxy_with_k_equal_v_is_the_exact_hidden_gradient(temperature, monkeypatch):
    g = torch.Generator().manual_seed(11)
    B, T, H, V = 3, 5, 4, 7
    h, W = torch.randn(B, T, H, generator=g, dtype=F64), torch.randn(V, H, generator=g, dtype=F64)
    y = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=F64)
    mask[1, 3:] = 0
    y[1, 4] = -100  # an ignore-index on padding is not read
    exact = exact_hidden_gradient(h, y.clamp(min=0), W, temperature) * mask[..., None]
    v = topk_proxy_vectors(h, y, mask, W, V, temperature=temperature)
    torch.testing.assert_close(v, exact, atol=1e-12, rtol=0)
    assert bool((v[mask == 0] == 0).all())
    # K < V against the formula on the whole [B, T, V] logits, with the default block and one token per block
    ref = _topk_all_at_once(h, y, mask, W, 3, temperature)
    torch.testing.assert_close(topk_proxy_vectors(h, y, mask, W, 3, temperature=temperature), ref, atol=1e-12, rtol=0)
    monkeypatch.setattr(delta, "ROW_BLOCK_BYTES", 1)
    torch.testing.assert_close(topk_proxy_vectors(h, y, mask, W, 3, temperature=temperature), ref, atol=1e-12, rtol=0)
    assert not torch.allclose(ref, exact, atol=1e-3)  # K = 3 < V is an approximation


def _topk_all_at_once(h, y, mask, W, K, temperature):
    z = h @ W.T / temperature  # [B, T, V]: fine for a test
    j = torch.argsort(z, dim=-1, descending=True)[..., :K]  # the top K, by a full sort
    p = torch.softmax(z.gather(-1, j), -1)
    v = W[y.clamp(min=0)] - (p[..., None] * W[j]).sum(-2)
    return v * mask[..., None]


def test_topk_proxy_dtype_grad_stream_and_errors():
    h, y, mask, W, adv = example_a()
    hf = h.float().requires_grad_(True)
    v = topk_proxy_vectors(hf, y, mask.bool(), W.float(), 2)
    assert v.dtype == torch.float32 and not v.requires_grad
    torch.testing.assert_close(v.double(), topk_proxy_vectors(h, y, mask, W, 2), atol=1e-6, rtol=0)
    # top-K proxies streamed chunk by chunk (old_logp = None) equal the whole batch
    chunks = [
        (topk_proxy_vectors(h[i : i + 1], y[i : i + 1], mask[i : i + 1], W, 2), adv[i : i + 1], mask[i : i + 1])
        for i in range(2)
    ]
    v64 = topk_proxy_vectors(h, y, mask, W, 2)
    streamed = torch.cat(delta.delta_coefficients_chunked(chunks).lam_bar)
    torch.testing.assert_close(streamed, coefficients(v64, adv, mask), atol=1e-10, rtol=0)
    for K in (0, 4, 2.0, True):
        with pytest.raises(ValueError, match="K must"):
            topk_proxy_vectors(h, y, mask, W, K)
    with pytest.raises(ValueError, match="temperature"):
        topk_proxy_vectors(h, y, mask, W, 2, temperature=0.0)
    with pytest.raises(ValueError, match="token_ids must lie"):
        topk_proxy_vectors(h, y + 1, mask, W, 2)
    with pytest.raises(ValueError, match="token_ids must be an integer"):
        topk_proxy_vectors(h, y.double(), mask, W, 2)
    with pytest.raises(ValueError, match="lm_head_weight"):
        topk_proxy_vectors(h, y, mask, W.T, 2)
    with pytest.raises(ValueError, match="token_ids"):
        topk_proxy_vectors(h, y[:, :2], mask, W, 2)


# ----------------------------------------------------------------------------------------------------
# Beside the method: the functions a run chooses once, state across steps, and delta.py naming none of them
# ----------------------------------------------------------------------------------------------------
def test_frozen_temperature_keeps_the_first_batchs_gamma0():
    """--delta_gamma frozen: the first batch with both sides freezes its γ±⁽⁰⁾ (at K = 1 its λ̄ is the default's,
    bit for bit: the lag makes γ⁽¹⁾ = γ⁽⁰⁾); a later batch uses it, as if it had been given; a batch with one side
    (the guard) measures nothing and freezes nothing."""
    frozen = delta_ablations.FrozenTemperature()
    functions = delta.DeltaFunctions(gamma=frozen)
    v1, adv1, mask1 = random_batch(21)
    assert torch.equal(coefficients(v1, adv1.clamp(min=0), mask1, functions=functions), mask1)
    assert frozen.gamma is None
    lb1, st1 = with_stats(v1, adv1, mask1, functions=functions)
    assert torch.equal(lb1, coefficients(v1, adv1, mask1))
    assert frozen.gamma == (st1["delta/gamma0_pos"], st1["delta/gamma0_neg"])
    v2, adv2, mask2 = random_batch(22)
    lb2, st2 = with_stats(v2, adv2, mask2, functions=functions)
    assert (
        (st2["delta/gamma_pos"], st2["delta/gamma_neg"])
        == frozen.gamma
        != (st2["delta/gamma0_pos"], st2["delta/gamma0_neg"])
    )
    torch.testing.assert_close(
        lb2, torch.tensor(np_reference(v2.numpy(), adv2.numpy(), mask2.numpy(), gamma=frozen.gamma)), atol=1e-10, rtol=0
    )
    assert not torch.allclose(lb2, coefficients(v2, adv2, mask2), atol=1e-4)


def test_functions_from_flags_puts_one_function_per_ablation_flag():
    from conftest import comparison_config  # grpo.py's flags and the ablations'

    paper = delta.DeltaFunctions()
    assert delta_ablations.functions_from_flags(comparison_config(credit="delta")) == paper
    for flags, field, fn in (
        (dict(delta_scores="within_side"), "score", delta_ablations.within_side_scores),
        (dict(delta_assignment="hard"), "assignment", delta_ablations.hard_assignment),
        (dict(delta_coefficients="raw"), "coefficients", delta_ablations.raw_coefficients),
        (dict(delta_normalize=False), "normalize", delta_ablations.no_normalization),
    ):
        functions = delta_ablations.functions_from_flags(comparison_config(credit="delta", **flags))
        assert getattr(functions, field) is fn and functions._replace(**{field: getattr(paper, field)}) == paper, flags
    frozen = comparison_config(credit="delta", delta_gamma="frozen")
    one, two = (delta_ablations.functions_from_flags(frozen) for _ in range(2))
    assert isinstance(one.gamma, delta_ablations.FrozenTemperature) and one.gamma is not two.gamma
    assert delta_ablations.proxy_from_flags(comparison_config(credit="delta")) is delta_ablations.paper_proxy
    topk = delta_ablations.proxy_from_flags(comparison_config(credit="delta", delta_proxy="topk", delta_proxy_topk=7))
    assert topk.needs_lm_head and topk.K == 7


def test_delta_py_code_names_no_ablation():
    """delta.py holds the paper's method: its code (names and string literals; docstrings and comments left out)
    names none of the ablations, which live in delta_ablations.py. The former keyword values would be caught."""
    import ast

    def code_words(source):
        tree = ast.parse(source)
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        words = set()
        for node in ast.walk(tree):
            for field in ("id", "attr", "name", "arg", "module"):
                if isinstance(getattr(node, field, None), str):
                    words.add(getattr(node, field).lower())
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                words.add(node.value.lower())
        return words

    ablations = (
        "hard",
        "within",
        "raw",
        "random",
        "frozen",
        "fixed",
        "topk",
        "top_k",
        "lamnorm",
        "ablation",
        "select",
        "uniform",
        "q2",
    )
    source = (Path(__file__).resolve().parents[1] / "delta.py").read_text(encoding="utf-8")
    assert not {w for w in code_words(source) for a in ablations if a in w}
    assert {w for w in code_words('if assignment == "hard":\n    x = scores\n') for a in ablations if a in w}


def test_trainer_keeps_frozen_gamma_in_the_ablations_object_and_resumes_it():
    """The run's credit function chooses the functions once; --delta_gamma frozen's state is the FrozenTemperature's,
    which the checkpoint reads and --resume writes back (the credit's ``state_dict`` / ``load_state_dict``, through
    run_setup.trainer_state / restore); without the flag there is no state to set."""
    from conftest import comparison_config, method_of

    from trainer import run_setup

    def credit_of(**flags):  # the run's credit function, as grpo.train makes it
        cfg = comparison_config(**flags)
        return method_of(cfg).credit(cfg, None)

    credit = credit_of(credit="delta", delta_gamma="frozen")
    functions = credit.functions
    assert isinstance(credit, delta_ablations.DeltaAblationCredit)
    assert isinstance(functions.gamma, delta_ablations.FrozenTemperature)
    assert credit.state_dict() == {"delta_gamma": None}
    credit.load_state_dict({"delta_gamma": [0.25, 0.5]})  # as read back from a checkpoint's JSON
    assert delta_ablations.kept_gamma(functions) == (0.25, 0.5)
    one = torch.tensor(1.0, dtype=F64)
    sums = (delta.MarginSums(one, one, one), delta.MarginSums(2 * one, 4 * one, one))  # one token each: γ = 0 (ε)
    assert [float(gamma) for gamma in functions.gamma(*sums)] == [0.25, 0.5]
    sampler = type("Sampler", (), {"position": 3})()
    state = {**run_setup.trainer_state(sampler, credit), "step": 4}
    assert state["delta_gamma"] == (0.25, 0.5)
    again = credit_of(credit="delta", delta_gamma="frozen")
    assert run_setup.restore(state, sampler, again) == 4
    assert delta_ablations.kept_gamma(again.functions) == (0.25, 0.5)
    plain = credit_of(credit="delta")
    assert type(plain) is credit_methods.DeltaCredit and plain.state_dict() == {}  # the paper's: no state
    assert plain.functions == delta.DeltaFunctions()  # delta.py's own λ̄: the paper's functions
    assert not hasattr(delta.adaptive_temperature, "gamma")
    assert credit_of(credit="delta", delta_coefficients="random").asks.hidden is False  # no v: no h_t

"""cscr.py and cscr_ablations.py give, bit for bit, what cscr.py gave before the ablations moved beside it.

The former code runs here, beside today's, on the same torch kernels: tests/frozen/cscr_71d7a89.py is cscr.py at
commit 71d7a89 byte for byte (tests/frozen/README.md), with its keyword API (``cscr_token_advantages(...,
threshold=, alpha=, w_min=, mode=, weight=, scope=, group_size=, sign_eps=, sign_mix=, return_stats=True)``).
Bits recorded on another CPU would not do: torch's kernel sets (ATEN_CPU_CAPABILITY) round exp and sums differently.
The inputs: random float32 and float64 tensors (8 rows of 6 tokens: padding with -inf / NaN garbage, a row with
Â = 0, a row whose every weight underflows at α = 30). Each case keeps its old keywords; ``call`` says how the same
run is asked for now (the ablations by their flag's name through ``cscr_ablations.choose``, as grpo.py does).
Compared: Ã, the logged stats, s of each mode, log w and w of each weight map, and λ at q = 0.8. The arithmetic did
not change, so the comparison is ``torch.equal`` (and == for the stats).
"""

import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from frozen import frozen_sha256, load_frozen  # noqa: E402  tests/frozen/ (pytest puts tests/ on sys.path)

import cscr  # noqa: E402
from comparisons import cscr_ablations  # noqa: E402

OLD = load_frozen("cscr_71d7a89")
DTYPES = (torch.float32, torch.float64)
CASES = [
    ("default", {}),
    ("threshold_0.5", {"threshold": 0.5}),
    ("alpha_0", {"alpha": 0.0}),
    ("alpha_3", {"alpha": 3.0}),
    ("alpha_30", {"alpha": 30.0}),
    ("floor", {"alpha": 4.0, "w_min": 0.1}),
    ("mean", {"mode": "mean"}),
    ("common", {"mode": "common"}),
    ("exp_abs", {"weight": "exp_abs", "alpha": 2.0}),
    ("inverse", {"weight": "inverse", "alpha": 2.0, "w_min": 0.3}),
    ("upweight", {"weight": "upweight"}),
    ("upweight_60", {"weight": "upweight", "alpha": 60.0, "w_min": 0.5}),
    ("sign_aware", {"weight": "sign_aware"}),
    ("sign_aware_args", {"weight": "sign_aware", "sign_eps": 0.1, "sign_mix": 0.3, "w_min": 0.95, "mode": "mean"}),
    ("group", {"scope": "group", "group_size": 4}),
    ("batch", {"scope": "batch"}),
    ("group_alpha_30", {"scope": "group", "group_size": 2, "alpha": 30.0}),
    ("upweight_group", {"weight": "upweight", "scope": "group", "group_size": 4}),
    ("sign_aware_batch", {"weight": "sign_aware", "scope": "batch"}),
    ("inverse_batch", {"weight": "inverse", "scope": "batch", "mode": "common", "threshold": 0.1}),
]
WEIGHT_CASES = [
    ("exp", 1.0, 0.0),
    ("exp", 5.0, 0.5),
    ("exp_abs", 2.0, 0.0),
    ("inverse", 2.0, 0.0),
    ("upweight", 1.0, 0.0),
]  # (weight map, α, w_min) of credit_log_weights / credit_weights


def inputs(dtype):
    """Ã's inputs in ``dtype``, drawn in float64: Â [8], ℓ0, ℓ+, ℓ− [8, 6], the bool mask [8, 6]."""
    B, T = 8, 6
    g = torch.Generator().manual_seed(39)
    mask = torch.arange(T)[None] < torch.tensor([6, 4, 6, 1, 5, 6, 3, 6])[:, None]
    lp0 = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    lp_pos = lp0 + torch.randn(B, T, generator=g, dtype=torch.float64)
    lp_neg = lp0 + 0.8 * torch.randn(B, T, generator=g, dtype=torch.float64)
    lp_pos[5] = lp0[5] - 40 - torch.rand(T, generator=g, dtype=torch.float64)  # row 5: every w underflows at α 30
    lp0[~mask] = -math.inf  # garbage on padding
    lp_pos[~mask] = -math.inf
    lp_neg[~mask] = math.nan
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv[2] = 0.0  # a row without credit
    x = {"adv": adv, "old_logp": lp0, "lp_pos": lp_pos, "lp_neg": lp_neg}
    return {**{k: v.to(dtype) for k, v in x.items()}, "mask": mask}


def call(x, old_keywords, return_stats=True):
    """The old call ``cscr_token_advantages(*x, **old_keywords)`` in today's API: cscr.py's ``cscr_token_advantages``
    and ``cscr_stats`` with its own options, and for an ablation the functions ``cscr_ablations.choose`` gives."""
    kw = dict(old_keywords)
    threshold = kw.pop("threshold", 0.2)
    ablation = cscr_ablations.choose(
        kw.pop("weight", "exp"),
        kw.pop("scope", "sequence"),
        kw.pop("group_size", None),
        kw.pop("sign_eps", 0.2),
        kw.pop("sign_mix", 0.5),
        **kw,
    )  # alpha, w_min, mode
    args = (x["adv"], x["old_logp"], x["lp_pos"], x["lp_neg"], x["mask"], threshold, ablation.settings)
    if ablation.functions == cscr.CscrFunctions():  # cscr.py's own (its options), no functions passed
        token_adv = cscr.cscr_token_advantages(*args)
        stats = cscr.cscr_stats(*args)
    else:  # an ablation's functions (comparisons/cscr_ablations.py)
        token_adv = cscr.cscr_token_advantages(*args, ablation.functions)
        stats = cscr.cscr_stats(*args, ablation.functions)
    return (token_adv, stats) if return_stats else token_adv


# Issue #44 gave exp_abs and inverse the spec §5 forms, w = exp(−α·s) and 1 / (1 + α·s), without the threshold the
# former ones had (tests/test_cscr.py checks them by hand): the former code's cases of those two maps are not compared.
CHANGED_MAPS = ("exp_abs", "inverse")


def test_the_frozen_cscr_is_the_commits_file():
    """tests/frozen/cscr_71d7a89.py is `git show 71d7a89:cscr.py`, unedited (its SHA-256 as README.md states)."""
    assert frozen_sha256("cscr_71d7a89") == "fd3d38c519222b23992642399ac5c13806affae1e9db961d4ecb2f632ec533b5"


def test_the_cases_cover_every_option_and_ablation():
    used = {(k, str(v)) for _, kw in CASES for k, v in kw.items()}
    for key, values in {
        "weight": ("exp_abs", "inverse", "upweight", "sign_aware"),
        "scope": ("group", "batch"),
        "mode": ("mean", "common"),
    }.items():
        assert {(key, v) for v in values} <= used
    assert {"alpha", "w_min", "threshold", "sign_eps", "sign_mix"} <= {k for k, _ in used}


def test_the_inputs_hold_what_the_cases_need():
    for dtype in DTYPES:
        x = inputs(dtype)
        a = cscr.cscr_token_advantages(
            x["adv"], x["old_logp"], x["lp_pos"], x["lp_neg"], x["mask"], 0.2, cscr.Settings(alpha=30.0)
        )
        assert torch.all(a[2] == 0) and bool(torch.isnan(x["lp_neg"][~x["mask"]]).all())
        assert torch.all(torch.exp(-30.0 * (x["old_logp"][5] - x["lp_pos"][5] - 0.2)) == 0)  # row 5 underflows


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_token_advantages_and_stats_are_bit_identical(dtype):
    x = inputs(dtype)
    for name, kw in CASES:
        if kw.get("weight") in CHANGED_MAPS:
            continue
        token_adv, stats = call(x, kw)
        want, want_stats = OLD.cscr_token_advantages(
            x["adv"], x["old_logp"], x["lp_pos"], x["lp_neg"], x["mask"], return_stats=True, **kw
        )
        assert token_adv.dtype == want.dtype == dtype, name
        assert torch.equal(token_adv, want), name
        assert torch.equal(call(x, kw, return_stats=False), token_adv), name
        assert stats == want_stats, name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sensitivity_weights_and_threshold_are_bit_identical(dtype):
    x = inputs(dtype)
    logps = (x["old_logp"], x["lp_pos"], x["lp_neg"], x["mask"])
    for mode in ("max", "mean", "common"):
        assert torch.equal(cscr.sensitivity(*logps, mode=mode), OLD.sensitivity(*logps, mode=mode)), mode
    s = cscr.sensitivity(*logps)
    for weight, alpha, w_min in WEIGHT_CASES:
        if weight in CHANGED_MAPS:
            continue
        ablation = cscr_ablations.choose(weight, alpha=alpha, w_min=w_min)  # the map, or the up-weighting ablation
        log_w = cscr.credit_log_weights(x["adv"], *logps, 0.2, ablation.settings, ablation.functions)
        if ablation.functions == cscr.CscrFunctions():  # cscr.py's own, the same without functions passed
            assert torch.equal(cscr.credit_log_weights(x["adv"], *logps, 0.2, ablation.settings), log_w)
        assert torch.equal(log_w, OLD.credit_log_weights(s, 0.2, alpha, w_min, weight)), weight
        assert torch.equal(
            torch.where(x["mask"], torch.exp(log_w), 0.0), OLD.credit_weights(s, x["mask"], 0.2, alpha, w_min, weight)
        ), weight
    assert cscr.calibrate_threshold(s, x["mask"], 0.8) == OLD.calibrate_threshold(s, x["mask"], 0.8)

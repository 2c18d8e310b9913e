"""cscr.py and cscr_ablations.py give, bit for bit, what cscr.py gave before the ablations moved beside it.

tests/data/cscr_reference.pt holds random float32 and float64 inputs (8 rows of 6 tokens: padding with -inf / NaN
garbage, a row with Â = 0, a row whose every weight underflows at α = 30) and what the old keyword API (commit
71d7a89, ``cscr_token_advantages(..., threshold=, alpha=, w_min=, mode=, weight=, scope=, group_size=, sign_eps=,
sign_mix=, return_stats=True)``) returned for the default and for every option and ablation: Ã, the logged stats,
s of each mode, log w and w of each weight map, and λ at q = 0.8.  Each case keeps its old keywords; ``call`` says
how the same run is asked for now (the ablations by their flag's name through ``cscr_ablations.choose``, as grpo.py
does).  The arithmetic did not change, so the comparison is ``torch.equal`` (and == for the stats).
"""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import cscr  # noqa: E402
from comparisons import cscr_ablations  # noqa: E402

REF = torch.load(ROOT / "tests" / "data" / "cscr_reference.pt", weights_only=True)
DTYPES = ("float32", "float64")


def call(x, old_keywords, return_stats=True):
    """The old call ``cscr_token_advantages(*x, **old_keywords)`` in today's API (the stats: ``cscr_stats``)."""
    kw = dict(old_keywords)
    threshold = kw.pop("threshold", 0.2)
    settings = cscr_ablations.choose(kw.pop("weight", "exp"), kw.pop("scope", "sequence"), kw.pop("group_size", None),
                                     kw.pop("sign_eps", 0.2), kw.pop("sign_mix", 0.5), **kw)  # alpha, w_min, mode
    args = (x["adv"], x["old_logp"], x["lp_pos"], x["lp_neg"], x["mask"], threshold, settings)
    token_adv = cscr.cscr_token_advantages(*args)
    return (token_adv, cscr.cscr_stats(*args)) if return_stats else token_adv


# Issue #44 gave exp_abs and inverse the spec §5 forms, w = exp(−α·s) and 1 / (1 + α·s), without the threshold the
# recorded ones had (tests/test_cscr.py checks them by hand).  exp_abs's recorded inputs have every valid s above λ,
# where its two forms agree, so it is still compared; the recorded cases of inverse are not.
CHANGED_MAPS = ("inverse",)


def test_the_fixture_covers_every_option_and_ablation():
    used = {(k, str(v)) for _, kw in REF["cases"] for k, v in kw.items()}
    for key, values in {"weight": ("exp_abs", "inverse", "upweight", "sign_aware"), "scope": ("group", "batch"),
                        "mode": ("mean", "common")}.items():
        assert {(key, v) for v in values} <= used
    assert {"alpha", "w_min", "threshold", "sign_eps", "sign_mix"} <= {k for k, _ in used}


@pytest.mark.parametrize("dtype", DTYPES)
def test_token_advantages_and_stats_are_bit_identical(dtype):
    x = REF["inputs"][dtype]
    for k, (name, kw) in enumerate(REF["cases"]):
        if kw.get("weight") in CHANGED_MAPS:
            continue
        token_adv, stats = call(x, kw)
        assert token_adv.dtype == REF["token_adv"][dtype][k].dtype, name
        assert torch.equal(token_adv, REF["token_adv"][dtype][k]), name
        assert torch.equal(call(x, kw, return_stats=False), token_adv), name
        assert stats == REF["stats"][dtype][k], name


@pytest.mark.parametrize("dtype", DTYPES)
def test_sensitivity_weights_and_threshold_are_bit_identical(dtype):
    x = REF["inputs"][dtype]
    s = [cscr.sensitivity(x["old_logp"], x["lp_pos"], x["lp_neg"], x["mask"], mode=m) for m in ("max", "mean", "common")]
    assert torch.equal(torch.stack(s), REF["sensitivity"][dtype])
    for k, (weight, alpha, w_min) in enumerate(REF["weight_cases"]):
        if weight in CHANGED_MAPS:
            continue
        settings = cscr_ablations.choose(weight, alpha=alpha, w_min=w_min)  # the map, or the up-weighting ablation
        log_w = cscr.credit_log_weights(x["adv"], x["old_logp"], x["lp_pos"], x["lp_neg"], x["mask"], 0.2, settings)
        assert torch.equal(log_w, REF["log_weights"][dtype][k])
        assert torch.equal(torch.where(x["mask"], torch.exp(log_w), 0.0), REF["weights"][dtype][k])
    assert cscr.calibrate_threshold(s[0], x["mask"], 0.8) == REF["threshold_q0.8"][dtype]

"""Tests for cscr.py against the hand-computed values of docs/specs/cscr.md §8 and independent formulas."""

import math
import sys
import textwrap
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cscr  # noqa: E402
from comparisons import cscr_ablations  # noqa: E402

# ---------------------------------------------------------------------------------------------------
# spec §8 worked example: one response of 8 tokens, lambda = 0.2
# ---------------------------------------------------------------------------------------------------
LP0 = [-2.30, -0.40, -1.60, -0.20, -0.05, -0.90, -0.30, -1.10]
LP_POS = [-0.90, -0.25, -0.70, -0.18, -0.05, -0.80, -0.20, -0.60]
LP_NEG = [-1.20, -0.30, -0.85, -0.22, -0.04, -1.00, -0.22, -0.70]
S_MAX = [1.40, 0.15, 0.90, 0.02, 0.01, 0.10, 0.10, 0.50]
W_A1 = [0.301194, 1, 0.496585, 1, 1, 1, 1, 0.740818]
W_TILDE_A1 = [0.368512, 1.223504, 0.607574, 1.223504, 1.223504, 1.223504, 1.223504, 0.906394]


def t(x):
    return torch.tensor([x], dtype=torch.float64)


def example(A=1.0, threshold=0.2, **settings):
    """Ã [1, 8] of the spec §8 example."""
    return cscr.cscr_token_advantages(
        torch.tensor([A], dtype=torch.float64),
        t(LP0),
        t(LP_POS),
        t(LP_NEG),
        torch.ones(1, 8),
        threshold,
        cscr.Settings(**settings),
    )


def example_stats(A=1.0, threshold=0.2, **settings):
    """cscr_stats of the spec §8 example."""
    return cscr.cscr_stats(
        torch.tensor([A], dtype=torch.float64),
        t(LP0),
        t(LP_POS),
        t(LP_NEG),
        torch.ones(1, 8),
        threshold,
        cscr.Settings(**settings),
    )


def example_weights(threshold=0.2, **settings):
    """w = exp(log w) [1, 8] of the spec §8 example (credit_log_weights: s, the weight step, the floor)."""
    return torch.exp(
        cscr.credit_log_weights(
            torch.ones(1, dtype=torch.float64),
            t(LP0),
            t(LP_POS),
            t(LP_NEG),
            torch.ones(1, 8),
            threshold,
            cscr.Settings(**settings),
        )
    )


def close(a, b, tol=1e-6):
    return torch.allclose(
        torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=tol, rtol=0
    )


def test_sensitivity_max_example():
    s = cscr.sensitivity(t(LP0), t(LP_POS), t(LP_NEG), torch.ones(1, 8))
    assert close(s[0], S_MAX)


def test_weights_example():
    assert close(example_weights(alpha=1.0)[0], W_A1)


def test_example_alpha1_positive_and_negative():
    adv = example(1.0, threshold=0.2, alpha=1.0)
    st = example_stats(1.0, threshold=0.2, alpha=1.0)
    assert close(adv[0], W_TILDE_A1)
    assert abs(st["cscr/w_bar_mean"] - 0.817325) < 1e-6
    assert abs(adv.sum().item() - 8.0) < 1e-9
    assert abs(st["cscr/eff_token_frac"] - 0.907926) < 1e-5  # spec: 0.9079
    adv_neg = example(-0.5, threshold=0.2, alpha=1.0)
    assert close(adv_neg[0], [-0.184256, -0.611752, -0.303787, -0.611752, -0.611752, -0.611752, -0.611752, -0.453197])
    assert abs(adv_neg.sum().item() + 4.0) < 1e-9
    assert (adv_neg < 0).all() and (adv > 0).all()


def test_stats_example():
    st = example_stats(1.0, threshold=0.2, alpha=1.0)
    assert abs(st["cscr/w_mean"] - 0.817325) < 1e-6
    assert abs(st["cscr/frac_w_lt_1"] - 3 / 8) < 1e-12
    assert abs(st["cscr/w_tilde_max"] - 1.223504) < 1e-6
    assert abs(st["cscr/inv_w_bar_max"] - 1 / 0.817325) < 1e-5
    assert abs(st["cscr/s_pos_mean"] - sum(S_MAX) / 8) < 1e-9
    assert st["cscr/s_neg_mean"] == 0.0  # no A < 0 row
    assert st["cscr/num_tokens"] == 8
    st_neg = example_stats(-0.5)
    assert abs(st_neg["cscr/s_neg_mean"] - sum(S_MAX) / 8) < 1e-9 and st_neg["cscr/s_pos_mean"] == 0.0


def test_alpha0_is_grpo():
    assert torch.equal(example(1.0, alpha=0.0)[0], torch.ones(8, dtype=torch.float64))
    assert torch.equal(example(-0.5, alpha=0.0)[0], torch.full((8,), -0.5, dtype=torch.float64))


def test_alpha5_strong():
    assert close(example_weights(alpha=5.0)[0], [0.002479, 1, 0.030197, 1, 1, 1, 1, 0.223130])
    adv = example(1.0, alpha=5.0)
    st = example_stats(1.0, alpha=5.0)
    assert abs(st["cscr/w_bar_mean"] - 0.656976) < 1e-6
    assert close(adv[0], [0.003773, 1.522126, 0.045964, 1.522126, 1.522126, 1.522126, 1.522126, 0.339632])
    assert abs(adv.sum().item() - 8.0) < 1e-9
    assert abs(st["cscr/eff_token_frac"] - 0.6837) < 5e-5


def test_alpha5_with_floor():
    assert close(example_weights(alpha=5.0, w_min=0.5)[0], [0.5, 1, 0.5, 1, 1, 1, 1, 0.5])
    adv = example(1.0, alpha=5.0, w_min=0.5)
    assert close(adv[0], [0.615385, 1.230769, 0.615385, 1.230769, 1.230769, 1.230769, 1.230769, 0.615385])


def test_mean_and_common_modes():
    s_mean = cscr.sensitivity(t(LP0), t(LP_POS), t(LP_NEG), torch.ones(1, 8), mode="mean")
    assert close(s_mean[0], [1.25, 0.125, 0.825, 0.02, 0.005, 0.10, 0.09, 0.45])
    expected = [0.420093, 1.20048, 0.642571, 1.20048, 1.20048, 1.20048, 1.20048, 0.934935]
    assert close(example(1.0, mode="mean")[0], expected)
    s_common = cscr.sensitivity(t(LP0), t(LP_POS), t(LP_NEG), torch.ones(1, 8), mode="common")
    # common = |D+ + D-|/2: differs from mean-abs only at indices 3 and 5 (both 0 there)
    assert close(s_common[0], [1.25, 0.125, 0.825, 0.0, 0.005, 0.0, 0.09, 0.45])
    assert close(example(1.0, mode="common")[0], expected)


def test_padding_example():
    m = torch.tensor([[1.0] * 8 + [0.0, 0.0]])
    lp0 = torch.tensor([LP0 + [-float("inf"), 3.7]], dtype=torch.float64)
    lp_pos = torch.tensor([LP_POS + [-float("inf"), -12.0]], dtype=torch.float64)
    lp_neg = torch.tensor([LP_NEG + [-float("inf"), float("nan")]], dtype=torch.float64)
    adv = cscr.cscr_token_advantages(
        torch.tensor([1.0]), lp0, lp_pos, lp_neg, m, threshold=0.2, settings=cscr.Settings(alpha=1.0)
    )
    assert not torch.isnan(adv).any()
    assert close(adv[0, :8], W_TILDE_A1)
    assert torch.equal(adv[0, 8:], torch.zeros(2, dtype=adv.dtype))
    assert abs(adv.sum().item() - 8.0) < 1e-9
    s = cscr.sensitivity(lp0, lp_pos, lp_neg, m.bool())
    assert not torch.isnan(s).any() and torch.equal(s[0, 8:], torch.zeros(2, dtype=s.dtype))


def test_zero_advantage_gives_zeros():
    adv = example(0.0)
    st = example_stats(0.0)
    assert torch.equal(adv, torch.zeros(1, 8, dtype=adv.dtype))
    assert st["cscr/num_tokens"] == 0 and st["cscr/eff_token_frac"] == 0.0


# The spec §5 alternative maps have no threshold: w = exp(−α·s) and w = 1 / (1 + α·s).  At α = 2 and s = 0, 0.1,
# 0.5, 1, 2 nats, by hand: exp(−2s) = 1, e^−0.2, e^−1, e^−2, e^−4 and 1/(1 + 2s) = 1, 1/1.2, 1/2, 1/3, 1/5.
S_HAND = [0.0, 0.1, 0.5, 1.0, 2.0]
EXP_ABS_HAND = [1.0, 0.8187307530779818, 0.36787944117144233, 0.1353352832366127, 0.01831563888873418]
INVERSE_HAND = [1.0, 5 / 6, 0.5, 1 / 3, 0.2]
# float64: each w is one product and one exp or log1p (then exp) of it, a few roundings of 2^-53 relative each;
# 1e-14 is far above that and far below the old thresholded forms' difference here (w = 1 at s = 0.1, not 0.82)
F64_MAPS = dict(rtol=1e-14, atol=0.0)


@pytest.mark.parametrize("weight,hand", [("exp_abs", EXP_ABS_HAND), ("inverse", INVERSE_HAND)])
def test_alternative_weight_maps_by_hand(weight, hand):
    s = torch.tensor([S_HAND], dtype=torch.float64)
    w = torch.exp(cscr.sensitivity_weights(s, None, None, 0.5, cscr.Settings(alpha=2.0, weight=weight)))
    torch.testing.assert_close(w, torch.tensor([hand], dtype=torch.float64), **F64_MAPS)
    # the same through the weight step and credit_log_weights: ℓ0 = 0, ℓ+ = −s, ℓ− = 0 give the sensitivity s; the
    # threshold (0.5 here, between the s values) does not enter
    zeros = torch.zeros_like(s)
    log_w = cscr.credit_log_weights(
        torch.ones(1, dtype=torch.float64),
        zeros,
        -s,
        zeros,
        torch.ones(1, 5),
        0.5,
        cscr.Settings(alpha=2.0, weight=weight),
    )
    torch.testing.assert_close(torch.exp(log_w), torch.tensor([hand], dtype=torch.float64), **F64_MAPS)


def test_alternative_weight_maps_on_the_example():
    """Ã = A·w / mean(w) with the spec §8 example's s and the alternative maps' formulas (no threshold)."""
    for weight, w in (("exp_abs", [math.exp(-2 * x) for x in S_MAX]), ("inverse", [1 / (1 + 2 * x) for x in S_MAX])):
        assert close(example(1.0, alpha=2.0, weight=weight)[0], [8 * x / sum(w) for x in w], tol=1e-12)


# ---------------------------------------------------------------------------------------------------
# sign / budget properties on random padded batches
# ---------------------------------------------------------------------------------------------------


def random_batch(B=12, T=15, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    m = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    lp0 = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    lp_pos = lp0 + torch.randn(B, T, generator=g, dtype=torch.float64)
    lp_neg = lp0 + torch.randn(B, T, generator=g, dtype=torch.float64)
    lp0[~m], lp_pos[~m], lp_neg[~m] = -float("inf"), -float("inf"), float("nan")  # garbage on padding
    A = torch.randn(B, generator=g, dtype=torch.float64)
    A[[2, B - 1]] = 0.0  # rows with zero advantage
    return A, lp0, lp_pos, lp_neg, m


@pytest.mark.parametrize("mode", ["max", "mean", "common"])
@pytest.mark.parametrize("w_min,alpha,thr", [(0.0, 1.0, 0.2), (0.1, 4.0, 0.0), (0.0, 30.0, 0.5)])
def test_sign_and_budget_random(mode, w_min, alpha, thr):
    A, lp0, lp_pos, lp_neg, m = random_batch()
    adv = cscr.cscr_token_advantages(
        A, lp0, lp_pos, lp_neg, m, threshold=thr, settings=cscr.Settings(alpha=alpha, w_min=w_min, mode=mode)
    )
    assert adv.shape == m.shape and not torch.isnan(adv).any()
    sign = torch.sign(A).unsqueeze(1).expand_as(adv)
    assert torch.equal(torch.sign(adv)[m], sign[m])
    assert torch.equal(adv[~m], torch.zeros_like(adv[~m]))
    L = m.sum(1).double()
    assert torch.allclose(adv.sum(1), L * A, atol=1e-9)
    # a reallocation: some tokens get more than A_i when others are down-weighted
    assert (adv.abs() > A.abs().unsqueeze(1) + 1e-12).any()


def test_budget_exact_when_every_weight_underflows():
    # every s is ~40 nats above lambda: with alpha = 30 each w = exp(-30 (s - 0.2)) underflows to 0 in float32 and
    # float64, yet w_t / w_bar_i is well defined: it equals L_i * softmax_t(-alpha * s_t) (an independent formula)
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        lp0 = -torch.rand(3, 6, generator=g, dtype=torch.float64)
        lp_pos = lp0 - 40 - torch.rand(3, 6, generator=g, dtype=torch.float64)
        lp_neg = lp0 - 1.0
        m = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] + [0] * 5], dtype=torch.bool)
        A = torch.tensor([1.5, -0.5, 2.0], dtype=torch.float64)
        log_w = cscr.credit_log_weights(
            A.to(dtype), lp0.to(dtype), lp_pos.to(dtype), lp_neg.to(dtype), m, 0.2, cscr.Settings(alpha=30.0)
        )
        assert (torch.exp(log_w)[m] == 0).all()  # all underflow
        adv = cscr.cscr_token_advantages(
            A.to(dtype),
            lp0.to(dtype),
            lp_pos.to(dtype),
            lp_neg.to(dtype),
            m,
            threshold=0.2,
            settings=cscr.Settings(alpha=30.0),
        )
        for i in range(3):
            L = int(m[i].sum())
            expected = A[i] * L * torch.softmax(-30.0 * (lp0 - lp_pos)[i, :L].abs(), 0)
            # float32 is the point: softmax of inputs |α·s| ≤ 30·41 ≈ 1.2e3 is relatively exact to |x|·2^-24 ≈ 7e-5
            assert torch.allclose(adv[i, :L].double(), expected, rtol=1e-4, atol=1e-6)
            assert abs(adv[i].double().sum().item() - L * A[i].item()) < 1e-4 * L
        assert torch.equal(adv[~m], torch.zeros_like(adv[~m]))


def test_scope_ablations():
    A, lp0, lp_pos, lp_neg, m = random_batch(B=8, T=10, seed=3)
    seq = cscr.cscr_token_advantages(A, lp0, lp_pos, lp_neg, m)
    ablated = lambda scope, size=None: cscr.cscr_token_advantages(  # noqa: E731
        A, lp0, lp_pos, lp_neg, m, 0.2, functions=cscr_ablations.choose(scope=scope, num_generations=size).functions
    )
    assert torch.equal(seq, ablated("sequence"))  # the paper's steps: cscr.py's, bit for bit
    assert torch.allclose(seq, ablated("group", 1), atol=1e-12)
    gb = ablated("group", 8)
    bb = ablated("batch")
    assert torch.allclose(gb, bb, atol=1e-12)
    # batch scope: the mean normalised weight over credit-carrying tokens is 1
    act = m & (A != 0).unsqueeze(1)
    wt = bb[act] / A.unsqueeze(1).expand_as(bb)[act]
    assert abs(wt.mean().item() - 1.0) < 1e-9
    assert not torch.allclose(seq, bb)


def test_argument_validation():
    A, lp0, lp_pos, lp_neg, m = random_batch(B=4, T=5)
    with pytest.raises(ValueError, match="alpha"):
        cscr.cscr_token_advantages(A, lp0, lp_pos, lp_neg, m, settings=cscr.Settings(alpha=-1.0))
    with pytest.raises(ValueError, match="w_min"):
        cscr.cscr_token_advantages(A, lp0, lp_pos, lp_neg, m, settings=cscr.Settings(w_min=1.5))
    with pytest.raises(ValueError, match="w_min"):
        cscr.cscr_token_advantages(A, lp0, lp_pos, lp_neg, m, settings=cscr.Settings(w_min=-0.1))
    with pytest.raises(ValueError, match="mode"):
        cscr.cscr_token_advantages(A, lp0, lp_pos, lp_neg, m, settings=cscr.Settings(mode="kl"))
    with pytest.raises(ValueError, match="mode"):
        cscr.sensitivity(lp0, lp_pos, lp_neg, m, mode="differential")
    with pytest.raises(ValueError, match="lp_pos"):
        cscr.cscr_token_advantages(A, lp0, lp_pos[:, :3], lp_neg, m)
    with pytest.raises(ValueError, match="adv shape"):
        cscr.cscr_token_advantages(A[:3], lp0, lp_pos, lp_neg, m)
    with pytest.raises(ValueError, match="loss_mask"):
        cscr.cscr_token_advantages(A, lp0, lp_pos, lp_neg, m[:, :2])
    with pytest.raises(ValueError, match="weight"):
        cscr.cscr_token_advantages(A, lp0, lp_pos, lp_neg, m, settings=cscr.Settings(weight="linear"))
    with pytest.raises(ValueError, match="num_generations"):
        cscr.cscr_token_advantages(
            A, lp0, lp_pos, lp_neg, m, 0.2, functions=cscr_ablations.choose("exp", "group", 3).functions
        )
    bad = lp0.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        cscr.cscr_token_advantages(A, bad, lp_pos, lp_neg, m)
    with pytest.raises(ValueError, match="overflows"):  # alpha * (s - lambda) = 5e308 is inf: no weight at all
        cscr.cscr_token_advantages(A, lp0, lp0 + 5.0, lp_neg, m, threshold=0.0, settings=cscr.Settings(alpha=1e308))


# ---------------------------------------------------------------------------------------------------
# threshold calibration
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("q", [0.0, 0.37, 0.8, 0.95, 1.0])
def test_calibrate_threshold_matches_torch_quantile(q):
    A, lp0, lp_pos, lp_neg, m = random_batch(B=9, T=13, seed=5)
    s = cscr.sensitivity(lp0, lp_pos, lp_neg, m)
    s_pad = s.clone()
    s_pad[~m] = 100.0  # padding must be ignored
    thr = cscr.calibrate_threshold(s_pad, m, q)
    assert abs(thr - torch.quantile(s[m], q).item()) < 1e-12
    assert cscr.calibrate_threshold(torch.tensor([[3.0, 1.0, 2.0, 9.0]]), torch.tensor([[1, 1, 1, 0]]), 0.5) == 2.0
    with pytest.raises(ValueError, match="quantile"):
        cscr.calibrate_threshold(s, m, 1.2)
    with pytest.raises(ValueError, match="valid"):
        cscr.calibrate_threshold(s, torch.zeros_like(m), 0.5)


# ---------------------------------------------------------------------------------------------------
# build_condition_prompts (spec §3)
# ---------------------------------------------------------------------------------------------------

CHATML = (
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nCompute 37+48-12.\n"
    "Put the final answer in \\boxed{}.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


def diff_middles(a, b):
    """The differing middles of two strings after removing their common prefix and suffix."""
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    j = 0
    while j < min(len(a), len(b)) - i and a[-1 - j] == b[-1 - j]:
        j += 1
    return a[i : len(a) - j], b[i : len(b) - j]


@pytest.mark.parametrize(
    "template,kw,middles",
    [
        ("verdict", {}, ("", "IN")),
        ("reference", {"reference": "73"}, ("", "IN")),
        ("answer", {"response_answer": "\\frac{1}{2}"}, ("", "not ")),
    ],
)
def test_condition_prompts_minimal_pair_chatml(template, kw, middles):
    p_pos, p_neg = cscr.build_condition_prompts(CHATML, template=template, **kw)
    assert diff_middles(p_pos, p_neg) == middles
    # the note ends the user turn: everything from the user's <|im_end|> on is unchanged
    q = CHATML.rfind("<|im_end|>", 0, CHATML.rfind("<|im_start|>assistant"))
    for p in (p_pos, p_neg):
        assert p.startswith(CHATML[:q]) and p.endswith(CHATML[q:])
        assert len(p) > len(CHATML)
        assert p.count("<|im_start|>") == CHATML.count("<|im_start|>")
    assert "CORRECT" in p_pos or "is the correct" in p_pos
    if template == "reference":
        assert "73" in p_pos and "73" in p_neg
    if template == "answer":
        assert "\\frac{1}{2} is not the correct" in p_neg


def test_condition_prompts_plain_text():
    p = "Compute 37+48-12.\n"
    p_pos, p_neg = cscr.build_condition_prompts(p)
    assert p_pos == "Compute 37+48-12.\n" + cscr.CONDITION_TEMPLATES["verdict"][0] + "\n"
    assert p_neg == "Compute 37+48-12.\n" + cscr.CONDITION_TEMPLATES["verdict"][1] + "\n"
    assert diff_middles(p_pos, p_neg) == ("", "IN")
    # no trailing whitespace: the last line stays the ending
    p_pos2, _ = cscr.build_condition_prompts("Problem: 1+1\nAnswer:")
    assert p_pos2.startswith("Problem: 1+1\n") and p_pos2.endswith("\nAnswer:")
    # anchor: placed right after the problem
    p_pos3, _ = cscr.build_condition_prompts(CHATML, anchor="Compute 37+48-12.")
    assert p_pos3.startswith(CHATML[: CHATML.find("Compute 37+48-12.") + 17] + "\n\nNote:")
    assert p_pos3.endswith(
        "\nPut the final answer in \\boxed{}.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    # custom templates with placeholders (LaTeX braces in values need no escaping)
    p_pos4, p_neg4 = cscr.build_condition_prompts(
        p, reference="\\frac{1}{2}", template=("ref {reference} yes", "ref {reference} no")
    )
    assert "ref \\frac{1}{2} yes" in p_pos4 and "ref \\frac{1}{2} no" in p_neg4


def test_condition_prompts_errors():
    with pytest.raises(ValueError, match="reference"):
        cscr.build_condition_prompts(CHATML, template="reference")
    with pytest.raises(ValueError, match="response_answer"):
        cscr.build_condition_prompts(CHATML, template="answer")
    with pytest.raises(ValueError, match="template"):
        cscr.build_condition_prompts(CHATML, template="hint")
    with pytest.raises(ValueError, match="anchor"):
        cscr.build_condition_prompts(CHATML, anchor="not there")


# ---------------------------------------------------------------------------------------------------
# condition_logprobs on a tiny random Qwen3 (left padding, position ids, temperature)
# ---------------------------------------------------------------------------------------------------


def naive_logprobs(model, tok, prompt, resp, temperature):
    """Independent reference: one unpadded sequence, default positions, full log_softmax + gather; the prompt is
    tokenised by the tokenisation rule, ``tok(prompt)``, as the rollout does."""
    p = tok(prompt)["input_ids"]
    ids = torch.tensor([p + resp])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double() / temperature
    logp = torch.log_softmax(logits, -1)
    return torch.tensor([logp[len(p) - 1 + k, r].item() for k, r in enumerate(resp)], dtype=torch.float64)


def test_condition_logprobs_matches_naive(tiny, float64_model):
    model, tok = tiny
    model = float64_model(model)  # the same log-probs in another layout: float64, 1e-10 (conftest)
    problems = ["Compute 37+48-12.\n", "Compute 1+2.\n", "What is 7 times 6.\n"]
    resp_text = ["73", "3 is it", "42.\n"]
    resp = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in resp_text]
    T = max(len(r) for r in resp)
    resp_ids = torch.full((3, T), -100, dtype=torch.long)  # garbage padding must be harmless
    mask = torch.zeros(3, T)
    for i, r in enumerate(resp):
        resp_ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    pairs = [cscr.build_condition_prompts(p) for p in problems]
    prompts_pos, prompts_neg = [a for a, _ in pairs], [b for _, b in pairs]
    assert len({len(tok(x)["input_ids"]) for x in prompts_pos}) == 3  # left padding exercised
    temp = 0.7
    calls = []

    def counting_fn(*args):
        calls.append(args[1].shape)
        return cscr.default_logprob_fn(*args)

    lp_pos, lp_neg = cscr.condition_logprobs(
        model, tok, pairs, resp_ids, mask, temperature=temp, logprob_fn=counting_fn
    )
    assert lp_pos.shape == (3, T) and len(calls) == 2
    for i in range(3):
        L = len(resp[i])
        assert lp_pos.dtype == torch.float64
        assert torch.allclose(lp_pos[i, :L], naive_logprobs(model, tok, prompts_pos[i], resp[i], temp), atol=1e-10)
        assert torch.allclose(lp_neg[i, :L], naive_logprobs(model, tok, prompts_neg[i], resp[i], temp), atol=1e-10)
        assert torch.equal(lp_pos[i, L:], torch.zeros(T - L)) and torch.equal(lp_neg[i, L:], torch.zeros(T - L))
    assert not torch.allclose(lp_pos, lp_neg)  # the verdict changes the log-probs
    # micro-batching gives the same result
    lp_pos1, lp_neg1 = cscr.condition_logprobs(model, tok, pairs, resp_ids, mask, temperature=temp, micro_batch_size=1)
    assert torch.allclose(lp_pos1, lp_pos, atol=1e-10) and torch.allclose(lp_neg1, lp_neg, atol=1e-10)

    # with the mask of the rows with A != 0, only they are scored (one pass over them), the others stay 0
    calls.clear()
    adv = torch.tensor([0.5, 0.0, -0.5])
    lp_pos2, lp_neg2 = cscr.condition_logprobs(
        model, tok, pairs, resp_ids, mask * (adv != 0)[:, None], temperature=temp, logprob_fn=counting_fn
    )
    assert [shape[0] for shape in calls] == [2, 2]
    assert torch.equal(lp_pos2[1], torch.zeros(T)) and torch.equal(lp_neg2[1], torch.zeros(T))
    for i, (p, q) in enumerate([(lp_pos2, lp_pos), (lp_neg2, lp_neg)]):
        torch.testing.assert_close(p[[0, 2]], q[[0, 2]], atol=1e-10, rtol=0)

    # the comparison is sensitive to the padding: attending to the left pad tokens changes the padded rows.
    # (Dropping only the position ids does not: RoPE scores depend on position differences, so a uniform
    # left-padding offset changes Qwen3's log-probs by float noise only; they are passed anyway.)
    def attend_pads_fn(model_, input_ids, attention_mask, response_mask, temperature):
        return cscr.default_logprob_fn(model_, input_ids, torch.ones_like(attention_mask), response_mask, temperature)

    lp_bad, _ = cscr.condition_logprobs(model, tok, pairs, resp_ids, mask, temperature=temp, logprob_fn=attend_pads_fn)
    assert (lp_bad - lp_pos)[mask.bool()].abs().max() > 1e-3


def test_condition_logprobs_errors(tiny):
    model, tok = tiny
    ids = torch.ones(2, 3, dtype=torch.long)
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="prompts"):
        cscr.condition_logprobs(model, tok, [("a\n", "b\n")], ids, mask)
    with pytest.raises(ValueError, match="temperature"):
        cscr.condition_logprobs(model, tok, [("a\n", "b\n")] * 2, ids, mask, temperature=0.0)
    with pytest.raises(ValueError, match="credited mask"):
        cscr.condition_logprobs(model, tok, [("a\n", "b\n")] * 2, ids, mask[:, :2])


# ---------------------------------------------------------------------------------------------------
# the tokenisation rule and the header's usage example (cscr.__doc__)
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_tiny(tiny_model_path):
    """The toy architecture, randomly initialised, with the toy tokenizer: its default call prepends a BOS."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_path).eval(), AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.mark.parametrize("which", ["toy_tokenizer_adds_bos", "char_tokenizer_adds_nothing"])
def test_conditioned_prompts_get_the_rollout_special_tokens(which, request):
    import rollout

    model, tok = request.getfixturevalue("toy_tiny" if which == "toy_tokenizer_adds_bos" else "tiny")
    batch = rollout.generate(
        model,
        tok,
        ["Compute 7+5-3.\n", "Compute 12+30.\n"],
        num_generations=2,
        settings=rollout.SamplingSettings(max_new_tokens=3, seed=0),
    )
    P = batch.prompt_length
    plain = [ids[a.bool()].tolist() for ids, a in zip(batch.input_ids[:, :P], batch.attention_mask[:, :P])]
    pairs = [cscr.build_condition_prompts(p) for p in batch.prompts]
    seen = []  # the prompt part of every row the two conditioned passes feed to the model

    def spy(model_, input_ids, attention_mask, response_mask, temperature):
        T = response_mask.shape[1]
        seen.extend(ids[a.bool()].tolist() for ids, a in zip(input_ids[:, :-T], attention_mask[:, :-T]))
        return cscr.default_logprob_fn(model_, input_ids, attention_mask, response_mask, temperature)

    cscr.condition_logprobs(model, tok, pairs, batch.response_ids, batch.response_mask, logprob_fn=spy)
    assert len(seen) == 2 * len(plain)
    bos_expected = which == "toy_tokenizer_adds_bos"
    special = {tok.bos_token_id, tok.eos_token_id} - {None}

    def edges(ids):  # the special tokens a row starts with and ends with
        i, j = 0, len(ids)
        while i < j and ids[i] in special:
            i += 1
        while j > i and ids[j - 1] in special:
            j -= 1
        return ids[:i], ids[j:]

    for k, cond in enumerate(seen):
        x = plain[k % len(plain)]
        assert (x[0] == tok.bos_token_id) == bos_expected  # the rollout's own treatment of the plain prompt
        assert (cond[0] == tok.bos_token_id) == bos_expected  # ... and the conditioned prompt's: the same
        assert edges(cond) == edges(x)
        assert cond == tok(pairs[k % len(plain)][k // len(plain)])["input_ids"]
    with pytest.raises(TypeError):  # no per-caller override of the rule
        cscr.condition_logprobs(model, tok, pairs, batch.response_ids, batch.response_mask, add_special_tokens=False)


def usage_example():
    """The indented code block after "Usage from any trainer" in cscr.py's header."""
    doc = cscr.__doc__
    block = doc[doc.index("Usage from any trainer") :]
    lines = []
    for line in block[block.index("::\n") + 3 :].splitlines():
        if line.strip() and not line.startswith("    "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines)).strip("\n") + "\n"


@pytest.mark.slow
def test_python_cscr_py_runs_the_header_example():
    """``python cscr.py`` runs the header's usage example, line for line (after its tiny Qwen3 and byte tokenizer are
    built), and prints Ã and the statistics."""
    import ast
    import subprocess

    source = Path(cscr.__file__).read_text(encoding="utf-8")
    main = [n for n in ast.parse(source).body if isinstance(n, ast.If)]
    assert len(main) == 1 and ast.unparse(main[0].test) == "__name__ == '__main__'"
    body = textwrap.dedent("\n".join(source.splitlines()[main[0].body[0].lineno - 1 : main[0].end_lineno]))
    assert usage_example() in body  # verbatim: the example is what the script runs
    out = subprocess.run([sys.executable, "cscr.py"], cwd=Path(cscr.__file__).parent, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "token_adv" in out.stdout and "'cscr/num_tokens': 18.0" in out.stdout


def test_header_usage_example_runs(toy_tiny, float64_model):
    import rollout

    model, tokenizer = toy_tiny
    model = float64_model(model)  # the passes are compared with unpadded ones: float64, 1e-10 (conftest)
    code = usage_example()
    assert "cscr.condition_logprobs" in code and "cscr.cscr_token_advantages" in code
    assert "cscr.scoring_inputs" in code and "cscr.default_logprob_fn" in code  # ℓ0 from public names alone
    assert "cscr._" not in code
    batch = rollout.generate(
        model,
        tokenizer,
        ["Compute 7+5-3.\n", "Compute 12+30.\n"],
        num_generations=2,
        settings=rollout.SamplingSettings(max_new_tokens=6, seed=1),
    )
    m = batch.response_mask.bool()
    # the trainer's plain old-log-prob pass over the rollout's own rows
    lp0 = cscr.default_logprob_fn(model, batch.input_ids, batch.attention_mask, batch.response_mask, 1.0)
    advantages = torch.tensor([1.0, -1.0, 0.5, 0.0], dtype=torch.float64)
    ns = {
        "cscr": cscr,
        "torch": torch,
        "model": model,
        "tokenizer": tokenizer,
        "prompts": batch.prompts,
        "response_ids": batch.response_ids,
        "loss_mask": batch.response_mask,
        "adv": advantages,
    }
    exec(code, ns)
    token_adv = ns["token_adv"]
    # the header's ℓ0: scoring_inputs of the plain prompts are the rollout's own rows, and their pass is lp0
    assert torch.equal(ns["inputs"][0], batch.input_ids) and torch.equal(ns["inputs"][1], batch.attention_mask.long())
    assert ns["old_logp"].dtype == torch.float64
    torch.testing.assert_close(ns["old_logp"], lp0, rtol=0, atol=1e-12)
    L = m.sum(1)
    assert token_adv.shape == m.shape
    assert torch.allclose(token_adv.sum(1), L * advantages, atol=1e-12)  # budget kept
    assert torch.equal(torch.sign(token_adv)[m], torch.sign(advantages)[:, None].expand_as(m)[m])  # sign kept
    for i in range(len(batch.prompts)):  # each pass against an unpadded reference, tokenised as the rollout was
        n, resp = int(L[i]), batch.response_ids[i, : int(L[i])].tolist()
        p_pos, p_neg = cscr.build_condition_prompts(batch.prompts[i])
        assert torch.allclose(lp0[i, :n], naive_logprobs(model, tokenizer, batch.prompts[i], resp, 1.0), atol=1e-10)
        assert torch.allclose(ns["lp_pos"][i, :n], naive_logprobs(model, tokenizer, p_pos, resp, 1.0), atol=1e-10)
        assert torch.allclose(ns["lp_neg"][i, :n], naive_logprobs(model, tokenizer, p_neg, resp, 1.0), atol=1e-10)


def test_credit_log_weights_by_hand():
    """The formulas the trainer uses (cscr_token_advantages works in logs) against hand values: the paper's map, and
    credit_log_weights (ℓ0 = 0, ℓ+ = −s, ℓ− = 0: the sensitivity s) with its floor w_min."""
    s = torch.tensor([[0.1, 0.2, 1.2]], dtype=torch.float64)
    weights = lambda alpha: cscr.sensitivity_weights(s, None, None, 0.2, cscr.Settings(alpha=alpha))  # noqa: E731
    assert weights(1.0).tolist() == [[0.0, 0.0, -1.0]]  # −α·max(0, s − λ)
    assert weights(2.0).tolist() == [[0.0, 0.0, -2.0]]
    zeros = torch.zeros_like(s)
    one = torch.ones(1, dtype=torch.float64)
    mask = torch.tensor([[True, True, True]])
    assert cscr.credit_log_weights(one, zeros, -s, zeros, mask).tolist() == [[0.0, 0.0, -1.0]]  # the defaults
    torch.testing.assert_close(
        cscr.credit_log_weights(one, zeros, -s, zeros, mask, 0.2, cscr.Settings(w_min=0.5)),
        torch.tensor([[0.0, 0.0, math.log(0.5)]], dtype=torch.float64),
    )  # floor w_min


@pytest.mark.parametrize(
    "flag,value", [("--cscr_threshold", "nan"), ("--cscr_threshold", "inf"), ("--cscr_alpha", "inf")]
)
def test_the_threshold_and_alpha_are_checked_at_the_command_line(tmp_path, flag, value):
    """λ and α were checked on every call of cscr_token_advantages; a run checks its flags once, in check_config, in
    one line before the run folder exists (cscr_token_advantages checks the Settings of a library caller)."""
    import grpo

    out = tmp_path / "run"
    with pytest.raises(SystemExit, match=flag):
        grpo.main(["--output_dir", str(out), "--credit", "cscr", flag, value])
    assert not out.exists()
    A, lp0, lp_pos, lp_neg, m = random_batch(B=4, T=3)
    with pytest.raises(ValueError, match="alpha"):
        cscr.cscr_token_advantages(A, lp0, lp_pos, lp_neg, m, settings=cscr.Settings(alpha=math.inf))

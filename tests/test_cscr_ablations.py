"""Tests for cscr_ablations.py, the spec §9 ablations beside cscr.py (upweight, sign_aware, per_group, per_batch),
hand-computed in float64; each is asked for by its flag's name through ``cscr_ablations.choose``, as grpo.py does:
a whole function in place of cscr.py's weight step or renormalisation, passed in cscr.py's ``functions`` argument.

Inputs: the spec §8 example (one response of 8 tokens, lambda = 0.2) and a 4-row batch of two groups written here.
"""

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cscr  # noqa: E402
from comparisons import cscr_ablations  # noqa: E402

F64 = torch.float64
TOL = dict(rtol=0, atol=1e-12)

# spec §8: l0, l+, l-; s = max(|d+|, |d-|) = [1.40, 0.15, 0.90, 0.02, 0.01, 0.10, 0.10, 0.50]
LP0 = [-2.30, -0.40, -1.60, -0.20, -0.05, -0.90, -0.30, -1.10]
LP_POS = [-0.90, -0.25, -0.70, -0.18, -0.05, -0.80, -0.20, -0.60]
LP_NEG = [-1.20, -0.30, -0.85, -0.22, -0.04, -1.00, -0.22, -0.70]
D_POS = [1.40, 0.15, 0.90, 0.02, 0.00, 0.10, 0.10, 0.50]


def close(actual, expected, **tol):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=F64), torch.as_tensor(expected, dtype=F64), **(tol or TOL))


def settings(weight="exp", scope="sequence", num_generations=None, sign_eps=0.2, sign_mix=0.5, **kw):
    """The Ablation of the rules --cscr_weight and --cscr_scope name (and alpha, w_min, mode)."""
    return cscr_ablations.choose(weight, scope, num_generations, sign_eps, sign_mix, **kw)


def token_advantages(adv, old_logp, lp_pos, lp_neg, loss_mask, threshold=0.2, ablation=None):
    """cscr.py's Ã with an ``Ablation``'s settings and functions (default: ``choose()``, the paper's)."""
    ablation = ablation or settings()
    return cscr.cscr_token_advantages(
        adv, old_logp, lp_pos, lp_neg, loss_mask, threshold, ablation.settings, ablation.functions
    )


def ablated_log_weights(adv, old_logp, lp_pos, lp_neg, loss_mask, threshold, ablation):
    """cscr.py's log w with an ``Ablation``'s settings and functions."""
    return cscr.credit_log_weights(
        adv, old_logp, lp_pos, lp_neg, loss_mask, threshold, ablation.settings, ablation.functions
    )


def ablated_stats(adv, old_logp, lp_pos, lp_neg, loss_mask, threshold, ablation):
    """cscr.py's logged statistics with an ``Ablation``'s settings and functions."""
    return cscr.cscr_stats(adv, old_logp, lp_pos, lp_neg, loss_mask, threshold, ablation.settings, ablation.functions)


def log_weights(s, weight, alpha=1.0, w_min=0.0):
    """log w [1, 8] of the sensitivities s [1, 8] under ``weight``: credit_log_weights with ℓ0 = 0, ℓ+ = −s, ℓ− = 0
    (so the sensitivity is s, and Δ+ = −s), Â = 1, λ = 0.2."""
    zeros = torch.zeros_like(s)
    return ablated_log_weights(
        torch.ones(1, dtype=F64), zeros, -s, zeros, torch.ones(1, 8), 0.2, settings(weight, alpha=alpha, w_min=w_min)
    )


def spec8(A, **kw):
    t = lambda x: torch.tensor([x], dtype=F64)  # noqa: E731
    return token_advantages(
        torch.tensor([A], dtype=F64),
        t(LP0),
        t(LP_POS),
        t(LP_NEG),
        torch.ones(1, 8),
        threshold=0.2,
        ablation=settings(**kw),
    )[0]


def normalised(w, A):
    """A · w / mean(w): the per-sequence renormalisation, by hand."""
    return [A * x * len(w) / sum(w) for x in w]


def test_upweight_spec8_by_hand():
    """log w = +alpha · max(0, s − 0.2): w = [e^1.2, 1, e^0.7, 1, 1, 1, 1, e^0.3] at alpha = 1, e^(2·excess) at 2."""
    w = [math.exp(1.2), 1, math.exp(0.7), 1, 1, 1, 1, math.exp(0.3)]
    close(spec8(1.0, weight="upweight"), normalised(w, 1.0))
    close(spec8(-0.5, weight="upweight"), normalised(w, -0.5))
    w2 = [x**2 for x in w]
    close(spec8(1.0, alpha=2.0, weight="upweight"), normalised(w2, 1.0))
    # the down-weighting default on the same inputs (w = 1 / the up-weights), for contrast: opposite reallocation
    close(spec8(1.0), normalised([1 / x for x in w], 1.0))
    # w_min has no effect (w >= 1); credit_log_weights gives the un-normalised log w
    close(spec8(1.0, weight="upweight", w_min=0.5), normalised(w, 1.0))
    s = cscr.sensitivity(*(torch.tensor([x], dtype=F64) for x in (LP0, LP_POS, LP_NEG)), torch.ones(1, 8))
    close(torch.exp(log_weights(s, "upweight"))[0], w)
    close(log_weights(s, "upweight", w_min=0.5)[0], [1.2, 0, 0.7, 0, 0, 0, 0, 0.3])
    # the step itself, in place of cscr.sensitivity_weights (Δ+ and Â unread)
    close(cscr_ablations.upweight(s, None, None, 0.2, cscr.Settings(alpha=2.0))[0], [2.4, 0, 1.4, 0, 0, 0, 0, 0.6])


def test_sign_aware_spec8_by_hand():
    """w = 0.5 + 0.5 · clip(exp(sign(A) · d+), 0.8, 1.2): A > 0 clips e^1.4, e^0.9, e^0.5 at 1.2; A < 0 clips their
    inverses at 0.8."""
    c = lambda x: min(max(x, 0.8), 1.2)  # noqa: E731
    w_pos = [0.5 + 0.5 * c(math.exp(d)) for d in D_POS]
    w_neg = [0.5 + 0.5 * c(math.exp(-d)) for d in D_POS]
    close(
        w_pos,
        [
            1.1,
            0.5 + 0.5 * math.exp(0.15),
            1.1,
            0.5 + 0.5 * math.exp(0.02),
            1.0,
            0.5 + 0.5 * math.exp(0.1),
            0.5 + 0.5 * math.exp(0.1),
            1.1,
        ],
    )
    close(spec8(1.0, weight="sign_aware"), normalised(w_pos, 1.0))
    close(spec8(-0.5, weight="sign_aware"), normalised(w_neg, -0.5))
    # other eps_w, mix: 0.7 + 0.3 · clip(exp(d+), 0.9, 1.1)
    w = [0.7 + 0.3 * min(max(math.exp(d), 0.9), 1.1) for d in D_POS]
    close(spec8(2.0, weight="sign_aware", sign_eps=0.1, sign_mix=0.3), normalised(w, 2.0))
    # threshold, alpha and the sensitivity mode do not enter the sign-aware weight
    close(spec8(1.0, weight="sign_aware", alpha=7.0, mode="mean"), normalised(w_pos, 1.0))
    # a floor above the weights' minimum: max(w_min, w)
    close(spec8(-0.5, weight="sign_aware", w_min=0.95), normalised([max(0.95, x) for x in w_neg], -0.5))


# ---- a batch of 4 rows in 2 groups: A = [+1, −1 | +0.5, 0], row 1 has a padded slot, row 3 has A = 0 ------------
ADV = torch.tensor([1.0, -1.0, 0.5, 0.0], dtype=F64)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
OLD = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -9.0], [-0.7, -0.2, -0.9], [-1.0, -5.0, -5.0]], dtype=F64)
POS = torch.tensor([[-0.4, -0.5, -1.1], [-0.3, -0.2, -1.0], [-0.7, -0.1, -0.2], [-3.0, -5.0, -5.0]], dtype=F64)
NEG = torch.tensor([[-0.8, -0.6, -2.5], [-0.1, -1.0, -2.0], [-1.0, -0.2, -0.9], [-0.2, -5.0, -5.0]], dtype=F64)
# d+ = [[0.6, 0, 0.9], [0, 1.0, pad], [0, 0.1, 0.7], [-2, pad, pad]];  d- = [[0.2, -0.1, -0.5], [0.2, 0.2, pad],
# [-0.3, 0, 0], [0.8, pad, pad]];  s = [[0.6, 0.1, 0.9], [0.2, 1.0, pad], [0.3, 0.1, 0.7], [2.0, pad, pad]]
EXCESS = [[0.4, 0.0, 0.7], [0.0, 0.8], [0.1, 0.0, 0.5]]  # max(0, s − 0.2) of the rows with A != 0
UP = [[math.exp(x) for x in row] for row in EXCESS]  # "upweight" at alpha = 1
SIGN = [[1.1, 1.0, 1.1], [1.0, 0.9], [1.0, 0.5 + 0.5 * math.exp(0.1), 1.1]]  # "sign_aware": A > 0 rows clip at 1.2,
# the A < 0 row: e^(−1.0) -> 0.8, so w = 0.9


def batch(weight, scope="sequence", **kw):
    return token_advantages(
        ADV,
        OLD,
        POS,
        NEG,
        MASK,
        threshold=0.2,
        ablation=settings(weight, scope, num_generations=2 if scope == "group" else None, alpha=1.0, **kw),
    )


def by_hand(w, scope):
    """[4, 3] expected A_i,t: A_i · w_t / w_bar, w_bar over the row / the group's / the batch's A != 0 tokens."""
    if scope == "sequence":
        bars = [sum(r) / len(r) for r in w]
    elif scope == "group":
        g0 = (sum(w[0]) + sum(w[1])) / 5
        bars = [g0, g0, sum(w[2]) / 3]  # row 3 (A = 0) is not in group 1's normaliser
    else:
        bars = [(sum(w[0]) + sum(w[1]) + sum(w[2])) / 8] * 3
    out = torch.zeros(4, 3, dtype=F64)
    for i, (row, bar) in enumerate(zip(w, bars)):
        out[i, : len(row)] = torch.tensor([float(ADV[i]) * x / bar for x in row], dtype=F64)
    return out


@pytest.mark.parametrize("scope", ["sequence", "group", "batch"])
@pytest.mark.parametrize("weight, w", [("upweight", UP), ("sign_aware", SIGN)])
def test_batch_scopes_by_hand(weight, w, scope):
    close(batch(weight, scope), by_hand(w, scope))


def test_sign_aware_batch_values_written_out():
    """Sequence scope, rows 0 and 1: w = [1.1, 1, 1.1] / mean 3.2/3 and [1, 0.9] / mean 0.95."""
    out = batch("sign_aware")
    close(out[0], [1.03125, 0.9375, 1.03125])
    close(out[1, :2], [-1 / 0.95, -0.9 / 0.95])
    assert out[1, 2] == 0 and (out[3] == 0).all()


@pytest.mark.parametrize("weight", ["upweight", "sign_aware"])
@pytest.mark.parametrize("seed", range(3))
def test_signs_and_per_sequence_budget_on_random_batches(weight, seed):
    """sign(A_i,t) = sign(A_i) on valid tokens, 0 elsewhere, and sum_t A_i,t = L_i · A_i under scope "sequence";
    group / batch scopes keep the signs and the group's / batch's budget."""
    g = torch.Generator().manual_seed(seed)
    B, T = 8, 11
    adv = torch.randn(B, generator=g, dtype=F64)
    adv[2] = 0.0
    mask = torch.arange(T)[None] < torch.randint(1, T + 1, (B, 1), generator=g)
    old, pos, neg = (-torch.rand(B, T, generator=g, dtype=F64) * 3 for _ in range(3))
    for scope in ("sequence", "group", "batch"):
        out = token_advantages(
            adv,
            old,
            pos,
            neg,
            mask,
            ablation=settings(weight, scope, num_generations=4 if scope == "group" else None, alpha=3.0),
        )
        valid = mask & (adv != 0)[:, None]
        assert torch.equal(torch.sign(out[valid]), torch.sign(adv[:, None].expand(B, T)[valid]))
        assert (out[~valid] == 0).all()
        L = mask.sum(1).double()
        if scope == "sequence":
            close(out.sum(1), L * adv)
        else:  # w̃ has mean 1 over the normaliser's tokens: sum over them of A_i,t / A_i = their count
            rows = 4 if scope == "group" else B
            ratio = torch.where(valid, out / torch.where(adv != 0, adv, 1.0)[:, None], 0.0)  # A_i,t / A_i
            close(ratio.reshape(B // rows, -1).sum(1), valid.reshape(B // rows, -1).sum(1).double())


def test_alpha_zero_mix_zero_eps_zero_give_grpo():
    grpo = torch.where(MASK, ADV[:, None].expand(4, 3), 0.0)
    for scope in ("sequence", "group", "batch"):
        kw = dict(scope=scope, num_generations=2 if scope == "group" else None)
        close(
            token_advantages(ADV, OLD, POS, NEG, MASK, ablation=settings("upweight", alpha=0.0, **kw)),
            grpo,
        )
        close(
            token_advantages(ADV, OLD, POS, NEG, MASK, ablation=settings("sign_aware", sign_mix=0.0, **kw)),
            grpo,
        )
        close(
            token_advantages(ADV, OLD, POS, NEG, MASK, ablation=settings("sign_aware", sign_eps=0.0, **kw)),
            grpo,
        )


def test_upweight_stays_finite_when_the_weights_overflow():
    """float32, alpha = 60, s up to 3 nats: exp(+180) overflows float32, the log-space max trick does not."""
    old = torch.zeros(2, 4)
    pos = torch.tensor([[-3.0, -0.1, -1.0, 0.0], [-2.9, -3.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 4)
    log_w = ablated_log_weights(adv, old, pos, pos, mask, 0.2, settings("upweight", alpha=60.0))
    assert torch.isinf(torch.exp(log_w)).any()
    out = token_advantages(adv, old, pos, pos, mask, ablation=settings("upweight", alpha=60.0))
    assert torch.isfinite(out).all()
    # float32 bound: each A_i,t (<= 4) carries ~2 roundings (w / w_bar, A·w̃), the 4-term sum 3 more
    bound = (4 * 2 + 3) * 4 * torch.finfo(torch.float32).eps
    close(out.double().sum(1), [4.0, -4.0], rtol=0, atol=bound)
    # row 0: the 3-nat token takes the whole budget (the next weight is e^(−60·2.0) smaller)
    close(out[0].double(), [4.0, 0.0, 0.0, 0.0], rtol=0, atol=bound)


def test_errors():
    with pytest.raises(ValueError, match="weight in"):  # a name cscr.py's weight step does not know
        cscr.cscr_token_advantages(ADV, OLD, POS, NEG, MASK, settings=cscr.Settings(weight="linear"))
    for kw, name in (
        (dict(sign_eps=1.0), "sign_eps"),
        (dict(sign_eps=-0.1), "sign_eps"),
        (dict(sign_mix=1.5), "sign_mix"),
    ):
        with pytest.raises(ValueError, match=name):
            batch("sign_aware", **kw)


def test_choose_names_each_rule_once_and_binds_its_parameters():
    """The flags' names -> an Ablation: the spec's maps as cscr.py's option in the paper's weight step, the ablations'
    functions from cscr_ablations.py, their parameters bound (the run chooses once, in grpo.Credit)."""
    assert cscr_ablations.choose() == cscr_ablations.Ablation(cscr.Settings(), cscr.CscrFunctions())  # the paper's
    assert cscr.CscrFunctions() == (cscr.sensitivity_weights, cscr.per_sequence)
    assert cscr_ablations.choose("inverse", "batch", alpha=2.0) == cscr_ablations.Ablation(
        cscr.Settings(alpha=2.0, weight="inverse"), cscr.CscrFunctions(renormalise=cscr_ablations.per_batch)
    )
    assert cscr_ablations.choose("upweight").functions.weights is cscr_ablations.upweight
    chosen = cscr_ablations.choose("sign_aware", "group", 2, sign_eps=0.1, sign_mix=0.3, w_min=0.1)
    weights = chosen.functions.weights
    assert weights.func is cscr_ablations.sign_aware and weights.keywords == {"eps": 0.1, "mix": 0.3}
    assert chosen.functions.renormalise.keywords == {"num_generations": 2} and chosen.settings.w_min == 0.1
    with pytest.raises(ValueError, match="weight must be one of"):
        cscr_ablations.choose("linear")
    with pytest.raises(ValueError, match="scope one of"):
        cscr_ablations.choose("exp", "token")


def test_grpo_credit_takes_the_rules_its_flags_name():
    from conftest import comparison_config, method_of

    def credit_of(**flags):  # the run's credit function, as grpo.train makes it
        cfg = comparison_config(**flags)
        return method_of(cfg).credit(cfg, None)

    credit = credit_of(
        credit="cscr",
        cscr_weight="sign_aware",
        cscr_scope="group",
        cscr_sign_eps=0.1,
        cscr_alpha=2.0,
        num_generations=4,
    )
    ablation = credit.ablation
    assert (ablation.settings.alpha, ablation.settings.w_min, ablation.settings.mode) == (2.0, 0.0, "max")
    assert ablation.functions.weights.func is cscr_ablations.sign_aware
    assert ablation.functions.weights.keywords == {"eps": 0.1, "mix": 0.5}
    renormalise = ablation.functions.renormalise
    assert renormalise.func is cscr_ablations.per_group and renormalise.keywords == {"num_generations": 4}
    assert credit.functions is ablation.functions  # what CscrCredit passes to cscr.py
    assert credit_of(credit="cscr").settings == cscr.Settings()
    # the spec §5 maps are cscr.py's options: the method's own credit function takes them, no ablation
    paper = credit_of(credit="cscr", cscr_weight="inverse")
    import grpo

    assert type(paper) is grpo.CREDIT_FUNCTIONS["cscr"] and paper.settings == cscr.Settings(weight="inverse")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_the_default_functions_are_the_papers_and_a_passed_function_is_used(dtype):
    """cscr.py's ``functions``: None and ``CscrFunctions()`` (what ``choose`` gives for the spec's maps) are the
    paper's, bit for bit (every map, α, w_min: log w, Ã, the statistics); a function in a field is the one called
    (the weight step with Δ+ and Â, the renormalisation with log w and the credited tokens), and the errors are
    the same one-line ones with an ablation's functions."""
    x = [t.to(dtype) for t in (ADV, OLD, POS, NEG)]
    for weight in ("exp", "exp_abs", "inverse"):
        for alpha, w_min in ((1.0, 0.0), (3.0, 0.1)):
            ablation = settings(weight, alpha=alpha, w_min=w_min)
            assert ablation.functions == cscr.CscrFunctions()
            want = cscr.credit_log_weights(*x, MASK, 0.2, ablation.settings)
            assert torch.equal(ablated_log_weights(*x, MASK, 0.2, ablation), want), (weight, alpha)
            want_adv = cscr.cscr_token_advantages(*x, MASK, 0.2, ablation.settings)
            assert torch.equal(token_advantages(*x, MASK, 0.2, ablation), want_adv)
            assert ablated_stats(*x, MASK, 0.2, ablation) == cscr.cscr_stats(*x, MASK, 0.2, ablation.settings)
    seen = {}

    def weights(s, shift_pos, adv, threshold, settings):  # the paper's, recording what it is given
        seen["weights"] = (shift_pos, adv)
        return cscr.sensitivity_weights(s, shift_pos, adv, threshold, settings)

    def renormalise(log_w, credited):  # the paper's, recording the credited tokens
        seen["credited"] = credited
        return cscr.per_sequence(log_w, credited)

    functions = cscr.CscrFunctions(weights, renormalise)
    got = cscr.cscr_token_advantages(*x, MASK, 0.2, functions=functions)
    assert torch.equal(got, cscr.cscr_token_advantages(*x, MASK, 0.2))
    assert torch.equal(seen["weights"][0], cscr.condition_shifts(*x[1:], MASK)[0]) and torch.equal(
        seen["weights"][1], x[0]
    )
    assert torch.equal(seen["credited"], MASK & (x[0] != 0)[:, None])
    nan = x[1].clone()
    nan[0, 0] = float("nan")
    bad = [
        ((x[0][:3], *x[1:]), MASK, 0.2, {}),  # adv of the wrong length
        (x, MASK, 0.2, {"alpha": -1.0}),
        (x, MASK, 0.2, {"w_min": 1.5}),
        ((x[0], nan, *x[2:]), MASK, 0.2, {}),  # not finite on a valid token
        ((x[0], x[1], x[1] + 5.0, x[3]), MASK, 0.0, {"alpha": 1e308}),  # α·s overflows
    ]
    for args, mask, threshold, kw in bad:
        with pytest.raises(ValueError) as want:
            cscr.credit_log_weights(*args, mask, threshold, cscr.Settings(**kw))
        with pytest.raises(ValueError) as got:
            ablated_log_weights(*args, mask, threshold, settings("upweight", **kw))
        assert str(got.value) == str(want.value)


def test_the_ablation_credit_reallocates_with_its_ablation():
    """CscrAblationCredit (what --cscr_weight upweight|sign_aware and --cscr_scope group|batch choose) passes its
    ablation's functions to cscr.py: its Ã and statistics are cscr.py's with them, not the paper's."""
    from conftest import comparison_config, method_of

    import grpo

    paper = grpo.CREDIT_FUNCTIONS["cscr"](grpo.GRPOConfig(credit="cscr", num_generations=2), None)
    paper_adv, _ = paper.reallocate(ADV, OLD, POS, NEG, MASK)
    for flags in (
        {"cscr_weight": "upweight"},
        {"cscr_weight": "sign_aware"},
        {"cscr_scope": "group"},
        {"cscr_scope": "batch"},
    ):
        cfg = comparison_config(credit="cscr", num_generations=2, **flags)
        method = method_of(cfg).credit(cfg, None)
        assert type(method) is cscr_ablations.CscrAblationCredit
        token_adv, stats = method.reallocate(ADV, OLD, POS, NEG, MASK)
        ablation = cscr_ablations.ablation_from_flags(cfg)
        args = (ADV, OLD, POS, NEG, MASK, cfg.cscr_threshold, ablation)
        assert method.functions is method.ablation.functions, flags  # what CscrCredit passes to cscr.py
        assert torch.equal(token_adv, token_advantages(*args)), flags
        assert stats == ablated_stats(*args), flags
        assert not torch.equal(token_adv, paper_adv), flags

"""verl's Optimal Token Baseline as --credit otb (comparisons/otb.py): its maths by hand, θ_old's per-token Σ_v π_v²
against an independent float64 formula, chunked and not, its credit c, and a toy run with --resume. Its equality
with verl 0.9.1's own function is tests/test_verl_otb.py (``-m verl``)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import comparisons
import grpo
from comparisons import otb
from trainer import chunked_head, policy, scale_passes

REPO = Path(__file__).resolve().parents[1]
D = torch.float64


def by_hand(rewards, mask, logp, sum_sq, G, rho=None, zero_tail=True, eps=1e-8):
    """docs/algo/otb.md's B*_t read one number at a time in Python floats: G_t = r_i on every valid token (an outcome
    reward at the last one), W_t = Σ_{j≤t} (1 − 2π_j + Σπ²)(·ρ̄_j²), B*_t = Σ G W / (Σ W + ε) over the group."""
    N, T = len(mask), len(mask[0])
    adv = [[0.0] * T for _ in range(N)]
    for g0 in range(0, N, G):
        rows = list(range(g0, g0 + G))
        energy = {}
        for i in rows:
            acc = 0.0
            for t in range(T):
                w = 1 - 2 * math.exp(logp[i][t]) + sum_sq[i][t]
                acc += (w * (rho[i][t] ** 2 if rho else 1.0)) * mask[i][t]
                energy[i, t] = acc
        lengths = {i: sum(mask[i]) for i in rows}
        ordered = sorted(lengths.values())
        longest = [i for i in rows if lengths[i] == ordered[-1]]
        for t in range(T):
            num = sum(rewards[i] * energy[i, t] * mask[i][t] for i in rows)
            den = sum(energy[i, t] * mask[i][t] for i in rows) + eps
            for i in rows:
                base = num / den if G > 1 else 0.0
                if zero_tail and G > 1 and len(longest) == 1 and i == longest[0] and ordered[-1] > ordered[-2]:
                    base = 0.0 if t >= ordered[-2] else base
                adv[i][t] = (rewards[i] - base) * mask[i][t]
    return torch.tensor(adv, dtype=D)


def _group(seed=0, N=6, T=5, lengths=(5, 3, 1, 4, 2, 1)):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).to(D)
    logp = -torch.rand(N, T, generator=g, dtype=D) * 3
    sum_sq = torch.exp(logp) ** 2 + torch.rand(N, T, generator=g, dtype=D) * 0.3  # ≥ π², as Σ_v π_v² is
    return mask, logp, sum_sq


@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("with_rho", [False, True])
def test_otb_by_hand(zero_tail, with_rho):
    """Two groups of three (one with differing rewards, one all equal: the zero tail moves it), unequal lengths and a
    one-token response, with and without ρ̄: the function equals the formula read by hand (float64, 1e-12)."""
    mask, logp, sum_sq = _group()
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0], dtype=D)
    rho = torch.rand(mask.shape, generator=torch.Generator().manual_seed(3), dtype=D) + 0.5 if with_rho else None
    ours = otb.optimal_token_baseline(rewards, mask, logp, sum_sq, 3, rho, handle_zero_tail=zero_tail)
    hand_rho = rho.tolist() if rho is not None else None
    want = by_hand(rewards.tolist(), mask.tolist(), logp.tolist(), sum_sq.tolist(), 3, hand_rho, zero_tail)
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-12)
    # the longest response beyond the group's second-longest: baseline 0 with the zero tail (Ã = r = 1 there), else
    # B* = its own G·W / (W + ε) ≈ r (Ã ≈ 0): row 0 (5 tokens; then 3) at t = 3, 4; row 3 (4; then 2) at t = 2, 3
    tails = torch.stack([ours[0, 3:], ours[3, 2:4]])
    assert torch.equal(tails, torch.ones_like(tails)) if zero_tail else float(tails.abs().max()) < 1e-5
    # the group whose rewards are all 1 (Â = 0): B*_t = ΣW/(ΣW + ε) elsewhere, so Ã = ε/(ΣW + ε), tiny
    assert float(ours[3:, :2].abs().max()) < 1e-5


def test_a_uniform_energy_gives_grpos_centred_reward():
    """Where every token's w is the same and the responses are as long, W_t is the same for every row: B*_t is the
    group's mean reward (to ε) and Ã = r_i − mean_g r, so the credit c = Ã / (r_i − mean_g r) is 1."""
    T = 4
    mask = torch.ones(4, T, dtype=D)
    logp = torch.full((4, T), math.log(0.5), dtype=D)
    sum_sq = torch.full((4, T), 0.3, dtype=D)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=D)
    token_adv = otb.optimal_token_baseline(rewards, mask, logp, sum_sq, 4)
    torch.testing.assert_close(token_adv, (rewards - 0.5)[:, None].expand(4, T), rtol=0, atol=1e-7)
    share = otb.credit_share(token_adv, rewards, mask, 4)
    torch.testing.assert_close(share, torch.ones(4, T, dtype=D), rtol=0, atol=1e-6)


def test_credit_share_keeps_equal_reward_groups_apart():
    """c = Ã / (r − mean) on a group whose rewards differ; Ã itself on a group whose rewards are all equal."""
    token_adv = torch.tensor([[0.2, 0.4], [-0.5, -0.25], [0.0, 0.7], [0.0, 0.0]], dtype=D)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=D)
    share = otb.credit_share(token_adv, rewards, torch.ones(4, 2, dtype=D), 2)
    torch.testing.assert_close(share[:2], torch.tensor([[0.4, 0.8], [1.0, 0.5]], dtype=D))
    torch.testing.assert_close(share[2:], token_adv[2:])


@pytest.mark.parametrize("chunked", [False, True])
def test_otbs_statistics_of_theta_olds_pass_are_the_log_sum_exp_formulas(
    toy_model_path, float64_model, monkeypatch, chunked
):
    """OTB's statistics from θ_old's pass (``old_logprobs(..., asked)`` with OTB's ``asks``), the mass and the sum of
    squares off the argmax, equal, for a float64 model, 1 − exp(max u − logsumexp(u)) and exp(logsumexp(2u) −
    2·logsumexp(u)) − π_max² of the full logits u = z/T (independent formulas), on the plain path and on the scale path
    with the LM head in chunks, to 1e-10: float64 softmax and sums over V = the toy's vocabulary are ~V·2^-53 apart."""
    import rollout
    import toy

    model, tok = policy.load_model_and_tokenizer(toy_model_path)
    model = float64_model(model)
    rows = toy.make_split("train")[:3]
    batch = rollout.generate(model, tok, [r["problem"] + "\n" for r in rows], 2, rollout.SamplingSettings(24, seed=1))
    cfg = grpo.GRPOConfig(temperature=0.7, micro_batch_size=2, chunked_lm_head=chunked)
    calls = []
    if chunked:  # a few positions per chunk: the head runs in chunks (ChunkedLMHead)
        monkeypatch.setattr(scale_passes, "LOGITS_CHUNK_BYTES", 3 * model.config.vocab_size * 4)
        apply = chunked_head.ChunkedLMHead.apply
        monkeypatch.setattr(chunked_head.ChunkedLMHead, "apply", lambda *a: calls.append(1) or apply(*a))
    old_logprobs = scale_passes.old_logprobs if chunked else grpo.old_logprobs
    old = old_logprobs(model, batch, cfg, otb.OTBCredit.asks)
    assert bool(calls) == chunked
    with torch.no_grad():
        position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=position_ids).logits
    T = batch.response_mask.shape[1]
    u = logits[:, -(T + 1) : -1].to(D) / cfg.temperature
    p_max = torch.exp(u.amax(-1) - torch.logsumexp(u, -1))
    sum_sq = torch.exp(torch.logsumexp(2 * u, -1) - 2 * torch.logsumexp(u, -1))
    for name, want in (("mass_off_argmax", 1 - p_max), ("sum_sq_off_argmax", sum_sq - p_max**2)):
        got = old.token_stats[name]
        assert got.dtype == D and got.shape == want.shape, name
        torch.testing.assert_close(got, want * batch.response_mask, rtol=0, atol=1e-10)
    assert float(sum_sq.max()) <= 1.0 and float((sum_sq * batch.response_mask).min()) >= 0.0


def test_otb_is_a_credit_of_the_comparisons_under_both_names():
    config = comparisons.config_class()
    assert {"otb", "optimal_token_baseline"} <= set(config.__dataclass_fields__["credit"].metadata["choices"])
    credits = [comparisons.method(config(credit=name)).credit for name in ("otb", "optimal_token_baseline")]
    assert credits == [otb.OTBCredit, otb.OTBCredit] and "otb" not in grpo.CREDIT_FUNCTIONS
    assert list(otb.OTBCredit.asks.token_stats) == ["mass_off_argmax", "sum_sq_off_argmax"]


def test_no_line_of_the_core_files_names_otb():
    for name in ("grpo.py", "delta.py", "cscr.py"):
        text = (REPO / name).read_text().lower()
        assert "otb" not in text and "optimal_token" not in text and "optimal token" not in text, name


@pytest.mark.slow
def test_a_toy_run_with_otb_resumes_and_logs_its_credit(tmp_path, toy_model_path):
    """``python -m comparisons --credit otb``: two steps, then --resume to three; metrics.jsonl has OTB's lines and
    samples/
    each token's credit c (its own ``credit_share``), the resumed run's last line equals one run of three steps."""
    common = ["--credit", "otb", "--model", toy_model_path, "--eval_num_generations", "0", "--logging_steps", "1"]
    common += ["--num_prompts_per_step", "4", "--num_generations", "4", "--save_steps", "2"]
    whole = tmp_path / "whole"
    part = tmp_path / "part"

    def run(*flags):
        subprocess.run(
            [sys.executable, "-m", "comparisons", *common, *flags], cwd=REPO, check=True, capture_output=True
        )

    run("--max_steps", "3", "--output_dir", str(whole))
    run("--max_steps", "2", "--output_dir", str(part))
    run("--max_steps", "3", "--output_dir", str(part), "--resume")
    lines = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    resumed = [json.loads(line) for line in (part / "metrics.jsonl").read_text().splitlines()]
    keep = ("reward", "loss", "grad_norm", "otb/abs_token_adv_mean", "otb/equal_reward_share")
    assert {k: lines[-1][k] for k in keep} == {k: resumed[-1][k] for k in keep}
    rows = [json.loads(line) for line in (whole / "samples" / "step_000003.jsonl").read_text().splitlines()]
    assert rows and all(len(r["credit"]) == len(r["tokens"]) for r in rows)
    assert any(r["advantage"] != 0 and any(c != 1.0 for c in r["credit"]) for r in rows)  # c is no longer Ã/Â = 1


def test_the_report_keeps_equal_reward_groups_apart():
    """samples_summary.credit_lands of an OTB run: rows with Â = 0 are counted apart, with the mean c (= Ã) of their
    credited tokens; a step whose equal-reward rows carry no credit adds nothing (no empty step); other runs: None."""
    from trainer import samples_summary

    def row(adv, credit, reward=1.0):
        return {
            "prompt": "p",
            "response": "r",
            "reward": reward,
            "advantage": adv,
            "tokens": ["a"] * len(credit),
            "credit": credit,
        }

    rows = {1: [row(0.0, [0.0, 0.0]), row(0.5, [1.0, 1.0])], 2: [row(0.0, [0.0, 1.0, 1.0]), row(0.0, [1e-9, 0.0])]}
    rows[1][1]["credit_share"] = [1.0, 1.0]  # OTB states its own c (run_setup.write_samples: its token values)
    lands = samples_summary.credit_lands(samples_summary.RunSamples("x", "x", "otb", {"credit": "otb"}, rows))
    assert lands["equal_reward"]["responses"] == 3
    assert lands["equal_reward"]["count"] == 2 and lands["equal_reward"]["mean"] == 1.0
    assert lands["equal_reward"]["per_step"] == [[2, 1.0, 2]]
    plain = {step: [{k: v for k, v in r.items() if k != "credit_share"} for r in rs] for step, rs in rows.items()}
    delta = samples_summary.RunSamples("x", "x", "delta", {"credit": "delta"}, plain)  # c = Ã/Â: no share stated
    assert samples_summary.credit_lands(delta)["equal_reward"] is None


def test_the_sampler_weights_enter_w_as_verl_folds_them():
    """--vllm_importance_sampling_correction: OTBCredit computes ρ̄ with the correction's own mode and bounds
    (sampler_mismatch.importance_weights) and passes it to the maths, where ρ̄² scales each w_j (verl's Step 2)."""
    from types import SimpleNamespace

    from trainer import credit_methods, sampler_mismatch

    mask, logp, sum_sq = _group(seed=4)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0], dtype=D)
    sampler = logp + torch.randn(mask.shape, generator=torch.Generator().manual_seed(5), dtype=D) * 0.3
    cfg = grpo.GRPOConfig(credit="otb", num_generations=3, use_vllm=True, vllm_importance_sampling_correction=True)
    p = torch.exp(logp)
    m = torch.where(p > 0.5, 1 - p, torch.full_like(p, 0.4))  # θ_old's mass off the argmax (π_j > 1/2: it is y)
    stats = {"mass_off_argmax": m, "sum_sq_off_argmax": sum_sq - (1 - m) ** 2}  # Σπ² = (1 − m)² + s
    old = policy.ThetaOld(logp, None, None, stats)
    batch = SimpleNamespace(sampler_logprobs=sampler)
    x = credit_methods.CreditInputs(batch, grpo.group_advantages(rewards, 3), old, None, 0, mask, rewards, None)
    result = otb.OTBCredit(cfg)(None, x)
    rho = sampler_mismatch.importance_weights(logp, sampler, mask, cfg.vllm_importance_sampling_mode, 3.0, None)
    assert not torch.equal(rho * mask, mask)  # the weights are not all 1
    w = otb.score_norm_sq(logp, stats["mass_off_argmax"], stats["sum_sq_off_argmax"])
    want = otb.optimal_token_baseline(rewards, mask, logp, None, 3, rho, w=w)
    torch.testing.assert_close(result.token_adv, want, rtol=0, atol=0)
    assert not torch.equal(want, otb.optimal_token_baseline(rewards, mask, logp, None, 3, w=w))
    torch.testing.assert_close(
        want, otb.optimal_token_baseline(rewards, mask, logp, sum_sq, 3, rho), rtol=0, atol=1e-12
    )


@pytest.mark.slow
def test_otb_runs_a_group_of_one_as_verl_does(tmp_path, toy_model_path):
    """--num_generations 1: GRPO's Â is 0 there (refused for --credit grpo, delta, cscr), OTB's baseline is absent and
    Ã = r on every valid token (verl, l.950); ``python -m comparisons --credit otb --num_generations 1`` trains."""
    rewards = torch.tensor([1.0, 0.0, 1.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    got = otb.optimal_token_baseline(rewards, mask, torch.zeros(3, 3), torch.ones(3, 3), 1)
    assert torch.equal(got, rewards[:, None] * mask)
    flags = ["--credit", "otb", "--model", toy_model_path, "--num_generations", "1", "--num_prompts_per_step", "4"]
    flags += ["--max_steps", "1", "--eval_num_generations", "0", "--output_dir", str(tmp_path / "run")]
    subprocess.run([sys.executable, "-m", "comparisons", *flags], cwd=REPO, check=True, capture_output=True)
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert line["step"] == 1 and line["otb/abs_token_adv_mean"] > 0


@pytest.mark.parametrize("gap", [1e-3, 1e-6, 3e-8])
def test_w_cannot_cancel_where_theta_old_is_almost_certain(gap):
    """w_j = 1 − 2π_j + Σπ², from a float32 pass's statistics, at π_j within ``gap`` of 1: ``score_norm_sq`` equals
    the float64 value (1 − π_j)² + Σ_{v≠j} π_v² to a relative 1e-5 (derived: softmax over V = 8 in float32 gives each
    π_v to ~(V + 3)·2^-24 relative; m² + s compounds it at most 4 times: 4·11·6e-8 ≈ 2.6e-6), where verl's form of the
    same float32 numbers is off by more than w itself at gap 1e-6 and below; for π_j ≤ 1/2 it is verl's form."""
    V = 8
    top = math.log((1 - gap) / gap * (V - 1))  # π_max = 1 − gap when the other V − 1 logits are 0
    u = torch.tensor([[top, 0.0, 0.5, -0.5, 0.25, -1.0, 0.1, -0.2], [0.0, 0.2, -0.1, 0.3, 0.0, 0.1, -0.3, 0.05]])
    u32 = u.to(torch.float32)
    y = torch.tensor([0, 3])  # row 0: the near-certain token; row 1: a token of π ≤ 1/2
    logp32 = torch.log_softmax(u32, -1).gather(-1, y[:, None]).squeeze(-1)
    w32 = otb.score_norm_sq(logp32, otb.mass_off_argmax(u32), otb.sum_sq_off_argmax(u32))
    p64 = torch.softmax(u.to(D), -1)
    py = p64.gather(-1, y[:, None]).squeeze(-1)
    want = (1 - py) ** 2 + p64.scatter(-1, y[:, None], 0.0).square().sum(-1)  # (1 − π_j)² + Σ_{v≠j} π_v², float64
    torch.testing.assert_close(w32.to(D), want, rtol=1e-5, atol=0)
    verl32 = 1 - 2 * torch.exp(logp32) + otb.sum_sq_prob(u32)
    if gap <= 1e-6:
        assert abs(float(verl32[0]) - float(want[0])) >= 0.5 * float(want[0])  # cancelled: off by half of w or more
    w64 = otb.score_norm_sq(torch.log(py), 1 - p64.amax(-1), p64.square().sum(-1) - p64.amax(-1) ** 2)
    # π ≤ 1/2: verl's form, in float64 to rounding (exp(log π), (1 − m)² + s: a few ulps of terms ≤ 2, < 1e-14)
    assert abs(float(w64[1]) - float(1 - 2 * py[1] + p64[1].square().sum())) < 1e-14

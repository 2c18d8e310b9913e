"""--credit delta / cscr through the trainer: end-to-end runs, logged metrics, micro-batch invariance."""

import dataclasses
import json

import pytest
import torch
from conftest import backward, comparison_config, stages_4_and_5

import grpo
import rollout
import toy
from trainer import checkpoint, memory_plan, policy, run_setup, scale_passes


def _run(tmp_path, model_path, credit, *extra):
    out = tmp_path / credit
    grpo.main(
        [
            "--model",
            model_path,
            "--prompt_template",
            "none",
            "--credit",
            credit,
            "--max_steps",
            "2",
            "--num_prompts_per_step",
            "8",
            "--num_generations",
            "4",
            "--eval_num_generations",
            "0",
            "--output_dir",
            str(out),
            "--save_steps",
            "0",
            *extra,
        ]
    )
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(l) for f in sorted((out / "samples").glob("*.jsonl")) for l in f.read_text().splitlines()]
    return lines, samples


@pytest.mark.parametrize("impl", ["normal", "memory_efficient"])
def test_delta_end_to_end_logs_coefficients(toy_model_path, tmp_path, impl):
    lines, samples = _run(tmp_path, toy_model_path, "delta", "--delta_impl", impl, "--micro_batch_size", "5")
    assert len(lines) == 2
    for key in (
        "delta/lam_pos_mean",
        "delta/lam_neg_mean",
        "delta/lam_pos_max",
        "delta/lam_neg_min",
        "delta/cos_mu",
        "delta/gamma_pos",
        "delta/gamma_neg",
    ):
        assert key in lines[0]
    live = [l for l in lines if l["delta/n_pos"] > 0 and l["delta/n_neg"] > 0]
    assert live, "the toy should produce both positive and negative responses"
    for l in live:  # λ ∈ [0.8, 1.2] before a global rescale N/Z that stays close to 1
        assert 0.6 < l["delta/lam_pos_min"] <= l["delta/lam_pos_max"] < 1.6
    assert any(len(s.get("lam_bar", ())) == len(s["tokens"]) > 0 for s in samples)  # λ̄ per token
    # samples/summary.json, written at the end: DelTA's token table and, on the toy, where the credit lands
    summary = json.loads((tmp_path / "delta" / "samples" / "summary.json").read_text())
    view = summary["delta_tokens"]["delta"]
    for side, sign in (("pos", 1), ("neg", -1)):  # every token of the side's rows counted once
        assert view[side]["tokens"] == sum(len(s["tokens"]) for s in samples if s["advantage"] * sign > 0)
    assert sum(summary["where_the_credit_lands"]["delta"]["responses"].values()) == len(samples)


def test_cscr_end_to_end_logs_weights(toy_model_path, tmp_path):
    lines, samples = _run(tmp_path, toy_model_path, "cscr", "--cscr_threshold_quantile", "0.8")
    for key in (
        "cscr/w_mean",
        "cscr/frac_w_lt_1",
        "cscr/w_tilde_max",
        "cscr/eff_token_frac",
        "cscr/s_pos_mean",
        "cscr/s_neg_mean",
        "cscr/threshold",
    ):
        assert key in lines[0]
    assert lines[0]["cscr/threshold"] == lines[1]["cscr/threshold"]  # calibrated once, then frozen
    assert any(len(s.get("sensitivity", ())) == len(s["tokens"]) > 0 for s in samples)  # s per token
    summary = json.loads((tmp_path / "cscr" / "samples" / "summary.json").read_text())
    assert "delta_tokens" not in summary or not summary["delta_tokens"]
    assert sum(summary["where_the_credit_lands"]["cscr"]["responses"].values()) == len(samples)


def test_cscr_says_once_when_its_weights_leave_the_moderate_band(capsys):
    """spec §5's band (1/w̄ ≲ 1.3, effective-token fraction ≳ 0.85): one line the first time a step leaves it, none
    within it or for a batch with no credited token (statistics 0)."""
    from trainer.credit_methods import CscrCredit

    credit = CscrCredit(grpo.GRPOConfig(credit="cscr"))
    credit.warn_if_strong({"cscr/inv_w_bar_max": 0.0, "cscr/eff_token_frac": 0.0}, 0)  # no credited token
    credit.warn_if_strong({"cscr/inv_w_bar_max": 1.2, "cscr/eff_token_frac": 0.9}, 1)  # within
    assert capsys.readouterr().out == ""
    credit.warn_if_strong({"cscr/inv_w_bar_max": 1.74, "cscr/eff_token_frac": 0.74}, 2)
    credit.warn_if_strong({"cscr/inv_w_bar_max": 1.9, "cscr/eff_token_frac": 0.7}, 3)
    out = capsys.readouterr().out
    assert out.count("[cscr]") == 1 and "step 3: max 1/w̄ 1.74" in out and "0.74" in out


# ---------------------------------------------------------------------------------------- micro-batch invariance
@pytest.fixture(scope="module")
def rollout_batch(toy_model_path):
    torch.manual_seed(0)
    model, tok = policy.load_model_and_tokenizer(toy_model_path)
    rows = toy.make_split("train")[:4]
    batch = rollout.generate(model, tok, [r["problem"] + "\n" for r in rows], 4, rollout.SamplingSettings(48, seed=3))
    return model, tok, rows, batch


def old_dtype(model):
    return next(model.parameters()).dtype


def _stages_4_to_6(model, tok, rows, batch, **flags):
    """θ_old's pass, the credit and one mini-batch's backward on the fixture batch with ``GRPOConfig(**flags)``:
    (old log-probs, DelTA's h_t at the response tokens or None, token advantages, loss, gradient)."""
    N, mask = batch.input_ids.shape[0], batch.response_mask.bool()
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0] * (N // 4), dtype=old_dtype(model)), 4)
    cfg = comparison_config(dual_clip=10.0, max_completion_length=48, **flags)
    answers = [r["answer"] for r in rows for _ in range(4)]
    _, _, theta_old, result = stages_4_and_5(model, tok, batch, cfg, adv, answers)
    old, hidden = theta_old.logp, theta_old.hidden
    token_adv = result.token_adv
    # a perturbed "old" policy: ratios away from 1, so that every clip branch matters
    perturbed = old + 0.1 * torch.randn(old.shape, generator=torch.Generator().manual_seed(1)) * mask
    model.zero_grad(set_to_none=True)
    model.train()
    loss, _, _ = backward(model, batch, theta_old._replace(logp=perturbed), token_adv, torch.arange(N), cfg)
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return old, None if hidden is None else hidden[mask], token_adv, loss, grad


# Every equality below is "the same computation" in another layout: compared in float64 (conftest.float64_model,
# which also runs HF's float32 islands in float64) to 1e-10 relative, a bound derived there; float32 rounding
# differs between CPUs (an earlier 1e-6 bound on float32 failed on another machine through DelTA's σ(Δ/γ)).
TOL = 1e-10


@pytest.mark.parametrize("credit", ["grpo", "delta", "cscr"])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_gradient_does_not_depend_on_micro_batch_size(rollout_batch, float64_model, credit, loss_type):
    model, tok, rows, batch = rollout_batch
    model = float64_model(model)
    runs = [
        _stages_4_to_6(model, tok, rows, batch, credit=credit, loss_type=loss_type, micro_batch_size=mbs)
        for mbs in (1, 2, 0)
    ]
    _assert_same_update(runs[2], runs[0])
    _assert_same_update(runs[2], runs[1])


def _assert_same_update(a, b, tol=TOL):
    """Two ``_stages_4_to_6`` results agree to ``tol`` (relative; the loss relative to the advantages' scale)."""
    (old0, h0, adv0, loss0, g0), (old1, h1, adv1, loss1, g1) = a, b
    assert old0.dtype == adv0.dtype == g0.dtype == torch.float64  # float32 anywhere would void the bound
    torch.testing.assert_close(old1, old0, rtol=tol, atol=tol)
    if h0 is not None:
        torch.testing.assert_close(h1, h0, rtol=tol, atol=tol)
    torch.testing.assert_close(adv1, adv0, rtol=tol, atol=tol)
    # the loss is a token-mean of terms of size ~|Â|, positive and negative: tol relative to that scale
    assert loss1 == pytest.approx(loss0, rel=tol, abs=tol * float(adv0.abs().max())) and g0.abs().sum() > 0
    assert (g1 - g0).norm() <= tol * g0.norm() and (g1 - g0).abs().max() <= tol * g0.abs().max()


@pytest.mark.parametrize("credit", ["grpo", "delta", "cscr"])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_padding_free_gives_the_padded_loss_and_gradient(rollout_batch, float64_model, credit, loss_type):
    """--padding_free (rows sorted by length, each micro-batch cut to its own longest prompt and response) gives the
    padded computation's old log-probs, token advantages, loss and gradient (float64, 1e-10 relative)."""
    model, tok, rows, batch = rollout_batch
    model = float64_model(model)
    for mbs in (1, 2, 0):
        _assert_same_update(
            *[
                _stages_4_to_6(
                    model,
                    tok,
                    rows,
                    batch,
                    credit=credit,
                    loss_type=loss_type,
                    micro_batch_size=mbs,
                    padding_free=pf,
                    shared_prompt=False,
                )
                for pf in (False, True)
            ]
        )


def test_padding_free_micro_batches_cover_each_row_once_at_its_own_width(rollout_batch):
    _, _, _, batch = rollout_batch
    N, T = batch.response_mask.shape
    lengths = batch.attention_mask.sum(1)
    for size in (0, 1, 3):
        plan = scale_passes.micro_batches(torch.arange(N), batch.attention_mask, size, T, padding_free=True)
        assert sorted(torch.cat([j for j, _, _ in plan]).tolist()) == list(range(N))
        assert len(plan) == (min(scale_passes.PADDING_FREE_BUCKETS, N) if size == 0 else -(-N // size))
        for j, cols, t in plan:  # no column is padding in every row of its micro-batch
            att = batch.attention_mask[j][:, cols]
            assert att[:, 0].any() and att[:, -1].any() and t == int(batch.attention_mask[j, -T:].sum(1).max())
            assert int(att.sum()) == int(lengths[j].sum())  # nothing real was cut
        widths = [cols.stop - cols.start for _, cols, _ in plan]
        assert sum(w * len(j) for w, (j, _, _) in zip(widths, plan)) <= N * batch.input_ids.shape[1]
    plain = scale_passes.micro_batches(torch.arange(N), batch.attention_mask, 2, T, padding_free=False)
    assert [j.tolist() for j, _, _ in plain] == [[i, i + 1] for i in range(0, N, 2)]


def _delta_credit(model, tok, batch, adv, **flags):
    """Stages 4-5 of DelTA on the fixture batch: (λ̄ [N, T], token advantages, stats, forward passes run)."""
    cfg = grpo.GRPOConfig(credit="delta", **flags)
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    _, _, _, result = stages_4_and_5(model, tok, batch, cfg, adv)
    handle.remove()
    return result.token_values["lam_bar"], result.token_adv, result.stats, len(calls)


@pytest.mark.parametrize("K", [0, 1, 2])
@pytest.mark.parametrize("rewards", ["mixed", "zero_groups", "one_side"])
def test_delta_memory_efficient_equals_normal_in_trainer(rollout_batch, float64_model, K, rewards):
    """--delta_impl memory_efficient (h recomputed by K + 3 no-grad, eval-mode passes over micro-batches, never the
    batch's h at once) gives normal's λ̄ (the whole batch's h kept by stage 4), for micro-batch sizes 1, 3 and the
    whole batch, with zero-advantage groups and with one side empty (λ̄ ≡ 1): float64, 1e-10 (conftest)."""
    model, tok, rows, batch = rollout_batch
    model = float64_model(model)
    r = {
        "mixed": [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0],
        "zero_groups": [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0],
        "one_side": [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    }[rewards]
    # one_side: with --scale_rewards none, a group with one 1 among four 0s gives Â > 0 to one row only; the other
    # group is all 0 (Â = 0): no negative side, so the guard gives λ̄ ≡ 1
    scale = "none" if rewards == "one_side" else "group"
    adv = grpo.group_advantages(torch.tensor(r * 2, dtype=torch.float64), 4, scale_rewards=scale)
    if rewards == "one_side":
        adv = adv.clamp(min=0)
    mask = batch.response_mask
    lam0, adv0, st0, _ = _delta_credit(model, tok, batch, adv, delta_k=K, micro_batch_size=0)
    assert lam0.dtype == torch.float64 and (st0["delta/fallback"] == 1.0) == (rewards == "one_side")
    if rewards != "one_side":
        assert not torch.allclose(lam0, mask.double())  # not the guard's λ̄ ≡ 1
    for mbs in (1, 3, 0):
        _, _, _, n0 = _delta_credit(model, tok, batch, adv, delta_k=K, micro_batch_size=mbs)  # stage 4's forwards
        lam1, adv1, st1, n1 = _delta_credit(
            model, tok, batch, adv, delta_k=K, micro_batch_size=mbs, delta_impl="memory_efficient"
        )
        torch.testing.assert_close(lam1, lam0, atol=TOL, rtol=TOL)
        torch.testing.assert_close(adv1, adv0, atol=TOL, rtol=TOL)
        for key in st0:
            assert st1[key] == pytest.approx(st0[key], rel=TOL, abs=TOL, nan_ok=True), key
        # stage 4's micro-batches, then the micro-batches again in each pass: one for the guard (one side empty),
        # else K + 3 (2 for K = 0)
        passes = 1 if rewards == "one_side" else (K + 3 if K else 2)
        assert n1 == n0 + passes * n0, (n1, n0, passes)


def test_delta_normal_stops_before_a_cache_that_does_not_fit(rollout_batch, monkeypatch):
    """--delta_impl normal checks stage 5's peak, memory_plan.DELTA_NORMAL_HOST_COPIES of its [N, T, H] float32 cache,
    against the host's memory before allocating the cache: one line naming the size and --delta_impl
    memory_efficient, not an out-of-memory kill mid-step."""
    model, tok, rows, batch = rollout_batch
    N, T = batch.response_mask.shape
    nbytes = memory_plan.DELTA_NORMAL_HOST_COPIES * N * T * model.config.hidden_size * 4
    share = memory_plan.HOST_MEMORY_SHARE
    monkeypatch.setattr(memory_plan, "host_memory_available", lambda: int(0.95 * nbytes / share))  # just too little
    with pytest.raises(
        SystemExit,
        match=rf"{N} responses × {T} tokens × {model.config.hidden_size} hidden .* use "
        r"--delta_impl memory_efficient",
    ):
        memory_plan.check_delta_cache(N, T, model.config.hidden_size)  # once, before the loop (preflight.check)
    monkeypatch.setattr(memory_plan, "host_memory_available", lambda: int(1.05 * nbytes / share))
    memory_plan.check_delta_cache(N, T, model.config.hidden_size)  # fits
    _delta_credit(model, tok, batch, torch.ones(N))
    _delta_credit(model, tok, batch, torch.ones(N), delta_impl="memory_efficient")  # keeps no cache at all


def _one_step(model, tok, cfg, rows, out_dir, monkeypatch, from_training_forward):
    """One grpo.train_step from ``model`` with stage 4's branch forced on or off (None: as grpo decides); returns
    (record, weights, the credit hook's arguments)."""
    if from_training_forward is not None:
        monkeypatch.setattr(memory_plan, "updates_on_policy", lambda *a, **k: from_training_forward)
    seen = {}
    method = grpo.paper_method(cfg)

    class SpyCredit(method.credit):  # this run's only: records what stage 5 receives and returns
        def __call__(self, model, x):
            seen.update(batch=x.batch, old_logp=x.old.logp.clone())
            out = super().__call__(model, x)
            seen["token_adv"] = out.token_adv.clone()
            return out

    spy = SpyCredit(cfg, tok)
    run = checkpoint.RunFolder(str(out_dir), dataclasses.asdict(cfg))
    run.start(model, {"prompt_template": "none"})
    actor = run_setup.Actor(model, tok, policy.build_optimizer(model.parameters(), cfg), None)
    stop_ids = rollout.stop_token_ids(tok, "none", model)
    source = run_setup.PromptSource(rows, rollout.PromptSampler(len(rows), 0), "none", stop_ids)
    parts = run_setup.step_parts(cfg, spy, method, policy.Forward(grpo.old_logprobs, grpo.micro_batches))
    record = grpo.train_step(0, cfg, actor, source, spy, run, parts)
    run.close()
    return record, [p.detach().clone() for p in model.parameters()], seen


@pytest.mark.parametrize("path", ["plain", "scale"])
@pytest.mark.parametrize("credit", ["grpo", "delta", "cscr"])
def test_theta_old_from_the_training_forward_gives_the_same_update(
    toy_model_path, tmp_path, monkeypatch, credit, path, float64_model
):
    """Stage 4's branch (θ_old's log-probs taken from the training forward, which stage 6 then reuses: TRL's way, on
    the plain path by default, and the scale path's) makes the same AdamW update, token advantages and statistics as
    the separate no-grad pass. In float64: AdamW's first step is about lr·sign(g), so a float32 gradient entry near 0
    could flip and move its weight by 2·lr."""
    import copy

    model, tok = policy.load_model_and_tokenizer(toy_model_path)
    model = float64_model(model)
    rows = toy.make_split("train")[:8]
    scale = dict(padding_free=True, shared_prompt=True, chunked_lm_head=True) if path == "scale" else {}
    cfg = grpo.GRPOConfig(credit=credit, num_prompts_per_step=4, num_generations=4, max_completion_length=48, **scale)
    assert memory_plan.updates_on_policy(cfg, 16, processes=1)  # --fuse_old_logprobs: on by default
    assert not memory_plan.updates_on_policy(dataclasses.replace(cfg, num_iterations=2), 16, processes=1)
    assert not memory_plan.updates_on_policy(dataclasses.replace(cfg, micro_batch_size=4), 16, processes=1)
    assert not memory_plan.updates_on_policy(dataclasses.replace(cfg, fuse_old_logprobs=False), 16, processes=1)
    assert not memory_plan.updates_on_policy(dataclasses.replace(cfg, beta=0.04), 16, processes=1)  # a reference
    assert not memory_plan.updates_on_policy(cfg, 16, processes=1, reuses_old_forward=False)
    assert not memory_plan.updates_on_policy(cfg, 16, processes=2, credit_gathers_weights=True)
    assert memory_plan.updates_on_policy(cfg, 16, processes=1, credit_gathers_weights=True)
    results = [
        _one_step(copy.deepcopy(model), tok, cfg, rows, tmp_path / str(fused), monkeypatch, fused)
        for fused in (False, True)
    ]
    (r0, w0, s0), (r1, w1, s1) = results
    assert r0["grad_norm"] > 0 and r1["grad_norm"] == pytest.approx(r0["grad_norm"], rel=TOL)
    assert r1["loss"] == pytest.approx(r0["loss"], abs=TOL) and r1["reward"] == r0["reward"]
    torch.testing.assert_close(s1["old_logp"], s0["old_logp"], atol=TOL, rtol=TOL)
    torch.testing.assert_close(s1["token_adv"], s0["token_adv"], atol=TOL, rtol=TOL)
    for p, q in zip(w0, w1):  # AdamW's first step: lr·g/(|g| + 1e-8), ≤ lr·TOL apart for g equal to TOL
        torch.testing.assert_close(q, p, atol=cfg.learning_rate * 1e-6, rtol=0)


@pytest.mark.parametrize("credit", ["delta", "cscr"])
def test_dropout_takes_theta_old_and_credit_from_eval_mode(
    toy_model_path, tmp_path, monkeypatch, float64_model, credit
):
    """With dropout (LoRA's, here 0.5) a training-mode forward is noisy: θ_old's log-probs, DelTA's h_t and CSCR's ℓ0
    come from eval mode (spec §2.1) on every path. The fused stage 4 turns itself off (``exact_optimisations``):
    the defaults give the λ̄ (or w̃) of --no-fuse_old_logprobs and the eval-mode log-probs; forcing the fused
    branch would take them from a dropped-out forward instead."""
    import copy

    model, tok = policy.load_model_and_tokenizer(toy_model_path)
    model = policy.prepare_model(float64_model(model), grpo.GRPOConfig(use_peft=True, lora_dropout=0.5))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # B = 0 at initialisation: the adapters (and their dropout) would change nothing yet
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    rows, runs = toy.make_split("train")[:8], {}
    for name, flags, force in (
        ("defaults", {"fuse_old_logprobs": True}, None),
        ("no_fuse", {"fuse_old_logprobs": False}, None),
        ("forced", {"fuse_old_logprobs": True}, True),
    ):
        cfg = grpo.GRPOConfig(
            credit=credit,
            num_prompts_per_step=4,
            num_generations=4,
            max_completion_length=48,
            use_peft=True,
            lora_dropout=0.5,
            **flags,
        )
        plan = scale_passes.exact_optimisations(model, cfg, say=lambda *a: None)
        assert plan["fuse_old_logprobs"].startswith("off") and "dropout" in plan["fuse_old_logprobs"]
        if force:
            cfg.fuse_old_logprobs = True
        runs[name] = _one_step(copy.deepcopy(model), tok, cfg, rows, tmp_path / name, monkeypatch, force)[2]
    b = runs["defaults"]["batch"]
    model.eval()
    with torch.no_grad():
        l0 = scale_passes.token_logprobs(model, b.input_ids, b.attention_mask, b.response_mask)
    torch.testing.assert_close(runs["defaults"]["old_logp"], l0, atol=TOL, rtol=TOL)
    torch.testing.assert_close(runs["defaults"]["token_adv"], runs["no_fuse"]["token_adv"], atol=TOL, rtol=TOL)
    assert (runs["forced"]["old_logp"] - l0).abs().max() > 1e-3  # what the refusal prevents
    assert (runs["forced"]["token_adv"] - runs["defaults"]["token_adv"]).abs().max() > 1e-3


# ------------------------------------------------------------------------------------- --shared_prompt (policy.py)
@pytest.mark.slow
@pytest.mark.parametrize("credit", ["grpo", "delta", "cscr"])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_shared_prompt_gives_the_unshared_log_probs_and_gradient(rollout_batch, float64_model, credit, loss_type):
    """--shared_prompt (each group's prompt run once, its keys and values read by the G responses; the prompt pass's
    gradient sent back once after the micro-batches') gives the full forward's old log-probs, DelTA's h_t, token
    advantages, loss and gradient, for micro-batch sizes 1, 2 and the whole batch (float64, 1e-10 relative)."""
    model, tok, rows, batch = rollout_batch
    model = float64_model(model)
    for mbs in (1, 2, 0):
        _assert_same_update(
            *[
                _stages_4_to_6(
                    model,
                    tok,
                    rows,
                    batch,
                    credit=credit,
                    loss_type=loss_type,
                    micro_batch_size=mbs,
                    shared_prompt=shared,
                )
                for shared in (False, True)
            ]
        )


def test_shared_prompt_runs_each_distinct_prompt_once_and_handles_one_token_prompts(toy_model_path, float64_model):
    """The prompt pass holds one row per distinct prompt (a group's G rows read the same one); a prompt of one token
    (nothing to cache: its cached columns are all padding) and a batch of one-token prompts (no prompt pass at all)
    give the full forward's log-probs and gradient."""
    model, tok = policy.load_model_and_tokenizer(toy_model_path)
    model = float64_model(model)
    for prompts in (["Compute 1+2.\n", "", "7", "Compute 12-3+4.\n"], ["", ""]):
        batch = rollout.generate(model, tok, prompts, 3, rollout.SamplingSettings(12, seed=5))
        N, T = batch.response_mask.shape
        shared = scale_passes.SharedPrompts(model, batch.input_ids, batch.attention_mask, torch.arange(N), T)
        assert (
            shared.mask.shape[0] == len(set(prompts))
            and shared.mask.shape[1] == int(batch.attention_mask[:, :-T].sum(1).max()) - 1
        )
        assert shared.index.tolist() == [shared.index[g * 3].item() for g in range(len(prompts)) for _ in range(3)]
        grads, logps = [], []
        for s in (None, shared):
            model.zero_grad(set_to_none=True)
            lp = scale_passes.token_logprobs(
                model,
                batch.input_ids,
                batch.attention_mask,
                batch.response_mask,
                shared=None if s is None else (s, torch.arange(N)),
            )
            (lp * torch.linspace(-1, 1, N)[:, None].double()).sum().backward()
            if s is not None:
                s.backward()
            logps.append(lp.detach())
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        torch.testing.assert_close(logps[1], logps[0], rtol=TOL, atol=TOL)
        assert (grads[1] - grads[0]).norm() <= TOL * grads[0].norm() and grads[0].abs().sum() > 0


def test_shared_prompt_is_off_where_it_would_not_be_exact(toy_model_path):
    """Off with --no-shared_prompt, gradient checkpointing (it replays forwards, and HF turns the cache off under it)
    and dropout (the G responses would share their prompt's dropout mask), each with one logged line; on where the
    flag is. (The model features of every optimisation: tests/test_architectures.py.)"""
    model, tok = policy.load_model_and_tokenizer(toy_model_path)
    scale = dict(padding_free=True, shared_prompt=True, chunked_lm_head=True, fuse_old_logprobs=True)

    def decide(cfg, m=model):
        said = []
        plan = scale_passes.exact_optimisations(m, cfg, said.append)
        return plan["shared_prompt"], said

    assert decide(grpo.GRPOConfig(**scale)) == ("on", [])
    assert decide(grpo.GRPOConfig()) == ("off: the flag", [])  # the toy's default: the plain path
    plan, said = decide(grpo.GRPOConfig(gradient_checkpointing=True, **scale))
    assert plan.startswith("off") and said == [
        "[exact] --shared_prompt off: it needs no gradient checkpointing: --gradient_checkpointing"
    ]
    lora = policy.prepare_model(model, grpo.GRPOConfig(use_peft=True, lora_dropout=0.1))
    plan, said = decide(grpo.GRPOConfig(**scale), lora)
    assert "train = eval: the model has dropout" in plan and len(said) == 3  # and padding-free, the fused stage 4


def test_shared_prompt_on_the_training_forward_gives_the_same_update(
    toy_model_path, tmp_path, monkeypatch, float64_model
):
    """Stage 4's training forward with the shared prompt pass (its backward run by stage 6 after the micro-batches')
    makes the same AdamW update as without it. In float64: AdamW's first step is about lr·sign(g), so float32
    rounding of a gradient entry near 0 would move its weight by up to 2·lr."""
    import copy

    model, tok = policy.load_model_and_tokenizer(toy_model_path)
    model = float64_model(model)
    rows = toy.make_split("train")[:8]
    results = []
    for shared in (False, True):
        cfg = grpo.GRPOConfig(
            credit="delta",
            num_prompts_per_step=4,
            num_generations=4,
            max_completion_length=48,
            shared_prompt=shared,
            fuse_old_logprobs=True,
        )
        results.append(_one_step(copy.deepcopy(model), tok, cfg, rows, tmp_path / str(shared), monkeypatch, True))
    (r0, w0, s0), (r1, w1, s1) = results
    assert r0["grad_norm"] > 0 and r1["grad_norm"] == pytest.approx(r0["grad_norm"], rel=TOL)
    torch.testing.assert_close(s1["token_adv"], s0["token_adv"], atol=TOL, rtol=TOL)
    for p, q in zip(w0, w1):  # AdamW's first step: lr·g/(|g| + 1e-8), ≤ lr·TOL apart for g equal to TOL
        torch.testing.assert_close(q, p, atol=cfg.learning_rate * 1e-6, rtol=0)


def test_cscr_scoring_passes_share_each_privileged_prompt(rollout_batch, monkeypatch, float64_model):
    """CSCR's ℓ+ and ℓ− with --shared_prompt (each group's x + c± run once, ``CscrCredit.scoring_logprobs``) equal the
    full forward's, and the prompt pass really ran on the distinct privileged prompts only."""
    import cscr

    model, tok, rows, batch = rollout_batch
    model = float64_model(model)
    answers = [r["answer"] for r in rows for _ in range(4)]
    pairs = [cscr.build_condition_prompts(p, reference=a) for p, a in zip(batch.prompts, answers)]
    built, original = [], scale_passes.SharedPrompts

    class Spy(original):  # records the number of rows each prompt pass ran on
        def __init__(self, *args):
            super().__init__(*args)
            built.append(self.mask.shape[0])

    monkeypatch.setattr(scale_passes, "SharedPrompts", Spy)
    out = []
    shared = scale_passes.forward(grpo.GRPOConfig(credit="cscr", shared_prompt=True), False).scoring_logprobs
    for fn in (scale_passes.token_logprobs, shared):
        out.append(cscr.condition_logprobs(model, tok, pairs, batch.response_ids, batch.response_mask, logprob_fn=fn))
    assert built == [len(rows), len(rows)]  # x + c+ then x + c−: one row per group, not per response
    for shared, full in zip(out[1], out[0]):
        assert full.abs().sum() > 0
        assert full.dtype == torch.float64
        torch.testing.assert_close(shared, full, rtol=TOL, atol=TOL)


def test_cscr_standalone_logprob_fn_is_the_trainers(rollout_batch, float64_model):
    """cscr.py keeps its own log-prob function (``default_logprob_fn``) so that it runs without this project; it
    must be the trainer's (grpo.py's plain ``token_outputs``; the scale path's ``token_logprobs``: left padding,
    position ids, temperature), or a standalone user's ℓ± would not match the trainer's ℓ0 (CSCR spec §4,
    "matching"). Float64: the same formula, 1e-10."""
    import cscr

    model, _, _, batch = rollout_batch
    model = float64_model(model)
    for temperature in (1.0, 0.7):
        ours = scale_passes.token_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.response_mask, temperature
        )
        theirs = cscr.default_logprob_fn(model, batch.input_ids, batch.attention_mask, batch.response_mask, temperature)
        plain = grpo.token_outputs(model, batch.input_ids, batch.attention_mask, batch.response_mask, temperature)
        assert ours.dtype == torch.float64 and ours.abs().sum() > 0
        torch.testing.assert_close(theirs, ours, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(plain.logp, ours, rtol=1e-10, atol=1e-10)


def test_cscr_diagnostics_scores_are_the_trainers(rollout_batch, float64_model):
    """cscr_diagnostics.py scores with the trainer's log-prob function on cscr.py's public builder: its ℓ0 is
    stage 4's θ_old pass (``grpo.old_logprobs``, the run's default layout), its ℓ± are ``Credit._cscr``'s scoring
    passes, its H(p0) the entropy the trainer's pass returns (float64, 1e-10)."""
    import cscr
    from tools import cscr_diagnostics

    model, tok, rows, batch = rollout_batch
    model = float64_model(model).eval()
    answers = [r["answer"] for r in rows for _ in range(4)]
    contexts = cscr_diagnostics.condition_contexts(
        batch.prompts, answers, batch.texts, "verdict", cscr.MARKER, cscr.TURN_END
    )
    mask = batch.response_mask.bool()
    scores = cscr_diagnostics.score_contexts(model, tok, contexts, batch.response_ids, mask, 1.0, 3)
    cfg = grpo.GRPOConfig(credit="cscr")
    trainer = {"old_logp": grpo.old_logprobs(model, batch, cfg).logp}
    trainer["lp_pos"], trainer["lp_neg"] = cscr.condition_logprobs(
        model,
        tok,
        list(zip(contexts["pos"], contexts["neg"])),
        batch.response_ids,
        batch.response_mask,
        logprob_fn=scale_passes.forward(cfg, False).scoring_logprobs,
    )
    with torch.no_grad():
        trainer["entropy"] = scale_passes.token_outputs(
            model, batch.input_ids, batch.attention_mask, batch.response_mask, asked=policy.Asked(entropy=True)
        ).entropy
    for name, expected in trainer.items():
        assert scores[name].dtype == torch.float64 and expected.abs().sum() > 0, name
        torch.testing.assert_close(scores[name], expected.to(torch.float64), rtol=TOL, atol=TOL)


def test_fused_stage_4_is_off_under_fsdp_for_a_credit_whose_passes_gather_the_weights(monkeypatch):
    """Under torchrun the training forward cannot stay open across CSCR's scoring passes (they need the gathered
    weights): step_parts reads the credit function's ``gathers_weights``, not the method's name, so CSCR's ablations
    inherit it and a new method declares it."""
    from comparisons import cscr_ablations

    def fused(credit_name, distributed):
        monkeypatch.setattr(run_setup.distributed, "world_size", lambda: 2 if distributed else 1)
        cfg = grpo.GRPOConfig(credit=credit_name, num_prompts_per_step=4, num_generations=4, fuse_old_logprobs=True)
        method = grpo.paper_method(cfg)
        plain = policy.Forward(grpo.old_logprobs, grpo.micro_batches)
        forward = run_setup.step_parts(cfg, method.credit(cfg, None), method, plain).forward
        return forward.old_logprobs.keywords["training_forward"]

    assert fused("grpo", True) and fused("delta", True) and fused("cscr", False)
    assert not fused("cscr", True)
    assert cscr_ablations.CscrAblationCredit(comparison_config(credit="cscr"), None).gathers_weights

"""GRPO math (advantages, loss, log-probs), rollout masks, data validation and an end-to-end toy run."""

import dataclasses
import itertools
import json
import math
import os

import pytest
import torch

import comparisons
import evaluate
import grpo
import rollout
import toy
from trainer import checkpoint, grpo_config, policy, problems, scale_passes


# ------------------------------------------------------------------------------------------------ advantages
def test_group_advantages_hand_values():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    a = grpo.group_advantages(r, 4)
    # group 1: mean 0.5, unbiased std sqrt(1/3) = 0.57735; (1-0.5)/(0.57735+1e-6)
    s = math.sqrt(1 / 3)
    exp1 = [0.5 / (s + 1e-6), -0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.5 / (s + 1e-6)]
    # group 2: mean 0.75, std 0.5: (1-0.75)/0.5 = 0.5, (0-0.75)/0.5 = -1.5
    exp2 = [0.25 / (0.5 + 1e-6)] * 3 + [-0.75 / (0.5 + 1e-6)]
    exp2 = [exp2[0], exp2[1], exp2[3], exp2[2]]
    torch.testing.assert_close(a, torch.tensor(exp1 + exp2), atol=1e-6, rtol=0)


def test_group_advantages_dr_grpo_and_degenerate_groups():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(
        grpo.group_advantages(r, 4, scale_rewards="none"), torch.tensor([0.75, -0.25, -0.25, -0.25])
    )
    # all-equal groups, with a non-dyadic value: exactly zero, no NaN, no amplified residue
    same = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7])
    a = grpo.group_advantages(same, 3)
    assert torch.equal(a, torch.zeros(6))
    assert torch.equal(grpo.group_advantages(torch.tensor([1.0, 0.0]), 1), torch.zeros(2))  # groups of one
    with pytest.raises(ValueError):
        grpo.group_advantages(torch.ones(5), 2)
    with pytest.raises(ValueError):
        grpo.group_advantages(torch.ones(4), 2, scale_rewards="batch")


# ------------------------------------------------------------------------------------------------ policy loss
# Hand example: two responses, the second with one padded position.
LOG_RATIO = torch.tensor([[0.3, -0.3, 0.05], [-0.4, 3.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADV = torch.tensor([1.0, -0.5])
# per token, computed by hand with ε = 0.2, ε_high = 0.28:
#   A=+1: r=e^0.3=1.3499 > 1.28 -> high clip: -1.28 ; r=e^-0.3=0.7408 (lower clip inactive for A>0): -0.740818
#         r=e^0.05=1.05127: -1.051271
#   A=-0.5: r=e^-0.4=0.6703 < 0.8 -> low clip: 0.5*0.8 = 0.4 ; r=e^3=20.0855: 0.5*20.0855 = 10.042768
#           (dual clip c=10 caps it at 0.5*10 = 5)
ROW1 = [-1.28, -math.exp(-0.3), -math.exp(0.05)]
ROW2 = [0.4, 0.5 * math.exp(3.0)]


def _loss(**kw):
    old = torch.zeros(2, 3)
    return grpo.policy_loss(old + LOG_RATIO, old, ADV, MASK, grpo.LossSettings(epsilon=0.2, epsilon_high=0.28, **kw))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_reward_that_is_not_finite_is_refused_naming_its_row(bad):
    """A NaN or ±inf reward (a reward function's) would turn its whole group's Â into NaN: refused in one line that
    names the row and the value, never returned as NaN advantages."""
    rewards = torch.tensor([1.0, 0.0, 0.0, bad, 1.0, 0.0])
    with pytest.raises(ValueError, match=rf"^rewards \(6,\) must be finite \(row 3 is {bad}\),"):
        grpo.group_advantages(rewards, 3)
    assert torch.isfinite(grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2)).all()


def test_policy_loss_dapo_both_clips():
    loss, stats = _loss(loss_type="dapo")
    assert loss.item() == pytest.approx((sum(ROW1) + sum(ROW2)) / 5, abs=1e-6)
    assert stats["clip_ratio/low_mean"] == pytest.approx(1 / 5)
    assert stats["clip_ratio/high_mean"] == pytest.approx(1 / 5)
    assert stats["clip_ratio/region_mean"] == pytest.approx(2 / 5)
    assert stats["clip_ratio/dual_mean"] == 0.0


def test_policy_loss_dual_clip_each_loss_type():
    row2 = [0.4, 5.0]
    loss, stats = _loss(loss_type="dapo", dual_clip=10.0)
    assert loss.item() == pytest.approx((sum(ROW1) + sum(row2)) / 5, abs=1e-6)
    assert stats["clip_ratio/dual_mean"] == pytest.approx(1 / 5)
    loss, _ = _loss(loss_type="grpo", dual_clip=10.0)
    assert loss.item() == pytest.approx((sum(ROW1) / 3 + sum(row2) / 2) / 2, abs=1e-6)
    loss, _ = _loss(loss_type="dr_grpo", dual_clip=10.0, max_completion_length=4)
    assert loss.item() == pytest.approx((sum(ROW1) + sum(row2)) / (2 * 4), abs=1e-6)


def test_policy_loss_token_advantages_and_padding_nan():
    old = torch.zeros(2, 3)
    logp = old + LOG_RATIO
    logp[1, 2] = -float("inf")  # padding may hold anything
    loss_b, _ = grpo.policy_loss(logp, old, ADV, MASK)
    loss_t, _ = grpo.policy_loss(logp, old, ADV[:, None].expand(2, 3).clone(), MASK)
    assert torch.isfinite(loss_b) and loss_b.item() == pytest.approx(loss_t.item())


def test_policy_loss_gradient_is_reinforce_at_ratio_one():
    # at θ_old (ratio 1) the DAPO gradient w.r.t. logp is −Â·mask / Σmask
    logp = torch.randn(2, 3, requires_grad=True)
    loss, _ = grpo.policy_loss(logp, logp.detach(), ADV, MASK)
    loss.backward()
    torch.testing.assert_close(logp.grad, -ADV[:, None] * MASK / MASK.sum())


def test_policy_loss_k3_kl():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.2], [0.1, 0.9, 1.0]]))
    ref = torch.log(torch.tensor([[0.25, 0.25, 0.4], [0.2, 0.9, 1.0]]))
    zero_adv = torch.zeros(2)
    loss, stats = grpo.policy_loss(logp, logp, zero_adv, MASK, grpo.LossSettings(beta=0.1), ref_logp=ref)
    d = ref - logp
    k3 = (torch.exp(d) - d - 1) * MASK
    assert stats["kl"] == pytest.approx((k3.sum() / 5).item())
    assert loss.item() == pytest.approx(0.1 * (k3.sum() / 5).item())
    _, stats = grpo.policy_loss(logp, logp, zero_adv, MASK, grpo.LossSettings(beta=0.1), ref_logp=logp)
    assert stats["kl"] == 0.0  # policy == reference


def test_policy_loss_errors():
    old = torch.zeros(2, 3)
    with pytest.raises(ValueError):
        grpo.policy_loss(old, old, ADV, MASK, grpo.LossSettings(loss_type="bnpo"))
    with pytest.raises(ValueError):
        grpo.policy_loss(old, old, ADV, MASK, grpo.LossSettings(loss_type="dr_grpo"))
    with pytest.raises(ValueError):
        grpo.policy_loss(old, old[:1], ADV, MASK)
    with pytest.raises(ValueError):
        grpo.policy_loss(old, old, ADV, MASK, grpo.LossSettings(beta=0.1))


# --------------------------------------------------------------------------- a surrogate of one's own, --credit
def _plain_pg(ratio, token_adv, settings):  # ℓ = −Ã·r: the unclipped policy gradient's surrogate
    return -token_adv * ratio, torch.zeros_like(ratio, dtype=torch.bool)


@dataclasses.dataclass(frozen=True)
class PlainPG(grpo.LossSettings):  # a comparison's surrogate: a LossSettings whose surrogate replaces the clip
    surrogate = staticmethod(_plain_pg)


def test_a_surrogate_of_its_own_is_normalised_as_its_loss_type():
    """A LossSettings subclass replaces the surrogate whole (comparisons/sapo.py's way); the loss is normalised as its
    --loss_type says (dapo: Σℓ / 5 tokens of the hand example, float64; grpo: each row's mean, then their mean), not
    by Dr. GRPO's B·max_completion_length."""
    d64 = torch.float64
    logp = torch.tensor([[0.3, -0.3, 0.05], [-0.4, 3.0, 0.0]], dtype=d64)
    old = torch.zeros(2, 3, dtype=d64)
    loss, _ = grpo.policy_loss(logp, old, ADV.to(d64), MASK.to(d64), PlainPG(loss_type="dapo", max_completion_length=3))
    hand = (-math.exp(0.3) - math.exp(-0.3) - math.exp(0.05) + 0.5 * math.exp(-0.4) + 0.5 * math.exp(3.0)) / 5
    assert loss.item() == pytest.approx(hand, rel=1e-12)  # Dr. GRPO's Σ / (2·3) was 5/6 of it
    seq, _ = grpo.policy_loss(logp, old, ADV.to(d64), MASK.to(d64), PlainPG(loss_type="grpo"))
    rows = ((-math.exp(0.3) - math.exp(-0.3) - math.exp(0.05)) / 3, (0.5 * math.exp(-0.4) + 0.5 * math.exp(3.0)) / 2)
    assert seq.item() == pytest.approx(sum(rows) / 2, rel=1e-12)


def test_a_loss_type_without_a_normaliser_is_refused():
    for bad in ("token_mean", "bnpo", "sapo"):  # (sapo's settings are comparisons/sapo.py's SapoSettings)
        with pytest.raises(ValueError, match=r"--loss_type '\w+' one of \['dapo', 'grpo', 'dr_grpo'\]"):
            grpo.policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), ADV, MASK, PlainPG(loss_type=bad))


def test_credit_choices_are_the_credit_functions():
    """--credit's choices are grpo.CREDIT_FUNCTIONS' keys; the comparisons add theirs in their own parser (python -m
    comparisons); an unknown --credit from code stops in check_config, naming the choices."""
    choices = grpo_config.GRPOConfig.__dataclass_fields__["credit"].metadata["choices"]
    assert choices == list(grpo.CREDIT_FUNCTIONS) == ["grpo", "delta", "cscr"]
    with pytest.raises(SystemExit, match=r"^grpo.py: error: --credit 'nope': one of grpo, delta, cscr$"):
        grpo_config.check_config(grpo.GRPOConfig(credit="nope"))
    with pytest.raises(SystemExit):
        grpo_config.build_parser().parse_args(["--credit", "otb"])
    extended = comparisons.config_class().__dataclass_fields__["credit"].metadata["choices"]
    assert extended[:3] == choices and {"otb", "optimal_token_baseline", "fipo"} <= set(extended)


def test_a_value_outside_a_flags_choices_in_code_stops_in_check_config():
    """A GRPOConfig made in code skips the parser: check_config refuses a value outside a flag's choices in one
    line, before anything loads (a bad --cscr_weight reached step 1 before, after the model and a rollout)."""
    said = r"^grpo.py: error: --cscr_weight 'linear': one of exp, exp_abs, inverse$"
    with pytest.raises(SystemExit, match=said):
        grpo_config.check_config(grpo.GRPOConfig(credit="cscr", cscr_weight="linear"))
    with pytest.raises(SystemExit, match=r"--delta_impl 'fast': one of normal, memory_efficient"):
        grpo_config.check_config(grpo.GRPOConfig(credit="delta", delta_impl="fast"))
    assert grpo_config.check_config(grpo.GRPOConfig()) == []


def test_an_unknown_loss_type_in_code_stops_before_any_model_loads(tmp_path, monkeypatch):
    """GRPOConfig(loss_type="nope") (no parser in between): check_config names the field and its choices in one
    line, before the run folder or any weights (it reached step 1 before, after loading and a rollout)."""
    said = r"^grpo.py: error: --loss_type 'nope': one of dapo, grpo, dr_grpo$"
    with pytest.raises(SystemExit, match=said):
        grpo_config.check_config(grpo.GRPOConfig(loss_type="nope"))
    loaded = []
    monkeypatch.setattr(policy, "build", lambda *a, **k: loaded.append(1))
    with pytest.raises(SystemExit, match=said):
        grpo.train(grpo.GRPOConfig(loss_type="nope", output_dir=str(tmp_path / "run")))
    assert loaded == [] and not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------------ log-probs
@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    return policy.load_model_and_tokenizer(tiny_model_path)


def _naive_logprobs(model, ids_list, resp_len, temperature):
    """Unpadded, full log_softmax + gather, one sequence at a time."""
    out = []
    for ids in ids_list:
        ids = torch.tensor(ids)[None]
        logits = model(input_ids=ids).logits[0].float() / temperature
        lp = torch.log_softmax(logits, -1)[:-1].gather(-1, ids[0, 1:, None]).squeeze(-1)
        out.append(lp[-resp_len:])
    return out


def test_token_logprobs_left_padding_matches_naive(tiny, float64_model):
    model, tok = tiny
    model = float64_model(model)  # the same log-probs in another layout: float64, 1e-10 (conftest)
    prompts = ["Compute 3+4.\n", "Compute 12+7-5.\n"]
    responses = ["3+4=7. \\boxed{7}", "12+7=19."]
    p_ids = [tok(p)["input_ids"] for p in prompts]
    r_ids = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in responses]
    T = max(map(len, r_ids))
    P = max(map(len, p_ids))
    pad = tok.pad_token_id
    input_ids = torch.tensor([[pad] * (P - len(p)) + p + r + [pad] * (T - len(r)) for p, r in zip(p_ids, r_ids)])
    attn = torch.tensor(
        [[0] * (P - len(p)) + [1] * (len(p) + len(r)) + [0] * (T - len(r)) for p, r in zip(p_ids, r_ids)]
    )
    mask = torch.tensor([[1.0] * len(r) + [0.0] * (T - len(r)) for r in r_ids])
    with torch.no_grad():
        plain = grpo.token_outputs(model, input_ids, attn, mask, temperature=0.7, asked=policy.Asked(hidden=True))
        scale = scale_passes.token_outputs(model, input_ids, attn, mask, 0.7, policy.Asked(hidden=True))
        torch.testing.assert_close(scale.logp, plain.logp, atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(scale.hidden, plain.hidden, atol=1e-10, rtol=1e-10)
        lp, hidden = plain.logp, plain.hidden
        for i, (p, r) in enumerate(zip(p_ids, r_ids)):
            naive = _naive_logprobs(model, [p + r], len(r), 0.7)[0]
            torch.testing.assert_close(lp[i, : len(r)], naive, atol=1e-10, rtol=1e-10)
            assert torch.all(lp[i, len(r) :] == 0)
            # hidden = input of lm_head at the positions predicting the response tokens
            hs = model(input_ids=torch.tensor([p + r]), output_hidden_states=True).hidden_states[-1][0]
            torch.testing.assert_close(
                hidden[i, : len(r)], hs[len(p) - 1 : len(p) + len(r) - 1], atol=1e-10, rtol=1e-10
            )


def test_response_mask_includes_eos_when_pad_equals_eos():
    eos = 5
    ids = torch.tensor([[7, 8, eos, eos, eos], [7, 8, 9, 9, 9], [eos, eos, eos, eos, eos]])
    mask, stopped = rollout.response_mask_from_ids(ids, [eos])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert stopped.tolist() == [True, False, True]


def test_generate_layout_and_eos_in_mask(tiny):
    model, tok = tiny
    prompts = ["Compute 3+4.\n", "Compute 12+7-5.\n"]
    ro = rollout.generate(model, tok, prompts, 3, rollout.SamplingSettings(max_new_tokens=12, seed=1))
    assert ro.input_ids.shape[0] == 6 and ro.prompts == [prompts[0]] * 3 + [prompts[1]] * 3
    assert ro.input_ids.shape[1] == ro.prompt_length + ro.response_ids.shape[1]
    for i in range(6):
        n = int(ro.response_mask[i].sum())
        if ro.finish_reasons[i] == "stop":
            assert ro.response_ids[i, n - 1].item() == tok.eos_token_id  # EOS is trained
        else:
            assert n == 12
    # same seed, same rollout
    again = rollout.generate(model, tok, prompts, 3, rollout.SamplingSettings(max_new_tokens=12, seed=1))
    assert torch.equal(again.response_ids, ro.response_ids)


# ------------------------------------------------------------------------------------------------ evaluation
def test_pass_at_k_matches_brute_force():
    for n in range(1, 7):
        for c in range(n + 1):
            outcomes = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(range(n), k))
                brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
                assert evaluate.pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
    with pytest.raises(ValueError):
        evaluate.pass_at_k(4, 1, 5)  # k > n refused
    with pytest.raises(ValueError):
        evaluate.pass_at_k(4, 5, 1)


def test_bad_rows_name_file_line_and_field(tmp_path):
    p = tmp_path / "train.jsonl"
    p.write_text(
        '{"problem": "1+1", "answer": "2"}\nnot json\n{"problem": "2+2"}\n{"problem": "3+3", "answer": "  "}\n'
    )
    with pytest.raises(ValueError) as e:
        problems.load_problems(str(p))
    msg = str(e.value)
    assert f"{p}:2: not valid JSON" in msg
    assert f"{p}:3: field 'answer' is missing" in msg
    assert f"{p}:4: field 'answer' is empty" in msg
    with pytest.raises(FileNotFoundError):
        problems.load_problems(str(tmp_path / "nope.jsonl"))


def test_cli_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "x"}\n')
    with pytest.raises(SystemExit) as e:
        grpo.main(["--data", str(bad), "--output_dir", str(tmp_path / "o")])
    assert "bad.jsonl:1: field 'answer' is missing" in str(e.value)
    with pytest.raises(SystemExit) as e:
        grpo.main(["--num_generations", "1", "--output_dir", str(tmp_path / "o")])
    assert "--num_generations" in str(e.value)
    with pytest.raises(SystemExit) as e:
        grpo.main(["--model", str(tmp_path / "no_such_model"), "--output_dir", str(tmp_path / "o")])
    assert f"model folder {tmp_path / 'no_such_model'} does not exist" in str(e.value)
    assert not (tmp_path / "o").exists()  # a run that fails to start leaves no folder behind
    with pytest.raises(SystemExit, match=r"--learning_rate must be > 0, got -1.0$"):
        grpo.main(["--learning_rate", "-1"])
    for argv, said in (
        (["--loss_type", "bogus"], "argument --loss_type: invalid choice: 'bogus'"),
        (["--credit", "foo"], "argument --credit: invalid choice: 'foo'"),
        (["--max_steps", "x"], "argument --max_steps: invalid int value: 'x'"),
        (["--no_such_flag"], "unrecognized arguments: --no_such_flag"),
    ):
        with pytest.raises(SystemExit, match=f"^grpo.py: error: {said}.*python grpo.py --help") as e:
            grpo.main(argv)  # one line (argparse alone would print the whole usage first)
        assert "\n" not in str(e.value) and capsys.readouterr() == ("", "")


def test_a_misspelt_flag_gets_the_close_one_suggested_in_one_line(capsys):
    for argv, said in (
        (
            ["--num_generatons", "4"],
            "unrecognized arguments: --num_generatons 4; did you mean --num_generations (not --num_generatons)?",
        ),
        (
            ["--lerning_rate=1e-5"],
            "unrecognized arguments: --lerning_rate=1e-5; did you mean --learning_rate (not --lerning_rate)?",
        ),
        (
            ["--no-padding_fre"],
            "unrecognized arguments: --no-padding_fre; did you mean --no-padding_free (not --no-padding_fre)?",
        ),  # a prefix is no flag (allow_abbrev=False)
        (["--zzz_qqq", "1"], "unrecognized arguments: --zzz_qqq 1"),
    ):  # nothing close: no guess
        with pytest.raises(SystemExit) as e:
            grpo.main(argv)
        assert str(e.value) == f"grpo.py: error: {said} (python grpo.py --help lists the flags)"
        assert capsys.readouterr() == ("", "")


def test_toy_splits_are_deterministic_and_disjoint():
    train, test = toy.make_split("train"), toy.make_split("test")
    assert len(test) == 200 and toy.make_split("test") == test
    assert not {r["problem"] for r in train} & {r["problem"] for r in test}
    for row in test[:20]:  # the reference answer is the arithmetic value of the expression
        assert eval(row["problem"][len("Compute ") : -1]) == int(row["answer"])


# ------------------------------------------------------------------------------------------------ end to end
def test_three_grpo_steps_change_parameters_and_log(toy_model_path, tmp_path):
    from transformers import AutoModelForCausalLM

    before = {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(toy_model_path).state_dict().items()}
    out = tmp_path / "run"
    grpo.main(
        [
            "--model",
            toy_model_path,
            "--prompt_template",
            "none",
            "--max_steps",
            "3",
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
        ]
    )
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [1, 2, 3]
    for key in (
        "reward",
        "accuracy",
        "completions/mean_length",
        "completions/clipped_ratio",
        "frac_reward_zero_std",
        "loss",
        "clip_ratio/low_mean",
        "kl",
        "grad_norm",
        "step_time",
    ):
        assert key in lines[0]
    after = AutoModelForCausalLM.from_pretrained(out / "final").state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "no parameter changed after three GRPO steps"
    assert (out / "config.json").exists() and list((out / "samples").glob("step_*.jsonl"))


def test_resume_refuses_changed_training_settings(tmp_path):
    path = tmp_path / "config.json"
    cfg = grpo.GRPOConfig(credit="delta", learning_rate=3e-4)
    path.write_text(json.dumps({"config": dataclasses.asdict(cfg)}))
    checkpoint.check_resume_config(
        str(path), dataclasses.asdict(dataclasses.replace(cfg, max_steps=100, resume=True, use_vllm=True))
    )
    with pytest.raises(ValueError, match=r"--credit 'delta' -> 'grpo', --learning_rate 0.0003 -> 0.001"):
        checkpoint.check_resume_config(
            str(path), dataclasses.asdict(dataclasses.replace(cfg, credit="grpo", learning_rate=1e-3))
        )


def test_use_vllm_without_vllm_is_one_clear_line():
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(SystemExit, match="--use_vllm needs vLLM.*tools/requirements-vllm.txt.*uninstall"):
        grpo_config.check_config(grpo.GRPOConfig(use_vllm=True))


@pytest.mark.parametrize("scale", ["group", "none"])
@pytest.mark.parametrize("num_generations", [0, 1])
def test_a_group_below_two_is_refused_once_at_its_real_bound(scale, num_generations):
    """G = 1: Â = r − mean of a group of one = 0 for every response, scaled or not (group_advantages), so the run
    would train its steps on zero advantages; G = 0 and G = 1 are refused before anything runs with the same line,
    which names the real bound (2) and the credit (a credit defined on a group of one declares it: OTB)."""
    assert torch.equal(grpo.group_advantages(torch.tensor([1.0, 0.0, 1.0]), 1, scale), torch.zeros(3))
    with pytest.raises(
        SystemExit,
        match=r"^grpo.py: error: --num_generations must be >= 2 with --credit delta: a group of one gives "
        r"every response advantage 0",
    ):
        grpo_config.check_config(grpo.GRPOConfig(credit="delta", num_generations=num_generations, scale_rewards=scale))
    assert grpo_config.check_config(grpo.GRPOConfig(num_generations=1), min_generations=1) == []


def test_a_plan_for_another_machine_has_no_notes_of_this_one(monkeypatch):
    """--dry_run notes what this machine lacks for the run (vLLM, a GPU for sleep mode), but not in a plan for
    another machine (--gpu_memory_gb): that machine's environment is not this one's."""
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = grpo.GRPOConfig(use_vllm=True, vllm_enable_sleep_mode=True, dry_run=True)
    here = grpo_config.check_config(cfg)
    assert len(here) == 2 and "sleep mode" in here[0] and "--use_vllm needs vLLM" in here[1]
    assert grpo_config.check_config(dataclasses.replace(cfg, gpu_memory_gb=80.0)) == []


# ------------------------------------------------------------------------------------------------ the first hour
TINY_RUN = [
    "--prompt_template",
    "none",
    "--max_steps",
    "1",
    "--num_prompts_per_step",
    "2",
    "--num_generations",
    "2",
    "--max_completion_length",
    "8",
    "--eval_num_generations",
    "0",
    "--save_steps",
    "0",
]


def test_help_shows_each_default_once(capsys):
    with pytest.raises(SystemExit):
        grpo.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: )" not in text and "(default: None)" not in text
    assert "--logging_steps LOGGING_STEPS write samples/step_*.jsonl every this many steps" in text
    assert "--learning_rate LEARNING_RATE AdamW learning rate" in text and "(default: 0.0003)" in text


def test_output_folder_of_an_earlier_run(tiny_model_path, tmp_path):
    """A new run refuses a folder that holds an earlier one and names both ways forward; --overwrite_output_dir
    deletes the old run first; --resume on a folder it cannot continue says why and what to do."""
    out = tmp_path / "run"
    argv = ["--model", tiny_model_path, "--output_dir", str(out), *TINY_RUN]
    grpo.main(argv)
    (out / "samples" / "step_000057.jsonl").write_text("{}\n")  # litter of an older, longer run
    with pytest.raises(
        SystemExit,
        match=r"already holds a run \(config.json, final, metrics.jsonl, samples.*"
        r"--resume to continue it, or --overwrite_output_dir to delete it",
    ):
        grpo.main(argv)
    grpo.main(argv + ["--overwrite_output_dir"])
    assert sorted(p.name for p in (out / "samples").iterdir()) == ["step_000001.jsonl", "summary.json"]  # no 57
    (out / "final" / "trainer_state.json").unlink()  # as if killed before its end (final/ then is no checkpoint)
    with pytest.raises(SystemExit, match="holds no complete checkpoint-<step>/.*--overwrite_output_dir"):
        grpo.main(argv + ["--resume"])  # it stopped before its first --save_steps
    grpo.main(argv + ["--overwrite_output_dir", "--max_steps", "2", "--save_steps", "1"])
    (out / "metrics.jsonl").write_text("")  # another run started here after its checkpoints were written
    with pytest.raises(
        SystemExit,
        match=r"cannot --resume from .*final: .*metrics.jsonl has 0 lines, fewer "
        r"than the \d+ .*--overwrite_output_dir",
    ):
        grpo.main(argv + ["--max_steps", "3", "--save_steps", "1", "--resume"])


def test_default_output_folder_names_the_model_and_the_credit():
    assert checkpoint.default_run_folder("toy", "delta") == os.path.join("runs", "delta")
    for model in ("Qwen/Qwen3-8B-Base", "/models/Qwen3-8B-Base/", "~/Qwen3-8B-Base"):
        assert checkpoint.default_run_folder(model, "delta") == os.path.join("runs", "Qwen3-8B-Base-delta"), model
    assert grpo.GRPOConfig().output_dir == ""  # the trainer's default: that folder


def test_unwritable_output_dir_stops_before_the_model_loads(tmp_path, monkeypatch):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(
        SystemExit,
        match=r"^grpo.py: error: --output_dir .*a_file/run: .*a_file is a file, not a "
        r"folder; choose another --output_dir$",
    ):
        grpo.main(["--output_dir", str(a_file / "run")])
    loaded = []
    monkeypatch.setattr(policy, "build", lambda *a, **k: loaded.append(1))
    monkeypatch.setattr(checkpoint.os, "access", lambda path, mode: False)  # as a read-only file system answers
    with pytest.raises(SystemExit, match=r"--output_dir .*/ro/run cannot be written \(.* is read-only or not writable"):
        grpo.main(["--output_dir", str(tmp_path / "ro" / "run")])
    assert loaded == [] and not (tmp_path / "ro").exists()


def test_a_run_without_evaluation_says_so_and_how_to_turn_it_on(tiny_model_path, tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"id": i, "problem": f"Compute {i}+1.", "answer": str(i + 1)}) + "\n" for i in range(4))
    )
    out = tmp_path / "run"
    grpo.main(["--model", tiny_model_path, "--data", str(data), "--output_dir", str(out), *TINY_RUN[:-4]])
    said = capsys.readouterr()
    assert (
        said.out.count(
            "[eval] off: --data is not the toy and --eval_data is empty; pass --eval_data FILE (e.g. "
            "data/math500.jsonl) for a held-out accuracy before and after training"
        )
        == 1
    )
    assert said.out.strip().splitlines()[-1] == f"done: 1 steps in {out} (held-out evaluation off)"


def test_logged_lengths_do_not_depend_on_masking_truncated_responses(toy_model_path, tmp_path):
    """--mask_truncated_completions drops truncated responses from the loss, not from the logged lengths."""
    argv = [
        "--model",
        toy_model_path,
        "--prompt_template",
        "none",
        "--max_steps",
        "2",
        "--num_prompts_per_step",
        "4",
        "--num_generations",
        "4",
        "--max_completion_length",
        "14",
        "--eval_num_generations",
        "0",
        "--save_steps",
        "0",
    ]
    logged = []
    for flag in ([], ["--mask_truncated_completions"]):
        grpo.main(argv + ["--output_dir", str(tmp_path / str(len(flag)))] + flag)
        logged.append([json.loads(line) for line in (tmp_path / str(len(flag)) / "metrics.jsonl").open()])
    assert logged[0][0]["completions/clipped_ratio"] > 0.5  # most responses hit the 14-token budget
    assert logged[1][0]["completions/mean_length"] == logged[0][0]["completions/mean_length"] > 10


def test_trained_folder_says_its_template(tiny_model_path, tmp_path, capsys):
    """final/ (and every checkpoint) carries run_info.json: --prompt_template auto uses the template it was trained
    with, and says so."""
    out = tmp_path / "run"
    grpo.main(
        [
            "--model",
            tiny_model_path,
            "--output_dir",
            str(out),
            *TINY_RUN,
            "--prompt_template",
            "r1",
            "--max_steps",
            "2",
            "--save_steps",
            "1",
        ]
    )
    for folder in (out / "final", out / "checkpoint-1"):
        assert json.loads((folder / "run_info.json").read_text())["prompt_template"] == "r1"
        assert rollout.resolve_template("auto", str(folder)) == "r1"
    said = []
    assert rollout.resolve_template("auto", str(out / "final"), said.append) == "r1"
    assert said == [f"[template] r1 (auto: the template it was trained with, {out / 'final' / 'run_info.json'})"]
    assert rollout.resolve_template("auto", tiny_model_path) == "none"  # the toy's folder (toy_info.json)
    assert rollout.resolve_template("auto", "Qwen/Qwen3-8B-Base") == "qwen_math"
    assert "[template] r1 (--prompt_template)" in capsys.readouterr().out


def test_progress_bars_do_not_interleave(toy_model_path, tmp_path, capsys):
    """The held-out evaluation shows a bar (cleared when done); a checkpoint written mid-run says one line instead
    of transformers' "Writing model shards" bar, which broke the training bar."""
    grpo.main(
        [
            "--model",
            toy_model_path,
            "--prompt_template",
            "none",
            "--max_steps",
            "2",
            "--save_steps",
            "1",
            "--num_prompts_per_step",
            "2",
            "--num_generations",
            "2",
            "--max_completion_length",
            "16",
            "--eval_num_generations",
            "1",
            "--output_dir",
            str(tmp_path / "run"),
        ]
    )
    out, err = capsys.readouterr()
    assert "eval step 0: sample" in err and "eval step 2: greedy" in err  # the evaluation's bars
    assert "Writing model shards" not in err
    assert f"[checkpoint] step 1: {tmp_path / 'run' / 'checkpoint-1'}" in out


def test_the_progress_bar_names_the_rule_from_the_flags(tiny_model_path, tmp_path, capsys):
    label = lambda **kw: comparisons.method(comparisons.config_class()(**kw)).label  # noqa: E731
    assert [label(), label(credit="delta"), label(credit="cscr"), label(fipo=True), label(credit="fipo")] == [
        "grpo",
        "delta",
        "cscr",
        "fipo",
        "fipo",
    ]
    assert [label(loss_type="sapo"), label(entropy_top_ratio=0.2), label(top_entropy_quantile=0.8)] == [
        "sapo",
        "forking",
        "forking",
    ]
    assert label(loss_type="sapo", credit="delta") == "sapo+delta"
    assert label(credit="delta", delta_select="top") == "delta-q2"
    for flags, name in ((["--loss_type", "sapo"], "GRPO[sapo]"), (["--entropy_top_ratio", "0.2"], "GRPO[forking]")):
        comparisons.main(["--model", tiny_model_path, "--output_dir", str(tmp_path / name), *TINY_RUN, *flags])
        err = capsys.readouterr().err
        assert f"{name}: 100%" in err and "GRPO[grpo]" not in err

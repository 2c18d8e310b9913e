"""The trainer/rollout/evaluation cases of docs/specs/bug_cases.md (C16-C30), each with its expected value.

The verifier cases (C01-C13, C28's grading half) are in tests/test_verify.py.
"""

import math

import pytest
import torch

import evaluate
import grpo
import rollout
from trainer import scale_passes


def test_C16_group_of_one_gives_zero_advantage():
    a = grpo.group_advantages(torch.tensor([1.0]), num_generations=1)
    assert torch.isfinite(a).all() and a.item() == 0.0


def test_C17_advantages_are_per_contiguous_group():
    a = grpo.group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]), num_generations=2)
    assert torch.equal(a[2:], torch.zeros(4))
    assert a[0].item() == pytest.approx(0.7071058, abs=1e-6) and a[1].item() == pytest.approx(-0.7071058, abs=1e-6)


def test_C18_token_mean_across_micro_batches():
    # mb1: one valid token with loss 4; mb2: three valid tokens with loss 0. Token-mean = 4/4 = 1, not 2.
    # With ratio 1 the per-token loss is −A, so A = −4 and A = 0 give those losses.
    total = 0.0
    for adv, mask in ((torch.tensor([-4.0]), torch.ones(1, 1)), (torch.tensor([0.0]), torch.ones(1, 3))):
        lp = torch.zeros_like(mask)
        loss, _ = grpo.policy_loss(lp, lp, adv, mask, scope=grpo.LossScope(num_tokens=4))
        total += loss.item()
    assert total == pytest.approx(1.0)


def test_C20_asymmetric_clip_table_and_on_policy_gradient():
    ratio = torch.tensor([[1.25, 1.30, 0.75, 0.75, 1.30]])
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0]])
    logp = torch.log(ratio).requires_grad_(True)
    mask = torch.ones(1, 5)
    loss, _ = grpo.policy_loss(logp, torch.zeros(1, 5), adv, mask)
    expected = torch.tensor([-1.25, -1.28, -0.75, 0.80, 1.30])
    assert loss.item() == pytest.approx(expected.mean().item(), abs=1e-6)
    loss.backward()
    # clipped tokens (1.30, +1) and (0.75, −1) get zero gradient
    assert logp.grad[0, 1] == 0 and logp.grad[0, 3] == 0 and logp.grad[0, 0] != 0
    # on-policy: loss 0, gradient −A/6 per token
    lp = torch.randn(2, 3, requires_grad=True)
    loss, _ = grpo.policy_loss(lp, lp.detach(), torch.tensor([1.0, -1.0]), torch.ones(2, 3))
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    torch.testing.assert_close(lp.grad, torch.tensor([[-1 / 6] * 3, [1 / 6] * 3]))


def test_C21_k3_value_direction_and_overflow():
    for dtype in (torch.float32, torch.bfloat16):
        lp = torch.tensor([[-1.0, -2.0, -1.0, -101.0]], dtype=dtype, requires_grad=True)
        ref = torch.tensor([[-2.0, -1.0, -1.0, -1.0]], dtype=dtype)
        zero = torch.zeros(1)
        _, stats = grpo.policy_loss(
            lp, lp.detach(), zero, torch.tensor([[1.0, 0, 0, 0]]), grpo.LossSettings(beta=1.0), ref_logp=ref
        )
        assert stats["kl"] == pytest.approx(0.367879, abs=2e-2 if dtype == torch.bfloat16 else 1e-5)
        _, stats = grpo.policy_loss(
            lp, lp.detach(), zero, torch.tensor([[0, 1.0, 0, 0]]), grpo.LossSettings(beta=1.0), ref_logp=ref
        )
        assert stats["kl"] == pytest.approx(0.718282, abs=2e-2 if dtype == torch.bfloat16 else 1e-5)
        loss, stats = grpo.policy_loss(
            lp, lp.detach(), zero, torch.ones(1, 4), grpo.LossSettings(beta=1.0), ref_logp=ref
        )
        loss.backward()
        assert math.isfinite(loss.item()) and torch.isfinite(lp.grad.float()).all() and stats["kl"] >= 0


def test_C23_eos_kept_in_mask_when_pad_equals_eos():
    mask, _ = rollout.response_mask_from_ids(torch.tensor([[11, 12, 2, 2, 2]]), [2])
    assert mask.tolist() == [[1, 1, 1, 0, 0]]
    mask, _ = rollout.response_mask_from_ids(torch.tensor([[11, 2, 13, 14]]), [2])
    assert mask.tolist() == [[1, 1, 0, 0]]
    mask, stopped = rollout.response_mask_from_ids(torch.tensor([[11, 12, 13]]), [2])
    assert mask.tolist() == [[1, 1, 1]] and stopped.tolist() == [False]


def test_C24_left_padding_with_absolute_positions(float64_model):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)  # float64: the same log-probs in another layout, 1e-10 (conftest)
    m = float64_model(GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=32))).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    pad_ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8, 9]])
    pad_mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    resp = torch.ones(1, 3)
    with torch.no_grad():
        alone = scale_passes.token_logprobs(m, ids, torch.ones_like(ids), resp)
        padded = scale_passes.token_logprobs(m, pad_ids, pad_mask, resp)
        # without position ids (arange positions) the padded row is wrong: the bug this guards against
        wrong = torch.log_softmax(m(input_ids=pad_ids, attention_mask=pad_mask).logits[0, -4:-1], -1)
        wrong = wrong.gather(-1, pad_ids[0, -3:, None]).squeeze(-1)
    torch.testing.assert_close(padded, alone, atol=1e-10, rtol=0)
    assert not torch.allclose(wrong, alone[0], atol=1e-5)


def test_C26_every_eos_id_ends_a_response():
    ids = torch.tensor([[5, 6, 101, 0, 0], [5, 6, 100, 0, 0], [5, 6, 7, 8, 9]])
    mask, stopped = rollout.response_mask_from_ids(ids, [100, 101])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert stopped.tolist() == [True, True, False]  # clipped ratio 1/3


def test_C28_base_model_template_is_plain_chatml_with_both_stop_tokens():
    p = rollout.apply_template("What is 2+3?", "qwen_math")
    assert p.count("What is 2+3?") == 1 and p.endswith("<|im_start|>assistant\n")
    assert rollout.PROMPT_TEMPLATES["qwen_math"][1] == ["<|im_end|>", "<|endoftext|>"]
    assert rollout.apply_template("What is 2+3?", "none") == "What is 2+3?\n"


def test_C30_unbiased_pass_at_k_and_avg_at_k():
    assert evaluate.pass_at_k(4, 1, 4) == 1.0
    assert evaluate.pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert evaluate.pass_at_k(4, 2, 2) == pytest.approx(5 / 6, abs=1e-12)
    assert evaluate.pass_at_k(16, 4, 8) == pytest.approx(0.961538, abs=1e-6)
    correct = [[1, 0, 0, 0], [1, 1, 1, 1]]
    avg = sum(map(sum, correct)) / 8
    pass1 = sum(evaluate.pass_at_k(4, sum(c), 1) for c in correct) / 2
    pass4 = sum(evaluate.pass_at_k(4, sum(c), 4) for c in correct) / 2
    assert (avg, pass1, pass4) == (0.625, pytest.approx(0.625), 1.0)
    assert sum(evaluate.pass_at_k(1, 1, 1) for _ in range(50)) / 164 == pytest.approx(0.304878, abs=1e-6)
    with pytest.raises(ValueError):
        evaluate.pass_at_k(1, 1, 10)  # one greedy sample: pass@10 refused


def test_C28_stop_strings_cut_a_run_on_continuation():
    import toy
    import verify

    tok = toy.build_tokenizer()
    raw = "2+3 = 5, so \\boxed{5}.\n\nQuestion: What is 4+5?\nAnswer: 4+5 = 9, so \\boxed{9}."
    ids = torch.tensor([tok(raw, add_special_tokens=False)["input_ids"]])
    mask = torch.ones_like(ids, dtype=torch.float)
    texts = [raw]
    assert not verify.verify(raw, "5")  # the invented follow-up's box would be graded
    found = rollout.cut_at_stop_strings(ids, mask, texts, tok, rollout.template_stop_strings("none"))
    assert found == [True]
    assert texts[0] == "2+3 = 5, so \\boxed{5}.\n\nQuestion:" and verify.verify(texts[0], "5")
    # the mask ends at the token that completes the stop string (character tokenizer: one token per character)
    assert int(mask.sum()) == len(texts[0]) and mask[0, len(texts[0]) :].sum() == 0
    assert rollout.template_stop_strings("r1") == ["</answer>"]


def test_C26_generation_config_eos_ids_are_stop_ids():
    import types

    import toy

    tok = toy.build_tokenizer()
    model = types.SimpleNamespace(generation_config=types.SimpleNamespace(eos_token_id=[tok.eos_token_id, 7]))
    assert rollout.stop_token_ids(tok, "none", model) == sorted({tok.eos_token_id, 7})
    assert rollout.stop_token_ids(tok, "none") == [tok.eos_token_id]

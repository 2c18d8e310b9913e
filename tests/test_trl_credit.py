"""tools/examples/trl_credit.py: delta.py and cscr.py inside TRL's GRPOTrainer give grpo.py's token credit.

Marker ``trl`` (needs tools/requirements-bench.txt; left out of the default run; ``.ci/run`` runs ``pytest -m trl`` in
its
own virtual environment). One TRL step on the toy with a generation batch of 2 prompts × 8 responses split into 4
micro-batches of 4 rows (``gradient_accumulation_steps`` 4): grpo.py's stages 4 and 5 (``grpo.old_logprobs`` + the
credit function of ``grpo.CREDIT_FUNCTIONS``, whole batch, its own θ_old pass) run on TRL's batch at θ_old, before
the subclass; the token
advantages that reach TRL's loss in each micro-batch must equal its rows, and so must λ̄ (DelTA) and
w̃ = Ã_{i,t}/Â_i (CSCR): the same computation, so in float64 to 1e-10 (tests/conftest.py ``float64_model``). Then a
few toy steps with ``--credit delta`` must raise the held-out avg@8.
"""

from collections import Counter

import pytest
import torch

import grpo
import rollout
from trainer import credit_methods, policy

pytestmark = pytest.mark.trl
TOL = 1e-10


@pytest.fixture(scope="module")
def example():
    from tools.examples import trl_credit  # needs trl: pip install -r requirements.txt -r tools/requirements-bench.txt

    return trl_credit


def _grpo_credit(model, tokenizer, credit, inputs, out):
    """grpo.py's stages 4-5 on TRL's batch ``out`` (rows ``inputs``): (Â [B], token advantages [B, T], keys)."""
    # grpo.py's defaults: the example's too (K 1, λ 0.8-1.2; verdict, 0.2, 1); the plain path: every prompt run with
    # its response, as TRL's forward does (--shared_prompt gives the same to rounding: tests/test_credit_e2e.py)
    cfg = grpo.GRPOConfig(credit=credit)
    mask = out["completion_mask"].float()
    batch = rollout.RolloutBatch(
        input_ids=torch.cat([out["prompt_ids"], out["completion_ids"]], 1),
        attention_mask=torch.cat([out["prompt_mask"], out["completion_mask"]], 1),
        response_ids=out["completion_ids"],
        response_mask=mask,
        prompt_length=out["prompt_ids"].shape[1],
        finish_reasons=["stop"] * len(mask),
        texts=tokenizer.batch_decode(out["completion_ids"], skip_special_tokens=True),
        prompts=[x["prompt"] for x in inputs],
        num_generations=8,
    )
    adv = out["advantages"].clone()
    function = grpo.CREDIT_FUNCTIONS[credit](cfg, tokenizer)
    plain = policy.Forward(grpo.old_logprobs, grpo.micro_batches)  # grpo.py's passes (CSCR's scoring: cscr.py's)
    theta_old = plain.old_logprobs(model, batch, cfg, function.asks)
    answers = [x["answer"] for x in inputs]
    result = function(model, credit_methods.CreditInputs(batch, adv, theta_old, answers, 0, mask, None, plain))
    model.train()  # grpo.old_logprobs leaves eval mode; TRL's step continues in training mode
    return adv, result.token_adv, [_key(p, c) for p, c in zip(out["prompt_ids"], out["completion_ids"])]


def _key(prompt_ids, completion_ids):
    return tuple(prompt_ids.tolist()), tuple(completion_ids.tolist())


@pytest.mark.parametrize("credit", ["grpo", "delta", "cscr"])
def test_token_advantages_equal_grpo_credit_across_micro_batches(
    example, toy_model_path, tmp_path, monkeypatch, float64_model, credit
):
    import trl

    model, tokenizer = policy.load_model_and_tokenizer(toy_model_path)
    model = float64_model(model)
    from trl.kernels import chunked_logprob  # TRL's loss accumulates in float32 whatever the model's dtype (float32

    # is the point there); this test compares the advantages that reach the loss, so the kernel gets float32 inputs
    monkeypatch.setattr(
        chunked_logprob, "_addmm_fp32", lambda acc, a, b: acc.addmm_(a.type(acc.dtype), b.type(acc.dtype))
    )
    args = example.build_parser().parse_args(
        [
            "--credit",
            credit,
            "--max_steps",
            "1",
            "--num_prompts_per_step",
            "2",
            "--num_generations",
            "8",
            "--gradient_accumulation_steps",
            "4",
            "--seed",
            "1",
            "--output_dir",
            str(tmp_path),
        ]
    )
    ref, micro = {}, []
    parent = trl.GRPOTrainer._generate_and_score_completions

    def generate_and_score(self, inputs):  # TRL's own batch, then grpo.py's credit on it at θ_old
        out = parent(self, inputs)
        ref["adv"], ref["token_adv"], ref["keys"] = _grpo_credit(self.model, tokenizer, credit, inputs, out)
        return out

    monkeypatch.setattr(trl.GRPOTrainer, "_generate_and_score_completions", generate_and_score)
    trainer = example.make_trainer(args, model, tokenizer)
    loss = trainer._compute_loss

    def compute_loss(model, inputs):  # what reaches TRL's loss, micro-batch by micro-batch
        micro.append(
            {k: inputs[k].detach().clone() for k in ("prompt_ids", "completion_ids", "completion_mask", "advantages")}
        )
        return loss(model, inputs)

    trainer._compute_loss = compute_loss
    trainer.train()

    assert [len(m["advantages"]) for m in micro] == [4, 4, 4, 4]
    adv, want = ref["adv"], ref["token_adv"]
    assert (adv > 0).any() and (adv < 0).any(), "the batch needs both signs of Â for DelTA and CSCR to act"
    keys = [_key(p, c) for m in micro for p, c in zip(m["prompt_ids"], m["completion_ids"])]
    assert Counter(keys) == Counter(ref["keys"])  # the micro-batches hold exactly the generation batch's rows
    rows = torch.tensor([ref["keys"].index(k) for k in keys])  # a repeated response's rows are equal
    mask = torch.cat([m["completion_mask"] for m in micro]).float()
    got = torch.cat([m["advantages"] for m in micro])
    got = got[:, None] * mask if got.dim() == 1 else got  # "grpo": TRL's own [B] advantages, broadcast by its loss
    torch.testing.assert_close(got, want[rows], rtol=0, atol=TOL)
    # the weights themselves: λ̄ (DelTA) or w̃ (CSCR) = Ã_{i,t} / Â_i on the tokens of rows with Â ≠ 0
    sel = (mask > 0) & (adv[rows] != 0)[:, None]
    weight_got, weight_want = (got / adv[rows, None])[sel], (want[rows] / adv[rows, None])[sel]
    torch.testing.assert_close(weight_got, weight_want, rtol=0, atol=TOL)
    spread = (weight_want - 1).abs().max().item()
    assert spread > 0.05 if credit != "grpo" else spread < TOL  # the credit is not GRPO's broadcast (or it is)


def test_delta_raises_the_heldout_reward(example, tmp_path):
    out = example.main(
        [
            "--credit",
            "delta",
            "--max_steps",
            "8",
            "--num_prompts_per_step",
            "8",
            "--eval_limit",
            "50",
            "--output_dir",
            str(tmp_path),
        ]
    )
    assert out["after"]["avg@8"] > out["before"]["avg@8"] + 0.05

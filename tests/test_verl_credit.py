"""tools/examples/verl_credit.py: delta.py and cscr.py as verl 0.9's advantage stage give grpo.py's token credit.

Marker ``verl`` (needs tools/requirements-verl.txt; left out of the default run; ``.ci/run`` runs ``pytest -m verl`` in
its own virtual environment). On a CPU, without Ray: a tiny random Qwen3 (float64: tests/conftest.py ``float64_model``)
and a batch laid out as verl's driver lays it out (``DataProto``: left-padded ``prompts``, right-padded ``responses``,
``input_ids``, ``attention_mask``, ``position_ids`` from verl's ``compute_position_id_with_mask``, ``response_mask``
from its ``compute_response_mask``, ``token_level_rewards`` with the score on the last response token, ``uid`` per
prompt, n = 4 responses each; Â from verl's ``compute_advantage``, ``old_log_probs`` from the credit pass's own
function, as verl's actor would give them up to its bf16 rounding). ``CreditRayPPOTrainer``'s ``_update_actor`` runs on
it with a stand-in worker group that dispatches each worker method's body to two data-parallel shards (DelTA's
``reduce_fn`` sums across them, as the all-reduce over the group does) and records what verl hands its actor's
``update_actor``. The advantages written into the ``DataProto`` must equal grpo.py's credit function
(``grpo.CREDIT_FUNCTIONS``) computed from the same log-probs, h_t and Â, in float64 to 1e-10 (the bound of
``float64_model``); verl's ``ppo_loss`` on what reached ``update_actor`` must equal ``policy_loss`` (DAPO token-mean, ε
0.2 / 0.28, dual clip c = 10), value and gradient, to 1e-12. The worker methods themselves run on one rank with a
stand-in engine, and the launch command composes verl's config and refuses what it cannot run before Ray starts. Not run
here (no GPU, no Ray cluster): verl's FSDP engine, the Ray worker group and its dispatch, the rollout. Last, grpo.py
itself trains the toy for two steps on this environment's pins.
"""

import copy
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import grpo
import rollout
from trainer import credit_methods, policy

pytestmark = pytest.mark.verl
TOL = 1e-10
ROOT = Path(__file__).resolve().parents[1]
N_GEN, MAX_RESPONSE = 4, 12
PROMPTS = ["12+7=", "3+45=", "8-2=", "40+9="]


@pytest.fixture(scope="module")
def example():
    pytest.importorskip("verl")  # the verl environment only (tools/requirements-verl.txt); in a fixture, so that the
    from tools.examples import verl_credit  # default run, which deselects these tests, collects the file without a skip

    return verl_credit


def as_float64(float64_model, model):
    """``float64_model(model)`` on this environment's transformers: its rotary embedding multiplies the float32
    positions by ``inv_freq`` with a matmul (5.19 broadcasts, which promotes), so ``inv_freq`` stays float32 there:
    cos/sin are then a float32 function of the integer positions alone, the same in every computation compared
    here, and are cast to float64 before they touch the activations."""
    model = float64_model(model)
    for module in model.modules():
        if isinstance(getattr(module, "inv_freq", None), torch.Tensor):
            module.inv_freq = module.inv_freq.type(torch.float32)  # .float()/.to() keep float64 inside the fixture
    return model


def verl_config(credit):
    """verl's ppo_trainer config as its driver composes it, with the DAPO loss and the credit block."""
    import verl.trainer
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(verl.trainer.__file__).parent / "config"), version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=[
                "trainer.use_v1=False",
                "algorithm.adv_estimator=grpo",
                f"actor_rollout_ref.rollout.n={N_GEN}",
                "actor_rollout_ref.actor.loss_agg_mode=token-mean",
                "actor_rollout_ref.actor.clip_ratio_low=0.2",
                "actor_rollout_ref.actor.clip_ratio_high=0.28",
                "actor_rollout_ref.actor.clip_ratio_c=10.0",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
                f"+credit.name={credit}",
                "+credit.micro_batch_size=3",
            ],
        )


def verl_batch(example, model, tokenizer, seed=0):
    """A rollout batch as verl's driver builds it before the actor's update (``fit``: repeat, union, response mask,
    old log-probs, rewards, ``compute_advantage``), with random responses (the layout is what matters here)."""
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import AdvantageEstimator, compute_advantage, compute_response_mask
    from verl.utils.model import compute_position_id_with_mask

    g = torch.Generator().manual_seed(seed)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS for _ in range(N_GEN)]  # repeat(interleave=True)
    P, B = max(map(len, ids)), len(ids)
    prompts = torch.full((B, P), pad)
    for i, x in enumerate(ids):
        prompts[i, P - len(x) :] = torch.tensor(x)  # left-padded
    lengths = torch.randint(3, MAX_RESPONSE + 1, (B,), generator=g)
    responses = torch.randint(4, len(tokenizer), (B, MAX_RESPONSE), generator=g)
    cols = torch.arange(MAX_RESPONSE)
    responses = torch.where(cols == lengths[:, None] - 1, eos, responses)  # EOS ends each response
    responses = torch.where(cols < lengths[:, None], responses, pad)  # right-padded
    attention_mask = torch.cat([prompts != pad, cols < lengths[:, None]], 1).long()
    input_ids = torch.cat([prompts, responses], 1)
    scores = torch.tensor(
        [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64
    )
    rewards = torch.zeros(B, MAX_RESPONSE, dtype=torch.float64)
    rewards[torch.arange(B), lengths - 1] = scores  # verl's reward managers: the score on the last response token
    data = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": compute_position_id_with_mask(attention_mask),
            "token_level_rewards": rewards,
        },
        non_tensors={
            "uid": np.array([f"p{i // N_GEN}" for i in range(B)], dtype=object),
            "reward_model": np.array([{"ground_truth": "19"}] * B, dtype=object),
        },
    )
    data.batch["response_mask"] = compute_response_mask(data)
    data.batch["old_log_probs"], _ = example.old_logps_and_hidden(
        model, input_ids, attention_mask, data.batch["response_mask"], 1.0, 5, hidden=False
    )
    data = compute_advantage(
        data, adv_estimator=AdvantageEstimator.GRPO, num_repeat=N_GEN, norm_adv_by_std_in_grpo=True
    )
    return data, scores


class ShardSum:
    """``reduce_fn`` of each of ``n`` threads (data-parallel ranks): Σ of that call's tensors over the threads, in
    rank order, the same result on every rank (an all-reduce SUM)."""

    def __init__(self, n):
        self.barrier, self.slots = threading.Barrier(n), [None] * n

    def of(self, rank):
        def reduce(t):
            self.slots[rank] = t
            self.barrier.wait()
            total = sum(self.slots[1:], self.slots[0].clone())
            self.barrier.wait()
            return total

        return reduce


class WorkerGroup:
    """A stand-in for the Ray worker group: each worker method's body on ``shards`` equal shards (verl's dispatch
    chunks the batch so), DelTA's ranks in threads that pool through ``ShardSum``; ``update_actor`` records what
    verl hands the actor."""

    def __init__(self, example, model, tokenizer, shards, pooled=True):
        self.example, self.model, self.tokenizer, self.shards, self.pooled = example, model, tokenizer, shards, pooled
        self.models = [copy.deepcopy(model) for _ in range(shards)]  # each rank its own module (and LM-head hook)
        self.outputs, self.update_inputs = [], []

    def compute_log_prob_h(self, data):
        from verl import DataProto

        chunks, outs, reduce = data.chunk(self.shards), [None] * self.shards, ShardSum(self.shards)

        def rank(r):
            outs[r] = self.example.delta_lambda_bar(
                self.models[r], chunks[r], reduce.of(r) if self.pooled else None, return_hidden=True
            )

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(self.shards)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert all(o is not None for o in outs), "a shard failed (see the thread's traceback above)"
        self.outputs = outs
        return DataProto.concat(outs)

    def compute_condition_log_probs(self, data):
        from verl import DataProto

        self.outputs = [
            self.example.condition_log_probs(self.model, self.tokenizer, c) for c in data.chunk(self.shards)
        ]
        return DataProto.concat(self.outputs)

    def update_actor(self, batch_td):
        from tensordict import TensorDict
        from verl.utils import tensordict_utils as tu

        self.update_inputs.append(batch_td)
        out = TensorDict({}, batch_size=[])
        tu.assign_non_tensor(out, metrics={"mfu": 0.0})
        return out


def trainer_with(example, credit, group):
    """``CreditRayPPOTrainer`` with verl's config and the stand-in worker group (no Ray, no workers to start)."""
    trainer = object.__new__(example.CreditRayPPOTrainer)
    trainer.config, trainer.actor_rollout_wg = verl_config(credit), group
    return trainer


def grpo_credit(model, tokenizer, credit, data, adv, logp, hidden):
    """grpo.py's stage 5 (its credit function, ``grpo.CREDIT_FUNCTIONS``) on the same rows, Â, log-probs and h_t:
    its token advantages [B, T]."""
    b = data.batch
    cfg = grpo.GRPOConfig(credit=credit, num_generations=N_GEN)  # the plain path: every prompt run with its response
    mask = b["response_mask"].to(torch.float64)
    prompt_mask = b["attention_mask"][:, : b["prompts"].shape[1]].bool()
    batch = rollout.RolloutBatch(
        input_ids=b["input_ids"],
        attention_mask=b["attention_mask"],
        response_ids=b["responses"],
        response_mask=mask,
        prompt_length=b["prompts"].shape[1],
        finish_reasons=["stop"] * len(mask),
        texts=tokenizer.batch_decode(b["responses"], skip_special_tokens=True),
        prompts=[tokenizer.decode(p[m]) for p, m in zip(b["prompts"], prompt_mask)],
        num_generations=N_GEN,
    )
    old = policy.ThetaOld(logp=logp, hidden=hidden, ref_logp=None, token_stats={})
    answers = [x["ground_truth"] for x in data.non_tensor_batch["reward_model"]]
    plain = policy.Forward(grpo.old_logprobs, grpo.micro_batches)  # grpo.py's passes (CSCR's scoring: cscr.py's)
    inputs = credit_methods.CreditInputs(batch, adv, old, answers, 0, mask, None, plain)
    return grpo.CREDIT_FUNCTIONS[credit](cfg, tokenizer)(model, inputs).token_adv


def test_verl_grpo_advantages_are_grpo_py_s(example, tiny, float64_model):
    """The Â both sides start from: verl's GRPO estimator (unbiased group std + 1e-6) is grpo.py's."""
    model, tokenizer = tiny
    data, scores = verl_batch(example, as_float64(float64_model, model), tokenizer)
    adv = example.sequence_advantages(data.batch["advantages"], data.batch["response_mask"])
    torch.testing.assert_close(adv, grpo.group_advantages(scores, N_GEN), rtol=0, atol=1e-12)
    assert (adv[8:12] == 0).all() and (adv > 0).any() and (adv < 0).any()  # a flat group; both signs elsewhere


@pytest.mark.parametrize("credit,shards", [("delta", 2), ("delta", 1), ("cscr", 2)])
def test_advantages_in_the_dataproto_equal_grpo_credit(example, tiny, float64_model, credit, shards):
    model, tokenizer = tiny
    model = as_float64(float64_model, model)
    data, _ = verl_batch(example, model, tokenizer)
    mask = data.batch["response_mask"]
    adv = example.sequence_advantages(data.batch["advantages"], mask)
    group = WorkerGroup(example, model, tokenizer, shards)
    trainer = trainer_with(example, credit, group)
    out = trainer._update_actor(data)  # apply_credit, then verl's own _update_actor

    got = data.batch["advantages"]  # what the subclass wrote into the DataProto, float64
    assert got.dtype == torch.float64 and got.shape == mask.shape
    reached = group.update_inputs[0]["advantages"]  # what verl's _update_actor handed the actor workers
    torch.testing.assert_close(reached, got, rtol=0, atol=0)
    outs = group.outputs
    logp = torch.cat([o.batch["log_probs_h"] for o in outs])
    hidden = torch.cat([o.batch["hidden"] for o in outs]) if credit == "delta" else None
    torch.testing.assert_close(logp, data.batch["old_log_probs"], rtol=0, atol=TOL)  # the same θ_old function
    want = grpo_credit(model, tokenizer, credit, data, adv, logp, hidden)
    torch.testing.assert_close(got, want, rtol=0, atol=TOL)
    sel = mask.bool() & (adv != 0)[:, None]
    weight = (got / adv[:, None])[sel]  # λ̄ (DelTA) or w̃ (CSCR) on the tokens of rows with Â ≠ 0
    assert (weight - 1).abs().max() > 0.05, "the credit is not GRPO's broadcast"
    assert (got[~mask.bool()] == 0).all() and (got[8:12] == 0).all()
    assert any(k.startswith("credit/") for k in out.meta_info["metrics"])


def test_delta_without_the_all_reduce_is_each_shard_s_own(example, tiny, float64_model):
    """The reduce_fn matters: without it each shard's λ̄ uses its own centroids, γ, N and Z (DelTA's release), which
    differs from the whole batch's; so the equality above checks the pooling."""
    model, tokenizer = tiny
    model = as_float64(float64_model, model)
    data, _ = verl_batch(example, model, tokenizer)
    pooled, alone = (
        trainer_with(example, "delta", WorkerGroup(example, model, tokenizer, 2, pooled=p)) for p in (True, False)
    )
    results = []
    for trainer in (pooled, alone):
        d = data.slice(0, len(data))  # its own copy of the advantages
        d.batch["advantages"] = data.batch["advantages"].clone()
        trainer.apply_credit(d)
        results.append(d.batch["advantages"])
    assert (results[0] - results[1]).abs().max() > 1e-3


def test_verl_loss_on_the_token_advantages_is_policy_loss(example, tiny, float64_model):
    """verl's ``ppo_loss`` (the actor's loss function: the registered "vanilla" policy loss, dual clip, ``agg_loss``
    token-mean) on the batch that reached ``update_actor`` equals grpo.py's ``policy_loss`` with the same Ã, value
    and gradient; so does the deprecated ``compute_policy_loss``. One micro-batch holding the mini-batch."""
    from verl.trainer.ppo import core_algos
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.losses import ppo_loss

    model, tokenizer = tiny
    model = as_float64(float64_model, model)
    data, _ = verl_batch(example, model, tokenizer)
    group = WorkerGroup(example, model, tokenizer, 2)
    trainer = trainer_with(example, "delta", group)
    trainer._update_actor(data)
    td = group.update_inputs[0]  # left_right_2_no_padding's layout: nested input ids, padded advantages
    mask, old, token_adv = data.batch["response_mask"], data.batch["old_log_probs"], data.batch["advantages"]
    g = torch.Generator().manual_seed(1)
    logp = (old + 1.5 * torch.randn(old.shape, generator=g, dtype=torch.float64)).requires_grad_()
    # the engine's log-probs: one value per token of the packed sequences, position k predicting token k + 1
    offsets = td["input_ids"].offsets()
    lengths = mask.sum(-1)
    rows = [torch.arange(int(end) - int(n) - 1, int(end) - 1) for end, n in zip(offsets[1:], lengths)]
    flat = torch.zeros(int(offsets[-1]), dtype=torch.float64).index_put((torch.cat(rows),), logp[mask.bool()])
    model_output = {"log_probs": torch.nested.nested_tensor_from_jagged(flat, offsets=offsets)}
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=len(mask))
    config = omega_conf_to_dataclass(trainer.config.actor_rollout_ref.actor)
    assert config.policy_loss.loss_mode == "vanilla" and config.clip_ratio_c == 10.0
    got, _ = ppo_loss(config, model_output, td)
    want, stats = grpo.policy_loss(
        logp, old, token_adv, mask, grpo.LossSettings(epsilon=0.2, epsilon_high=0.28, dual_clip=10.0, loss_type="dapo")
    )
    assert stats["clip_ratio/dual_mean"] > 0 and stats["clip_ratio/low_mean"] > 0 and stats["clip_ratio/high_mean"] > 0
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    (grad_got,) = torch.autograd.grad(got, logp)
    (grad_want,) = torch.autograd.grad(want, logp)
    torch.testing.assert_close(grad_got, grad_want, rtol=0, atol=1e-12)
    old_api = core_algos.compute_policy_loss(
        old,
        logp,
        token_adv,
        mask,
        cliprange=0.2,
        cliprange_low=0.2,
        cliprange_high=0.28,
        clip_ratio_c=10.0,
        loss_agg_mode="token-mean",
    )[0]
    torch.testing.assert_close(old_api, want, rtol=0, atol=1e-12)


def test_the_launch_registers_the_worker_and_the_trainer(example):
    """What ``main`` starts (checked without starting Ray): the task runner maps the actor's role to
    ``CreditActorRolloutRefWorker``, whose credit methods are registered for verl's data-parallel dispatch."""
    from verl.single_controller.base.decorator import MAGIC_ATTR

    runner = example._task_runner().__ray_actor_class__()
    config = verl_config("delta")
    cls, _ = runner.add_actor_rollout_worker(config)
    assert cls is example.CreditActorRolloutRefWorker
    assert [w.__ray_actor_class__ for w in runner.role_worker_mapping.values()] == [cls]
    for name in ("compute_log_prob_h", "compute_condition_log_probs"):
        assert hasattr(getattr(cls, name), MAGIC_ATTR)
    assert example.credit_settings(config)["name"] == "delta" and example.credit_settings(None)["name"] == "grpo"
    with pytest.raises(ValueError, match="credit.name"):
        example.credit_settings({"credit": {"name": "ppo"}})


def test_the_launch_command_refuses_what_it_cannot_run(example, tmp_path):
    """``python tools/examples/verl_credit.py ...``: verl's hydra config with the ``credit`` block is composed and
    checked
    before Ray starts; v1's driver (verl 0.9.1's default) and an unknown method are refused with the fix."""
    for overrides, message in (
        (["+credit.name=delta"], "pass trainer.use_v1=False"),
        (["trainer.use_v1=False", "+credit.name=ppo"], "credit.name must be grpo, delta or"),
    ):
        proc = subprocess.run(
            [sys.executable, str(ROOT / "tools" / "examples" / "verl_credit.py"), *overrides],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )  # hydra's outputs/ goes to tmp_path
        assert message in proc.stdout + proc.stderr, proc.stderr[-2000:]


def test_the_worker_methods_on_one_rank(example, tiny, float64_model):
    """``CreditActorRolloutRefWorker``'s two methods themselves (verl's ``register`` wrapper, the engine's module in
    its ``eval_mode``, the tokenizer of its model config), on a stand-in engine holding the model, one rank and no
    process group (so no all-reduce): the same tensors as the bodies the tests above run."""
    import contextlib
    from types import SimpleNamespace

    model, tokenizer = tiny
    model = as_float64(float64_model, model)
    data, _ = verl_batch(example, model, tokenizer)
    data.batch["seq_advantages"] = example.sequence_advantages(data.batch["advantages"], data.batch["response_mask"])
    data.meta_info = {"credit": {"name": "delta", "micro_batch_size": 3}, "temperature": 1.0}
    worker = object.__new__(example.CreditActorRolloutRefWorker)  # no Ray actor, no FSDP engine to build
    engine = SimpleNamespace(
        module=model,
        ulysses_sequence_parallel_size=1,
        eval_mode=contextlib.nullcontext,
        get_data_parallel_group=lambda: None,
    )
    worker.actor = SimpleNamespace(engine=engine, model_config=SimpleNamespace(tokenizer=tokenizer))
    got = worker.compute_log_prob_h(data)
    want = example.delta_lambda_bar(model, data)
    torch.testing.assert_close(got.batch["lam_bar"], want.batch["lam_bar"], rtol=0, atol=0)
    got = worker.compute_condition_log_probs(data)
    want = example.condition_log_probs(model, tokenizer, data)
    for key in ("log_probs_h", "lp_pos", "lp_neg"):
        torch.testing.assert_close(got.batch[key], want.batch[key], rtol=0, atol=0)
    engine.ulysses_sequence_parallel_size = 2
    with pytest.raises(ValueError, match="ulysses_sequence_parallel_size=1"):
        worker.compute_log_prob_h(data)


def test_grpo_py_trains_the_toy_on_verl_s_pins(example, tmp_path):
    """grpo.py runs in this environment (transformers below 5.11, as verl 0.9.1 pins it): two DelTA steps."""
    import transformers
    from packaging.version import Version

    assert Version(transformers.__version__) < Version("5.11")
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "grpo.py",
            "--credit",
            "delta",
            "--max_steps",
            "2",
            "--prompt_template",
            "none",
            "--num_prompts_per_step",
            "2",
            "--num_generations",
            "4",
            "--max_completion_length",
            "16",
            "--eval_num_generations",
            "0",
            "--save_steps",
            "0",
            "--output_dir",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) >= 2 and '"delta/' in lines[-1]

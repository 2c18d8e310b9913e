"""DelTA and CSCR token credit as verl 0.9's advantage stage, with delta.py and cscr.py copied in unchanged.

verl's advantage-estimator registry hands an estimator only rewards, mask, index and config, and DelTA needs Â
before a pass that also returns h_t; so, as DelTA's own release does (``recipe/dapo/dapo_ray_trainer.py`` and
``compute_log_prob_h`` in its ``dp_actor.py``), this file adds two small pieces to verl's PPO driver:

* ``CreditRayPPOTrainer`` (a ``RayPPOTrainer``): verl's ``fit`` computes ``old_log_probs`` and then Â with
  ``compute_advantage`` (``algorithm.adv_estimator=grpo``: Â_i broadcast over the response, ``advantages`` [B, T]).
  Its ``_update_actor``, which ``fit`` calls next (after a critic's update, if any), first runs ``apply_credit``:
  Â [B] is read back from ``advantages`` (``sequence_advantages``), the actor workers run the credit pass, and
  ``batch["advantages"]`` [B, T] becomes Ã = Â·λ̄ (DelTA) or Â·w̃ (CSCR); then verl's own update runs unchanged.
  Once per rollout batch, at θ_old, before verl splits the batch into mini- and micro-batches: DelTA's centroids, γ,
  N and Z are statistics of the whole batch (delta.py header).
* ``CreditActorRolloutRefWorker`` (verl's ``ActorRolloutRefWorker``) with two worker methods, dispatched over the
  data-parallel ranks as ``compute_log_prob`` is: ``compute_log_prob_h`` runs θ_old's no-grad, eval-mode forward
  on the rank's rows once more and reads h_t (the LM head's input, a forward pre-hook) with log p(y_t) from it
  (``old_logps_and_hidden``); λ̄ is computed there by ``delta.delta_coefficients_chunked``, ``pool=...``
  an all-reduce(SUM) over the data-parallel group, so h_t [b, T, H] never leaves the GPU that made it and λ̄ is the
  whole batch's (DelTA's release keeps each rank's own statistics). ``compute_condition_log_probs`` runs CSCR's
  plain pass ℓ0 and its two conditioned passes ℓ± (``cscr.condition_logprobs``) with the same function, position
  ids and temperature, so ℓ± − ℓ0 measures the prompt only; the driver turns them into w̃.
* The loss is verl's, unchanged: ``ppo_loss`` (``verl/workers/utils/losses.py``) passes ``advantages`` [B, T] to the
  registered "vanilla" policy loss (``compute_policy_loss_vanilla`` in ``core_algos.py``; dual clip with
  ``clip_ratio_c``) and ``agg_loss`` (``loss_agg_mode=token-mean``): −Ã·ratio per token, clipped, summed and divided
  by the global token count, which is grpo.py's ``policy_loss`` (DAPO) with Ã in place of Â (tested).
  The ratio's θ_old stays verl's ``old_log_probs``; the credit pass's own log p (the same weights, in the
  worker's dtype) feeds only v_t = (1 − p)·h_t and CSCR's ℓ0.

Run (verl's v0 driver, which ``RayPPOTrainer`` is; verl 0.9.1 defaults to its v1 trainer)::

    python tools/examples/verl_credit.py trainer.use_v1=False algorithm.adv_estimator=grpo \\
        actor_rollout_ref.actor.loss_agg_mode=token-mean actor_rollout_ref.actor.clip_ratio_low=0.2 \\
        actor_rollout_ref.actor.clip_ratio_high=0.28 actor_rollout_ref.actor.clip_ratio_c=10.0 \\
        +credit.name=delta +credit.K=1 +credit.lam_min=0.8 +credit.lam_max=1.2 ...   # the rest of verl's keys

(``+credit.name=cscr`` with ``+credit.template=verdict +credit.threshold=0.2 +credit.alpha=1.0 +credit.w_min=0.0``;
``+credit.micro_batch_size`` rows per credit forward, default 8; ``grpo`` or no ``credit`` key: verl unchanged.)
``main`` is verl's ``main_ppo`` with ``CreditTaskRunner``, which registers the worker class and builds the trainer.

Tested on a CPU (tests/test_verl_credit.py, ``pytest -m verl`` in the environment tools/requirements-verl.txt builds):
on a tiny random Qwen3 and a batch laid out as verl's driver lays it out (``DataProto`` with ``prompts``,
``responses``, ``input_ids``, ``attention_mask``, ``position_ids``, ``response_mask``, ``token_level_rewards``,
``old_log_probs``, ``uid``; Â from verl's own ``compute_advantage``), the advantages that ``_update_actor`` writes
into the ``DataProto`` and hands to ``update_actor`` equal grpo.py's credit functions (``grpo.CREDIT_FUNCTIONS``)
computed from the same log-probs and h_t (float64, 1e-10), DelTA also over two data-parallel shards whose
``reduce_fn`` sums across them; and verl's ``ppo_loss`` on what reaches ``update_actor`` equals ``policy_loss``; the
worker methods themselves run on one rank with a stand-in engine; the launch command composes verl's config. Not run
on a CPU (they need Ray workers on GPUs): the Ray worker group and its dispatch (the test calls the worker methods'
bodies, ``delta_lambda_bar`` and ``condition_log_probs``, on each shard itself, the shards in threads), verl's FSDP
engine (its module under verl's patches, bf16, the all-reduce over its process group), the rollout (vLLM/SGLang) and
``fit``'s other stages; verl's actor computes in bf16, so the test compares from the shared inputs (log-probs, h_t,
Â) onward.

Left out on purpose: Ulysses sequence parallelism in the credit pass (``ulysses_sequence_parallel_size`` > 1
raises), Megatron workers, DelTA's ablations and CSCR's threshold calibration (grpo.py's flags; pass their keywords
through ``credit``), multimodal and multi-turn prompts, any advantage estimator but GRPO's (Â must be one number per
response). Read next: delta.py and cscr.py headers; tools/examples/trl_credit.py (the same for TRL); README "Use it in
your own trainer".
"""

from __future__ import annotations

import sys as _sys  # run as a script (python tools/X.py): the repository root on the path
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from verl import DataProto
from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.workers.engine_workers import ActorRolloutRefWorker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's delta.py and cscr.py (copy them next to this file elsewhere)
import cscr  # noqa: E402
import delta  # noqa: E402
from tools.examples.theta_old import old_logps_and_hidden  # noqa: E402  (θ_old with h_t, shared)

METHODS = ("grpo", "delta", "cscr")
DELTA_KEYS = ("K", "lam_min", "lam_max")  # delta.delta_coefficients_chunked's keywords
CSCR_KEYS = ("alpha", "w_min", "mode", "weight")  # cscr.Settings's fields (and credit.threshold: λ)


def credit_settings(config) -> dict:
    """The ``credit`` block of verl's config as a plain dict: ``name`` ("grpo" without the block) and the keywords.
    Raises ValueError: an unknown name."""
    block = config.get("credit", None) if config is not None else None
    out = dict(block) if block is not None else {}
    out.setdefault("name", "grpo")
    if out["name"] not in METHODS:
        raise ValueError(f"credit.name must be grpo, delta or cscr, got {out['name']!r}")
    return out


def sequence_advantages(advantages, response_mask):
    """Â_i [B] from verl's GRPO ``advantages`` [B, T] (Â_i on every response token, 0 on padding): the value at the
    row's first response token; 0 for a row without one. Exact (no averaging)."""
    mask = response_mask.bool()
    first = mask.int().argmax(-1)  # first True (0 for an empty row, masked out below)
    adv = advantages.gather(1, first[:, None]).squeeze(1)
    return torch.where(mask.any(-1), adv, torch.zeros_like(adv))


def delta_lambda_bar(module, data: DataProto, reduce_fn=None, return_hidden=False):
    """DelTA's λ̄ [b, T] of this rank's rows ``data`` (a ``DataProto`` shard with ``input_ids``, ``attention_mask``,
    ``response_mask``, ``seq_advantages`` Â [b]; ``meta_info``: ``temperature``, ``credit``), pooled over the ranks by
    ``reduce_fn`` (an all-reduce SUM; None: this shard alone). Returns a ``DataProto`` with ``lam_bar`` [b, T],
    ``log_probs_h`` [b, T] and, with ``return_hidden``, ``hidden`` [b, T, H]; ``meta_info["metrics"]``: the
    statistics (delta.STAT_KEYS; pooled, but the extremes are this rank's: ``pool_stats``)."""
    b, meta = data.batch, data.meta_info
    settings = meta.get("credit", {})
    mask = b["response_mask"]
    logp, h = old_logps_and_hidden(
        module,
        b["input_ids"],
        b["attention_mask"],
        mask,
        meta.get("temperature", 1.0),
        settings.get("micro_batch_size", 8),
        hidden=True,
    )
    adv = b["seq_advantages"].to(h.device)
    # spec §2.5: the shard is one chunk; every statistic (centroid sums, margin moments, N, Z) is a sum, so the
    # all-reduce (``pool``) makes them the whole batch's (Eq. 2–3, App. H, Eq. 8): the one-process λ̄
    v = delta.proxy_vectors(h, logp, mask)  # DelTA App. F: v_t = (1 − p(y_t))·h_t
    keys = {k: settings[k] for k in DELTA_KEYS if k in settings}
    result = delta.delta_coefficients_chunked([(v, adv, mask)], pool=reduce_fn, **keys)  # the shard: one chunk
    lam_bar = result.lam_bar[0]  # λ̄ [b, T]
    stats = delta.delta_stats(result._replace(lam_bar=lam_bar), adv, mask, reduce_fn)
    out = {"lam_bar": lam_bar, "log_probs_h": logp}
    if return_hidden:
        out["hidden"] = h
    return DataProto.from_dict(tensors=out, meta_info={"metrics": stats})  # verl's collect lists each rank's


def pool_stats(per_rank) -> dict:
    """One dict from each rank's DelTA statistics (``delta_lambda_bar``'s ``metrics``): the extremes over the ranks,
    the rest (sums over the whole batch, hence equal on every rank) from the first."""
    if isinstance(per_rank, dict):
        per_rank = [per_rank]
    out = dict(per_rank[0])
    for key in out:
        if key.endswith(("_min", "_max")):
            values = [s[key] for s in per_rank if s[key] == s[key]]  # a rank without that side gives NaN
            out[key] = (min if key.endswith("_min") else max)(values) if values else out[key]
    return out


def condition_log_probs(module, tokenizer, data: DataProto):
    """CSCR's three passes over this rank's rows ``data`` (``prompts``, ``responses``, ``input_ids``,
    ``attention_mask``, ``response_mask``, ``seq_advantages``; ``non_tensor_batch["reward_model"]``'s
    ``ground_truth`` if present): ℓ0 (``log_probs_h``, the plain prompt) and ℓ+, ℓ− (``lp_pos``, ``lp_neg``), [b, T]
    nats. The conditioned prompt is the decoded rollout prompt with CSCR's note (spec §3, ``template``), tokenised
    as verl tokenises a chat prompt (``add_special_tokens=False``) and passed as ids (cscr.py's rule)."""
    from verl.utils.reward_score.math_reward import last_boxed_only_string, remove_boxed

    b, meta = data.batch, data.meta_info
    settings, temperature = meta.get("credit", {}), meta.get("temperature", 1.0)
    mask, responses, prompts = b["response_mask"], b["responses"], b["prompts"]
    size = settings.get("micro_batch_size", 8)
    lp0, _ = old_logps_and_hidden(module, b["input_ids"], b["attention_mask"], mask, temperature, size, hidden=False)
    prompt_mask = b["attention_mask"][:, : prompts.shape[1]].bool()
    refs = [(x or {}).get("ground_truth") for x in data.non_tensor_batch.get("reward_model", [None] * len(mask))]
    pairs = []  # (x + c+, x + c−) of each row, as token ids
    for i in range(len(mask)):
        text = tokenizer.decode(responses[i][mask[i].bool()], skip_special_tokens=True)
        boxed = last_boxed_only_string(text)
        pair = cscr.build_condition_prompts(  # spec §3: x + c+, x + c−
            tokenizer.decode(prompts[i][prompt_mask[i]], skip_special_tokens=False),
            reference=refs[i],
            response_answer=remove_boxed(boxed) if boxed else "",
            template=settings.get("template", "verdict"),
        )
        pairs.append(tuple(tokenizer(x, add_special_tokens=False)["input_ids"] for x in pair))
    scored = mask.bool() & (b["seq_advantages"] != 0)[:, None]  # the rows with Â ≠ 0 (the others get no credit)
    lp_pos, lp_neg = cscr.condition_logprobs(
        module, tokenizer, pairs, responses, scored, temperature=temperature, micro_batch_size=size
    )  # spec §4
    return DataProto.from_dict(tensors={"log_probs_h": lp0, "lp_pos": lp_pos, "lp_neg": lp_neg})


class CreditActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's actor worker with the credit passes, on the FSDP engine's module (eval mode, its offload handled by
    ``eval_mode``), dispatched over the data-parallel ranks as ``compute_log_prob`` is."""

    def _module(self):
        engine = self.actor.engine
        if getattr(engine, "ulysses_sequence_parallel_size", 1) > 1:
            raise ValueError(
                "the credit pass runs whole sequences (Ulysses sequence parallelism is left out): set "
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1"
            )
        return engine, engine.module

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob_h(self, data: DataProto) -> DataProto:
        """θ_old's pass with h_t on this rank's rows, then λ̄ over the whole batch (``delta_lambda_bar``)."""
        engine, module = self._module()
        group = engine.get_data_parallel_group()

        def all_reduce(t):  # Σ over the data-parallel ranks: DelTA's sufficient statistics (spec §2.5)
            t = t.clone()
            dist.all_reduce(t, group=group)
            return t

        data = data.to(torch.cuda.current_device() if torch.cuda.is_available() else "cpu")
        with engine.eval_mode():
            out = delta_lambda_bar(
                module, data, all_reduce if dist.is_initialized() else None, data.meta_info.get("return_hidden", False)
            )
        return out.to("cpu")

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_condition_log_probs(self, data: DataProto) -> DataProto:
        """CSCR's ℓ0, ℓ+, ℓ− on this rank's rows (``condition_log_probs``)."""
        engine, module = self._module()
        data = data.to(torch.cuda.current_device() if torch.cuda.is_available() else "cpu")
        with engine.eval_mode():
            out = condition_log_probs(module, self.actor.model_config.tokenizer, data)
        return out.to("cpu")


class CreditRayPPOTrainer(RayPPOTrainer):
    """verl's PPO driver with token credit (config block ``credit``): ``advantages`` [B, T] = Ã, written into the
    ``DataProto`` after verl's ``compute_advantage`` and before the actor's update."""

    def _update_actor(self, batch: DataProto) -> DataProto:
        metrics = self.apply_credit(batch)
        out = super()._update_actor(batch)  # verl's update: ppo_loss -> compute_policy_loss_vanilla -> agg_loss
        out.meta_info["metrics"].update(metrics)
        return out

    def apply_credit(self, batch: DataProto) -> dict:
        """Replace ``batch.batch["advantages"]`` [B, T] (GRPO's Â_i broadcast) by Ã [B, T], in place; returns metrics.
        Raises ValueError: an advantage estimator other than GRPO's, or an unknown ``credit.name``."""
        settings = credit_settings(self.config)
        if settings["name"] == "grpo":
            return {}
        if str(self.config.algorithm.adv_estimator) not in ("grpo", "AdvantageEstimator.GRPO"):
            raise ValueError(
                "credit needs algorithm.adv_estimator=grpo (one Â per response), got "
                f"{self.config.algorithm.adv_estimator}"
            )
        mask = batch.batch["response_mask"]
        adv = sequence_advantages(batch.batch["advantages"], mask)  # Â [B]
        keys = ["prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"]
        data = DataProto.from_dict(
            tensors={**{k: batch.batch[k] for k in keys}, "seq_advantages": adv},
            non_tensors={k: batch.non_tensor_batch[k] for k in ("reward_model",) if k in batch.non_tensor_batch},
            meta_info={"credit": settings, "temperature": self.config.actor_rollout_ref.rollout.temperature},
        )
        if settings["name"] == "delta":
            out = self.actor_rollout_wg.compute_log_prob_h(data)
            lam_bar = out.batch["lam_bar"].to(adv.dtype)
            token_adv = delta.delta_token_advantages(adv, lam_bar, mask)  # Ã = Â·λ̄ (spec §2.3 step 7)
            stats = pool_stats(out.meta_info["metrics"])
        else:
            out = self.actor_rollout_wg.compute_condition_log_probs(data)
            cscr_settings = cscr.Settings(**{k: settings[k] for k in CSCR_KEYS if k in settings})
            inputs = (
                adv,
                out.batch["log_probs_h"],
                out.batch["lp_pos"],
                out.batch["lp_neg"],
                mask,
                settings.get("threshold", 0.2),
                cscr_settings,
            )
            token_adv = cscr.cscr_token_advantages(*inputs)  # spec §5: w̃, Ã = Â·w̃ (sign and budget kept)
            stats = cscr.cscr_stats(*inputs)  # what is logged of them
        batch.batch["advantages"] = token_adv.to(batch.batch["advantages"].dtype)
        return {f"credit/{k}": v for k, v in stats.items()}


# --- The launch: verl's main_ppo (v0 driver) with the worker class and the trainer above ---------------------------
def _task_runner():
    """verl's v0 ``TaskRunner`` (a Ray actor) that registers ``CreditActorRolloutRefWorker`` and builds
    ``CreditRayPPOTrainer``."""
    import ray
    from verl.trainer import main_ppo_v0

    class CreditTaskRunner(main_ppo_v0.TaskRunner.__ray_actor_class__):
        def add_actor_rollout_worker(self, config):
            _, group_cls = super().add_actor_rollout_worker(config)
            for role in self.role_worker_mapping:  # the actor's role (ActorRollout or ActorRolloutRef)
                self.role_worker_mapping[role] = ray.remote(CreditActorRolloutRefWorker)
            return CreditActorRolloutRefWorker, group_cls

        def run(self, config):
            main_ppo_v0.RayPPOTrainer = CreditRayPPOTrainer  # TaskRunner.run builds its trainer by this name
            return super().run(config)

    return ray.remote(num_cpus=1)(CreditTaskRunner)


def main():
    import hydra
    import verl.trainer
    from verl.trainer.main_ppo import run_ppo

    config_dir = str(Path(verl.trainer.__file__).parent / "config")
    # Ray's workers inherit the environment of the cluster this process starts: let them import this file's modules
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "tools" / "examples"), os.environ.get("PYTHONPATH", "")]
    )

    @hydra.main(config_path=config_dir, config_name="ppo_trainer", version_base=None)
    def _main(config):
        credit_settings(config)  # an unknown name fails before Ray starts
        if config.trainer.use_v1:
            raise SystemExit(
                "verl_credit.py: error: the credit stage is a RayPPOTrainer (verl's v0 driver): "
                "pass trainer.use_v1=False"
            )
        run_ppo(config, task_runner_class=_task_runner())

    _main()


if __name__ == "__main__":
    main()

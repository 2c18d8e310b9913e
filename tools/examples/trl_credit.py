"""DelTA and CSCR token credit inside TRL 1.16's ``GRPOTrainer``, with delta.py and cscr.py copied in unchanged.

``CreditGRPOTrainer`` adds ``credit="grpo" | "delta" | "cscr"`` to TRL's trainer by overriding one method:

* ``_generate_and_score_completions`` is where TRL holds the whole generation batch (this process's
  ``per_device_train_batch_size × steps_per_generation`` rows) with its sequence advantages Â_i. After TRL's
  own work the override replaces ``"advantages"`` [B] by the token advantages Ã_{i,t} [B, T]
  (``token_advantages``), computed once per generation batch from θ_old. TRL then shuffles and splits the batch
  into micro-batches (gradient accumulation) and reuses it for ``num_iterations`` passes; its ``_compute_loss``
  already accepts [B, T] advantages and its ``dapo`` loss divides by the generation batch's token count, so no
  loss code changes. This is what DelTA needs: its centroids, temperatures, N and Z are statistics of the whole
  rollout batch (delta.py header), never of one micro-batch.
* θ_old: TRL skips its own old-log-prob pass when the generation and the optimizer steps line up, runs it in
  training mode when it does, and its fused LM head never calls the ``lm_head`` module (no hook there sees h_t),
  so ``token_advantages`` runs one no-grad, eval-mode forward of its own over the batch
  (tools/examples/theta_old.py's ``old_logps_and_hidden``: ``cscr.default_logprob_fn`` with a pre-hook on the LM head).
  DelTA reads
  log p(y_t) and h_t from it (App. F: v_t = (1 − p)·h_t); CSCR reads ℓ0 from it and scores ℓ± with
  ``cscr.condition_logprobs``, which uses the same position ids, temperature and eval mode, so ℓ± − ℓ0 measures
  the prompt only. TRL tokenises text prompts with ``tokenizer(prompt)``, cscr.py's one tokenisation rule.
* TRL's loss keeps its own ratio (the training forward's log-probs, detached, when it skipped the old pass).

Left out on purpose: pooling DelTA's statistics over processes (each process uses its own rows, as DelTA's
official code does; ``delta.delta_coefficients_chunked(..., pool=all_reduce)`` pools them), CSCR's
threshold calibration (grpo.py ``--cscr_threshold_quantile``), conversational, multimodal and tool-calling prompts.

Run on the toy (CPU): ``python tools/examples/trl_credit.py --credit delta`` trains with TRL and prints the held-out
avg@8 before and after, as ``python grpo.py --credit delta`` does (same prompts in the same order, same reward,
same evaluation). Needs ``pip install -r requirements.txt -r tools/requirements-bench.txt``. Tested against grpo.py's
credit functions (``grpo.CREDIT_FUNCTIONS``, trainer/credit_methods.py) in tests/test_trl_credit.py (``pytest -m
trl``). Read next: delta.py and cscr.py headers; trainer/credit_methods.py (the same calls in our own trainer);
README "Use it in your own trainer".
"""

from __future__ import annotations

import sys as _sys  # run as a script (python tools/X.py): the repository root on the path
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))

import argparse
import sys
from pathlib import Path

import torch
from trl import GRPOConfig, GRPOTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's modules
import cscr  # noqa: E402
import delta  # noqa: E402
import verify  # noqa: E402
from tools.examples.theta_old import old_logps_and_hidden  # noqa: E402  (θ_old with h_t, shared)


class CreditGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` with token credit: ``credit`` "grpo" (TRL unchanged), "delta" (DelTA, ``delta_kwargs``
    for ``delta.delta_coefficients``: K, lam_min, lam_max) or "cscr" (CSCR, ``cscr_template`` and
    ``cscr_kwargs`` for ``cscr.cscr_token_advantages`` and ``cscr.cscr_stats``: threshold, settings). The dataset's
    ``answer`` column is CSCR's ``reference``."""

    def __init__(self, *args, credit="grpo", delta_kwargs=None, cscr_template="verdict", cscr_kwargs=None, **kwargs):
        if credit not in ("grpo", "delta", "cscr"):
            raise ValueError(f"credit must be grpo, delta or cscr, got {credit!r}")
        super().__init__(*args, **kwargs)
        self.credit, self.cscr_template = credit, cscr_template
        self.delta_kwargs, self.cscr_kwargs = delta_kwargs or {}, cscr_kwargs or {}

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if self.credit != "grpo":
            out["advantages"] = self.token_advantages(inputs, out)  # [B] -> [B, T], before TRL splits the batch
        return out

    @torch.no_grad()
    def token_advantages(self, inputs, out):
        """Token advantages Ã_{i,t} [B, T] of one whole generation batch, from θ_old (``inputs``: the rows' dataset
        examples; ``out``: TRL's batch, ``advantages`` still the sequence advantages Â_i [B])."""
        adv, mask, response_ids = out["advantages"], out["completion_mask"], out["completion_ids"]
        model = self.accelerator.unwrap_model(self.model)
        input_ids = torch.cat([out["prompt_ids"], response_ids], 1)
        attention_mask = torch.cat([out["prompt_mask"], mask], 1)
        size = self.args.per_device_train_batch_size
        old_logp, h = old_logps_and_hidden(
            model, input_ids, attention_mask, mask, self.temperature, size, hidden=self.credit == "delta"
        )
        if self.credit == "delta":
            v = delta.proxy_vectors(h, old_logp, mask)  # DelTA App. F: v_t = (1 − p(y_t))·h_t
            result = delta.delta_coefficients(v, adv, mask, **self.delta_kwargs)  # λ̄ of the whole batch
            stats = delta.delta_stats(result, adv, mask)
            token_adv = delta.delta_token_advantages(adv, result.lam_bar, mask)  # Ã = Â·λ̄, over the whole batch
        else:
            texts = self.processing_class.batch_decode(response_ids, skip_special_tokens=True)
            pairs = [
                cscr.build_condition_prompts(
                    x["prompt"],
                    reference=x.get("answer"),
                    template=self.cscr_template,
                    response_answer=verify.extract_boxed(text) or "",
                )
                for x, text in zip(inputs, texts)
            ]  # CSCR spec §3: x + c+, x + c−
            lp_pos, lp_neg = cscr.condition_logprobs(  # spec §4: ℓ+, ℓ− of the rows with Â ≠ 0
                model,
                self.processing_class,
                pairs,
                response_ids,
                mask.bool() & (adv != 0)[:, None],
                temperature=self.temperature,
                micro_batch_size=size,
            )
            token_adv = cscr.cscr_token_advantages(adv, old_logp, lp_pos, lp_neg, mask, **self.cscr_kwargs)
            stats = cscr.cscr_stats(adv, old_logp, lp_pos, lp_neg, mask, **self.cscr_kwargs)  # CSCR spec §5's logs
        for key, value in stats.items():  # logged by TRL with its own metrics (mean over the logging window)
            self._metrics["train" if self.model.training else "eval"][key].append(value)
        return token_adv


# --- The toy run: the settings under which TRL's GRPOTrainer matches grpo.py (tools/bench/vs_trl.py) -----------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--credit", default="grpo", choices=["grpo", "delta", "cscr"])
    ap.add_argument("--max_steps", type=int, default=30, help="optimizer steps, one generation batch each")
    ap.add_argument("--num_prompts_per_step", type=int, default=16)
    ap.add_argument("--num_generations", type=int, default=8)
    ap.add_argument(
        "--gradient_accumulation_steps",
        type=int,
        default=1,
        help="micro-batches per generation batch (the credit is computed once per generation batch)",
    )
    ap.add_argument("--learning_rate", type=float, default=3e-4, help="constant")
    ap.add_argument("--max_completion_length", type=int, default=64)
    ap.add_argument("--eval_limit", type=int, default=0, help="first N held-out problems (0: all 200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output_dir", default="runs/trl_credit")
    return ap


def make_trainer(args, model, tokenizer) -> CreditGRPOTrainer:
    """The trainer for ``build_parser``'s ``args``: grpo.py's defaults in TRL's vocabulary (DAPO loss, no KL,
    ε 0.2 / 0.28, group-std advantages, temperature 1, no top-k, constant lr, AdamW, clip 1), grpo.py's prompt
    order, verify.py's binary reward."""
    from datasets import Dataset

    import rollout
    from trainer import problems

    P, G, ga = args.num_prompts_per_step, args.num_generations, args.gradient_accumulation_steps
    if (P * G) % ga:
        raise SystemExit(
            f"trl_credit.py: error: --gradient_accumulation_steps {ga} must divide "
            f"--num_prompts_per_step × --num_generations = {P * G}"
        )
    rows = problems.load_problems("toy", split="train")
    order = rollout.PromptSampler(len(rows), args.seed).take(P * args.max_steps)  # grpo.py's prompts, in its order
    dataset = Dataset.from_list(
        [{"prompt": rollout.apply_template(rows[i]["problem"], "none"), "answer": rows[i]["answer"]} for i in order]
    )

    def reward(prompts, completions, answer, **kwargs):  # grpo.py's stage 2: binary, from verify.py
        return [float(ok) for ok, _ in verify.grade_batch(list(completions), list(answer))]

    config = GRPOConfig(
        output_dir=args.output_dir,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        per_device_train_batch_size=P * G // ga,
        gradient_accumulation_steps=ga,
        num_generations=G,
        max_completion_length=args.max_completion_length,
        top_k=0,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        epsilon_high=0.28,
        loss_type="dapo",
        beta=0.0,
        scale_rewards="group",
        shuffle_dataset=False,
        max_steps=args.max_steps,
        seed=args.seed,
    )
    return CreditGRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        credit=args.credit,
    )


def heldout(model, tokenizer, args) -> dict:
    """grpo.py's held-out evaluation (evaluate.py: greedy and avg@8 at temperature 1, seed + 12345)."""
    import evaluate
    from trainer import problems

    rows = problems.load_problems("toy", split="test")[: args.eval_limit or None]
    settings = evaluate.EvalSettings(8, 1.0, 1.0, args.max_completion_length, seed=args.seed + 12345)
    return evaluate.evaluate_rows(model, tokenizer, rows, "none", settings)


def main(argv=None) -> dict:
    import toy
    from trainer import policy

    toy.register()  # --model toy, the toy's data: the built-in toy in the repository's generic modules (toy/)

    args = build_parser().parse_args(argv)
    model, tokenizer = policy.load_model_and_tokenizer("toy")
    torch.set_num_threads(1)  # the toy (~1M parameters): as grpo.py does, threads cost more than they give
    torch.manual_seed(args.seed)
    before = heldout(model, tokenizer, args)
    make_trainer(args, model, tokenizer).train()
    after = heldout(model, tokenizer, args)
    print(
        f"held-out avg@8: {before['avg@8']:.3f} -> {after['avg@8']:.3f}   "
        f"greedy: {before['greedy']:.3f} -> {after['greedy']:.3f}"
    )
    return {"before": before, "after": after}


if __name__ == "__main__":
    main()

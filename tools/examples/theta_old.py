"""θ_old's pass for another trainer's batch: the log-probs of the sampled tokens and the LM head's input h_t.

Shared by tools/examples/trl_credit.py and tools/examples/verl_credit.py, whose trainers hold the rollout batch as
``input_ids`` [B, P + T] (left-padded prompt | right-padded response) but never expose h_t: TRL's fused LM head
and verl's engine compute log-probs without calling the ``lm_head`` module's output, so one extra no-grad,
eval-mode forward captures h_t with a forward pre-hook on the LM head. The log-probs come from
``cscr.default_logprob_fn``, the same function as CSCR's ℓ± (cscr.py's matching rule), with position ids counting
real tokens. Left out on purpose: sharing the trainer's own old-log-prob pass (it would need changes inside TRL's or
verl's engine; the cost is one forward per rollout batch).
"""

from __future__ import annotations

import torch

import cscr


@torch.no_grad()
def old_logps_and_hidden(model, input_ids, attention_mask, response_mask, temperature, batch_size, hidden=False):
    """θ_old's log p(y_t) [B, T] (nats, 0 on padding) and, with ``hidden``, the LM head's input h_t [B, T, H] at the
    positions that predict the response tokens (DelTA App. F; else None); no grad, eval mode (restored after),
    ``batch_size`` rows per forward. ``input_ids``, ``attention_mask`` [B, P + T]; ``response_mask`` [B, T]."""
    T, hs = response_mask.shape[1], []
    head = model.get_output_embeddings()
    hook = head.register_forward_pre_hook(lambda _, args: hs.append(args[0][:, -T - 1 : -1])) if hidden else None
    was_training = model.training
    model.eval()
    try:
        logps = [
            cscr.default_logprob_fn(model, input_ids[s], attention_mask[s], response_mask[s], temperature)
            for s in torch.arange(len(input_ids), device=input_ids.device).split(batch_size)
        ]
    finally:
        model.train(was_training)
        if hook is not None:
            hook.remove()
    return torch.cat(logps), torch.cat(hs) if hidden else None

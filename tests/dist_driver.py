"""Entry script of tests/test_distributed.py: ``python -m comparisons`` (``comparisons.main``: grpo.py's flags and the
comparisons', e.g. ``--credit otb``) with batch-invariant rollouts.

Run as ``python tests/dist_driver.py <flags>`` or ``torchrun --nproc_per_node N tests/dist_driver.py ...``.

Why the patch: HF sampling draws the random numbers of a whole batch at once, so the same prompt gets different
responses when it shares a batch with other prompts, and a step split over two processes would not sample what one
process samples. Here each prompt's group is generated on its own, seeded from the prompt text and the step, so
every process count sees the same rollouts and the test compares only what distribution changes: the loss
normalisers, the summed gradients, DelTA's statistics, the logging and the checkpoint.
"""

import os
import sys
import zlib

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import comparisons  # noqa: E402
import rollout  # noqa: E402

_generate = rollout.generate


def _pad(t, width, value, left):
    pad = (width - t.shape[1], 0) if left else (0, width - t.shape[1])
    return torch.nn.functional.pad(t, pad, value=value)


def per_prompt_generate(model, tokenizer, prompts, num_generations, settings, batch_size=None, progress=""):
    step_seed = settings.seed % 1_000_003  # grpo seeds a step with seed*100_003 + step + 1_000_003*rank: drop the rank
    parts = [
        _generate(
            model,
            tokenizer,
            [p],
            num_generations,
            settings._replace(seed=zlib.crc32(p.encode()) + step_seed),
            progress=progress,
        )
        for p in prompts
    ]
    P = max(r.prompt_length for r in parts)
    T = max(r.response_ids.shape[1] for r in parts)
    pad = tokenizer.pad_token_id
    cat = lambda f: torch.cat([f(r) for r in parts])  # noqa: E731
    prompt_ids = cat(lambda r: _pad(r.input_ids[:, : r.prompt_length], P, pad, True))
    prompt_attn = cat(lambda r: _pad(r.attention_mask[:, : r.prompt_length], P, 0, True))
    response_ids = cat(lambda r: _pad(r.response_ids, T, pad, False))
    response_mask = cat(lambda r: _pad(r.response_mask, T, 0, False))
    return rollout.RolloutBatch(
        input_ids=torch.cat([prompt_ids, response_ids], 1),
        attention_mask=torch.cat([prompt_attn, response_mask.long()], 1),
        response_ids=response_ids,
        response_mask=response_mask,
        prompt_length=P,
        finish_reasons=[f for r in parts for f in r.finish_reasons],
        texts=[t for r in parts for t in r.texts],
        prompts=[q for r in parts for q in r.prompts],
        num_generations=num_generations,
    )


def count_chunked_lm_head_calls(budget: int) -> None:
    """``scale_passes.LOGITS_CHUNK_BYTES`` set to ``budget`` (tests force the chunked LM head on the toy's small
    vocabulary, in a run given ``--chunked_lm_head``), and each process writes how many micro-batches went through
    ``ChunkedLMHead`` to ``<output_dir>/chunked_lm_head_calls.<rank>`` when it exits."""
    import atexit

    from trainer import chunked_head, scale_passes

    scale_passes.LOGITS_CHUNK_BYTES = budget
    calls = [0]
    apply = chunked_head.ChunkedLMHead.apply
    chunked_head.ChunkedLMHead.apply = lambda *a: calls.__setitem__(0, calls[0] + 1) or apply(*a)
    out = sys.argv[sys.argv.index("--output_dir") + 1]
    rank = os.environ.get("RANK", "0")
    atexit.register(lambda: open(os.path.join(out, f"chunked_lm_head_calls.{rank}"), "w").write(str(calls[0])))


if __name__ == "__main__":
    rollout.generate = per_prompt_generate
    if os.environ.get("TEST_LOGITS_CHUNK_BYTES"):  # (with --chunked_lm_head: the scale path's chunked LM head)
        count_chunked_lm_head_calls(int(os.environ["TEST_LOGITS_CHUNK_BYTES"]))
    comparisons.main(sys.argv[1:])

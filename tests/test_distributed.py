"""torchrun + FSDP2 on the CPU (gloo): two processes make the same update as one process with the same global batch.

Each case launches ``tests/dist_driver.py`` (grpo.main with batch-invariant rollouts, see its docstring) once as a
plain process and once under ``torchrun --nproc_per_node 2``, for 2 steps on the toy, and compares the saved
weights (``final/``, written once by process 0 in the save_pretrained format). Marked ``multiprocess``.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(ROOT, "tests", "dist_driver.py")
FLAGS = [
    "--prompt_template",
    "none",
    "--num_prompts_per_step",
    "4",
    "--num_generations",
    "4",
    "--max_completion_length",
    "24",
    "--max_steps",
    "2",
    "--eval_num_generations",
    "0",
    "--learning_rate",
    "1e-3",
    "--save_steps",
    "0",
]


def _run(out, model, nproc, *extra, env=None):
    cmd = (
        [sys.executable, DRIVER]
        if nproc == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), DRIVER]
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    res = subprocess.run(
        cmd + ["--model", str(model), "--output_dir", str(out), *FLAGS, *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return out


def _weights(folder):
    name = (
        "adapter_model.safetensors"
        if os.path.exists(os.path.join(folder, "adapter_model.safetensors"))
        else "model.safetensors"
    )
    return load_file(os.path.join(folder, name))


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("credit", ["grpo", "delta", "delta_memory_efficient", "delta_topk", "otb"])
def test_two_processes_equal_one_process(toy_model_path, tmp_path, credit):
    """The weights after 2 steps agree to 1e-5: AdamW's step lr·m̂/(√v̂ + ε) barely depends on the rounding of the
    gradient (summed in another order over 2 processes), except where |g| ≈ ε = 1e-8, where it moves by at most
    lr·δg/(4ε) = 1e-3·δg/4e-8: below 1e-5 for the float32 δg ≲ 1e-10 of these sums. delta_memory_efficient: each
    process streams its micro-batches through K + 3 passes and the statistics are summed over both."""
    flags = (
        ["--credit", "delta", "--delta_impl", "memory_efficient", "--micro_batch_size", "3"]
        if credit == "delta_memory_efficient"
        else ["--credit", "delta", "--delta_proxy", "topk"]
        if credit == "delta_topk"
        else ["--credit", credit]
    )
    one = _run(tmp_path / "one", toy_model_path, 1, *flags)
    two = _run(tmp_path / "two", toy_model_path, 2, *flags)
    w0, w1, w2 = _weights(toy_model_path), _weights(one / "final"), _weights(two / "final")
    assert _max_diff(w0, w1) > 1e-4  # the two steps really moved the weights
    assert _max_diff(w1, w2) < 1e-5
    # metrics pooled over both processes equal the single process's
    for a, b in zip(_metrics(one), _metrics(two)):
        for key in (
            "reward",
            "completions/mean_length",
            "loss",
            "grad_norm",
            "delta/lam_pos_max",
            "otb/equal_reward_share",
        ):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    # written once, in the save_pretrained format: loads with no torch.distributed
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(two / "final")
    assert torch.equal(model.state_dict()["model.norm.weight"], w2["model.norm.weight"])


def test_delta_scope_local_keeps_statistics_per_process(toy_model_path, tmp_path):
    """--delta_scope local (the official code's per-process statistics) is a different update on 2 processes:
    the all-reduce of the global scope is what makes 2 processes equal 1."""
    one = _run(tmp_path / "one", toy_model_path, 1, "--credit", "delta")
    local = _run(tmp_path / "local", toy_model_path, 2, "--credit", "delta", "--delta_scope", "local")
    assert _max_diff(_weights(one / "final"), _weights(local / "final")) > 1e-4


def test_two_processes_lora(toy_model_path, tmp_path):
    lora = ["--use_peft", "--lora_dropout", "0"]  # dropout masks depend on how rows are split: off for the check
    one = _run(tmp_path / "one", toy_model_path, 1, *lora)
    two = _run(tmp_path / "two", toy_model_path, 2, *lora)
    w1, w2 = _weights(one / "final"), _weights(two / "final")
    assert all("lora_" in k for k in w2)  # the adapter only
    assert max(w1[k].abs().max().item() for k in w1 if "lora_B" in k) > 1e-4
    assert _max_diff(w1, w2) < 1e-5


def test_two_processes_resume(toy_model_path, tmp_path):
    """A checkpoint written by 2 processes resumes (in 2 processes) to exactly the uninterrupted run."""
    full = _run(tmp_path / "full", toy_model_path, 2, "--credit", "delta", "--save_steps", "1")
    shutil.copytree(full / "checkpoint-1", tmp_path / "resumed" / "checkpoint-1")
    shutil.copy(full / "metrics.jsonl", tmp_path / "resumed" / "metrics.jsonl")
    resumed = _run(tmp_path / "resumed", toy_model_path, 2, "--credit", "delta", "--resume")
    assert _max_diff(_weights(full / "final"), _weights(resumed / "final")) == 0.0

    def measured(r):
        return {k: v for k, v in r.items() if k in ("step_time", "generation_time") or k.startswith("memory/")}

    assert _metrics(resumed) == [{**m, **measured(r)} for m, r in zip(_metrics(full), _metrics(resumed))]


def test_two_processes_chunked_lm_head(toy_model_path, tmp_path):
    """The LM head in chunks of positions under FSDP2 (its weight gathered by the root module's forward, inside which
    ChunkedLMHead runs; its gradient reduce-scattered with the root's): with a budget of 10 positions (the toy's
    V = 100) every pass of 2 DelTA steps is chunked, on 2 processes as on 1, and both end where the single process with
    the default budget (the whole head at once) does (1e-5, test_two_processes_equal_one_process's bound: float32 sums
    in another order; the padded path's sums differ more, and AdamW's first step turns a sign into 2·lr)."""
    chunked = {"TEST_LOGITS_CHUNK_BYTES": str(10 * 100 * 4)}
    plain = _run(tmp_path / "plain", toy_model_path, 1, "--credit", "delta", "--chunked_lm_head")  # the whole head
    one = _run(tmp_path / "one", toy_model_path, 1, "--credit", "delta", "--chunked_lm_head", env=chunked)
    two = _run(tmp_path / "two", toy_model_path, 2, "--credit", "delta", "--chunked_lm_head", env=chunked)
    calls = {(run.name, f.name): int(f.read_text()) for run in (one, two) for f in run.glob("chunked_lm_head_calls.*")}
    assert len(calls) == 3 and min(calls.values()) > 0, calls
    w0, w1, w2 = _weights(plain / "final"), _weights(one / "final"), _weights(two / "final")
    assert _max_diff(_weights(toy_model_path), w0) > 1e-4
    assert _max_diff(w0, w1) < 1e-5 and _max_diff(w1, w2) < 1e-5


MIXED_DRIVER = r"""
import os
import sys
import torch
import grpo, rollout
from trainer import distributed, policy

distributed.init_distributed()
torch.manual_seed(0)
model, tok = policy.load_model_and_tokenizer(sys.argv[1], device="cpu")
before = {n: p.detach().clone() for n, p in model.named_parameters()}
distributed.shard_model(model, compute_dtype=torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = tok(["Compute 3+4.\n3+4=7. \\boxed{7}"] * 2, return_tensors="pt")
out = model(**ids)
loss = out.logits.float().logsumexp(-1).mean()
loss.backward()
opt.step()
params = dict(model.named_parameters())
res = ("RESULT", out.logits.dtype, {p.dtype for p in params.values()}, {p.grad.dtype for p in params.values()},
      all(type(p).__name__ == "DTensor" for p in params.values()),
      max((params[n].full_tensor() - before[n]).abs().max().item() for n in before) > 1e-4)
if torch.distributed.get_rank() == 0:
    print(*res, flush=True)
# The last collective was an all-gather (full_tensor): leave without interpreter shutdown, which gloo's worker threads
# can abort a moment after such a collective (distributed.close's docstring). The barrier: both processes are done.
distributed.barrier()
os._exit(0)
"""


def test_mixed_precision_keeps_float32_master_weights(toy_model_path, tmp_path):
    """shard_model(compute_dtype=bfloat16) (used for --torch_dtype float32 on several GPUs): forward and backward in
    bfloat16, float32 sharded weights, gradients and update."""
    driver = tmp_path / "mixed.py"
    driver.write_text(MIXED_DRIVER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(driver),
            str(toy_model_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [l for l in res.stdout.splitlines() if l.startswith("RESULT")]
    assert lines == ["RESULT torch.bfloat16 {torch.float32} {torch.float32} True True"], res.stdout[-2000:]


def test_two_processes_held_out_evaluation(toy_model_path, tmp_path):
    """The held-out evaluation under FSDP2: each process samples its own problems (a different number of forward
    passes on each), so it must run on the gathered weights; pooled, it equals one process's greedy accuracy."""
    import toy

    data = tmp_path / "heldout.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in toy.make_split("test")[:7]))  # 4 + 3 problems
    extra = ("--max_steps", "1", "--eval_num_generations", "2", "--eval_data", str(data))
    one = _metrics(_run(tmp_path / "one", toy_model_path, 1, *extra))
    two = _metrics(_run(tmp_path / "two", toy_model_path, 2, *extra))
    ev1, ev2 = [[m for m in ms if "eval/greedy" in m] for ms in (one, two)]
    assert len(ev1) == len(ev2) == 2  # before and after training
    assert ev2[0]["eval/greedy"] == ev1[0]["eval/greedy"]

"""The trainer's infrastructure, behind one-line calls: settings and flags (grpo_config), recipes, the checks
before any weights load (preflight, memory_plan), the model (policy), torchrun/FSDP2
(distributed), the vLLM engine (vllm_engine), the sampler correction (sampler_mismatch), checkpoints and the run
folder (checkpoint), the loop's setup and bookkeeping (run_setup), a finished run's samples/summary.json
(samples_summary), data loading (problems, hub), evaluate.py's resumable runner and responses files (responses_file)
and its flags, results folder and tables (eval_results), the scale path's passes (scale_passes, chunked_head), the
shipped model configs (trainer/model_configs/), and the credit functions (credit_methods), which wire the methods'
pure maths (delta.py, cscr.py) to the model's passes: DelTA's chunks of h_t, CSCR's privileged prompts, scoring
passes and its once-per-run λ calibration (the one step of a paper here: docs/specs/cscr.md §5's λ).

Imported by the top level (grpo.py, rollout.py, evaluate.py), by toy/ (its registries: ``toy.register``), by
comparisons/ (credit_methods: the credit functions they subclass) and by tools/. Generic code: it imports the top-level
files it serves (rollout, verify, delta, cscr) and nothing of the toy, the comparisons or the tools
(tests/test_layout.py checks it).

Here, only what grpo.py calls before its slow imports (``catch_ctrl_c_while_importing``)."""

import os
import signal
import sys


def catch_ctrl_c_while_importing() -> None:
    """Ctrl-C before grpo.py's ``main`` (its imports take seconds): run_setup.run_command's line for a run stopped
    before training began, from process 0 only, and a shell's status for SIGINT; no traceback (``os._exit``)."""
    signal.signal(signal.SIGINT, _interrupted_while_importing)


def _interrupted_while_importing(signum, frame):
    if os.environ.get("RANK", "0") == "0":
        print("grpo.py: interrupted: before training began; the same command starts again", file=sys.stderr, flush=True)
    os._exit(130)

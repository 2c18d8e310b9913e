"""The trainer's infrastructure, behind one-line calls: settings and flags (grpo_config), recipes, the checks
before any weights load (preflight, memory_plan), the model and its optimised passes (policy), torchrun/FSDP2
(distributed), the vLLM engine (vllm_engine), the sampler correction (sampler_mismatch), checkpoints and the run
folder (checkpoint), the loop's setup and bookkeeping (run_setup), data loading (problems, hub) and the shipped model
configs (trainer/model_configs/). None of it is a paper's method.

Imported by the top level (grpo.py, rollout.py, evaluate.py), by toy/ (``toy.register`` fills its registries), by
comparisons/ (loss_rules.py: the model's passes) and by tools/. Generic code: it imports the top-level files it
serves (rollout, verify, cscr, evaluate) and nothing of the toy, the comparisons or the tools, which register
themselves (docs/layout.md; tests/test_layout.py names the arrows still to remove)."""

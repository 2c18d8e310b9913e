"""The trainer's infrastructure, behind one-line calls from grpo.py, rollout.py and evaluate.py: settings and flags
(grpo_config), recipes, the checks before any weights load (preflight, memory_plan), the model and its optimised
passes (policy), torchrun/FSDP2 (distributed), the vLLM engine (vllm_engine), the sampler correction
(sampler_mismatch), checkpoints and the run folder (checkpoint), the loop's bookkeeping (run_setup), data loading
(problems, hub) and the shipped model configs (trainer/model_configs/). None of it is a paper's method."""

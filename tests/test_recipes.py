"""Recipes (recipes.py), DAPO's overlong reward shaping (grpo.overlong_penalty) and the paper's recipe end to end."""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import grpo
import toy
from trainer import grpo_config, recipes

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------ overlong shaping
def test_overlong_penalty_hand_values_at_the_buffer_edges():
    # L_max = 8, L_cache = 4: 0 up to 8 − 4 = 4 tokens, then ((8 − 4) − |o|) / 4 down to −1 at |o| = 8 (DAPO §3.4)
    lengths = torch.tensor([1, 4, 5, 6, 7, 8])
    expected = torch.tensor([0.0, 0.0, -0.25, -0.5, -0.75, -1.0])
    assert torch.equal(grpo.overlong_penalty(lengths, 8, 4), expected)
    assert torch.equal(grpo.overlong_penalty(lengths, 8, 4, factor=0.5), expected * 0.5)
    # verl's form, computed independently: min(−(|o| − (L_max − L_cache)) / L_cache · factor, 0)
    verl = [min(-(n - (20480 - 4096)) / 4096 * 1.0, 0.0) for n in (16384, 16385, 18432, 20480)]
    assert grpo.overlong_penalty(torch.tensor([16384, 16385, 18432, 20480]), 20480, 4096).tolist() == verl
    assert verl[0] == 0.0 and verl[-1] == -1.0 and verl[2] == -0.5


def test_overlong_buffer_not_shorter_than_the_budget_is_refused():
    for buffer in (8, 9, -1):
        with pytest.raises(
            SystemExit,
            match=rf"^grpo.py: error: --overlong_buffer_len {buffer} must be >= 0 and "
            r"shorter than --max_completion_length 8 \(verl asserts the same\)$",
        ):
            grpo_config.check_config(grpo.GRPOConfig(max_completion_length=8, overlong_buffer_len=buffer))
    grpo_config.check_config(grpo.GRPOConfig(max_completion_length=8, overlong_buffer_len=7))


# ------------------------------------------------------------------------------------------------ recipes
def test_auto_is_toy_for_the_toy_and_the_paper_for_any_other_model(toy_model_path, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    trained = tmp_path / "final"  # a trained toy run's folder: its run_info.json names the toy as the base model
    trained.mkdir()
    (trained / "run_info.json").write_text(json.dumps({"base_model": "toy", "prompt_template": "none"}))
    assert [
        recipes.auto_recipe(m) for m in ("toy", toy_model_path, str(trained), str(other), "Qwen/Qwen3-8B-Base")
    ] == ["toy", "toy", "toy", "delta_paper", "delta_paper"]


def test_a_flag_given_beats_the_recipe_and_the_toy_recipe_is_the_defaults():
    cfg = grpo.GRPOConfig(model="Qwen/Qwen3-8B-Base")
    given = set(
        vars(
            grpo_config.build_parser(defaults=False).parse_args(
                [
                    "--model",
                    "Qwen/Qwen3-8B-Base",
                    "--learning_rate",
                    "3e-4",
                    "--no-gradient_checkpointing",
                    "--data",
                    "math500",
                    "--num_generations",
                    "8",
                ]
            )
        )
    )
    assert given == {"model", "learning_rate", "gradient_checkpointing", "data", "num_generations"}
    cfg = dataclasses.replace(cfg, learning_rate=3e-4, gradient_checkpointing=False, data="math500", num_generations=8)
    out = recipes.apply(cfg, given)
    assert out.recipe == "delta_paper"
    assert (out.learning_rate, out.gradient_checkpointing, out.data, out.num_generations) == (3e-4, False, "math500", 8)
    for name in set(recipes.DELTA_PAPER) - given:  # every other setting is the paper's
        assert getattr(out, name) == recipes.DELTA_PAPER[name], name
    # the spec's rows (docs/specs/delta.md §4), written out again here
    assert (
        out.num_prompts_per_step,
        out.num_mini_batches,
        out.weight_decay,
        out.epsilon,
        out.epsilon_high,
        out.dual_clip,
        out.loss_type,
        out.beta,
        out.max_prompt_length,
        out.max_completion_length,
        out.temperature,
        out.top_p,
        out.overlong_buffer_len,
        out.overlong_penalty_factor,
        out.eval_temperature,
        out.eval_top_p,
        out.torch_dtype,
        out.delta_impl,
    ) == (
        128,
        4,
        0.1,
        0.2,
        0.28,
        10.0,
        "dapo",
        0.0,
        2048,
        20480,
        1.0,
        1.0,
        4096,
        1.0,
        1.0,
        0.7,
        "float32",
        "memory_efficient",
    )
    toy_cfg = recipes.apply(grpo.GRPOConfig(), set())
    assert toy_cfg == dataclasses.replace(grpo.GRPOConfig(), recipe="toy")  # toy: every default unchanged
    # built in code (given None): the fields that differ from the defaults count as given
    coded = recipes.apply(grpo.GRPOConfig(model="m", recipe="delta_one_gpu", num_generations=4))
    assert (coded.num_generations, coded.use_peft, coded.use_vllm, coded.learning_rate) == (4, True, True, 1e-5)


def test_recipe_errors_are_one_line():
    with pytest.raises(ValueError, match=r"^--data toy under --recipe delta_paper: .*pass --recipe toy"):
        recipes.apply(grpo.GRPOConfig(model="Qwen/Qwen3-8B-Base", data="toy"), {"model", "data"})
    with pytest.raises(SystemExit, match=r"^grpo.py: error: argument --recipe: invalid choice: 'paper'"):
        grpo.main(["--recipe", "paper"])
    assert recipes.apply(grpo.GRPOConfig(model="Qwen/Qwen3-8B-Base", recipe="toy"), {"model", "recipe"}).data == "toy"


def test_help_lists_every_recipe(capsys):
    with pytest.raises(SystemExit):
        grpo.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "recipes (--recipe): toy: the defaults above; delta_paper: --data math_train" in out
    assert "delta_one_gpu: delta_paper with --use_peft" in out and "--dual_clip 10.0" in out


def test_describe_names_where_each_value_came_from():
    given = {"model", "num_generations"}
    cfg = recipes.apply(grpo.GRPOConfig(model="m", num_generations=2), given)
    lines = recipes.describe(cfg, given, grpo.GRPOConfig())
    assert lines[0] == "--recipe delta_paper"
    assert "--model m (flag)" in lines and "--num_generations 2 (flag)" in lines
    assert "--learning_rate 1e-06 (recipe)" in lines and "--dual_clip 10.0 (recipe)" in lines


# ------------------------------------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_another_model_gets_the_paper_recipe_for_every_flag_not_given(toy_model_path, tmp_path):
    """The toy's folder without its toy_info.json is, to the trainer, another model: delta_paper."""
    model = tmp_path / "another"
    shutil.copytree(toy_model_path, model)
    (model / "toy_info.json").unlink()
    assert not toy.is_toy_model(str(model))
    config_path = model / "config.json"  # MATH's templated prompts run past the toy's 128 positions (preflight's check)
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "max_position_embeddings": 512}))
    out = tmp_path / "run"
    argv = [
        "--model",
        str(model),
        "--credit",
        "delta",
        "--num_prompts_per_step",
        "2",
        "--num_generations",
        "2",
        "--max_completion_length",
        "8",
        "--overlong_buffer_len",
        "4",
        "--max_steps",
        "2",
        "--eval_num_generations",
        "1",
        "--max_prompt_length",
        "200",
        "--save_steps",
        "1",
        "--output_dir",
        str(out),
    ]
    grpo.main(argv)
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["recipe"] == "delta_paper"
    assert (
        config["learning_rate"],
        config["weight_decay"],
        config["dual_clip"],
        config["overlong_penalty_factor"],
        config["data"],
        config["torch_dtype"],
        config["delta_impl"],
    ) == (1e-6, 0.1, 10.0, 1.0, "math_train", "float32", "memory_efficient")
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [l for l in lines if "reward" in l]
    assert [l["step"] for l in steps] == [1, 2]
    for l in steps:  # an 8-token budget with a 4-token buffer: every response of 5+ tokens is penalised
        assert l["overlong/penalty_mean"] <= 0 and l["reward"] == pytest.approx(
            l["accuracy"] + l["overlong/penalty_mean"]
        )
    assert any(l["overlong/penalty_mean"] < 0 for l in steps)
    # --resume compares resolved values: the same flags under another recipe resolve to other settings
    with pytest.raises(
        SystemExit,
        match=r"--resume with settings that differ .*--data 'math_train' -> 'toy'.*"
        r"--learning_rate 1e-06 -> 0.0003",
    ):
        grpo.main(argv + ["--resume", "--recipe", "toy"])


# ------------------------------------------------------------------------------------------------ --dry_run
@pytest.fixture(params=["Qwen3-8B-Base", "Qwen3-14B-Base"])
def config_only(request, tmp_path):
    """A folder holding only a shipped config.json (trainer/model_configs/): no weights, no tokenizer."""
    folder = tmp_path / request.param
    folder.mkdir()
    shutil.copy(ROOT / "trainer" / "model_configs" / "Qwen" / request.param / "config.json", folder)
    return str(folder)


def _dry_run(capsys, *argv):
    assert grpo.main(list(argv) + ["--dry_run"]) is None
    return capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, fused",
    [
        ([], True),  # the toy's default: one update of one micro-batch, β = 0
        (["--num_mini_batches", "4"], False),
        (["--micro_batch_size", "4"], False),
        (["--beta", "0.04"], False),
        (["--no-fuse_old_logprobs"], False),
        (["--entropy_top_ratio", "0.2", "--entropy_pool", "micro"], False),  # a loss stage with its own forward
        (["--entropy_top_ratio", "0.2"], True),
    ],
)
def test_dry_run_names_the_theta_old_pass_the_run_takes(capsys, argv, fused):
    """--dry_run's stage-4 line is the run's choice (memory_plan.updates_on_policy, as run_setup.step_parts), not the
    --fuse_old_logprobs flag alone: a flag that does not apply says so."""
    import comparisons

    main = comparisons.main if "--entropy_top_ratio" in argv else grpo.main
    assert main(["--credit", "grpo", *argv, "--dry_run"]) is None
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("[path] stage 4"))
    assert ("from the update's own forward" in line) == fused
    assert ("--fuse_old_logprobs: only for one update" in line) == (not fused and "--no-fuse_old_logprobs" not in argv)


def test_a_nucleus_below_one_is_said_once_to_make_the_update_off_policy(capsys):
    """The rollout samples the top-p nucleus, the trainer scores softmax(z/T) uncut (rollout.py's header): below 1 a
    run says so, in one line, before anything loads; at 1 (the default) it says nothing."""
    out = _dry_run(capsys, "--top_p", "0.9")
    assert [x for x in out.splitlines() if x.startswith("[warn] --top_p")] == [
        "[warn] --top_p 0.9: sampled from the nucleus, scored uncut: each update is off-policy there"
    ]
    assert "[warn] --top_p" not in _dry_run(capsys)


def test_dry_run_of_the_papers_recipe_on_one_80gb_gpu_says_it_does_not_fit_and_what_does(config_only, capsys):
    out = _dry_run(capsys, "--credit", "delta", "--model", config_only, "--gpu_memory_gb", "80")
    assert "[recipe] delta_paper (auto: a real model)" in out and "--learning_rate 1e-06 (recipe)" in out
    assert "[note] prompts not measured" in out  # no tokenizer in the folder: planned at --max_prompt_length
    assert "memory plan:" in out and "1 process on a GPU of 80.0 GB" in out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("does not fit: peak ") and "short by " in verdict and "fits with: " in verdict
    for stage in ("rollout", "θ_old pass", "credit", "update"):
        assert f"\n{stage}" in out
    assert sorted(p.name for p in Path(config_only).iterdir()) == ["config.json"]  # nothing loaded, nothing written


def test_dry_run_of_the_one_gpu_recipe_and_of_the_papers_eight_gpu_run_say_they_fit(config_only, capsys):
    out = _dry_run(
        capsys, "--credit", "delta", "--model", config_only, "--recipe", "delta_one_gpu", "--gpu_memory_gb", "80"
    )
    assert "[note] --use_vllm" not in out and "[note] --vllm_enable_sleep_mode" not in out  # another machine's plan
    assert out.strip().splitlines()[-1].startswith("fits: peak ")
    # README's torchrun command: the paper's recipe on 8 GPUs with vLLM (H200s: 141 GB each)
    out = _dry_run(
        capsys,
        "--credit",
        "delta",
        "--model",
        config_only,
        "--plan_processes",
        "8",
        "--use_vllm",
        "--vllm_enable_sleep_mode",
        "--gpu_memory_gb",
        "141",
    )
    assert "8 processes on a GPU of 141.0 GB" in out and out.strip().splitlines()[-1].startswith("fits: peak ")


def _offline_env(tmp_path):
    """A fresh clone's first hour without network: HF_HUB_OFFLINE, an empty Hugging Face cache, and every endpoint
    and proxy on a closed local port (anything that still tried the network would fail, not hang)."""
    dead = "http://127.0.0.1:9"
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_ENDPOINT": dead,
        "HTTP_PROXY": dead,
        "HTTPS_PROXY": dead,
        "ALL_PROXY": dead,
        "NO_PROXY": "",
    }


def test_the_readmes_dry_run_plans_qwen3_8b_offline_from_the_shipped_config(tmp_path):
    """README's plan command, as a new user types it, offline with an empty cache: the tokenizer is not here (a note:
    prompts not measured), config.json is the copy in trainer/model_configs/, the plan is printed, exit status 0."""
    command = "python grpo.py --credit delta --model Qwen/Qwen3-8B-Base --dry_run --gpu_memory_gb 80"
    assert command in (ROOT / "README.md").read_text()
    res = subprocess.run(
        [sys.executable, *command.split()[1:]],
        cwd=ROOT,
        env=_offline_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout
    assert "[note] prompts not measured (" in out and "planned at 2048 prompt tokens" in out
    assert "[note] config.json of Qwen/Qwen3-8B-Base: the copy in trainer/model_configs/Qwen/Qwen3-8B-Base/" in out
    assert "memory plan: Qwen3-8B-Base, 8.19 B parameters, 1 process on a GPU of 80.0 GB" in out
    assert out.strip().splitlines()[-1].startswith("does not fit: peak ")
    assert not (tmp_path / "hf").exists() or not any((tmp_path / "hf").rglob("config.json"))  # nothing downloaded


def test_the_14b_dry_run_plans_offline_too_and_a_hub_id_not_shipped_says_what_to_do(tmp_path, monkeypatch, capsys):
    """The same for Qwen3-14B-Base in this process, with the network cut (a connection attempt fails the test);
    a hub id with no copy here stops with one line naming it."""
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("the dry run tried the network")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    out = _dry_run(capsys, "--credit", "delta", "--model", "Qwen/Qwen3-14B-Base", "--gpu_memory_gb", "80")
    assert "memory plan: Qwen3-14B-Base, 14.77 B parameters" in out and "[note] prompts not measured" in out
    assert out.strip().splitlines()[-1].startswith("does not fit: peak ")
    with pytest.raises(
        SystemExit,
        match=r"^grpo.py: error: cannot read the config.json of model 'Qwen/Qwen3-4B': "
        r".*HF_HUB_OFFLINE is set: the plan needs only its config.json: --model "
        r"/path/to/Qwen3-4B, a folder holding it, plans it",
    ):
        grpo.main(["--model", "Qwen/Qwen3-4B", "--dry_run"])


def test_a_dry_run_of_a_hub_id_not_shipped_fails_at_once_without_network(monkeypatch):
    """No network and HF_HUB_OFFLINE not set: the config.json of a hub id with no copy in trainer/model_configs/ is not
    asked
    of the hub client (half a minute of retries, once) but of hub.require_hub, which finds no network in one try;
    the line names the folder flag that plans it."""
    import socket

    tried = []

    def no_network(*args, **kwargs):  # hub.require_hub's one try: the host does not resolve
        tried.append(args[0])
        raise socket.gaierror(-2, "Name or service not known")

    def the_hub_client(*args, **kwargs):
        raise AssertionError("the hub client tried the network")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", the_hub_client)
    monkeypatch.setattr(socket.socket, "connect", the_hub_client)
    with pytest.raises(SystemExit) as e:
        grpo.main(["--model", "Qwen/Qwen3-4B-Base", "--dry_run"])
    assert str(e.value) == (
        "grpo.py: error: cannot read the config.json of model 'Qwen/Qwen3-4B-Base': cannot reach huggingface.co to "
        "download model 'Qwen/Qwen3-4B-Base' (gaierror: no network?): the plan needs only its config.json: --model "
        "/path/to/Qwen3-4B-Base, a folder holding it, plans it (`hf download Qwen/Qwen3-4B-Base config.json "
        "--local-dir Qwen3-4B-Base` on a machine with network)"
    )
    assert tried == [("huggingface.co", 443)] * 2  # the tokenizer's (a note of the plan), then config.json's


def test_an_error_about_a_value_the_recipe_set_names_the_recipe(tmp_path):
    with pytest.raises(
        SystemExit,
        match=r"^grpo.py: error: --overlong_buffer_len 4096 must be >= 0 and shorter than "
        r"--max_completion_length 8 \(verl asserts the same\) \(--overlong_buffer_len "
        r"4096 is the delta_paper recipe's; a flag given beats it\)$",
    ):
        grpo.main(["--model", str(tmp_path), "--max_completion_length", "8"])
    given = {"model", "max_completion_length", "overlong_buffer_len"}  # both given: no recipe to name
    cfg = recipes.apply(grpo.GRPOConfig(model="m", max_completion_length=8, overlong_buffer_len=9), given)
    assert (
        recipes.name_the_recipe("--overlong_buffer_len 9 ... --max_completion_length 8", cfg, given)
        == "--overlong_buffer_len 9 ... --max_completion_length 8"
    )


@pytest.mark.parametrize(
    "flags, said",
    [
        (dict(temperature=0.0), "--temperature 0.0 must be > 0"),
        (dict(top_p=1.5), "--top_p 1.5 must be in (0, 1]"),
        (dict(eval_temperature=-1.0), "--eval_temperature -1.0 must be > 0"),
        (dict(eval_top_p=0.0), "--eval_top_p 0.0 must be in (0, 1]"),
        (dict(overlong_penalty_factor=-1.0), "--overlong_penalty_factor -1.0 must be >= 0"),
        (dict(gpu_memory_gb=0.0), "--gpu_memory_gb 0.0 must be > 0"),
        (dict(epsilon=1.0), "--epsilon 1.0 must be in [0, 1)"),
        (dict(epsilon_high=-0.1), "--epsilon_high -0.1 must be >= 0"),
        (dict(cscr_w_min=1.5), "--cscr_w_min 1.5 must be in [0, 1]"),
        (dict(cscr_threshold_quantile=0.0), "--cscr_threshold_quantile 0.0 must be in (0, 1]"),
        (dict(grade_workers=0), "--grade_workers 0 must be >= 1"),
        (dict(grade_timeout=0.0), "--grade_timeout 0.0 must be > 0 seconds"),
        (dict(plan_processes=8), "--plan_processes 8 plans a torchrun of that many: use it with --dry_run"),
    ],
)
def test_sampling_and_plan_flags_are_checked_before_anything_runs(flags, said):
    with pytest.raises(SystemExit, match="^grpo.py: error: " + re.escape(said)):
        grpo_config.check_config(grpo.GRPOConfig(**flags))
    grpo_config.check_config(grpo.GRPOConfig(eval_temperature=0.6, eval_top_p=0.7, plan_processes=8, dry_run=True))


def test_the_papers_recipe_samples_with_vllm_asleep_only_when_planned_for_gpus(monkeypatch):
    """delta_paper turns on vLLM with sleep mode on GPUs or a dry run planned for them (--gpu_memory_gb), never on a
    CPU run (which would then need vLLM), and leaves the IS correction off (DelTA's code has none)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    base = grpo.GRPOConfig(model="x", data="math_train", credit="delta")
    cpu = recipes.apply(base, set())
    planned = recipes.apply(dataclasses.replace(base, dry_run=True, gpu_memory_gb=80.0), {"dry_run", "gpu_memory_gb"})
    real_with_gb = recipes.apply(dataclasses.replace(base, gpu_memory_gb=80.0), {"gpu_memory_gb"})
    assert (cpu.use_vllm, cpu.vllm_enable_sleep_mode) == (False, False)
    assert (real_with_gb.use_vllm, real_with_gb.vllm_enable_sleep_mode) == (False, False)
    assert (planned.use_vllm, planned.vllm_enable_sleep_mode) == (True, True)
    assert planned.vllm_gpu_memory_utilization is None  # sized by the plan at preflight
    assert not planned.vllm_importance_sampling_correction
    given = recipes.apply(
        dataclasses.replace(base, dry_run=True, gpu_memory_gb=80.0, use_vllm=False),
        {"dry_run", "gpu_memory_gb", "use_vllm"},
    )
    assert not given.use_vllm and not given.vllm_enable_sleep_mode  # a flag given beats the recipe
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert recipes.apply(base, set()).use_vllm

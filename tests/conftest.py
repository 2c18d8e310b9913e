"""Shared fixtures: the toy model (warmed up, cached) and a tiny random toy model (fast)."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

torch.set_num_threads(1)  # tiny models: threads cost more than they give, and keep CI predictable


@pytest.fixture(scope="session")
def toy_model_path():
    """The warmed-up toy base model that ships in toy_model/ (toy.py)."""
    import toy

    return toy.ensure_toy_model()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A randomly initialised toy-architecture model saved with save_pretrained (no warm-up)."""
    import toy

    return toy.build_toy_model(tmp_path_factory.mktemp("tiny") / "model", warmup_steps=0)


@pytest.fixture(scope="session")
def tiny():
    """A tiny random Qwen3 (hidden 16, 2 layers) with a character tokenizer that adds no BOS: (model, tokenizer)."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models

    chars = list("0123456789 +-=.:\n") + [chr(c) for c in range(97, 123)]
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + chars)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tk.decoder = decoders.Fuse()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    cfg = transformers.Qwen3Config(
        vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=512, initializer_range=0.3,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    return model, tok

"""Shared fixtures: the toy model (warmed up, cached) and a tiny random toy model (fast)."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED_DATA = ROOT.parent / "shared" / "data"

torch.set_num_threads(1)  # tiny models: threads cost more than they give, and keep CI predictable


@pytest.fixture(scope="session")
def toy_model_path():
    """The warmed-up toy base model (built once into the cache, about two minutes on 2 cores)."""
    import toy

    return toy.ensure_toy_model()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A randomly initialised toy-architecture model saved with save_pretrained (no warm-up)."""
    import toy

    return toy.build_toy_model(tmp_path_factory.mktemp("tiny") / "model", warmup_steps=0)

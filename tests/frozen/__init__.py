"""Former implementations, each a commit's file byte for byte (README.md here): a test that guards "this change
moved no bits" runs the former code beside today's on the same machine, so both meet the same torch kernels."""

import hashlib
import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load_frozen(stem: str):
    """The module tests/frozen/<stem>.py, imported under its own name (``delta_71d7a89``, not ``delta``)."""
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def frozen_sha256(stem: str) -> str:
    """The SHA-256 of tests/frozen/<stem>.py's bytes (hex), to check that the copy is still the commit's file."""
    return hashlib.sha256((HERE / f"{stem}.py").read_bytes()).hexdigest()

"""The Hugging Face hub: whether a download can work, decided in seconds (``require_hub``).

policy.py (a model or tokenizer not in the local cache) and problems.py (a benchmark's hub copy) ask it before they
download, so that a machine without network fails with one line that says what to do, instead of waiting through
the hub client's retries and ending in a deep traceback. Imports no project module. Left out on purpose: the
downloads themselves (``from_pretrained``, ``datasets.load_dataset``), proxies and mirrors other than
``HF_ENDPOINT``.
"""

from __future__ import annotations

import os


def require_hub(name: str, what: str = "model", fix: str = "") -> None:
    """Fail in seconds, with one line, when ``name`` must be downloaded from the Hugging Face hub and cannot be:
    ``HF_HUB_OFFLINE`` is set, or the hub's host does not answer within 3 s (instead of waiting through the hub
    client's retries). Call it after a cache-only load of ``name`` failed. ``fix``: what the line tells the user to
    do (default: download it where there is network and pass its folder)."""
    import socket
    from urllib.parse import urlparse

    folder = name.split("/")[-1]
    fix = fix or (
        f"download it on a machine with network (`hf download {name} --local-dir {folder}`, "
        f"huggingface-hub's CLI) and pass its folder, e.g. "
        f"--{'model' if what == 'model' else 'benchmarks'} /path/to/{folder}"
    )
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        raise ValueError(f"{what} {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: {fix}")
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=3).close()
    except OSError as e:
        raise ValueError(
            f"cannot reach {host} to download {what} {name!r} ({type(e).__name__}: no network?): {fix}"
        ) from None

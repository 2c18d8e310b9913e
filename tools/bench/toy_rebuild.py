"""The toy's rebuild check (.ci/run): does toy/'s recipe still make the shipped toy/model/?

``python tools/bench/toy_rebuild.py [--output DIR]`` reruns ``toy.build_toy_model`` (seed 0, ``toy.WARMUP``, one thread:
about 7 minutes on one CPU core) into ``--output`` (default: a temporary folder) and compares the result with the
shipped ``toy/model/``: identical weights where the platform allows it (``toy.compare_weights``), else the same
held-out greedy accuracy and avg@8 (the 200 test problems, the trainer's evaluation ``evaluate.evaluate_rows``, seed
12345) within ``REBUILD_TOLERANCE`` points; exit status 1 if not, or if the two models hold different tensors.

Why here, not in toy/: comparing accuracies loads and evaluates both models (policy.py, evaluate.py); toy/ imports
project modules only inside ``register`` (to add itself to the generic ones) and never evaluate.py, so the check sits
at the top of the stack, beside the other scripts that run the project rather than make it up.

Left out on purpose: replacing toy/model/ with the rebuild (copy the --output folder by hand, then bump
``toy.TOY_VERSION`` if the recipe changed). Read next: toy/__init__.py (the recipe), evaluate.py (the evaluation).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import toy  # noqa: E402

PROG = "toy_rebuild.py"
# A rebuilt model whose weights are not bit-identical (another CPU's float rounding) must still score within this many
# points (of 100) of the shipped one, greedy and avg@8, on the 200 held-out problems.
REBUILD_TOLERANCE = 5.0


def compare_models(built, shipped=toy.SHIPPED, rows: list[dict] | None = None) -> dict:
    """``toy.compare_weights`` of the two folders and, when the weights are not identical, both models' greedy accuracy
    and avg@8 in points on ``rows`` (default: the 200 held-out problems) as ``rebuilt`` and ``shipped``; ``ok``: the
    weights are identical or both figures agree within ``REBUILD_TOLERANCE`` points.

    Raises:
        ValueError: the two models hold different tensors (toy.compare_weights).
    """
    import evaluate
    from trainer import policy

    out = toy.compare_weights(built, shipped)
    out["ok"] = out["identical"]
    if not out["identical"]:
        rows = toy.load_split("test") if rows is None else rows
        for name, folder in (("rebuilt", built), ("shipped", shipped)):
            model, tokenizer = policy.load_model_and_tokenizer(str(folder), device="cpu")
            res = evaluate.evaluate_rows(model, tokenizer, rows, "none", evaluate.EvalSettings(8, seed=12345))
            out[name] = {"greedy": 100 * res["greedy"], "avg@8": 100 * res["avg@8"]}
        out["ok"] = all(abs(out["rebuilt"][k] - out["shipped"][k]) <= REBUILD_TOLERANCE for k in ("greedy", "avg@8"))
    return out


def verdict(res: dict) -> str:
    """The comparison in one line: identical weights, or the weights' largest difference and both models' figures."""
    if res["identical"]:
        return "identical weights to the shipped toy/model/"
    return (
        f"weights differ (max |diff| {res['max_abs_weight_diff']:.2e}); held-out greedy / avg@8: rebuilt "
        f"{res['rebuilt']['greedy']:.1f} / {res['rebuilt']['avg@8']:.1f}, shipped {res['shipped']['greedy']:.1f} / "
        f"{res['shipped']['avg@8']:.1f} (tolerance {REBUILD_TOLERANCE} points): "
        + ("within it" if res["ok"] else "OUTSIDE it")
    )


def main(argv=None) -> int:
    """Rebuild, compare, print the verdict; returns the exit status (0: the recipe still makes the shipped model).

    Raises:
        SystemExit: no shipped model to compare with (one line).
        ValueError: the rebuilt model holds other tensors than the shipped one.
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--output", metavar="DIR", help="where the rebuild is written, as DIR/model (default: a temporary folder)"
    )
    args = ap.parse_args(argv)
    if not (toy.SHIPPED / "model.safetensors").exists():
        raise SystemExit(f"{PROG}: error: no shipped model to compare with in {toy.SHIPPED}")
    output = Path(args.output or tempfile.mkdtemp(prefix="toy-rebuild-")) / "model"
    t0 = time.time()
    print(f"[toy] rebuilding into {output} (seed 0, {toy.WARMUP['steps']} warm-up steps) ...", flush=True)
    toy.build_toy_model(output)
    res = compare_models(output, toy.SHIPPED)
    print(f"[toy] rebuilt in {time.time() - t0:.0f}s; {verdict(res)}")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except ValueError as e:  # the rebuild holds other tensors: one line, exit status 1
        raise SystemExit(f"{PROG}: error: {e}")

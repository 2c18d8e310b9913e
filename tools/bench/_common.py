"""Shared helpers of the benchmark scripts (credit_overhead.py, vs_trl.py, scaling.py).

* ``run_one(spec)``: one fresh ``grpo.train`` run in a child process (grpo.py's flags and the comparisons', its
  method from ``comparisons.method`` as ``python -m comparisons`` runs it), with per-step timings (``metrics.jsonl``,
  a timing subclass of the run's credit function, CPU time) and the peak memory of the run; optional
  benchmark-only patches (``spec["patches"]``) that force every response to the full completion length and replace
  the verifier by seeded random rewards (scaling.py: random-init models).
* ``SCALE_FLAGS`` / ``SCALE_PATH``: the scale path's three flags (trainer/scale_passes.py) and --fuse_old_logprobs,
  grpo.py's defaults when the recorded results (results/) were made; the scripts' runs keep them unless told otherwise.
* ``plan_traits(credit)``: what ``memory_plan.plan`` reads of a credit function, as the trainer hands it.
* ``PeakMemory``: the peak resident-set increase of this process over a block (CPU) or the CUDA peak.
* ``prepare_toy_model``: a private snapshot of the toy model (the shipped toy/model/, or a benchmark-only build).
* ``machine_description``, ``git_state``, ``library_versions``: what every result JSON records.
* ``forkserver_pool``: a pool whose every task runs in a fresh process forked from a server that has already
  imported torch/transformers (a run starts in about a second).

Nothing here changes the project's files or their behaviour outside the benchmark's own processes.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# imported once by the fork server, so that each run's fresh process starts without paying for them
PRELOAD = [
    "torch",
    "transformers",
    "transformers.models.auto.modeling_auto",
    "transformers.generation.utils",
    "transformers.models.auto.tokenization_auto",
    "transformers.models.qwen3.modeling_qwen3",
    "grpo",
    "comparisons",
    "delta",
    "cscr",
    "rollout",
    "verify",
    "evaluate",
    "toy",
]


# The scale path (trainer/scale_passes.py: padding-free micro-batches, each group's prompt run once, the LM head in
# chunks, θ_old from the update's forward), grpo.py's default until the plain path became it: every result under
# results/ was made with it, so the scripts' runs take it (the same numbers to rounding as the plain path, not bit
# for bit). As flags (reproduce.py's commands) and as config fields (run_one's configs); tests/test_bench.py ties
# both to scale_passes.FLAGS.
SCALE_FLAGS = ["--padding_free", "--shared_prompt", "--chunked_lm_head", "--fuse_old_logprobs"]
SCALE_PATH = {flag.removeprefix("--"): True for flag in SCALE_FLAGS}


def plan_traits(credit: str) -> dict:
    """What ``memory_plan.plan`` reads of the credit function of a paper's ``--credit`` (grpo, delta, cscr:
    ``grpo.CREDIT_FUNCTIONS``) and of grpo.py's loss stage, as ``run_setup.prepare`` hands them to the plan (its
    ``traits``): without them the plan takes GRPO's (no per-token arrays beside Ã)."""
    import grpo

    function = grpo.CREDIT_FUNCTIONS[credit]
    return {
        "credit_gathers_weights": function.gathers_weights,
        "reuses_old_forward": grpo.LossStage().reuses_old_forward,
        "credit_token_arrays": function.token_arrays + len(function.asks.token_stats or {}),
    }


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def now_iso() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


# ----------------------------------------------------------------------------------------------------------
# Memory
# ----------------------------------------------------------------------------------------------------------
class PeakMemory:
    """Peak memory of this process over a ``with`` block.

    CPU: the increase of the resident set: the peak counter (``VmHWM``) is reset on entry by writing ``5`` to
    ``/proc/self/clear_refs`` and read on exit, minus ``VmRSS`` on entry (falls back to ``ru_maxrss``, the
    lifetime peak, if the reset is refused). Unlike tracemalloc it sees torch's allocations; it includes
    everything the block allocates (model, optimizer, activations, glibc caching): an honest upper bound of
    the working set. CUDA: ``torch.cuda.max_memory_allocated`` over the block (reset on entry).
    Attributes after the block: ``rss_before_mib``, ``peak_rss_increase_mib``, ``rss_method``,
    ``cuda_max_allocated_mib`` (None without CUDA).
    """

    def __enter__(self):
        import resource

        import torch

        from trainer import policy  # the trainer's own readers of the peak (grpo.py logs each step's with them)

        self.cuda = torch.cuda.is_available()
        self._rss_before = policy.proc_status_kib("VmRSS")
        self._reset_ok = policy.reset_peak_memory()  # the host's counter and, on a GPU, the allocator's
        self._maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return self

    def __exit__(self, *exc):
        import resource

        import torch

        from trainer import policy

        peak_kib = policy.proc_status_kib("VmHWM") if self._reset_ok else None
        if peak_kib is not None:
            self.rss_method = "VmHWM after clear_refs reset"
        else:  # no reset possible: the lifetime peak, meaningful only if the process peaked inside the block
            peak_kib, self.rss_method = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "ru_maxrss (no reset)"
        self.rss_before_mib = (self._rss_before or 0) / 1024
        self.peak_rss_increase_mib = (peak_kib - (self._rss_before or self._maxrss_before)) / 1024
        self.cuda_max_allocated_mib = torch.cuda.max_memory_allocated() / 2**20 if self.cuda else None
        return False

    def as_dict(self) -> dict:
        return {
            "rss_before_mib": self.rss_before_mib,
            "peak_rss_increase_mib": self.peak_rss_increase_mib,
            "rss_method": self.rss_method,
            "cuda_max_allocated_mib": self.cuda_max_allocated_mib,
        }


MEMORY_METHOD_CPU = (
    "peak RSS increase: VmHWM (reset via /proc/self/clear_refs before the measured call) minus "
    "VmRSS before it, fresh forked process per run"
)
MEMORY_METHOD_CUDA = "torch.cuda.max_memory_allocated over the measured call"


# ----------------------------------------------------------------------------------------------------------
# Benchmark-only patches (child processes only)
# ----------------------------------------------------------------------------------------------------------
def install_patches(patches: dict) -> dict:
    """Patch ``grpo``'s view of ``rollout`` / ``verify`` in this process only (never the files); returns a
    description of what was patched.

    ``no_stop``: ``rollout.stop_token_ids`` returns ``[vocab_size]``, an id the model has no logit for, so it is
    never sampled, and ``rollout.template_stop_strings`` returns ``[]``: every response runs to exactly
    ``max_completion_length`` tokens (a random model otherwise emits EOS at random and lengths, hence costs,
    differ between runs). ``random_rewards`` (an int seed): ``verify.grade_batch`` returns, for each group of
    ``num_generations`` consecutive responses, exactly half correct (a seeded random choice per call), so every
    group has reward spread, every response a non-zero advantage, and the DelTA/CSCR code paths do real work.
    """
    import grpo
    import rollout

    done = {}
    if patches.get("no_stop"):
        original = rollout.stop_token_ids

        def stop_token_ids(tokenizer, template="none", model=None):
            vocab = getattr(getattr(model, "config", None), "vocab_size", None) or len(tokenizer)
            original(tokenizer, template, model)  # same validation as the trainer's call
            return [int(vocab)]

        rollout.stop_token_ids = stop_token_ids
        rollout.template_stop_strings = lambda template: []
        done["no_stop"] = (
            "stop ids = [vocab_size] (never sampled), no stop strings: every response has exactly "
            "max_completion_length tokens"
        )
    if patches.get("random_rewards") is not None:
        seed, group = int(patches["random_rewards"]), int(patches["num_generations"])
        calls = [0]

        def grade_batch(responses, references, timeout=None, num_workers=1):
            rng = random.Random(seed * 1_000_003 + calls[0])
            calls[0] += 1
            out = []
            for g in range(0, len(responses), group):
                n = min(group, len(responses) - g)
                correct = set(rng.sample(range(n), n // 2))
                out += [(j in correct, "ok") for j in range(n)]
            return out

        grpo.verify.grade_batch = grade_batch
        done["random_rewards"] = (
            f"verify.grade_batch replaced: half of each group of {group} correct, seeded "
            f"random choice (seed {seed}, one draw per step)"
        )
    return done


# ----------------------------------------------------------------------------------------------------------
# Child process: one fresh train() run
# ----------------------------------------------------------------------------------------------------------
def run_one(spec: dict) -> dict:
    """One ``grpo.train`` run as described by ``spec``; returns per-step timings and peak memory.

    ``spec``: ``config`` (fields of ``python -m comparisons``' config: grpo.py's ``GRPOConfig`` and the comparisons'
    flags), optional ``profile`` (path: cProfile the run into it), optional ``patches`` (see ``install_patches``).
    Runs in a child process: the run's method (``comparisons.method``) with its credit function timed
    (``timed_credit``), and CPU-time wrappers on ``rollout.generate`` / ``run_setup.log_step`` (this process only;
    grpo.py is not changed).
    """
    import torch

    import comparisons
    import grpo
    import rollout

    patched = install_patches(spec.get("patches") or {})
    hook = []

    # CPU time of this process per step (less sensitive than wall time to other processes sharing the cores):
    # a step runs from its rollout.generate call to its metrics line (run_setup.log_step), both looked
    # up at call time. It excludes the grading worker's CPU (a separate process, same for every
    # credit) and the first lines of the step (prompt sampling), which come before generate.
    marks = []
    from trainer import run_setup

    original_generate = rollout.generate
    original_log = run_setup.log_step

    def generate(*a, **k):
        c0 = time.process_time()
        out = original_generate(*a, **k)
        marks.append({"cpu_start": c0, "cpu_generation": time.process_time() - c0})
        return out

    def log_step(*a, **k):
        marks[-1]["cpu_end"] = time.process_time()
        return original_log(*a, **k)

    rollout.generate = generate
    run_setup.log_step = log_step
    cfg = comparisons.config_class()(**{"recipe": "toy", **spec["config"]})  # toy-sized settings, on widened toys too
    method = comparisons.method(cfg)
    method = method._replace(credit=timed_credit(method.credit, hook))
    profiler = None
    if spec.get("profile"):
        import cProfile

        profiler = cProfile.Profile()
    t0 = time.perf_counter()
    with PeakMemory() as mem:
        if profiler is not None:
            profiler.enable()
        grpo.train(cfg, None, method)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(spec["profile"])
    wall = time.perf_counter() - t0
    steps = []
    with open(os.path.join(cfg.output_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if "step_time" in rec:  # the step's timings, its peak memory (grpo.py logs memory/*), its rollouts
                steps.append(
                    {
                        k: v
                        for k, v in rec.items()
                        if k.startswith("memory/")
                        or k
                        in (
                            "step",
                            "step_time",
                            "generation_time",
                            "reward",
                            "frac_reward_zero_std",
                            "completions/mean_length",
                        )
                    }
                )
    for s, h, m in zip(steps, hook, marks):
        s.update(h)
        s["cpu_step_time"] = m["cpu_end"] - m["cpu_start"]
        s["cpu_generation_time"] = m["cpu_generation"]
    return {
        "wall_time": wall,
        "steps": steps,
        **mem.as_dict(),
        "torch_threads": torch.get_num_threads(),
        "patches": patched,
        "pid": os.getpid(),
    }


def timed_credit(credit: type, sink: list) -> type:
    """``credit`` (a credit function class, trainer/credit_methods.py's kind) whose every call appends its seconds
    (CUDA synchronised) and what it worked on to ``sink``; otherwise the same class (a subclass: its traits and
    state as the original's)."""
    import torch

    cuda = torch.cuda.is_available()

    class Timed(credit):
        def __call__(self, model, x):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = super().__call__(model, x)
            if cuda:
                torch.cuda.synchronize()
            sink.append(
                {
                    "credit_time": time.perf_counter() - t0,
                    "rows_nonzero_adv": int((x.adv != 0).sum()),
                    "response_width": int(x.batch.response_mask.shape[1]),
                    "response_tokens": int(x.batch.response_mask.sum()),
                }
            )
            return out

    Timed.__name__ = Timed.__qualname__ = f"Timed{credit.__name__}"
    return Timed


class _FreshProcesses:
    """``apply(fn, args)``: ``fn(*args)`` in a fresh process, one per task, forked from a server that pre-imported the
    modules. The processes are not daemonic (concurrent.futures'), so a run may start its own children, as
    verify.py's grading workers do (a multiprocessing.Pool worker may not)."""

    def __init__(self, ctx):
        from concurrent.futures import ProcessPoolExecutor

        self._executor = ProcessPoolExecutor(max_workers=1, mp_context=ctx, max_tasks_per_child=1)

    def apply(self, fn, args=(), kwds=None):
        return self._executor.submit(fn, *args, **(kwds or {})).result()

    def close(self):
        self._executor.shutdown(wait=True)

    def join(self):
        pass


def forkserver_pool(preload: list[str]):
    """A one-worker pool of fresh processes (one task each) forked from a server that pre-imported ``preload``."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(preload)
    return _FreshProcesses(ctx)


# ----------------------------------------------------------------------------------------------------------
# The model every run loads
# ----------------------------------------------------------------------------------------------------------
def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def snapshot(src: Path, dst: Path) -> bool:
    """Copy a saved model folder; False if it is missing or was replaced while copying (concurrent rebuild)."""
    for _ in range(5):
        try:
            if not (src / "config.json").exists():
                return False
            before = os.stat(src).st_ino
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst)
            if os.stat(src).st_ino == before and (dst / "model.safetensors").exists():
                return True
        except (OSError, shutil.Error):
            pass
        time.sleep(2)
    return False


def prepare_toy_model(workdir: Path, toy_warmup_steps: int, prog: str) -> tuple[str, dict]:
    """A private copy of the toy model (``toy.model_folder()``, the folder ``--model toy`` loads, never built here:
    the shipped toy/model/, else the cache) in ``workdir/toy_model``, and where it came from.

    When there is neither, a benchmark-only toy is built with ``toy_warmup_steps`` warm-up steps and kept in
    ``$TMPDIR/credit_overhead_toy/toy-<version>-warmup<steps>`` for later benchmark runs (never in the project's
    toy cache, whose model is warmed up fully). A private copy means a concurrent rebuild of the cache cannot
    change the model mid-benchmark.
    """
    import toy

    dst = workdir / "toy_model"
    src = toy.model_folder()
    if snapshot(src, dst):
        source = f"snapshot of the toy model {src}"
    else:
        private = (
            Path(tempfile.gettempdir()) / "credit_overhead_toy" / f"toy-{toy.TOY_VERSION}-warmup{toy_warmup_steps}"
        )
        if not (private / "config.json").exists():
            print(
                f"[bench] no cached toy model at {src}: building a benchmark-only one in {private} "
                f"({toy_warmup_steps} warm-up steps, once) ...",
                flush=True,
            )
            t0 = time.time()
            toy.build_toy_model(private, warmup_steps=toy_warmup_steps)
            print(f"[bench] built in {time.time() - t0:.0f}s", flush=True)
        if not snapshot(private, dst):
            raise SystemExit(f"{prog}: error: could not copy the toy model from {private}")
        source = f"benchmark-only toy model ({toy_warmup_steps} warm-up steps) {private}"
    info = json.loads((dst / "toy_info.json").read_text()) if (dst / "toy_info.json").exists() else {}
    return str(dst), {"source": source, "toy_info": info, "weights_sha256": sha256(dst / "model.safetensors")}


# ----------------------------------------------------------------------------------------------------------
# Provenance: machine, libraries, git
# ----------------------------------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def library_versions(extra: tuple[str, ...] = ()) -> dict:
    """``checkpoint.library_versions()`` plus the versions of ``extra`` distributions that are installed."""
    import importlib.metadata as md

    from trainer import checkpoint

    versions = checkpoint.library_versions()
    for pkg in extra:
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return versions


def machine_description(extra_packages: tuple[str, ...] = ()) -> dict:
    import torch

    desc = {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "platform": platform.platform(),
        "torch_default_threads": torch.get_num_threads(),
        "versions": library_versions(extra_packages),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        with open("/proc/meminfo") as f:
            desc["mem_total_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    return desc


def git_state() -> dict:
    """The repository's commit and its uncommitted .py files (None where this is not a git checkout)."""

    def git(*a):
        r = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True)
        if r.returncode:
            raise OSError(r.stderr.strip())
        return r.stdout

    try:
        if not (REPO / ".git").exists():  # a source tree without .git (an archive), perhaps inside another checkout
            raise OSError("no .git folder")
        dirty = [l[3:] for l in git("status", "--porcelain").splitlines() if l[3:].endswith(".py")]
        return {"commit": git("rev-parse", "HEAD").strip(), "dirty_python_files": dirty}
    except OSError as e:
        return {"commit": None, "note": f"not a git checkout ({str(e)[:100]})"}


def write_json(path: str, result: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {path}")


def finish(result: dict, out: str, workdir, keep: bool, kept: str = "runs") -> dict:
    """End of every benchmark: write ``result`` to ``out`` (if given), then keep or delete ``workdir``."""
    if out:
        write_json(out, result)
    if keep:
        print(f"{kept} kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return result

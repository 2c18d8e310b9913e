"""The run folder of grpo.py: checkpoints written complete or not at all, resumed exactly, and the run's logs.

A run folder (``--output_dir``) holds::

    config.json          the flags, prompt template, versions (written at the start; read back by --resume)
    metrics.jsonl        one JSON line per step and per evaluation (also sent to the --report_to trackers)
    samples/step_*.jsonl a few logged groups per step, token by token with each token's credit (report.py)
    samples/summary.json at the end: the numbers of those samples (DelTA's tokens, on the toy where the credit
                         lands), written by samples_summary.write_samples_summary
    tensorboard/         event files, with --report_to tensorboard
    checkpoint-<step>/   resumable: weights or LoRA adapter, tokenizer, run_info.json, optimizer.pt, rng_state.pt,
                         trainer_state.json (written last: its presence marks the folder complete)
    final/               save_pretrained folder of the trained policy and run_info.json (its prompt template, base
                         model, credit): evaluate.py --model <run>/final uses the template it was trained with
    summary.json         the before/after evaluation and the last step's record

A new run refuses a folder that holds an earlier one (``--resume`` continues it, ``--overwrite_output_dir`` deletes
it first), but for a run that stopped (Ctrl-C, a crash) before its first checkpoint: there is nothing to resume, so
the new run moves its logs into ``interrupted-<k>/`` there, says so in one line, and starts. Nothing is written
before the model has loaded, so a run that fails to start leaves no folder.

Every folder is written into a temporary sibling ``<name>.tmp-<pid>-<hex>`` and renamed into place when complete, so
a crash leaves the previous checkpoints intact and no half-written ``checkpoint-<step>``; folders and files get the
umask's modes (0755 and 0644 under umask 022), as ``save_pretrained`` into a plain folder gives, the temporary ones
too. A save that was stopped (Ctrl-C, a kill) leaves its temporary folder (a whole model copy): the next run in the
folder, plain or ``--resume``, removes those whose process is gone, in one line (``clear_stale_saves``). Under
torchrun every process calls the save functions (the FSDP2 shards are gathered, distributed.py) and process 0 writes.

Nothing here knows about credit rules, policy.py or the report page: the trainer hands over its state as a
dict, the model as an object to save or load into, and report.py reads the folder back. Left out on purpose: keeping
only the last N checkpoints, asynchronous or sharded (per-process) checkpoint files, and cloud storage.
Read next: grpo.py ``train``, which calls these.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import random
import re
import secrets
import shutil
import time

import torch

from trainer import distributed

TRAINER_STATE = "trainer_state.json"  # written last into a checkpoint: its presence marks the folder complete
_CKPT_RE = re.compile(r"checkpoint-(\d+)")
# What a run writes into its folder (a save in progress: <name>.tmp-*), and where the logs of a run stopped before
# its first checkpoint are moved by the next run there (RunFolder)
RUN_FILES = re.compile(
    r"config\.json|metrics\.jsonl|samples|tensorboard|summary\.json|"
    r"(checkpoint-\d+|final)(\.tmp.*)?"
)
# What report.py writes into a run's folder (``python tools/report.py runs/x``): its page, report.html by default (any
# ``--output <name>.html``), and the page's numbers beside it (<name>.json). Part of the run for RunFolder: moved
# aside with its logs, deleted with it.
REPORT_PAGE = re.compile(r".+\.html")
SET_ASIDE = re.compile(r"interrupted-(\d+)")
# A save's temporary folders: ``_new_tmp_dir``'s <name>.tmp-<pid>-<hex> (group 2: the pid) and ``_replace_dir``'s
# <name>.tmp-old-<pid> (group 3), the checkpoint it replaces, for the moment between its two renames
TMP_SAVE = re.compile(r"(checkpoint-\d+|final)\.tmp-(?:(\d+)-[0-9a-f]+|old-(\d+))")


# Flags that may change between a run and its --resume: when it stops, what it logs and saves, how it samples (vLLM
# or HF draw different random numbers, but from the same policy) and how it computes the same update (micro-batches,
# padding-free, the shared prompt pass, the fused stage 4, DelTA's implementation: equal to rounding). Everything
# else decides the updates.
RESUME_MAY_CHANGE = {
    "resume",
    "grade_workers",
    "max_steps",
    "save_steps",
    "logging_steps",
    "eval_steps",
    "eval_num_generations",
    "num_samples_to_log",
    "num_threads",
    "output_dir",
    "use_vllm",
    "vllm_gpu_memory_utilization",
    "vllm_enable_sleep_mode",
    "micro_batch_size",
    "padding_free",
    "shared_prompt",
    "fuse_old_logprobs",
    "delta_impl",
    "gradient_checkpointing",
    "overwrite_output_dir",
    "report_to",
    "eval_temperature",
    "eval_top_p",
    "dry_run",
    "gpu_memory_gb",
    "plan_processes",
}


# ----------------------------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------------------------
def latest_checkpoint(output_dir: str) -> str | None:
    """The complete checkpoint with the highest step in ``output_dir``, or None.

    Only folders named exactly ``checkpoint-<step>`` that hold ``trainer_state.json`` count: a save in progress
    (or killed) lives in ``checkpoint-<step>.tmp-*`` and a folder without the marker was never completed. A
    finished run's ``final/`` is one too (its marker's step: the run's --max_steps), so a finished run resumes.
    """
    best, best_step = None, -1
    if not os.path.isdir(output_dir):
        return None
    for name in os.listdir(output_dir):
        m = _CKPT_RE.fullmatch(name)
        path = os.path.join(output_dir, name)
        if not os.path.isfile(os.path.join(path, TRAINER_STATE)):
            continue
        if name == "final":
            with open(os.path.join(path, TRAINER_STATE)) as f:
                step = json.load(f)["step"]
        else:
            step = int(m.group(1)) if m else -1
        if step > best_step:
            best, best_step = path, step
    return best


def _replace_dir(tmp: str, path: str) -> None:
    # os.replace cannot overwrite a non-empty folder: move the old one aside first (its name has .tmp, so it is
    # never taken for a checkpoint), then swap in the new one and delete the old one.
    old = None
    if os.path.exists(path):
        old = f"{path}.tmp-old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def _new_tmp_dir(path: str) -> str:
    """A new, empty sibling ``<path>.tmp-<pid>-<random>`` to write ``path`` into before ``_replace_dir``: made by
    ``os.mkdir``, so it has the umask's mode as every other folder the run writes (``tempfile.mkdtemp`` makes 0700:
    other users could not read the model), and a name no other save uses (it fails rather than reuse one)."""
    for _ in range(100):
        tmp = f"{os.path.abspath(path)}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.mkdir(tmp)
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot make a temporary folder beside {path}")


@contextlib.contextmanager
def _writing(path: str):
    """A new temporary sibling of ``path`` to write into (``_new_tmp_dir``), renamed into place when the block ends,
    or removed when it raises: an exception or Ctrl-C inside a save leaves no ``.tmp-*`` folder in this process (a
    killed process's are swept when the run folder is next opened)."""
    tmp = _new_tmp_dir(path)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _replace_dir(tmp, path)


def _follow_umask(folder: str) -> None:
    """Give every file under ``folder`` its folder's mode without the execute bits (0644 under umask 022): the
    safetensors writer makes model.safetensors 0600 whatever the umask. The folder's own mode (``_new_tmp_dir``'s
    ``os.mkdir``) is the umask's, read without changing the process's umask."""
    mode = os.stat(folder).st_mode & 0o666
    for root, _, files in os.walk(folder):
        for name in files:
            os.chmod(os.path.join(root, name), mode)


def _process_gone(pid: int) -> bool:
    """Whether no process ``pid`` runs on this machine (``os.kill`` with signal 0 only checks; a process of another
    user exists too). pid 0 or less names no single process: not gone."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):  # another user's process; a number no pid can be (not a save of ours)
        return False
    return False


def stale_saves(output_dir: str) -> list[str]:
    """The names of the temporary save folders in ``output_dir`` (``TMP_SAVE``) whose process is gone: a save
    stopped by Ctrl-C or a kill, a whole model copy that nothing else removes. Those of a running process (a save in
    progress) are not listed. The pid is checked on this machine: a save in progress on another machine, into the
    same folder, is not seen."""
    if not os.path.isdir(output_dir):
        return []
    names = []
    for name in sorted(os.listdir(output_dir)):
        m = TMP_SAVE.fullmatch(name)
        if m and os.path.isdir(os.path.join(output_dir, name)) and _process_gone(int(m.group(2) or m.group(3))):
            names.append(name)
    return names


def _folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(folder) for f in files)


def clear_stale_saves(output_dir: str, say=print) -> None:
    """Remove ``stale_saves(output_dir)``, saying so in one line (names and bytes freed); nothing is said when there
    are none. A ``<name>.tmp-old-<pid>`` whose ``<name>`` is missing (the process died between ``_replace_dir``'s
    two renames) is the only copy of that checkpoint: it is renamed back to ``<name>`` instead, in its own line."""
    removed, freed = [], 0
    for name in stale_saves(output_dir):
        folder = os.path.join(output_dir, name)
        m = TMP_SAVE.fullmatch(name)
        target = os.path.join(output_dir, m.group(1))
        if m.group(3) is not None and not os.path.exists(target):  # a .tmp-old-<pid>, the only copy left
            os.replace(folder, target)
            say(f"[run] {folder}/ renamed back to {target}/: its process stopped while replacing it")
            continue
        size = _folder_bytes(folder)
        shutil.rmtree(folder, ignore_errors=True)
        if not os.path.exists(folder):
            removed.append(name)
            freed += size
    if removed:
        say(
            f"[run] removed {', '.join(n + '/' for n in removed)} from {output_dir} ({freed / 2**30:.2f} GiB): "
            f"the unfinished save{'s' * (len(removed) != 1)} of a process that is gone"
        )


def save_model(model, tokenizer, path: str, info: dict | None = None) -> None:
    """``save_pretrained`` (safetensors) of the model (a peft model: its adapter) and tokenizer, written to a
    temporary folder and renamed into place. Under FSDP2 every process calls it and process 0 writes the gathered
    full weights: the folder loads with ``from_pretrained`` (or peft) with no torch.distributed. ``info`` is written
    as ``run_info.json`` (how the model was trained, e.g. its prompt template)."""
    sd = distributed.gathered_model_state(model)
    if distributed.rank() != 0:
        return
    with _writing(path) as tmp:
        _save_model_folder(tmp, model, tokenizer, sd, info)
        _follow_umask(tmp)


def _save_model_folder(folder: str, model, tokenizer, state_dict: dict | None, info: dict | None) -> None:
    """``save_pretrained`` of model (or adapter) and tokenizer, and ``info`` as ``run_info.json`` (how the model
    was trained: its prompt template, base model, credit). transformers' "Writing model shards" bar is off: it
    would break the training bar in the middle of a run (the trainer says one line instead)."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(folder, **({"state_dict": state_dict} if state_dict is not None else {}))
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(folder)
    if not info:
        return
    with open(os.path.join(folder, "run_info.json"), "w") as f:
        json.dump(info, f, indent=1)
    adapter = os.path.join(folder, "adapter_config.json")
    if os.path.exists(adapter) and info.get("base_model"):  # name the base model as the user did ("toy", a hub
        with open(adapter) as f:  # id), not by this machine's cache path
            config = json.load(f)
        with open(adapter, "w") as f:
            json.dump({**config, "base_model_name_or_path": info["base_model"]}, f, indent=2, sort_keys=True)
        card, local = os.path.join(folder, "README.md"), config.get("base_model_name_or_path")
        if local and os.path.exists(card):  # peft's model card names it too (`base_model:`, a tag)
            with open(card) as f:
                text = f.read()
            with open(card, "w") as f:
                f.write(text.replace(local, info["base_model"]))


def save_checkpoint(path: str, model, tokenizer, optimizer, state: dict, info: dict | None = None) -> None:
    """Write a resumable checkpoint into ``path`` (e.g. ``<output_dir>/checkpoint-<step>``), atomically.

    Contents: the model (``save_pretrained``, safetensors) or, for a peft model, the adapter only; the tokenizer;
    ``optimizer.pt`` (AdamW moments and step counts, keyed by parameter name with full tensors, so a checkpoint
    written by N processes resumes in M); ``rng_state.pt`` (python, torch CPU and every CUDA device); ``info`` as
    ``run_info.json``; and last ``trainer_state.json`` (``state``: step, sampler position, metrics.jsonl length...).
    Under torchrun every process must call this; process 0 writes (``--output_dir`` must be on a filesystem every
    process sees, for ``--resume``).
    """
    model_sd = distributed.gathered_model_state(model)
    optim_sd = distributed.full_optimizer_state(model, optimizer)
    if distributed.rank() != 0:
        return
    rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    with _writing(path) as tmp:
        _save_model_folder(tmp, model, tokenizer, model_sd, info)
        _follow_umask(tmp)  # now, before the optimizer's long write: a save stopped there leaves no 0600 model file
        torch.save(optim_sd, os.path.join(tmp, "optimizer.pt"))  # this and the next files: open()'s umask modes
        torch.save(rng, os.path.join(tmp, "rng_state.pt"))
        with open(os.path.join(tmp, TRAINER_STATE), "w") as f:  # last: its presence marks the folder complete
            json.dump(state, f, indent=1)


def _load_full_weights(model, folder: str) -> None:
    """Copy a ``save_pretrained`` folder's safetensors weights (one file or shards) into ``model`` in place."""
    from safetensors.torch import load_file

    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    own, loaded = model.state_dict(), set()
    for name in files:
        sd = load_file(os.path.join(folder, name))
        unexpected = model.load_state_dict(sd, strict=False).unexpected_keys
        if unexpected:
            raise ValueError(f"checkpoint {folder} has weights the model does not: {unexpected[:3]}")
        loaded |= set(sd)
    # a key save_pretrained left out is fine only if it is tied to a loaded one (e.g. lm_head = embed_tokens)
    ptrs = {own[k].data_ptr() for k in loaded}
    missing = [k for k in own if k not in loaded and own[k].data_ptr() not in ptrs]
    if missing:
        raise ValueError(f"checkpoint {folder} lacks weights: {missing[:3]}")


def load_checkpoint_weights(path: str, model, use_peft: bool) -> dict:
    """The weights (or adapter) of a ``save_checkpoint`` folder into the *unsharded* ``model``; returns the trainer
    state. Raises ValueError: written with(out) ``--use_peft`` while this run is not, or weights that do not
    match the model."""
    with open(os.path.join(path, TRAINER_STATE)) as f:
        state = json.load(f)
    if bool(state.get("use_peft")) != use_peft:
        raise ValueError(
            f"checkpoint {path} was written {'with' if state.get('use_peft') else 'without'} "
            f"--use_peft; resume it with the same setting"
        )
    if use_peft:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        res = set_peft_model_state_dict(model, load_file(os.path.join(path, "adapter_model.safetensors")))
        if getattr(res, "unexpected_keys", None):
            raise ValueError(f"adapter in {path} does not match --lora_* settings: {res.unexpected_keys[:3]}")
    else:
        _load_full_weights(model, path)
    return state


def load_checkpoint_optimizer(path: str, model, optimizer) -> None:
    """The AdamW state and RNG states of a ``save_checkpoint`` folder. Under FSDP2 (after sharding) every process
    calls it: process 0 reads the full state and each process keeps its own shard."""
    many = distributed.is_distributed()
    osd = {}
    if distributed.rank() == 0:
        osd = torch.load(os.path.join(path, "optimizer.pt"), map_location="cpu", weights_only=True)
    distributed.load_full_optimizer_state(model, optimizer, osd)
    rng = torch.load(os.path.join(path, "rng_state.pt"), weights_only=True)
    random.setstate(tuple(x if not isinstance(x, list) else tuple(x) for x in rng["python"]))
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available() and not many:
        torch.cuda.set_rng_state_all(rng["cuda"])


def changed_settings(path: str, config: dict) -> list[str]:
    """The training settings of ``config`` that differ from the run's ``config.json`` at ``path`` (none when it is
    missing or unreadable), each ``--flag old -> new``; the flags a --resume may change are left out."""
    try:
        with open(path) as f:
            old = json.load(f).get("config", {})
    except (OSError, ValueError):
        return []
    return [
        f"--{k} {old[k]!r} -> {config[k]!r}"
        for k in sorted(config)
        if k in old and k not in RESUME_MAY_CHANGE and old[k] != config[k]
    ]


def check_resume_config(path: str, config: dict) -> None:
    """Refuse to resume a run with different training settings (its metrics.jsonl would mix two runs).

    Args:
        path: the run's ``config.json``; config: this run's flags (``dataclasses.asdict``).
    Raises:
        ValueError: naming each changed flag with its old and new value.
    """
    changed = changed_settings(path, config)
    if changed:
        raise ValueError(
            f"--resume with settings that differ from {path}: {', '.join(changed)}; resume with the "
            f"same settings, or start a new run in another --output_dir"
        )


def library_versions() -> dict:
    """Versions of the libraries that decide the numbers (saved next to every result)."""
    import importlib.metadata as md
    import sys

    versions = {"python": sys.version.split()[0]}
    for pkg in ("torch", "transformers", "peft", "math-verify", "vllm", "numpy", "datasets"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return versions


# ----------------------------------------------------------------------------------------------------------
# Experiment trackers (--report_to, TRL's flag and names): the same values as metrics.jsonl, under the same names
# ----------------------------------------------------------------------------------------------------------
TRACKERS = {
    "tensorboard": ("torch.utils.tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "trackio": ("trackio", "trackio"),
}  # --report_to name: (module imported, package to install)


def import_trackers(report_to: str) -> dict:
    """The modules of ``--report_to`` (``none``, or names from ``TRACKERS`` comma-separated), imported now, before
    any model loads; none of them is imported unless asked for. Raises ValueError naming an unknown tracker or the
    package to install."""
    names = [n.strip() for n in (report_to or "none").split(",") if n.strip() not in ("", "none")]
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ValueError(
            f"--report_to {report_to}: unknown tracker {unknown[0]!r}; choose none, or any of "
            f"{', '.join(TRACKERS)} (comma-separated)"
        )
    modules = {}
    for name in names:
        module, package = TRACKERS[name]
        try:
            modules[name] = importlib.import_module(module)
        except ImportError:
            raise ValueError(f"--report_to {name} needs the {package} package: pip install {package}") from None
    return modules


class Tracker:
    """One open experiment tracker: ``log(values, step)``, ``close()``.

    tensorboard: event files in ``<run>/tensorboard/`` (``tensorboard --logdir <run>``); a resumed run purges the
    events after its checkpoint's step, as metrics.jsonl drops those lines. wandb and trackio share one API
    (``init(project, name, config)``, ``run.log(values, step=)``, ``run.finish()``): the project is
    ``$WANDB_PROJECT`` / ``$TRACKIO_PROJECT`` (default ``rlvr-credit``), the run is named after its folder.
    """

    def __init__(self, name: str, module, path: str, config: dict, first_step: int):
        self.name = name
        if name == "tensorboard":
            self.run = module.SummaryWriter(os.path.join(path, "tensorboard"), purge_step=first_step or None)
        else:
            self.run = module.init(
                project=os.environ.get(f"{name.upper()}_PROJECT", "rlvr-credit"),
                name=os.path.basename(os.path.abspath(path)),
                config=config,
            )

    def log(self, values: dict, step: int) -> None:
        if self.name == "tensorboard":
            for k, v in values.items():
                self.run.add_scalar(k, v, global_step=step)
        else:
            self.run.log(values, step=step)

    def close(self) -> None:
        if self.name == "tensorboard":
            self.run.close()
        else:
            self.run.finish()


# ----------------------------------------------------------------------------------------------------------
# The run's logs
# ----------------------------------------------------------------------------------------------------------
def default_run_folder(model: str, credit: str) -> str:
    """``runs/<credit>`` for the toy, ``runs/<model>-<credit>`` otherwise (the model's last path part, e.g.
    runs/Qwen3-8B-Base-delta): two runs of different models or credits never share a folder by default."""
    name = os.path.basename(os.path.normpath(os.path.expanduser(model)))
    return os.path.join("runs", credit if model == "toy" else f"{name}-{credit}")


def check_writable(path: str) -> None:
    """ValueError (one line naming --output_dir) when the run folder ``path`` could not be created or written: checked
    on the folder, or the nearest folder above it that exists, before any model loads, and without writing."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"--output_dir {path}: {existing} is a file, not a folder; choose another --output_dir")
    if not os.access(existing, os.W_OK | os.X_OK):  # also False on a read-only file system (EROFS), even for root
        raise ValueError(
            f"--output_dir {path} cannot be written ({existing} is read-only or not writable by this "
            f"user); choose another --output_dir"
        )


class RunFolder:
    """config.json, metrics.jsonl, samples/ and summary.json of one run; only process 0 writes (``main``)."""

    def __init__(self, path: str, config: dict, main: bool = True, say=print):
        """Open the run folder ``path`` for a run with flags ``config`` (``dataclasses.asdict`` of the trainer's),
        deciding what happens to what is already there, before any model is loaded:

        * nothing there (or an empty folder): a new run;
        * ``config["resume"]``: continue from its latest complete checkpoint (``resume_from``), after checking that
          the checkpoint, metrics.jsonl and config.json fit together and the training settings did not change;
        * ``config["overwrite_output_dir"]``: a new run; the earlier one is deleted by ``start`` (after the model
          loaded, so a run that fails to start loses nothing);
        * a run of this trainer that stopped before its first complete checkpoint (only its own files there, and
          report.py's page on it): a new run; ``start`` moves those files into ``interrupted-<k>/`` (``set_aside``),
          with one line;
        * otherwise an earlier run there stops this one: ValueError naming the ways forward that work (--resume only
          where a checkpoint is: no message sends the user to a command that refuses in turn).
        The trackers of ``config["report_to"]`` are imported here (``import_trackers``) and opened by ``start``.
        First the temporary folders of saves whose process is gone are removed (``clear_stale_saves``, one line);
        nothing is written here: a run that fails before ``start`` leaves no folder behind.
        Raises ValueError: see above, and an unknown or missing tracker; each case in one line that says what to do.
        """
        self.path, self.config, self.main, self.say, self.metrics_file = path, config, main, say, None
        self.skipped_updates_total = 0  # non-finite updates skipped so far (kept across --resume)
        self.resume_from, self.resume_state, self.model_info = None, None, {}
        self._tracker_modules, self.trackers = import_trackers(config.get("report_to", "none")), []
        self.set_aside = []  # the names start() moves into interrupted-<k>/ (a run stopped before its checkpoint)
        if main:
            check_writable(path)
            clear_stale_saves(path, say)
        stale = set(stale_saves(path))  # the other processes: what process 0 removes now is no earlier run
        earlier = (
            [n for n in sorted(os.listdir(path)) if not SET_ASIDE.fullmatch(n) and n not in stale]
            if os.path.isdir(path)
            else []
        )
        if config.get("resume"):
            self.resume_from = latest_checkpoint(path)
            if self.resume_from is None and earlier and self._stopped_before_a_checkpoint(earlier):
                raise ValueError(
                    f"--resume: {path} holds no complete checkpoint-<step>/ (the run stopped before its "
                    f"first --save_steps); run the same command without --resume to start again (its "
                    f"logs are moved aside), or with --overwrite_output_dir to delete them"
                )
            if self.resume_from is None and earlier:  # not this trainer's logs alone: nothing it may move aside
                raise ValueError(
                    f"--resume: {path} holds no complete checkpoint-<step>/ and files this trainer did "
                    f"not write ({self._listed(self._foreign(earlier) or earlier)}): "
                    f"--overwrite_output_dir deletes them all and starts again, or choose another "
                    f"--output_dir"
                )
            if self.resume_from is None:
                say(f"[resume] {path} is empty: starting from step 0")
            else:
                self._check_resumable()
        elif earlier and not config.get("overwrite_output_dir"):
            if self._stopped_before_a_checkpoint(earlier):  # nothing to resume: start again, its logs kept aside
                self.set_aside = earlier
                return
            if latest_checkpoint(path) is None:  # --resume would refuse it too: name only what works
                raise ValueError(
                    f"{path} holds files this trainer did not write "
                    f"({self._listed(self._foreign(earlier) or earlier)}) and no checkpoint to resume: "
                    f"--overwrite_output_dir deletes them all and starts again, or choose another "
                    f"--output_dir"
                )
            changed = changed_settings(os.path.join(path, "config.json"), config)
            if changed:  # --resume would refuse these settings: name only what works
                raise ValueError(
                    f"{path} already holds a run with other settings ({', '.join(changed[:3])}"
                    f"{', ...' if len(changed) > 3 else ''}): choose another --output_dir, or --overwrite_output_dir "
                    "to delete it and start again"
                )
            raise ValueError(
                f"{path} already holds a run ({self._listed(earlier)}): pass --resume to continue it, or "
                f"--overwrite_output_dir to delete it and start again (or choose another --output_dir)"
            )

    @staticmethod
    def _foreign(names: list[str]) -> list[str]:
        """The names of a folder's listing that are neither what a run of this trainer writes (``RUN_FILES``) nor
        what report.py writes about it (``REPORT_PAGE``: a page, and the <name>.json of its numbers beside it)."""
        pages = {n.removesuffix(".html") for n in names if REPORT_PAGE.fullmatch(n)}
        return [
            n
            for n in names
            if not (
                RUN_FILES.fullmatch(n)
                or REPORT_PAGE.fullmatch(n)
                or n.endswith(".json")
                and n.removesuffix(".json") in pages
            )
        ]

    @staticmethod
    def _listed(names: list[str]) -> str:
        return f"{', '.join(names[:4])}{', ...' if len(names) > 4 else ''}"

    def _stopped_before_a_checkpoint(self, names: list[str]) -> bool:
        """Whether the folder holds a run of this trainer (its config.json) that stopped (Ctrl-C, a crash) before
        its first complete checkpoint, and nothing else (report.py's page on it included: ``_foreign``): nothing
        to resume. TRL's trainer never refuses a folder; this one starts again there, after moving those logs aside
        (``start``)."""
        if latest_checkpoint(self.path) is not None or self._foreign(names):
            return False
        try:
            with open(os.path.join(self.path, "config.json")) as f:
                return isinstance(json.load(f).get("config"), dict)
        except (OSError, ValueError, AttributeError):
            return False

    def _aside_folder(self) -> str:
        """``<path>/interrupted-<k>``, the first k from 1 not taken."""
        k = 1
        while os.path.exists(os.path.join(self.path, f"interrupted-{k}")):
            k += 1
        return os.path.join(self.path, f"interrupted-{k}")

    def interrupted_note(self) -> str:
        """What an interrupted run leaves and what the next command does with it, for the trainer's one line."""
        last = latest_checkpoint(self.path)
        if last is not None:
            with open(os.path.join(last, TRAINER_STATE)) as f:
                step = json.load(f)["step"]
            return (
                f"{last} holds step {step}: the same command with --resume continues from there (without it, the "
                f"run folder is refused)"
            )
        steps = sum('"reward"' in line for line in self.metrics_lines())
        if not steps:
            return f"stopped before step 1, nothing kept in {self.path}; the same command starts again"
        every = self.config.get("save_steps")
        return (
            f"{self.path} holds the logs of {steps} step{'s' * (steps != 1)} and no checkpoint ("
            + (f"--save_steps {every} writes the first at step {every}" if every else "--save_steps 0")
            + f"): the same command starts again, after moving them to {self._aside_folder()}/"
        )

    def _check_resumable(self) -> None:
        """The checkpoint, metrics.jsonl and config.json of ``resume_from`` describe one run with these settings."""
        with open(os.path.join(self.resume_from, TRAINER_STATE)) as f:
            self.resume_state = json.load(f)
        have, keep = len(self.metrics_lines()), self.resume_state["metrics_lines"]
        if have < keep:
            raise ValueError(
                f"cannot --resume from {self.resume_from}: {self.metrics_path} has {have} line"
                f"{'s' * (have != 1)}, fewer than the {keep} logged when that checkpoint was written "
                "(another run wrote here since); start again with --overwrite_output_dir or use another "
                "--output_dir"
            )
        check_resume_config(os.path.join(self.path, "config.json"), self.config)
        self.skipped_updates_total = self.resume_state["skipped_updates_total"]

    def load_weights(self, model) -> None:
        """``--resume``: the weights (or adapter) of ``resume_from`` into the unsharded ``model`` (policy.build's
        ``load_weights`` hook: after the frozen reference is made, before sharding); nothing for a new run."""
        if self.resume_from is not None:
            load_checkpoint_weights(self.resume_from, model, bool(self.config.get("use_peft")))

    def load_optimizer(self, model, optimizer) -> dict | None:
        """``--resume``: AdamW's state and the RNG states of ``resume_from`` (after sharding: each process keeps its
        shard), said in one line; returns the checkpoint's trainer state, None for a new run."""
        if self.resume_from is None:
            return None
        load_checkpoint_optimizer(self.resume_from, model, optimizer)
        state = self.resume_state
        self.say(f"[resume] from {self.resume_from}: step {state['step']}, {state['metrics_lines']} metrics lines kept")
        return state

    def start(self, model, info: dict) -> None:
        """Begin the run's logs: delete an earlier run (``--overwrite_output_dir``), write config.json (the flags,
        ``info``, the model's sizes, library versions), open metrics.jsonl (``open_metrics``). ``info`` must name
        the ``prompt_template``: it is also written as ``run_info.json`` into every saved model folder, so
        ``--prompt_template auto`` finds it there (rollout.resolve_template). Every process calls it."""
        self.model_info = {
            "prompt_template": info["prompt_template"],
            "base_model": self.config.get("model"),
            "credit": self.config.get("credit"),
        }
        distributed.barrier()  # every process has read the old config.json before process 0 rewrites it
        if self.main:
            if self.config.get("overwrite_output_dir") and not self.config.get("resume"):
                shutil.rmtree(self.path, ignore_errors=True)
            elif self.set_aside:  # a run stopped before its first checkpoint: its logs kept, out of the way
                aside = self._aside_folder()
                steps = sum('"reward"' in line for line in self.metrics_lines())
                os.makedirs(aside)
                for name in self.set_aside:
                    os.replace(os.path.join(self.path, name), os.path.join(aside, name))
                self.say(
                    f"[run] {self.path} held a run stopped after {steps} step{'s' * (steps != 1)}, before its "
                    f"first checkpoint: its logs are now in {aside}/; starting from step 0"
                )
            os.makedirs(os.path.join(self.path, "samples"), exist_ok=True)
        self.write_json(
            "config.json",
            {
                "config": self.config,
                **info,
                "num_parameters": sum(p.numel() for p in model.parameters()),
                "num_trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
                "resumed_from": self.resume_from,
                "versions": library_versions(),
            },
        )
        self.open_metrics(self.resume_state, self.resume_from)
        if self.main:  # after the old run was deleted: a tracker may write into the folder
            first = self.resume_state["step"] + 1 if self.resume_state else 0
            self.trackers = [
                Tracker(name, module, self.path, self.config, first) for name, module in self._tracker_modules.items()
            ]

    @property
    def metrics_path(self) -> str:
        return os.path.join(self.path, "metrics.jsonl")

    def metrics_lines(self) -> list[str]:
        if not os.path.exists(self.metrics_path):
            return []
        with open(self.metrics_path) as f:
            return f.read().splitlines(keepends=True)

    def read_metrics(self) -> list[dict]:
        return [json.loads(line) for line in self.metrics_lines() if line.strip()]

    def write_json(self, name: str, obj: dict) -> None:
        if self.main:
            with open(os.path.join(self.path, name), "w") as f:
                json.dump(obj, f, indent=1)

    def open_metrics(self, resume_state: dict | None, checkpoint: str | None = None) -> None:
        """Start metrics.jsonl: a run from step 0 starts a new file (never mixing two runs); a resumed run first
        drops the lines logged after its checkpoint (no step twice; ``_check_resumable`` made sure they exist),
        then appends."""
        if resume_state is not None and self.main:
            lines = self.metrics_lines()[: resume_state["metrics_lines"]]
            with open(self.metrics_path + ".tmp", "w") as f:
                f.writelines(lines)
            os.replace(self.metrics_path + ".tmp", self.metrics_path)
        if self.main:
            self.metrics_file = open(self.metrics_path, "a" if resume_state is not None else "w")

    def close(self) -> None:
        if self.metrics_file is not None:
            self.metrics_file.close()
            self.metrics_file = None
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []

    def logged_eval(self, step: int) -> dict:
        """The evaluation record logged at ``step`` (a resumed run reads its "before" evaluation back), or {}."""
        return next(
            (r for r in self.read_metrics() if r.get("step") == step and any(k.startswith("eval/") for k in r)), {}
        )

    def _state(self, state: dict) -> dict:  # the trainer's state + what the run folder knows, for trainer_state.json
        return {
            "metrics_lines": len(self.metrics_lines()) if self.main else 0,
            "skipped_updates_total": self.skipped_updates_total,
            "use_peft": self.config.get("use_peft", False),
            "model": self.config.get("model"),
            "seed": self.config.get("seed"),
            **state,
        }

    def save_checkpoint(self, step: int, model, tokenizer, optimizer, state: dict) -> None:
        """``save_checkpoint`` into ``checkpoint-<step>``; the trainer ``state`` gains the step, the number of
        metrics.jsonl lines so far (``--resume`` cuts the log back to them), the skipped-update count and the run's
        ``use_peft``, ``model`` and ``seed``. Every process calls it."""
        t0, path = time.time(), os.path.join(self.path, f"checkpoint-{step}")
        save_checkpoint(path, model, tokenizer, optimizer, self._state({"step": step, **state}), self.model_info)
        self.say(f"[checkpoint] step {step}: {path} ({time.time() - t0:.1f} s)")

    def finished(self, max_steps: int) -> bool:
        """A ``--resume`` of a run that already ran ``max_steps`` steps (its latest checkpoint is its ``final/``, or
        a later one): says so in one line; nothing is written or deleted."""
        if self.resume_state is None or self.resume_state["step"] < max_steps:
            return False
        self.say(
            f"[resume] {self.path} has run {self.resume_state['step']} steps (--max_steps {max_steps}): nothing "
            f"to do; pass a larger --max_steps to train on"
        )
        return True

    def summary(self) -> dict:
        """The run's summary.json ({} if it has none)."""
        path = os.path.join(self.path, "summary.json")
        if not os.path.exists(path):
            return {}
        with open(path) as f:
            return json.load(f)

    def discard(self) -> None:
        """Remove what ``start`` wrote, for a run that stopped before its first training step (a bad flag value met
        late, an interrupted first evaluation): the corrected rerun then finds an empty folder. Process 0."""
        self.close()
        if self.main and self.resume_from is None and os.path.isdir(self.path):
            names = os.listdir(self.path)
            if not any(SET_ASIDE.fullmatch(n) for n in names):
                shutil.rmtree(self.path, ignore_errors=True)
            for name in names:  # an earlier run's logs, set aside by start, stay
                path = os.path.join(self.path, name)
                if SET_ASIDE.fullmatch(name) or not os.path.exists(path):
                    continue
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.remove(path)

    def finish(self, model, tokenizer, summary: dict, optimizer=None, state: dict | None = None) -> None:
        """Write ``final/`` and summary.json; every process calls it and waits for process 0. ``final/`` is the model
        (``save_pretrained``); with ``optimizer`` and the trainer ``state`` (its ``step`` the run's last) it is also a
        checkpoint, so that ``--resume`` of a finished run has nothing to redo (AdamW's moments: twice the trainable
        weights, float32). samples/summary.json is the reader's: samples_summary's ``write_samples_summary``,
        which the trainer calls after this."""
        if optimizer is None:
            save_model(model, tokenizer, os.path.join(self.path, "final"), self.model_info)
        else:
            save_checkpoint(
                os.path.join(self.path, "final"), model, tokenizer, optimizer, self._state(state), self.model_info
            )
        self.write_json("summary.json", summary)
        distributed.barrier()  # nobody leaves before process 0 has written final/

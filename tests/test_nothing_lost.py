"""Nothing lost, nothing silent: a flag met late leaves no folder behind, a finished run resumes to nothing, a batch
without learning signal moves nothing (issue: every flag checked before anything is written)."""

import json
import os

import pytest
import torch

import comparisons
import grpo
import verify

BASE = [
    "--max_steps",
    "2",
    "--num_prompts_per_step",
    "4",
    "--num_generations",
    "4",
    "--eval_num_generations",
    "2",
    "--save_steps",
    "0",
]


def _lines(folder):
    return (folder / "metrics.jsonl").read_text().splitlines()


def test_bad_cscr_template_stops_before_anything_is_written(toy_model_path, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match="--cscr_template 'nonsense'"):
        grpo.main(
            [
                "--model",
                toy_model_path,
                "--credit",
                "cscr",
                "--cscr_template",
                "nonsense",
                "--output_dir",
                str(out),
                *BASE,
            ]
        )
    assert not out.exists()


def test_a_run_that_stops_before_its_first_step_leaves_nothing(toy_model_path, tmp_path, monkeypatch):
    """An error in step 1 (after the step-0 evaluation was logged) removes the run folder: the rerun starts."""
    out = tmp_path / "run"

    def broken(*args, **kwargs):
        raise RuntimeError("broken in step 1")

    monkeypatch.setattr(grpo, "train_step", broken)
    with pytest.raises(RuntimeError, match="broken in step 1"):
        grpo.main(["--model", toy_model_path, "--output_dir", str(out), *BASE])
    assert not out.exists()
    monkeypatch.undo()
    grpo.main(["--model", toy_model_path, "--output_dir", str(out), *BASE])
    assert len(_lines(out)) == 4  # eval 0, steps 1 and 2, eval 2


@pytest.mark.slow
def test_resume_of_a_finished_run_does_nothing_and_loses_no_row(toy_model_path, tmp_path, capsys):
    out = tmp_path / "run"
    grpo.main(["--model", toy_model_path, "--output_dir", str(out), *BASE])
    before = {name: (out / name).read_bytes() for name in ("metrics.jsonl", "summary.json")}
    weights = (out / "final" / "model.safetensors").read_bytes()
    capsys.readouterr()
    grpo.main(["--model", toy_model_path, "--output_dir", str(out), "--resume", *BASE])
    said = capsys.readouterr()
    assert "nothing to do" in said.out + said.err
    assert {name: (out / name).read_bytes() for name in before} == before
    assert (out / "final" / "model.safetensors").read_bytes() == weights
    # a larger --max_steps trains on from the final state: the rows so far are kept, the new ones appended
    grpo.main(["--model", toy_model_path, "--output_dir", str(out), "--resume", *BASE[2:], "--max_steps", "3"])
    lines = [json.loads(line) for line in _lines(out)]
    assert [line["step"] for line in lines] == [0, 1, 2, 2, 3, 3]
    assert _lines(out)[:4] == before["metrics.jsonl"].decode().splitlines()


@pytest.mark.parametrize(
    "flags",
    [
        ["--credit", "grpo"],
        ["--credit", "delta"],
        ["--credit", "fipo"],
        ["--loss_type", "sapo"],
        ["--entropy_top_ratio", "0.2"],
        ["--credit", "cscr", "--cscr_threshold_quantile", "0.8"],
    ],
)
def test_a_batch_without_signal_moves_nothing(toy_model_path, tmp_path, monkeypatch, flags):
    """Every group's rewards equal: every advantage is 0, so the optimizer step is skipped (weight decay and AdamW's
    momentum would move the weights); metrics.jsonl says so; CSCR's calibration waits for a batch with signal."""
    monkeypatch.setattr(verify, "grade_batch", lambda texts, answers, *a, **kw: [(False, "ok")] * len(texts))
    out = tmp_path / "run"
    comparisons.main(["--model", toy_model_path, "--output_dir", str(out), "--weight_decay", "0.1", *BASE, *flags])
    from safetensors.torch import load_file

    start = load_file(os.path.join(toy_model_path, "model.safetensors"))
    end = load_file(str(out / "final" / "model.safetensors"))
    assert all(torch.equal(start[k], end[k]) for k in start)
    optimizer = torch.load(out / "final" / "optimizer.pt", weights_only=True)  # (torch's checkpoint writer makes
    moments = [m for st in optimizer["state"].values() for k, m in st.items() if k.startswith("exp_avg")]  # a state)
    assert moments and all(not m.any() for m in moments)  # AdamW never took a step with a gradient
    steps = [json.loads(line) for line in _lines(out) if "reward" in json.loads(line)]
    assert [s["no_signal"] for s in steps] == [1.0, 1.0]


@pytest.mark.parametrize(
    "flags",
    [
        ["--credit", "grpo"],
        ["--credit", "delta"],
        ["--credit", "fipo"],
        ["--loss_type", "sapo"],
        ["--top_entropy_quantile", "0.8"],
        ["--credit", "cscr"],
        ["--credit", "delta", "--delta_select", "top", "--loss_type", "dr_grpo"],
    ],
)
def test_every_step_line_has_the_same_keys_with_or_without_signal(toy_model_path, tmp_path, monkeypatch, flags):
    """Step 1 has no signal (every reward 0), step 2 the verifier's: both metrics.jsonl lines have the same keys
    (a tracker's columns get no holes); where no update ran its statistics are 0.0 and no_signal 1, else 0."""
    grade, calls = verify.grade_batch, []

    def first_batch_flat(texts, answers, *args, **kw):
        calls.append(len(texts))
        return [(False, "ok")] * len(texts) if len(calls) == 1 else grade(texts, answers, *args, **kw)

    monkeypatch.setattr(verify, "grade_batch", first_batch_flat)
    out = tmp_path / "run"
    comparisons.main(
        [
            "--model",
            toy_model_path,
            "--output_dir",
            str(out),
            *BASE[:6],
            "--eval_num_generations",
            "0",
            "--save_steps",
            "0",
            "--seed",
            "1",
            *flags,
        ]
    )
    first, second = [json.loads(line) for line in _lines(out)]
    assert (first["no_signal"], second["no_signal"]) == (1.0, 0.0)  # step 2 had signal: it updated
    assert sorted(first) == sorted(second)
    assert first["clip_ratio/region_mean"] == first["kl"] == first["grad_norm"] == 0.0
    assert any(k.startswith("clip_ratio/") for k in first)


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--temperature", "0"),
        ("--beta", "-1"),
        ("--cscr_alpha", "-1"),
        ("--cscr_w_min", "2"),
        ("--cscr_threshold_quantile", "1.5"),
        ("--eval_num_generations", "-1"),
        ("--weight_decay", "-0.1"),
        ("--entropy_top_ratio", "1.5"),
        ("--sapo_temperature_neg", "0"),
    ],
)
def test_every_bad_value_stops_in_one_line_before_the_folder(tmp_path, flag, value):
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match=flag):
        grpo.main(["--output_dir", str(out), flag, value])
    assert not out.exists()


def test_the_toy_on_other_data_says_why_it_gets_no_template(toy_model_path):
    """Item 8: --data math_train with the toy model says why the template is none (the toy reads bare prompts); the
    toy's own data keeps the quickstart's line."""
    import rollout

    said = []
    assert rollout.resolve_template("auto", toy_model_path, said.append, "math_train") == "none"
    assert said == [
        "[template] none (auto: the toy model reads bare prompts, so --data math_train is asked without a template)"
    ]
    said.clear()
    assert rollout.resolve_template("auto", toy_model_path, said.append, "toy") == "none"
    assert said == ["[template] none (auto: the toy)"]


def test_the_toy_models_parameter_count_is_the_one_its_docstring_gives(toy_model_path):
    """Item 8: toy.py says 813,440 parameters (it said "about 1M")."""
    from transformers import AutoModelForCausalLM

    import toy

    n = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(toy_model_path).parameters())
    assert n == 813_440 and "813,440 parameters" in toy.__doc__


def test_a_missing_data_file_lists_the_training_sets_too(tmp_path):
    """Item 8: the "data file not found" line names the shipped training sets (math_train) beside the benchmarks."""
    from trainer import problems

    with pytest.raises(
        FileNotFoundError,
        match=r"data file not found: nosuch \(benchmark names: aime24, .*; "
        r"training sets: math_train; or toy\)",
    ):
        problems.load_problems("nosuch")
    with pytest.raises(SystemExit, match="^grpo.py: error: --data: data file not found: .*training sets: math_train"):
        grpo.main(["--data", str(tmp_path / "nosuch.jsonl"), "--output_dir", str(tmp_path / "run")])  # before a model
    with pytest.raises(SystemExit, match="^grpo.py: error: --eval_data: data file not found"):  # the flag named
        grpo.main(["--eval_data", str(tmp_path / "nosuch.jsonl"), "--output_dir", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("umask,folder_mode", [(0o022, 0o755), (0o077, 0o700)])
def test_saved_folders_follow_the_umask(tiny, tmp_path, umask, folder_mode):
    """checkpoint-*/ and final/ get the umask's mode, as every other folder the run writes (tempfile.mkdtemp's 0700
    kept other users from reading the model), and are still written whole or not at all (no .tmp-* left)."""
    from trainer import checkpoint

    model, tok = tiny
    old = os.umask(umask)
    try:
        checkpoint.save_checkpoint(
            str(tmp_path / "checkpoint-1"), model, tok, torch.optim.AdamW(model.parameters()), {"step": 1}
        )
        checkpoint.save_checkpoint(
            str(tmp_path / "checkpoint-1"), model, tok, torch.optim.AdamW(model.parameters()), {"step": 1}
        )  # over an existing one: the same mode
        checkpoint.save_model(model, tok, str(tmp_path / "final"))
    finally:
        os.umask(old)
    for name in ("checkpoint-1", "final"):
        assert (tmp_path / name).stat().st_mode & 0o777 == folder_mode, name
        for f in (tmp_path / name).iterdir():
            assert f.stat().st_mode & 0o777 == folder_mode & 0o666, f
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1", "final"]
    assert checkpoint.latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-1")


@pytest.mark.slow
def test_ctrl_c_after_step_1_prints_one_line_and_the_plain_command_starts_again(toy_model_path, tmp_path, capsys):
    """Ctrl-C in a terminal (SIGINT to the whole process group: the trainer and its grading workers) after step 1,
    before the first checkpoint: exit status 130, one line on stderr and no traceback from any process; the folder
    holds nothing to resume, so the same command without --resume starts again there, moving the stopped run's logs
    into interrupted-1/ (nothing lost) and saying so in one line."""
    import signal
    import subprocess
    import sys
    import time

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "run"
    argv = [
        "--model",
        toy_model_path,
        "--output_dir",
        str(out),
        "--num_prompts_per_step",
        "4",
        "--num_generations",
        "4",
        "--eval_num_generations",
        "0",
        "--max_steps",
        "50",
    ]  # first checkpoint: 50
    # its own process group, with SIGINT at its default as a terminal's foreground command has it: a runner started
    # in the background (nohup pytest &, some CI) ignores SIGINT, and an ignored signal stays ignored across exec
    proc = subprocess.Popen(
        [sys.executable, "grpo.py", *argv],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.time() + 600
        while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 1):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    said = [line for line in lines if line.startswith("grpo.py:")]
    n = len(_lines(out))  # the steps logged when the signal landed: 1, or 2 on a machine that ran step 2 meanwhile
    steps = f"{n} step{'s' * (n != 1)}"
    assert (
        n >= 1
        and said == [lines[-1]]
        and said[0].startswith(f"grpo.py: interrupted: {out} holds the logs of {steps} and no checkpoint")
    ), err[-3000:]
    assert said[0].endswith(f"the same command starts again, after moving them to {out / 'interrupted-1'}/")
    stopped = (out / "metrics.jsonl").read_text()
    # the same command, to one step: it starts (no "pass --resume"), moves the logs aside, completes its step
    grpo.main(argv[:-1] + ["1"])
    said = capsys.readouterr().out
    assert (
        f"[run] {out} held a run stopped after {steps}, before its first checkpoint: its logs are now in "
        f"{out / 'interrupted-1'}/; starting from step 0" in said
    )
    assert (out / "interrupted-1" / "metrics.jsonl").read_text() == stopped
    assert sorted(p.name for p in (out / "interrupted-1").iterdir()) == ["config.json", "metrics.jsonl", "samples"]
    assert [json.loads(line)["step"] for line in _lines(out)] == [1] and (out / "final").is_dir()


def test_ctrl_c_while_torch_imports_prints_one_line(tmp_path):
    """Ctrl-C in the first seconds of `python grpo.py`, while torch imports (before main's own handling): one line
    on stderr, no traceback, exit status 130. The signal goes once torch's shared library is mapped into the
    process (/proc/<pid>/maps), so it lands inside the imports, after grpo.py's first lines ran."""
    import signal
    import subprocess
    import sys
    import time

    if not os.path.exists("/proc/self/maps"):
        pytest.skip("needs /proc/<pid>/maps (Linux) to see when torch is being imported")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen(
        [sys.executable, "grpo.py", "--dry_run", "--output_dir", str(tmp_path / "run")],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 120
        while "libtorch" not in open(f"/proc/{proc.pid}/maps").read():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert err.splitlines() == ["grpo.py: interrupted: before training began; the same command starts again"], err
    assert out == "" and not (tmp_path / "run").exists()


def test_a_folder_with_a_checkpoint_or_foreign_files_is_still_refused_and_the_note_says_resume(tmp_path):
    from trainer import checkpoint

    folder = tmp_path / "run"
    (folder / "samples").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"config": {"save_steps": 2}}))
    (folder / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.5}\n')
    run = checkpoint.RunFolder(str(folder), {"save_steps": 2}, say=lambda *a: None)
    assert run.set_aside == ["config.json", "metrics.jsonl", "samples"]  # stopped before a checkpoint: start again
    assert run.interrupted_note().startswith(f"{folder} holds the logs of 2 steps and no checkpoint")
    (folder / "notes.txt").write_text("mine")  # a file the trainer never writes: not its folder to tidy
    with pytest.raises(
        ValueError,
        match=r"holds files this trainer did not write \(notes.txt\) and no checkpoint "
        r"to resume: --overwrite_output_dir deletes them all",
    ):
        checkpoint.RunFolder(str(folder), {}, say=lambda *a: None)  # (--resume would refuse it: not named)
    (folder / "notes.txt").unlink()
    (folder / "checkpoint-2").mkdir()
    (folder / "checkpoint-2" / "trainer_state.json").write_text('{"step": 2}')
    with pytest.raises(ValueError, match="already holds a run .*pass --resume"):
        checkpoint.RunFolder(str(folder), {}, say=lambda *a: None)
    # other settings: --resume would refuse them, so the refusal offers only what works
    (folder / "config.json").write_text(json.dumps({"config": {"save_steps": 2, "num_mini_batches": 1}}))
    with pytest.raises(ValueError) as e:
        checkpoint.RunFolder(str(folder), {"save_steps": 2, "num_mini_batches": 4}, say=lambda *a: None)
    assert str(e.value) == (
        f"{folder} already holds a run with other settings (--num_mini_batches 1 -> 4): choose another --output_dir, "
        "or --overwrite_output_dir to delete it and start again"
    )
    run = checkpoint.RunFolder(str(folder), {"resume": False, "overwrite_output_dir": True}, say=lambda *a: None)
    assert run.interrupted_note() == (
        f"{folder / 'checkpoint-2'} holds step 2: the same command with --resume "
        f"continues from there (without it, the run folder is refused)"
    )


def _dead_pid() -> int:
    """The pid of a process that has ended (and been waited for)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def _stopped_save(folder, name):
    """A temporary save folder as a stopped save leaves it: one (fake) weights file inside."""
    (folder / name).mkdir(parents=True)
    (folder / name / "model.safetensors").write_bytes(b"\0" * 1000)


@pytest.mark.parametrize("resume", [False, True], ids=["plain", "resume"])
def test_the_next_run_removes_the_saves_of_processes_that_are_gone(tmp_path, resume):
    """Issue #43 item 7: Ctrl-C (or a kill) during a save leaves checkpoint-<step>.tmp-<pid>-<hex>/, a whole model
    copy. The next RunFolder there, plain or --resume, removes those whose process is gone, in one line, and keeps
    a running process's (a save in progress)."""
    from trainer import checkpoint

    folder = tmp_path / "run"
    (folder / "samples").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"config": {"save_steps": 2}}))
    (folder / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.5}\n')
    if resume:  # a run with checkpoint-2, stopped while saving checkpoint-3
        (folder / "checkpoint-2").mkdir()
        (folder / "checkpoint-2" / "trainer_state.json").write_text(
            json.dumps({"step": 2, "metrics_lines": 2, "skipped_updates_total": 0})
        )
    dead = f"checkpoint-3.tmp-{_dead_pid()}-abcd"
    live = f"checkpoint-4.tmp-{os.getpid()}-beef"
    _stopped_save(folder, dead)
    _stopped_save(folder, live)
    said = []
    run = checkpoint.RunFolder(str(folder), {"save_steps": 2, "resume": resume}, say=said.append)
    assert not (folder / dead).exists() and (folder / live / "model.safetensors").exists()
    removal = [line for line in said if dead in line]
    assert removal == [f"[run] removed {dead}/ from {folder} (0.00 GiB): the unfinished save of a process that is gone"]
    assert all(live not in line for line in said)
    if resume:
        assert run.resume_from == str(folder / "checkpoint-2") and said == removal
    else:  # the stopped run's logs go aside as before; the removed save is not among them
        assert "metrics.jsonl" in run.set_aside and dead not in run.set_aside
    said.clear()
    checkpoint.RunFolder(str(folder), {"save_steps": 2, "resume": resume}, say=said.append)
    assert not any("removed" in line for line in said)  # nothing left to remove: nothing said


def test_a_stale_old_copy_whose_checkpoint_is_missing_is_put_back(tmp_path):
    """A process killed between _replace_dir's two renames leaves <name>.tmp-old-<pid>/ as the only copy of that
    checkpoint: the next run renames it back rather than removing it; a .tmp-old- whose checkpoint exists is removed."""
    from trainer import checkpoint

    pid = _dead_pid()
    _stopped_save(tmp_path, f"checkpoint-4.tmp-old-{pid}")
    _stopped_save(tmp_path, f"final.tmp-old-{pid}")
    (tmp_path / "final").mkdir()
    said = []
    checkpoint.clear_stale_saves(str(tmp_path), say=said.append)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4", "final"]
    assert (tmp_path / "checkpoint-4" / "model.safetensors").exists()
    assert said == [
        f"[run] {tmp_path / f'checkpoint-4.tmp-old-{pid}'}/ renamed back to {tmp_path / 'checkpoint-4'}/: "
        f"its process stopped while replacing it",
        f"[run] removed final.tmp-old-{pid}/ from {tmp_path} (0.00 GiB): the unfinished save of a process that is gone",
    ]


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077], ids=["022", "027", "077"])
def test_a_stopped_saves_files_follow_the_umask(tiny, tmp_path, umask):
    """Issue #43 item 7: the files of a save's temporary folder follow the umask (the safetensors writer makes
    model.safetensors 0600 whatever the umask): when a save is stopped while writing the optimizer state (a killed
    process leaves the folder as it is then), its folder is 0777 & ~umask and its files 0666 & ~umask. In this
    process the stop then removes the folder (issue #53)."""
    from trainer import checkpoint

    model, tok = tiny
    real_save = torch.save
    seen = {}

    def stop_at_the_optimizer(obj, f, *a, **kw):
        if str(f).endswith("optimizer.pt"):
            folder = os.path.dirname(str(f))
            seen[folder] = os.stat(folder).st_mode & 0o777
            seen.update({name: os.stat(os.path.join(folder, name)).st_mode & 0o777 for name in os.listdir(folder)})
            raise KeyboardInterrupt("Ctrl-C during the save")
        return real_save(obj, f, *a, **kw)

    old = os.umask(umask)
    try:
        torch.save = stop_at_the_optimizer
        with pytest.raises(KeyboardInterrupt):
            checkpoint.save_checkpoint(
                str(tmp_path / "checkpoint-1"), model, tok, torch.optim.AdamW(model.parameters()), {"step": 1}
            )
    finally:
        torch.save = real_save
        os.umask(old)
    folders = [k for k in seen if os.path.isabs(k)]
    assert len(folders) == 1 and ".tmp-" in folders[0] and seen.pop(folders[0]) == 0o777 & ~umask
    assert "model.safetensors" in seen and set(seen.values()) == {0o666 & ~umask}, seen
    assert list(tmp_path.iterdir()) == []  # the stopped save removed its own folder


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
@pytest.mark.parametrize("save", ["checkpoint", "final"])
def test_a_save_stopped_in_this_process_removes_its_temporary_folder(tiny, tmp_path, stop, save):
    """An exception or Ctrl-C inside a save (a notebook, a wrapper that calls grpo.main again) removes its own
    ``<name>.tmp-*`` folder in the same process: the run folder then lists what it held before, and the earlier
    complete copy of the folder being replaced stays whole."""
    from trainer import checkpoint

    model, tok = tiny
    optimizer = torch.optim.AdamW(model.parameters())
    target = tmp_path / ("checkpoint-1" if save == "checkpoint" else "final")

    def save_it():
        if save == "checkpoint":
            checkpoint.save_checkpoint(str(target), model, tok, optimizer, {"step": 1})
        else:
            checkpoint.save_model(model, tok, str(target))

    save_it()  # the earlier, complete copy
    listing = sorted(p.name for p in tmp_path.rglob("*"))
    real_save_pretrained = type(tok).save_pretrained

    def stop_in_the_tokenizer(self, *a, **kw):
        raise stop("stopped while saving")

    type(tok).save_pretrained = stop_in_the_tokenizer
    try:
        with pytest.raises(stop):
            save_it()
    finally:
        type(tok).save_pretrained = real_save_pretrained
    assert sorted(p.name for p in tmp_path.rglob("*")) == listing


def test_a_budget_beyond_the_models_context_stops_before_the_run_folder(tmp_path):
    """grpo.py with a response budget beyond the toy's 128-position context: one line naming the context and the
    flag, before any weights load, and no run folder left."""
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match=r"the model's context is 128 positions .*--max_completion_length 200 exceed"):
        grpo.main(["--max_completion_length", "200", "--output_dir", str(out)])
    assert not out.exists()

"""Smoke tests of tools/bench/scaling.py (the benchmark-only patches and the summary), on a tiny grid, of
tools/bench/credit_overhead.py's rows (every comparison rule of tools/bench/reproduce.py) on two tiny ones, and of the
GPU
check (tools/bench/gpu_check.py, tools/bench/gpu_smoke.py, tools/bench/gpu_wheels.sh) on the CPU with --tiny.

Checks what the benchmark's numbers rely on, not timings: every response really has the forced length, the random
rewards give every response a non-zero advantage (so DelTA's and CSCR's hooks run on every row), the runs of one
cell see identical rollouts, and the summary's ratios are computed against the same cell's GRPO row.
No trl needed.
"""

import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.bench import _common, credit_overhead, gpu_check, gpu_smoke, memory_plan_check, scaling  # noqa: E402

pytestmark = pytest.mark.bench  # the benchmark scripts' smoke tests: -m bench (pyproject.toml; .ci/run runs them)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaling") / "scaling.json"
    res = scaling.main(
        [
            "--cells",
            "toy:12",
            "--credits",
            "grpo,delta,cscr",
            "--steps",
            "2",
            "--num_prompts_per_step",
            "2",
            "--num_generations",
            "2",
            "--out",
            str(out),
        ]
    )
    return res, out


def test_forced_length_and_random_rewards(result):
    res, _ = result
    assert res["all_responses_full_length"] is True
    for run in res["runs"]:
        for step in run["steps"]:
            assert step["completions/mean_length"] == 12.0
            assert step["response_width"] == 12 and step["response_tokens"] == 2 * 2 * 12
            assert step["reward"] == 0.5  # exactly half of each group marked correct
            assert step["rows_nonzero_adv"] == 4  # every response has a non-zero advantage
            assert step["frac_reward_zero_std"] == 0.0


def test_credit_hooks_run_and_ratios(result):
    res, out = result
    rows = {r["credit"]: r for r in res["summary"]}
    assert set(rows) == {"grpo", "delta", "cscr"}
    assert rows["grpo"]["ratio_s_per_step"] == pytest.approx(1.0)
    for name in ("delta", "cscr"):
        assert rows[name]["ratio_s_per_step"] == pytest.approx(rows[name]["s_per_step"] / rows["grpo"]["s_per_step"])
    assert all(r["steps_timed"] == 1 and r["torch_threads"] == [1] for r in rows.values())
    assert res["models"]["toy"]["num_parameters"] == 813_440
    saved = json.loads(out.read_text())
    assert saved["benchmark"] == "scaling" and saved["machine"]["versions"]["torch"]
    assert saved["table_markdown"].count("\n| toy") == 3


def test_bad_cells_rejected():
    with pytest.raises(SystemExit, match="bad --cells entry"):
        scaling.parse_cells("toy:0")
    with pytest.raises(SystemExit, match="bad --cells entry"):
        scaling.parse_cells("giant:64")
    assert scaling.parse_cells("toy:64, 30m:256,toy:64") == [("toy", 64), ("30m", 256)]


# ----------------------------------------------------------------------------------------------------------
# tools/bench/gpu_check.py (the GPU check, issue #17) and tools/bench/gpu_smoke.py, on the CPU with --tiny: every part
# runs
# through the same code as on the device; what it records is checked against its sources (the run folders, the
# tiny config), and a child past its time limit is stopped with its whole process group.
# ----------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def random_toy_root(tmp_path_factory):
    """A folder holding toy-<version>/ with the randomly initialised toy (no warm-up), for RLVR_TOY_CACHE."""
    import toy

    root = tmp_path_factory.mktemp("toy_cache")
    toy.build_toy_model(root / f"toy-{toy.TOY_VERSION}", warmup_steps=0)
    return root


@pytest.mark.slow
def test_gpu_check_tiny_runs_every_part(tmp_path, random_toy_root):
    out, work = tmp_path / "out", tmp_path / "work"
    res = gpu_check.main(
        [
            "--tiny",
            "--out",
            str(out),
            "--work",
            str(work),
            "--wheels",
            "",
            "--toy_credits",
            "delta",
            "--toy_cache",
            str(random_toy_root),
            "--budget",
            "900",
        ]
    )
    status = {(p["part"], p["label"]): p["status"] for p in res["parts"]}
    assert status == {
        ("setup", "install wheels"): "skipped",
        ("setup", "environment"): "ok",
        ("smoke", "gpu_smoke.py"): "ok",
        ("toy", "toy delta"): "ok",
        ("vllm", "probe"): "ok",
        ("vllm", "--use_vllm"): "absent" if importlib.util.find_spec("vllm") is None else "skipped",
    }
    assert res["ok"] is True and res["problems"] == []
    # four files, as they come back from the device (at most 8), rewritten after every part
    assert sorted(os.listdir(out)) == ["gpu_check.json", "gpu_check.log", "gpu_smoke_tiny.json", "toy_runs.tar.gz"]
    saved = json.loads((out / "gpu_check.json").read_text())
    assert [p["status"] for p in saved["parts"]] == [p["status"] for p in res["parts"]] and saved["ok"] is True
    log = (out / "gpu_check.log").read_text()
    assert all(f"===== {p['part']} / {p['label']}: {p['command']}" in log for p in saved["parts"] if "rc" in p)

    env = saved["environment"]  # from the child, with the children's environment
    assert env["machine"]["versions"]["torch"] == importlib.metadata.version("torch")
    assert env["machine"]["versions"]["math-verify"] == importlib.metadata.version("math-verify")
    assert env["grading"]["ok"] is True and env["grading"]["right"][0] is True
    assert all(i["ok"] for i in env["imports"].values()) and env["gpu"] is None
    # the commit where this tree is a git checkout; "no git" in a source tree without .git (a downloaded archive)
    head = (
        subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
        if (REPO / ".git").exists() and shutil.which("git")
        else None
    )
    if head is not None and head.returncode == 0:
        assert env["git"]["commit"] == head.stdout.strip()
    elif gpu_smoke.GIT_STAMP.exists():  # tools/bench/gpu_wheels.sh's stamp of a tree copied without .git
        assert env["git"]["source"] and len(env["git"]["commit"]) == 40
    else:
        assert env["git"]["commit"] is None and "not a git checkout" in env["git"]["note"]

    smoke = next(p for p in saved["parts"] if p["part"] == "smoke")["result"]
    assert smoke == json.loads((out / "gpu_smoke_tiny.json").read_text())
    assert smoke["all_ok"] is True and smoke["command"].startswith("python tools/bench/gpu_smoke.py")
    assert [(r["mode"], r["credit"], r["micro_batch_size"]) for r in smoke["runs"]] == [
        ("lora", "grpo", 3),
        ("lora", "delta", 3),
        ("lora", "cscr", 3),
        ("full", "grpo", 2),
    ]
    # KV cache per token by hand from the tiny config: K and V × layers × KV heads × head_dim × 4 bytes (float32)
    t = gpu_smoke.TINY
    per_token = 2 * t["num_hidden_layers"] * t["num_key_value_heads"] * t["head_dim"] * 4
    assert smoke["kv_cache"]["mb_per_token"] == round(per_token / 1e6, 4)
    assert smoke["kv_cache"]["positions"] == smoke["rows"] * (12 + 24)  # --tiny: prompts 12, responses 24
    # gpu_smoke runs DelTA with --delta_impl memory_efficient: no [N, T, H] cache of h_t is kept
    assert smoke["runs"][1]["credit"] == "delta" and "delta_hidden" not in smoke["runs"][1]
    # memory_plan.py's prediction beside every measured peak (on the CPU: no GPU peak, a CPU plan)
    plans = next(p for p in saved["parts"] if p["part"] == "smoke")["plan"]
    assert [(e["mode"], e["credit"]) for e in plans] == [(r["mode"], r["credit"]) for r in smoke["runs"]]
    assert all(
        "error" not in e
        and e["device"] == "CPU"
        and e["predicted_tensors_gb"] > 0
        and "rollout" not in e["predicted_stages_gb"]
        and e["measured_peak_allocated_gb"] is None
        for e in plans
    )
    toy_plan = next(p for p in saved["parts"] if p["label"] == "toy delta")["plan"]
    assert "error" not in toy_plan and toy_plan["measured_peak_rss_gb"] > 0
    assert toy_plan["predicted_tensors_gb"] == max(toy_plan["predicted_stages_gb"].values()) > 0

    with tarfile.open(out / "toy_runs.tar.gz") as tar:
        names = tar.getnames()
        assert {n.split("/")[0] for n in names} == {"toy_delta"}
        for credit in ("delta",):  # the device runs cscr too (--toy_credits delta,cscr), the same code
            run = next(p for p in saved["parts"] if p["label"] == f"toy {credit}")["run"]
            lines = tar.extractfile(f"toy_{credit}/metrics.jsonl").read().decode().splitlines()
            assert run["metrics"] == [json.loads(line) for line in lines]  # embedded = the run's own file
            assert run["summary"] == json.loads(tar.extractfile(f"toy_{credit}/summary.json").read())
            assert json.loads(tar.extractfile(f"toy_{credit}/config.json").read())["config"]["credit"] == credit
            assert run["steps"] == 2 and run["summary"]["last_step"]["step"] == 2
            assert run["heldout_metric"] == "eval/avg@1" and isinstance(run["learned"], bool)
            assert {"final", "checkpoint-1", "metrics.jsonl", "summary.json"} <= set(run["files"])
    assert not any("/final" in n or "/checkpoint-" in n for n in names)  # no weights come back


def test_memory_plan_check_tiny(tmp_path):
    """tools/bench/memory_plan_check.py --tiny: two runs measured and predicted, the bound applied as stated."""
    out = tmp_path / "memory_plan_check.json"
    res = memory_plan_check.main(["--tiny", "--out", str(out)])
    rows = res["rows"]
    assert [r["name"] for r in rows] == [c[0] for c in memory_plan_check.TINY]
    for r in rows:
        assert r["measured_mb"] > 0 and len(r["per_step_peak_rss_mb"]) == 2  # --steps 2
        assert r["predicted_mb"] == pytest.approx(max(r["stages_mb"].values()), abs=0.1)  # CPU: no reserve
        assert r["within_bound"] == memory_plan_check.within_bound(r["predicted_mb"], r["measured_mb"])
    assert json.loads(out.read_text())["table_markdown"].count("\n|") == 1 + len(rows)
    assert memory_plan_check.within_bound(110, 100) and memory_plan_check.within_bound(80, 100)  # +10%; 20 MB
    assert not memory_plan_check.within_bound(1300, 1000) and not memory_plan_check.within_bound(700, 1000)


def test_gpu_check_stops_a_child_past_its_limit(tmp_path, monkeypatch):
    monkeypatch.setitem(gpu_check.LIMITS, "smoke", (2, 2))
    monkeypatch.setattr(gpu_check, "MIN_PART_S", 0)
    check = gpu_check.Check(
        gpu_check.parse_args(["--tiny", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w")]), []
    )
    pid_file = tmp_path / "grandchild.pid"
    sleeper = (
        "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(120)']); open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(120)"
    )
    rec = check.child("smoke", "sleeper", [sys.executable, "-c", sleeper, str(pid_file)], "smoke")
    assert rec["status"] == "timeout" and rec["timeout_s"] == 2 and rec["rc"] is not None
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # gone, or a zombie waiting for init to reap it
        state = subprocess.run(
            ["ps", "-o", "stat=", "-p", str(grandchild)], capture_output=True, text=True, check=False
        ).stdout
        if not state.strip() or state.strip().startswith("Z"):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the child's own child {grandchild} survived the time-out")
    check.deadline = time.time()  # no budget left: the next child is skipped, never started
    rec = check.child("smoke", "never", [sys.executable, "-c", "open('started', 'w')"], "smoke")
    assert rec["status"] == "skipped" and "budget spent" in rec["reason"] and "rc" not in rec
    saved = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert [(p["label"], p["status"]) for p in saved["parts"]] == [("sleeper", "timeout"), ("never", "skipped")]


def test_gpu_check_device_call_and_wheel_pins():
    # the device call written in gpu_check.py's header parses with gpu_check's own flags and fits the tool
    doc = gpu_check.__doc__
    call = re.search(r'run\(command="([^"]+)", carry=(\[[^\]]*\]),\s*timeout_s=(\d+)\)', doc)
    command, carry, timeout_s = call.group(1), json.loads(call.group(2)), int(call.group(3))
    words = shlex.split(command)
    assert len(command) < 2000 and words[1:3] == ["python3", "tools/bench/gpu_check.py"]
    args = gpu_check.parse_args(words[3:])
    assert timeout_s >= args.budget + 30 and timeout_s <= 600 and carry == [".whl"]
    # the wheels carried to the device are requirements.txt's pins (and math-verify's own pin)
    script = (REPO / "tools" / "bench" / "gpu_wheels.sh").read_text()
    pins = dict(p.split("==") for p in re.search(r"PINS=\(([^)]*)\)", script).group(1).split())
    req = {
        re.split(r"[\[=]", line)[0]: line
        for line in (REPO / "requirements.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    assert req["math-verify"] == f"math-verify=={pins['math-verify']}" and req["pebble"] == f"pebble=={pins['pebble']}"
    assert req["antlr4-python3-runtime"] == f"antlr4-python3-runtime=={pins['antlr4-python3-runtime']}"
    if importlib.util.find_spec("math_verify") is not None:
        assert f"latex2sympy2_extended=={pins['latex2sympy2_extended']}" in importlib.metadata.requires("math-verify")


def test_scaling_update_lengths_runs_both_modes_on_the_same_batch(tmp_path):
    res = scaling.main(
        [
            "--update_lengths",
            "4:20",
            "--cells",
            "toy:0",
            "--num_prompts_per_step",
            "2",
            "--num_generations",
            "2",
            "--steps",
            "2",
            "--out",
            "",
        ]
    )
    rows = {(r["padding_free"], r["shared_prompt"]): r for r in res["summary"]}
    assert (
        set(rows) == {(True, True), (True, False), (False, False)}
        and rows[True, True]["speedup"] == pytest.approx(rows[False, False]["s_update"] / rows[True, True]["s_update"])
        and rows[False, False]["speedup"] == 1.0
    )
    runs = res["runs"]
    assert {r["response_tokens"] for r in runs} == {4 + 9 + 15 + 20}  # lengths evenly spread over 4..20
    assert all(r["padded_response_tokens"] == 4 * 20 and len(r["seconds"]) == 2 for r in runs)


def test_widened_toy_computes_the_same_function(toy_model_path, tmp_path, float64_model):
    """tools/bench/memory.py's widened toy (hidden 128 -> 512, zeros everywhere else) gives the toy's log-probs:
    float64,
    1e-10, once the per-head q/k norms get back their ε (the one change the widening makes, see its docstring).
    (512 = 4·128: the norm weights' factor sqrt(h/H) = 1/2 is exact in the float32 the model is saved in.)"""
    from transformers import AutoModelForCausalLM

    import grpo
    import rollout
    from tools.bench import memory
    from trainer import policy

    wide_path = memory.widen_toy_model(toy_model_path, str(tmp_path / "wide"), 512)
    toy, tok = policy.load_model_and_tokenizer(toy_model_path)
    wide = AutoModelForCausalLM.from_pretrained(wide_path)
    assert wide.config.hidden_size == 512 and sum(p.numel() for p in wide.parameters()) > 1.5 * sum(
        p.numel() for p in toy.parameters()
    )
    for layer in wide.model.layers:
        layer.self_attn.q_norm.variance_epsilon = layer.self_attn.k_norm.variance_epsilon = toy.config.rms_norm_eps
    batch = rollout.generate(toy, tok, ["Compute 7+5-3.\n", "Compute 12+30.\n"], 3, rollout.SamplingSettings(16))
    logp = [  # grpo.py's (plain) log-probs
        grpo.token_outputs(
            float64_model(m).eval(), batch.input_ids, batch.attention_mask, batch.response_mask, 1.0
        ).logp
        for m in (toy, wide)
    ]
    assert logp[0].abs().sum() > 0
    torch.testing.assert_close(logp[1], logp[0], rtol=1e-10, atol=1e-10)


def test_memory_lm_head_smallest(tmp_path):
    """tools/bench/memory.py --only lm_head at 512 tokens and hidden 128 (1.3 GB for the unchunked run): both variants
    measured beside memory_plan's prediction; the chunked one in chunks (2 of 441 positions), below the other."""
    from tools.bench import memory

    out = tmp_path / "lm_head.json"
    res = memory.main(["--only", "lm_head", "--lm_head_tokens", "512", "--lm_head_hidden", "128", "--out", str(out)])
    r = res["lm_head"]
    assert (r["chunked"]["chunked"], r["unchunked"]["chunked"]) == (True, False)
    assert r["chunked"]["chunk_positions"] == 441 and r["row_logits_bytes"] == 512 * 151_936 * 4
    for v in ("chunked", "unchunked"):
        assert r[v]["measured_over_predicted"] == pytest.approx(r[v]["live_peak_bytes"] / r[v]["predicted_bytes"])
    assert r["chunked"]["live_peak_bytes"] < r["unchunked"]["live_peak_bytes"]
    assert json.loads(out.read_text())["lm_head"]["T"] == 512


# ------------------------------------------------------------------------------------------------ credit_overhead.py
def test_credit_overhead_rows_are_the_rules_flags():
    """--rules (default: every row of RULES) runs each rule's flags as python -m comparisons' parser reads them;
    --credits keeps its old meaning (grpo = the dapo row, delta once per --delta_impls); unknown names stop with one
    line."""
    import comparisons
    from trainer import grpo_config

    config = comparisons.config_class()
    ap = credit_overhead.build_parser()
    rows = credit_overhead.row_specs(ap.parse_args([]))
    assert [n for n, _ in rows] == [r[0] for r in credit_overhead.RULES] and rows[0] == ("dapo", {})
    by_name = dict(rows)
    for name, _, flags, _, _ in credit_overhead.RULES:
        cfg = config(**by_name[name])  # the rule's settings, every other field the default
        assert cfg == config(**vars(grpo_config.build_parser(config).parse_args(flags))), name
    assert by_name["no_lamnorm"] == {"credit": "delta", "delta_normalize": False}
    assert by_name["topk_proxy"] == {"credit": "delta", "delta_proxy": "topk", "delta_proxy_topk": 20}
    assert credit_overhead.row_specs(ap.parse_args(["--rules", "fipo,dapo,fipo"])) == [
        ("fipo", {"fipo": True}),
        ("dapo", {}),
    ]
    old = credit_overhead.row_specs(ap.parse_args(["--credits", "grpo,delta,cscr"]))
    assert old == [
        ("dapo", {}),
        ("delta", {"credit": "delta", "delta_impl": "normal"}),
        ("delta[memory_efficient]", {"credit": "delta", "delta_impl": "memory_efficient"}),
        ("cscr", {"credit": "cscr"}),
    ]
    for argv, words in (
        (["--rules", "dapo,fipoo"], "unknown ['fipoo']"),
        (["--credits", "fipo"], "unknown credit"),
        (["--rules", "dapo", "--credits", "grpo"], "not both"),
    ):
        with pytest.raises(SystemExit, match=re.escape(words)):
            credit_overhead.row_specs(ap.parse_args(argv))
    with pytest.raises(SystemExit, match="--rules must include dapo"):
        credit_overhead.main(["--rules", "fipo", "--out", ""])


def test_credit_overhead_times_two_rules(tmp_path, capsys):
    """The tiniest run (2 steps, 1 round, 2 × 2 responses): each rule's row, its ratio to the dapo row of the same
    run, its flags reached the trainer (FIPO's branch logged), at reproduce.py's four mini-batches, on the scale path
    (--path's default)."""
    out = tmp_path / "co.json"
    res = credit_overhead.main(
        [
            "--rules",
            "dapo,fipo",
            "--steps",
            "2",
            "--repeats",
            "1",
            "--num_prompts_per_step",
            "2",
            "--num_generations",
            "2",
            "--no-warmup_round",
            "--keep_runs",
            "--out",
            str(out),
        ]
    )
    workdir = Path(re.search(r"runs kept in (\S+)", capsys.readouterr().out).group(1))
    try:
        s = res["summary"]
        assert list(s) == ["dapo", "fipo"] and s["dapo"]["ratio_s_per_step"] == 1.0
        assert s["fipo"]["ratio_s_per_step"] == pytest.approx(s["fipo"]["s_per_step"] / s["dapo"]["s_per_step"])
        assert s["fipo"]["ratio_cpu_s_per_step_train"] == pytest.approx(
            s["fipo"]["cpu_s_per_step_train"] / s["dapo"]["cpu_s_per_step_train"]
        )
        assert all(r["steps_timed"] == 1 and "goal_met" not in r for r in s.values())
        assert res["identical_rollouts"] is True and res["settings"]["train_config"]["num_mini_batches"] == 4
        assert res["rows"] == [
            {"name": "dapo", "flags": [], "config": {}},
            {"name": "fipo", "flags": ["--fipo"], "config": {"fipo": True}},
        ]
        assert json.loads(out.read_text())["summary"].keys() == s.keys()
        for name in ("dapo", "fipo"):
            cfg = json.loads((workdir / f"r0_{name}" / "config.json").read_text())["config"]
            assert (cfg["credit"], cfg["fipo"], cfg["num_mini_batches"]) == ("grpo", name == "fipo", 4)
            assert all(cfg[flag] for flag in _common.SCALE_PATH)  # --path scale
            metrics = (workdir / f"r0_{name}" / "metrics.jsonl").read_text()
            assert ("fipo/f_mean" in metrics) == (name == "fipo")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# ------------------------------------------------------------------------------------------------------ reproduce.py
def test_reproduce_check_finds_a_changed_figure(tmp_path, capsys):
    """tools/bench/reproduce.py on one tiny run of the dapo row (one step, --extra): the record keeps its exact command,
    commit, machine and figures, and the page's table prints that command; --check reruns it, prints both figures and
    matches (exit 0); with one recorded figure changed it names it and exits 1; a seed the record lacks stops."""
    if str(REPO / "tools" / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "tools" / "bench"))
    import reproduce

    from trainer import problems

    record, root, held_out = tmp_path / "record.json", tmp_path / "runs", tmp_path / "held_out.jsonl"
    held_out.write_text("".join(json.dumps(r) + "\n" for r in problems.load_problems("toy", split="test")[:8]))
    tiny = [
        "--extra",
        f"--max_steps 1 --num_prompts_per_step 2 --num_generations 2 --eval_data {held_out} "
        "--eval_num_generations 2 --save_steps 0",
        "--record",
        str(record),
    ]
    assert reproduce.main(["--rules", "dapo", "--seeds", "0", "--root", str(root), *tiny]) == 0
    saved = json.loads(record.read_text())
    (run,) = saved["results"]["dapo"]["runs"]
    assert run["command"] == (
        "python grpo.py --num_mini_batches 4 --padding_free --shared_prompt --chunked_lm_head --fuse_old_logprobs "
        f"--max_steps 1 --num_prompts_per_step 2 --num_generations 2 --eval_data {held_out} --eval_num_generations 2 "
        "--save_steps 0 --seed 0"
    )
    config = json.loads((root / "dapo-seed0" / "config.json").read_text())["config"]
    assert all(config[flag] for flag in _common.SCALE_PATH)  # the scale path, as every record's run
    assert run["git"]["commit"] and run["machine"]["cpu"]["simd"] and run["machine_kind"] != "not recorded"
    summary = json.loads((root / "dapo-seed0" / "summary.json").read_text())
    assert (run["avg8_after"], run["greedy_after"]) == (summary["after"]["eval/avg@2"], summary["after"]["eval/greedy"])
    assert f"`{run['command'][: -len('0')]}S` (S = 0)" in reproduce.table(saved)
    capsys.readouterr()

    assert reproduce.main(["--check", "dapo", "--seed", "0", "--log_check", *tiny]) == 0
    out = capsys.readouterr().out
    assert "MATCH" in out and "DIFFERS" not in out and f"{run['avg8_after']:.6f}" in out
    saved = json.loads(record.read_text())
    (run,) = saved["results"]["dapo"]["runs"]
    assert run["checks"][-1]["match"] is True and run["checks"][-1]["machine_kind"] == run["machine_kind"]
    assert all(run["checks"][-1][k] == run[k] for k in reproduce.FIGURES)

    run["avg8_after"] += 1 / 16  # one more correct sample of the 8 × 2
    record.write_text(json.dumps(saved))
    assert reproduce.main(["--check", "dapo", "--seed", "0", *tiny]) == 1
    out = capsys.readouterr().out
    assert re.search(r"avg8_after\s+\S+\s+\S+\s+DIFFERS", out) and "MISMATCH: avg8_after" in out
    assert re.search(r"greedy_after\s+\S+\s+\S+\s+same", out)
    with pytest.raises(SystemExit, match="the record has no such run"):
        reproduce.main(["--check", "dapo", "--seed", "1", *tiny])


def test_reproduce_pins_the_kernels_of_the_record(monkeypatch, capsys):
    """--check runs a row under the CPU kernels its record names (ATEN_CPU_CAPABILITY), and says in one line (exit 2)
    when this CPU cannot run them; the caller's environment is left as it was."""
    if str(REPO / "tools" / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "tools" / "bench"))
    import reproduce

    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert reproduce.pin_capability("default") is None  # every x86 CPU runs torch's scalar kernels
    assert reproduce.torch_kernels() == "DEFAULT"
    monkeypatch.setattr(reproduce, "torch_kernels", lambda: "AVX2")  # a CPU without AVX-512
    assert "cannot run torch's AVX512 kernels" in reproduce.pin_capability("AVX512")
    record = {
        "results": {"dapo": {"runs": [{"seed": 0, "command": "x", "machine": {"torch_cpu_capability": "AVX512"}}]}}
    }
    with pytest.raises(SystemExit) as stop:
        reproduce.check(record, "dapo", 0, [], keep=False)
    assert stop.value.code == 2
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("cannot check dapo seed 0: its figures come from torch's AVX512 kernels")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert reproduce.main(["--table", "--record", str(REPO / "tools" / "bench" / "results" / "reproduce.json")]) == 0
    assert "ATEN_CPU_CAPABILITY" not in os.environ


def _reproduce():
    """tools/bench/reproduce.py, imported as the script imports its helpers (its own folder on the path)."""
    if str(REPO / "tools" / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "tools" / "bench"))
    import reproduce

    return reproduce


def test_reproduce_commands_and_the_record():
    """A row's command goes to the entry point that takes its flags (python grpo.py, else python -m comparisons),
    with the paper's four mini-batches and the scale path's four flags (scale_passes.FLAGS, the path every record
    was made on); each command parses under its entry point's parser; every recorded run's command is its row's
    command today, and a run whose command was spelled otherwise when it ran keeps that spelling."""
    import comparisons
    from trainer import grpo_config, scale_passes

    reproduce = _reproduce()
    # the scale path's flags and --fuse_old_logprobs (on by default now, on either path): the records' settings
    assert [f.removeprefix("--") for f in _common.SCALE_FLAGS] == [*scale_passes.FLAGS, "fuse_old_logprobs"]
    assert _common.SCALE_PATH == dict.fromkeys([*scale_passes.FLAGS, "fuse_old_logprobs"], True)
    assert reproduce.command(["--credit", "delta"], 3) == [
        *("python", "grpo.py", "--credit", "delta", "--num_mini_batches", "4"),
        *_common.SCALE_FLAGS,
        *("--seed", "3"),
    ]
    assert reproduce.command(["--fipo"], 0)[:4] == ["python", "-m", "comparisons", "--fipo"]
    assert reproduce.command(["--credit", "otb"], 0)[:3] == ["python", "-m", "comparisons"]
    parsers = {
        "grpo.py": grpo_config.build_parser(grpo_config.GRPOConfig),
        "comparisons": grpo_config.build_parser(comparisons.config_class()),
    }
    flags = {name: f for name, _, f, _, _ in reproduce.RULES}
    for name, f in flags.items():
        cmd = reproduce.command(f, 0)
        cfg = vars(parsers[cmd[1] if cmd[1] == "grpo.py" else cmd[2]].parse_args(cmd[2 + (cmd[1] == "-m") :]))
        assert all(cfg[flag] for flag in _common.SCALE_PATH) and cfg["num_mini_batches"] == 4, name
    record = json.loads(reproduce.RECORD.read_text())
    for name, row in record["results"].items():
        for run in row["runs"]:
            assert run["command"] == shlex.join(reproduce.command(flags[name], run["seed"])), (name, run["seed"])
            if "command_as_run" in run:  # made before the scale path's flags were written out (grpo.py's defaults)
                assert (
                    run["command_as_run"].startswith("python grpo.py ")
                    and "--padding_free" not in run["command_as_run"]
                )


def test_reproduce_check_reruns_the_records_command(monkeypatch, capsys):
    """--check reruns the record's own command (its flags and entry point), not the row's today, and calls a record
    whose command is no longer the row's a mismatch even where the figures agree; a record whose command is not a toy
    command of grpo.py or of the comparisons stops with one line."""
    reproduce = _reproduce()
    figures = {k: 0.5 for k in reproduce.FIGURES}
    ran = []

    def fake_run(root, name, seed, cmd):
        ran.append(cmd)
        return {"git": {"commit": "c"}, "machine_kind": "m", **figures}

    monkeypatch.setattr(reproduce, "run", fake_run)
    monkeypatch.setattr(reproduce, "pin_capability", lambda capability: None)
    recorded = "python grpo.py --credit delta --num_mini_batches 4 --seed 0"  # the plain path: not the row's today
    record = {
        "results": {
            "delta": {
                "runs": [{"seed": 0, "command": recorded, "machine": {"torch_cpu_capability": "AVX2"}, **figures}]
            }
        }
    }
    assert reproduce.check(record, "delta", 0, [], keep=False) is False
    assert ran == [shlex.split(recorded)]
    out = capsys.readouterr().out
    assert "<- not the recorded one" in out and "MISMATCH: command" in out and "DIFFERS" not in out
    record["results"]["delta"]["runs"][0]["command"] = shlex.join(reproduce.command(["--credit", "delta"], 0))
    assert reproduce.check(record, "delta", 0, [], keep=False) is True
    record["results"]["delta"]["runs"][0]["command"] = "python train.py --seed 0"
    with pytest.raises(SystemExit, match="is not 'python grpo.py ...' or 'python -m comparisons ...'"):
        reproduce.check(record, "delta", 0, [], keep=False)


def test_memory_smallest():
    """tools/bench/memory.py at its smallest: stage 5 alone on a 1 MiB h cache, then the three variants' steps at 16
    responses on the toy (hidden 128), on the scale path."""
    from tools.bench import memory

    res = memory.main(
        [
            *("--sizes", "16", "--hidden_size", "128", "--max_completion_length", "8"),
            *("--steps", "2", "--repeats", "1", "--stage5_mib", "1", "--stage5_repeats", "1", "--out", ""),
        ]
    )
    stage5 = res["stage5"]["1"]
    assert stage5["N"] == 2**20 // (8 * 128 * 4) and stage5["runs"][0]["peak_above_cache_mib"] >= 0
    assert set(res["summary"]["16"]) == set(memory.VARIANTS)
    assert res["summary"]["16"]["grpo"]["ratio_s_per_step"] == 1.0
    assert all(res["settings"]["train_config"][flag] for flag in _common.SCALE_PATH)


def test_vs_trl_smallest():
    """tools/bench/vs_trl.py at its smallest (needs TRL: -m bench in tools/requirements-bench.txt's environment):
    our default (the plain path), the scale path and TRL, side by side, on the same prompts."""
    pytest.importorskip("trl")
    from tools.bench import vs_trl

    res = vs_trl.main(
        [
            *("--steps", "2", "--rounds", "1", "--num_prompts_per_step", "2", "--num_generations", "2"),
            *("--max_completion_length", "8", "--eval_limit", "2", "--eval_k", "1", "--out", ""),
        ]
    )
    assert set(res["summary"]) == {"ours", "ours_scale", "trl"} and res["same_prompts"] is True
    assert [r["trainer"] for r in res["runs"]] == ["ours", "trl", "ours_scale"]
    assert "ours, the scale path (--padding_free --shared_prompt --chunked_lm_head" in res["table_markdown"]
    assert {"speed", "speed_default", "speed_met", "speed_default_met"} <= set(res["goals"])

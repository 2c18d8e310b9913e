"""evaluate.py, its command's flags, results folder and tables (trainer/eval_results.py), its resumable runner
(trainer/responses_file.py) and the benchmarks it reads (problems.py: loaders and name resolution, the Hugging Face
mapping with a fake `datasets`), protocol presets, metrics and the question-weighted overall row by hand,
markdown/--compare output, resuming an interrupted run on a tiny random model, and DelTA's seven benchmarks
(--benchmarks delta_paper: its Table 1 layout and question-weighted Avg., by hand and end to end on the toy)."""

import json
import math
import sys
import types
from pathlib import Path

import pytest

import evaluate
import rollout
import toy
from trainer import eval_results, hub, policy, problems, responses_file

DATA = Path(__file__).resolve().parents[1] / "data"  # the benchmarks the repository ships
COUNTS = {
    "aime24": 30,
    "aime25": 30,
    "amc23": 40,
    "math500": 500,
    "minerva": 272,
    "olympiadbench": 675,
    "gsm8k": 1319,
    "hmmt_feb25": 30,  # the eight of --benchmarks all, then DelTA's four more (data/README.md)
    "aime26": 30,
    "hmmt_nov25": 30,
    "hmmt_feb26": 33,
    "brumo25": 30,
}
ALL = list(COUNTS)[:8]


# ------------------------------------------------------------------------------------------------------
# Loaders and name resolution
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(COUNTS))
def test_real_benchmark_files_load_with_expected_counts(name):
    rows = problems.load_problems(name, data_dir=DATA)
    assert len(rows) == COUNTS[name]
    for r in rows:
        assert {"id", "problem", "answer", "source"} <= set(r)
        assert all(isinstance(r[k], str) and r[k].strip() for k in ("id", "problem", "answer"))
        assert r["source"] == name
    assert len({r["id"] for r in rows}) == len(rows)


def test_the_training_set_ships_and_loads_by_name():
    rows = problems.load_problems("math_train")  # data/train/math_train.jsonl
    assert len(rows) == 7470 and rows == problems.load_problems(str(DATA / "train" / "math_train.jsonl"))
    assert {r["source"] for r in rows} == {"math_train"}


def test_loaders_return_answers_as_the_files_give_them():
    # the verifier compares 2,125 with 2125 and 025 with 25: the loader must not touch them
    gsm = problems.load_problems("gsm8k", data_dir=DATA)
    assert sum("," in r["answer"] for r in gsm) == 14
    aime = problems.load_problems("aime24", data_dir=DATA)
    assert {"025", "073", "023", "045", "033", "080", "055"} <= {r["answer"] for r in aime}


def test_all_resolves_to_the_eight_files_in_order():
    pairs = problems.resolve_benchmarks("all", DATA)
    assert [n for n, _ in pairs] == list(problems.BENCHMARKS) == ALL
    assert all(Path(s) == DATA / f"{n}.jsonl" for n, s in pairs)


def test_delta_paper_suite_is_deltas_seven_in_table_order_with_213_questions(tmp_path):
    pairs = problems.resolve_benchmarks("delta_paper", DATA)
    order = ["aime24", "aime25", "aime26", "hmmt_feb25", "hmmt_nov25", "hmmt_feb26", "brumo25"]  # DelTA's Table 1
    assert [n for n, _ in pairs] == order and all(Path(s) == DATA / f"{n}.jsonl" for n, s in pairs)
    counts = [len(problems.load_benchmark(n, s)) for n, s in pairs]
    assert counts == [30, 30, 30, 30, 30, 33, 30] and sum(counts) == problems.DELTA_PAPER_QUESTIONS == 213
    # the four new names work wherever a name is accepted: alone, in a list, in load_problems (grpo's --eval_data)
    new = ["aime26", "hmmt_nov25", "hmmt_feb26", "brumo25"]
    assert problems.resolve_benchmarks(",".join(new), DATA) == [(n, str(DATA / f"{n}.jsonl")) for n in new]
    assert [len(problems.load_problems(n)) for n in new] == [30, 30, 33, 30]
    assert problems.resolve_benchmarks("brumo25", tmp_path) == [("brumo25", "hf")]  # no local file: the hub copy
    assert problems.HF_DATASETS["hmmt_feb26"]["path"] == "MathArena/hmmt_feb_2026"
    with pytest.raises(ValueError, match=r"names \['aime24', 'aime25', 'hmmt_feb25'\] more than once"):
        problems.resolve_benchmarks("all,delta_paper", DATA)
    with pytest.raises(ValueError, match=r"unknown benchmark 'delta_papr'.*suite \(all, delta_paper\)"):
        problems.resolve_benchmarks("delta_papr", DATA)


def test_name_path_and_toy_resolution(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text(json.dumps({"id": "a", "problem": "1+1?", "answer": "2"}) + "\n")
    pairs = problems.resolve_benchmarks(f"math500, toy,{f}", DATA)
    assert pairs == [("math500", str(DATA / "math500.jsonl")), ("toy", "toy"), ("mine", str(f))]
    assert [len(problems.load_benchmark(n, s)) for n, s in pairs] == [500, 200, 1]
    # a known name with no local file goes to the hub
    assert problems.resolve_benchmarks("aime25", tmp_path) == [("aime25", "hf")]
    with pytest.raises(ValueError, match="unknown benchmark 'mathh500'"):
        problems.resolve_benchmarks("mathh500", DATA)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        problems.resolve_benchmarks(str(tmp_path / "nope.jsonl"), DATA)
    with pytest.raises(ValueError, match="more than once"):
        problems.resolve_benchmarks("all,math500", DATA)


def test_data_dir_default_and_env_override(tmp_path, monkeypatch):
    monkeypatch.delenv("RLVR_DATA_DIR", raising=False)
    assert problems.default_data_dir() == Path(problems.__file__).resolve().parents[1] / "data" == DATA
    (tmp_path / "math500.jsonl").write_text(
        "".join(json.dumps({"id": str(i), "problem": f"p{i}", "answer": str(i)}) + "\n" for i in range(3))
    )
    monkeypatch.setenv("RLVR_DATA_DIR", str(tmp_path))
    assert problems.default_data_dir() == tmp_path
    assert [r["answer"] for r in problems.load_problems("math500")] == ["0", "1", "2"]


# ------------------------------------------------------------------------------------------------------
# Hugging Face mapping (a fake `datasets` module) and the offline error
# ------------------------------------------------------------------------------------------------------
FAKE_HUB = {
    "openai/gsm8k": [
        {"question": "How many?", "answer": "Add them.\n#### 1,234"},
        {"question": "And now?", "answer": "So #### 7"},
    ],
    "Hothan/OlympiadBench": [
        {"id": 1606, "question": "Find x.", "final_answer": ["$\\frac{1}{2 n+2}$"]},
        {"id": 1607, "question": "Find y.", "final_answer": ["$69$,$84$"]},
    ],
    "math-ai/amc23": [{"id": 0, "question": "Cities?", "answer": 27.0}],
    "HuggingFaceH4/MATH-500": [{"problem": "Define p.", "answer": "p - q", "unique_id": "test/algebra/1.json"}],
    "HuggingFaceH4/aime_2024": [{"id": 60, "problem": "Aya walks.", "answer": "204"}],
    "math-ai/minervamath": [{"question": "Magellan?", "answer": "The size is \\boxed{1.6} cm."}],
}


def _fake_datasets(calls, fail=None):
    mod = types.ModuleType("datasets")

    def load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        if fail is not None:
            raise fail
        return list(FAKE_HUB[path])

    mod.load_dataset = load_dataset
    return mod


def test_hub_mapping_converts_rows_like_the_local_files(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(hub, "require_hub", lambda *a, **k: None)  # as if the hub answered
    monkeypatch.setitem(sys.modules, "datasets", _fake_datasets(calls))
    empty = tmp_path  # no local files: every name goes to the hub
    gsm = problems.load_problems("gsm8k", data_dir=empty)
    assert calls[-1] == ("openai/gsm8k", "main", "test")
    assert gsm == [
        {"id": "0", "problem": "How many?", "answer": "1,234", "source": "gsm8k"},
        {"id": "1", "problem": "And now?", "answer": "7", "source": "gsm8k"},
    ]
    oly = problems.load_problems("olympiadbench", data_dir=empty)
    assert calls[-1] == ("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train")
    assert [(r["id"], r["problem"], r["answer"]) for r in oly] == [
        ("1606", "Find x.", "\\frac{1}{2 n+2}"),
        ("1607", "Find y.", "69,84"),
    ]
    amc = problems.load_problems("amc23", data_dir=empty)
    assert (amc[0]["problem"], amc[0]["answer"]) == ("Cities?", "27")  # 27.0 -> "27"
    math500 = problems.load_problems("math500", data_dir=empty)
    assert calls[-1] == ("HuggingFaceH4/MATH-500", None, "test")
    assert (math500[0]["id"], math500[0]["answer"]) == ("test/algebra/1.json", "p - q")
    aime = problems.load_benchmark("aime24", "hf", empty)
    assert calls[-1] == ("HuggingFaceH4/aime_2024", None, "train") and aime[0]["id"] == "60"
    assert problems.load_problems("minerva", data_dir=empty)[0]["answer"] == "1.6"  # a solution: its box
    # a local file wins over the hub
    n_calls = len(calls)
    assert len(problems.load_problems("gsm8k", data_dir=DATA)) == 1319 and len(calls) == n_calls


def test_every_benchmark_has_a_hub_mapping():
    assert set(problems.HF_DATASETS) == set(problems.KNOWN_BENCHMARKS) == set(COUNTS)
    for spec in problems.HF_DATASETS.values():
        assert "/" in spec["path"] and spec["split"] in ("train", "test")


def test_offline_error_names_the_missing_file_and_the_hub_id(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(hub, "require_hub", lambda *a, **k: None)  # the hub answers, the download fails
    monkeypatch.setitem(sys.modules, "datasets", _fake_datasets(calls, fail=ConnectionError("no network")))
    with pytest.raises(FileNotFoundError, match="no local file and cannot download: math500") as e:
        problems.load_problems("math500", data_dir=tmp_path)
    assert "HuggingFaceH4/MATH-500" in str(e.value) and "ConnectionError" in str(e.value)
    assert str(tmp_path / "math500.jsonl") in str(e.value)
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed: import fails
    with pytest.raises(FileNotFoundError, match="no local file and cannot download: aime25.*datasets"):
        evaluate.main(["--benchmarks", "aime25", "--data_dir", str(tmp_path), "--model", "no-such-model"])


def test_no_network_fails_at_once_in_one_line(tmp_path, monkeypatch):
    # the hub's host refuses the connection (as on a machine without network): no retries, one line naming the fix
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls = []
    monkeypatch.setitem(sys.modules, "datasets", _fake_datasets(calls))
    with pytest.raises(
        FileNotFoundError,
        match=r"no local file and cannot download: math500 .*cannot reach "
        r"127\.0\.0\.1 .*no network",
    ) as e:
        problems.load_problems("math500", data_dir=tmp_path)
    assert calls == [] and "\n" not in str(e.value)  # the download was not even tried
    with pytest.raises(
        ValueError,
        match=r"cannot reach 127\.0\.0\.1 to download model 'no-org/no-model'.*`hf download "
        r"no-org/no-model --local-dir no-model`.*--model /path/to/no-model",
    ):
        policy.load_model_and_tokenizer("no-org/no-model")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # honoured: the local cache only, and a message that says so
    with pytest.raises(ValueError, match="not in the local Hugging Face cache and HF_HUB_OFFLINE is set"):
        policy.load_model_and_tokenizer("no-org/no-model")
    with pytest.raises(ValueError, match="model folder /no/such/folder does not exist"):
        policy.load_model_and_tokenizer("/no/such/folder")


def test_bad_hub_rows_are_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "require_hub", lambda *a, **k: None)
    mod = types.ModuleType("datasets")
    mod.load_dataset = lambda path, name=None, split=None: [{"question": "q", "answer": "no hashes"}]
    monkeypatch.setitem(sys.modules, "datasets", mod)
    with pytest.raises(ValueError, match="####"):
        problems.load_problems("gsm8k", data_dir=tmp_path)


# ------------------------------------------------------------------------------------------------------
# Protocol presets
# ------------------------------------------------------------------------------------------------------
def test_presets_and_explicit_overrides():
    d = evaluate.resolve_settings("delta")
    assert (d["num_samples"], d["temperature"], d["top_p"], d["max_new_tokens"], d["greedy"]) == (
        16,
        1.0,
        0.7,
        30000,
        False,
    )
    g = evaluate.resolve_settings("greedy")
    assert (g["num_samples"], g["temperature"], g["greedy"]) == (0, 0.0, True)
    base = evaluate.resolve_settings(None)
    assert base == evaluate.DEFAULT_SETTINGS
    # an explicit flag beats the preset; unset (None) flags fall back to preset, then defaults
    o = evaluate.resolve_settings("delta", top_p=0.95, num_samples=4, max_new_tokens=None, greedy=True)
    assert (o["num_samples"], o["top_p"], o["max_new_tokens"], o["temperature"], o["greedy"]) == (
        4,
        0.95,
        30000,
        1.0,
        True,
    )
    assert o["seed"] == 0 and o["chunk_size"] == evaluate.DEFAULT_SETTINGS["chunk_size"]
    assert evaluate.resolve_settings("greedy", max_new_tokens=64)["max_new_tokens"] == 64


def test_cli_flags_default_to_none_so_presets_apply():
    args = eval_results.build_parser(evaluate.PROTOCOLS).parse_args(["--protocol", "delta", "--top_p", "0.9"])
    flags = {k: getattr(args, k) for k in evaluate.DEFAULT_SETTINGS}
    assert flags["top_p"] == 0.9 and all(v is None for k, v in flags.items() if k != "top_p")
    s = evaluate.resolve_settings(args.protocol, **flags)
    assert (s["top_p"], s["num_samples"], s["max_new_tokens"]) == (0.9, 16, 30000)
    assert eval_results.build_parser(evaluate.PROTOCOLS).parse_args(["--no-greedy"]).greedy is False


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(protocol="delta2"), "unknown protocol"),
        (dict(protocol="greedy", num_samples=4), "identical"),
        (dict(num_samples=0, greedy=False), "nothing to evaluate"),
        (dict(top_p=0.0), "top_p"),
        (dict(temperature=-1.0), "temperature"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(num_samples=-2), "num_samples"),
    ],
)
def test_bad_settings_are_refused(kwargs, match):
    protocol = kwargs.pop("protocol", None)
    with pytest.raises(ValueError, match=match):
        evaluate.resolve_settings(protocol, **kwargs)


def test_pass_k_list_and_refusal_of_k_above_n():
    assert evaluate.default_pass_ks(16) == [1, 2, 4, 8, 16]
    assert evaluate.default_pass_ks(6) == [1, 2, 4, 6]
    assert evaluate.default_pass_ks(0) == []
    with pytest.raises(ValueError, match=r"refused k = \[8\]"):
        evaluate.check_pass_ks([1, 8], 4)
    with pytest.raises(ValueError, match="num_samples=4"):  # refused before any model is loaded
        evaluate.main(["--benchmarks", "toy", "--num_samples", "4", "--pass_k", "2,8", "--model", "no-such-model"])
    with pytest.raises(SystemExit, match="argument --pass_k: '1,a': comma-separated integers"):  # names the flag
        evaluate.main(["--benchmarks", "toy", "--pass_k", "1,a"])


# ------------------------------------------------------------------------------------------------------
# Metrics by hand
# ------------------------------------------------------------------------------------------------------
def _rec(pid, mode, sample, correct, length=10, finish="stop", boxed=True, reason=None):
    return {
        "id": pid,
        "mode": mode,
        "sample": sample,
        "correct": correct,
        "length": length,
        "finish_reason": finish,
        "extracted": "1" if boxed else None,
        "reason": reason or ("ok" if boxed else "no_box"),
    }


def test_metrics_by_hand():
    rows = [{"id": i, "problem": "p", "answer": "1"} for i in ("a", "b", "c")]
    recs = [
        _rec("a", "greedy", 0, True, length=5),
        _rec("b", "greedy", 0, False, length=7, finish="length", boxed=False),
        _rec("c", "greedy", 0, False, length=9, reason="timeout"),
    ]
    correct = {"a": [True] * 4, "b": [False, True, False, False], "c": [False] * 4}
    for pid, flags in correct.items():
        for s, ok in enumerate(flags):
            recs.append(
                _rec(
                    pid,
                    "sample",
                    s,
                    ok,
                    length=10 * (s + 1),
                    finish="length" if s == 3 else "stop",
                    boxed=s != 2,
                    reason="parse_error" if (pid, s) == ("c", 0) else None,
                )
            )
    m = evaluate.compute_metrics(recs, rows, num_samples=4, greedy=True)
    assert m["num_problems"] == 3
    assert m["greedy"] == pytest.approx(1 / 3)
    assert m["avg@4"] == pytest.approx(5 / 12)  # 4 + 1 + 0 correct of 12
    assert m["pass@1"] == pytest.approx((1 + 1 / 4 + 0) / 3)
    # pass@2 of problem b (n=4, c=1): 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert m["pass@2"] == pytest.approx((1 + (1 - math.comb(3, 2) / math.comb(4, 2)) + 0) / 3)
    assert m["pass@4"] == pytest.approx(2 / 3)
    assert m["greedy/mean_length"] == pytest.approx(7) and m["greedy/max_length"] == 9
    assert m["greedy/truncation_rate"] == pytest.approx(1 / 3) and m["greedy/boxed_rate"] == pytest.approx(2 / 3)
    assert m["greedy/timeout"] == 1 and m["greedy/no_box"] == 1
    assert m["sample/mean_length"] == pytest.approx(25) and m["sample/max_length"] == 40
    assert m["sample/truncation_rate"] == pytest.approx(1 / 4) and m["sample/boxed_rate"] == pytest.approx(3 / 4)
    assert m["sample/parse_error"] == 1 and m["sample/no_box"] == 3
    with pytest.raises(ValueError, match="missing response record"):
        evaluate.compute_metrics(recs[:-1], rows, num_samples=4, greedy=True)
    with pytest.raises(ValueError, match="refused"):
        evaluate.compute_metrics(recs, rows, num_samples=4, greedy=True, pass_ks=[8])


def test_overall_is_question_count_weighted():
    x = {
        "num_problems": 30,
        "greedy": 0.5,
        "avg@4": 0.2,
        "sample/max_length": 100,
        "sample/timeout": 1,
        "sample/mean_length": 50.0,
    }
    y = {
        "num_problems": 10,
        "greedy": 0.1,
        "avg@4": 0.6,
        "sample/max_length": 300,
        "sample/timeout": 2,
        "sample/mean_length": 10.0,
        "only_here": 1.0,
    }
    o = eval_results.overall_metrics({"x": x, "y": y})
    assert o["greedy"] == pytest.approx((30 * 0.5 + 10 * 0.1) / 40)  # 0.4, not the plain mean 0.3
    assert o["avg@4"] == pytest.approx(0.3)  # not the plain mean 0.4
    assert o["sample/mean_length"] == pytest.approx(40.0)
    assert o["sample/max_length"] == 300 and o["sample/timeout"] == 3 and o["num_problems"] == 40
    assert "only_here" not in o
    with pytest.raises(ValueError):
        eval_results.overall_metrics({})


def test_weighted_average_by_hand_and_on_deltas_table_1():
    assert eval_results.weighted_average([(30, 0.5), (33, 0.0)]) == pytest.approx(15 / 63)  # plain mean: 0.25
    assert eval_results.weighted_average([(1, 2.0), (3, 6.0)]) == pytest.approx(5.0)  # (2 + 18) / 4
    # DelTA's Table 1 (docs/specs/delta.md, section 5), Qwen3-8B and -14B DelTA rows, 30 questions each and 33 for
    # HMMT26 Feb: by hand 8B (179.37 * 30 + 20.27 * 33) / 213 = 6050.01 / 213 = 28.4038; 14B 8499.87 / 213 = 39.9055.
    # The paper rounds every cell to 0.005, so its Avg and the average of its cells differ by at most 0.01.
    cols_8b, cols_14b = (
        [43.13, 26.46, 28.12, 18.33, 18.54, 20.27, 44.79],
        [56.87, 37.92, 45.21, 26.04, 32.92, 26.89, 54.79],
    )
    n = [30, 30, 30, 30, 30, 33, 30]
    assert eval_results.weighted_average(zip(n, cols_8b)) == pytest.approx(6050.01 / 213, abs=1e-12)
    assert eval_results.weighted_average(zip(n, cols_8b)) == pytest.approx(28.40, abs=0.01)
    assert eval_results.weighted_average(zip(n, cols_14b)) == pytest.approx(39.91, abs=0.01)
    for bad in ([], [(0, 0.5)], [(2.0, 0.5)]):
        with pytest.raises(ValueError):
            eval_results.weighted_average(bad)


def _paper_results(counts, accs, settings=None):
    names = problems.DELTA_PAPER
    return {
        "model": "m",
        "protocol": "delta",
        "settings": settings or evaluate.resolve_settings("delta"),
        "benchmarks": {b: {"num_problems": c, "avg@16": a} for b, c, a in zip(names, counts, accs)},
    }


def test_delta_paper_table_by_hand():
    res = _paper_results([30, 30, 30, 30, 30, 33, 30], [0.4313, 0.2646, 0.2812, 0.1833, 0.1854, 0.2027, 0.4479])
    table = eval_results.delta_paper_table(res, evaluate.PROTOCOLS["delta"])
    assert table["metric"] == "avg@16" and table["questions"] == 213 and table["notes"] == []
    assert table["avg"] == pytest.approx(60.5001 / 213)
    lines = eval_results.format_delta_paper_table(table).splitlines()
    assert lines == [
        "| Model | Metric | AIME24 | AIME25 | AIME26 | HMMT25 Feb | HMMT25 Nov | HMMT26 Feb | Brumo25 | Avg. |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| m | avg@16 | 43.13 | 26.46 | 28.12 | 18.33 | 18.54 | 20.27 | 44.79 | 28.40 |",
        "| questions |  | 30 | 30 | 30 | 30 | 30 | 33 | 30 | 213 |",
    ]
    # not DelTA's evaluation: said under the table; a missing benchmark: no table
    small = _paper_results([2] * 7, [0.5] * 7, evaluate.resolve_settings("delta", num_samples=2))
    small["benchmarks"] = {b: {"num_problems": 2, "avg@2": 0.5} for b in problems.DELTA_PAPER}
    assert (
        eval_results.format_delta_paper_table(
            eval_results.delta_paper_table(small, evaluate.PROTOCOLS["delta"])
        ).splitlines()[-1]
        == "Not DelTA's evaluation: 14 questions, not DelTA's 213; num_samples 2 (delta: 16)."
    )
    del res["benchmarks"]["brumo25"]
    assert eval_results.delta_paper_table(res, evaluate.PROTOCOLS["delta"]) is None


# ------------------------------------------------------------------------------------------------------
# Markdown table and --compare
# ------------------------------------------------------------------------------------------------------
def _result(model, math500, aime24, temperature=1.0):
    b = {
        "math500": {
            "num_problems": 400,
            "greedy": math500[0],
            "avg@4": math500[1],
            "sample/mean_length": 300.0,
            "sample/max_length": 900,
            "sample/truncation_rate": 0.05,
            "sample/boxed_rate": 0.9,
            "sample/timeout": 1,
            "sample/parse_error": 2,
            "greedy/parse_error": 1,
        },
        "aime24": {
            "num_problems": 30,
            "greedy": aime24[0],
            "avg@4": aime24[1],
            "sample/mean_length": 800.0,
            "sample/max_length": 1000,
            "sample/truncation_rate": 0.5,
            "sample/boxed_rate": 0.4,
            "sample/timeout": 0,
            "sample/parse_error": 0,
            "greedy/parse_error": 0,
        },
    }
    return {
        "model": model,
        "protocol": None,
        "prompt_template": "qwen_math",
        "settings": {"temperature": temperature, "num_samples": 4},
        "benchmarks": b,
        "overall": eval_results.overall_metrics(b),
    }


def test_markdown_table():
    table = eval_results.format_table(_result("m", (0.5, 0.25), (0.1, 0.0)))
    lines = table.splitlines()
    assert lines[0].startswith("| benchmark | problems | greedy | avg@4 | mean len (sample) |")
    assert lines[2] == "| math500 | 400 | 50.0 | 25.0 | 300.0 | 900 | 5.0 | 90.0 | 1 | 3 |"
    assert lines[3] == "| aime24 | 30 | 10.0 | 0.0 | 800.0 | 1000 | 50.0 | 40.0 | 0 | 0 |"
    # overall greedy = (400*0.5 + 30*0.1)/430 = 47.2 %
    assert lines[4].startswith("| **overall** | 430 | 47.2 | 23.3 | ")


def test_compare_prints_both_and_the_difference(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_result("base", (0.5, 0.25), (0.1, 0.0))))
    b.write_text(json.dumps(_result("delta", (0.6, 0.2), (0.0, 0.05), temperature=0.6)))
    evaluate.main(["--compare", str(a), str(b)])
    out = capsys.readouterr().out
    assert "| benchmark | problems | greedy A | greedy B | greedy Δ | avg@4 A | avg@4 B | avg@4 Δ |" in out
    assert "| math500 | 400 | 50.0 | 60.0 | +10.0 | 25.0 | 20.0 | -5.0 |" in out
    assert "| aime24 | 30 | 10.0 | 0.0 | -10.0 | 0.0 | 5.0 | +5.0 |" in out
    # overall greedy: A (200+3)/430 = 47.2, B (240+0)/430 = 55.8
    assert "| **overall** | 430 | 47.2 | 55.8 | +8.6 |" in out
    assert "model: base vs delta" in out and "temperature: 1.0 vs 0.6" in out


def test_compare_with_different_benchmark_sets_uses_shared_overall(tmp_path):
    a = _result("a", (0.5, 0.25), (0.1, 0.0))
    b = _result("b", (0.6, 0.2), (0.0, 0.05))
    del b["benchmarks"]["aime24"]
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    out = evaluate.compare_results_files(str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert "| aime24 | 30 | 10.0 | – | – |" in out
    assert "| **overall (shared)** | 400 | 50.0 | 60.0 | +10.0 |" in out


def test_plot_is_skipped_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert eval_results.plot_results(_result("m", (0.5, 0.2), (0.1, 0.0)), tmp_path) == []
    assert list(tmp_path.iterdir()) == []


def test_plot_writes_one_png_per_benchmark_and_overall(tmp_path):
    pytest.importorskip("matplotlib")
    paths = eval_results.plot_results(_result("m", (0.5, 0.2), (0.1, 0.0)), tmp_path)
    assert sorted(Path(p).name for p in paths) == ["aime24.png", "math500.png", "overall.png"]
    assert all(Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


# ------------------------------------------------------------------------------------------------------
# End to end on a tiny random model: outputs, resume after an interruption, settings hash
# ------------------------------------------------------------------------------------------------------
def test_chunks_are_length_sorted_and_fixed_by_the_data():
    rows = [{"id": str(i), "problem": "x" * n, "answer": "1"} for i, n in enumerate([5, 2, 9, 2, 7])]
    chunks = responses_file.make_chunks(rows, 2)
    assert [[r["id"] for r in c] for c in chunks] == [["1", "3"], ["0", "4"], ["2"]]  # ties keep file order
    assert responses_file.make_chunks(list(reversed(rows)), 2)[0] == [rows[3], rows[1]]
    keys = [responses_file.chunk_key(i, c) for i, c in enumerate(chunks)]
    assert len(set(keys)) == 3 and responses_file.chunk_key(0, chunks[0]) == keys[0]
    assert responses_file.chunk_key(0, [dict(chunks[0][0], answer="2"), chunks[0][1]]) != keys[0]
    seeds = {responses_file.chunk_seed(0, b, m, c) for b in ("x", "y") for m in ("greedy", "sample") for c in range(3)}
    assert len(seeds) == 12 and responses_file.chunk_seed(0, "x", "sample", 1) == responses_file.chunk_seed(
        0, "x", "sample", 1
    )


@pytest.fixture()
def counting_generate(monkeypatch):
    calls = []
    real = rollout.generate

    def wrapper(model, tokenizer, prompts, num_generations, settings, batch_size=None, progress=""):
        calls.append(
            {"prompts": list(prompts), "n": num_generations, "temperature": settings.temperature, "seed": settings.seed}
        )
        return real(model, tokenizer, prompts, num_generations, settings, batch_size, progress)

    monkeypatch.setattr(rollout, "generate", wrapper)
    return calls


def _without_run(path):
    res = json.loads(Path(path).read_text())
    res.pop("run")
    return res


def test_resume_generates_only_missing_chunks_and_matches_uninterrupted_run(
    tmp_path, tiny_model_path, counting_generate, capsys
):
    import toy

    data = tmp_path / "four.jsonl"
    # file order = length order, so the chunks (made after a length sort) are problems {0, 1} and {2, 3}
    rows = sorted(toy.make_split("test", n=4), key=lambda r: len(r["problem"]))
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    argv = [
        "--model",
        tiny_model_path,
        "--benchmarks",
        str(data),
        "--prompt_template",
        "none",
        "--num_samples",
        "2",
        "--max_new_tokens",
        "6",
        "--chunk_size",
        "2",
        "--output_dir",
        str(out),
        "--no_progress",
        "--grade_workers",
        "1",
    ]
    res = evaluate.main(argv)
    # 4 problems in chunks of 2, greedy then sample: 4 generate calls, 4 + 8 records
    assert [(c["temperature"], len(c["prompts"]), c["n"]) for c in counting_generate] == [
        (0.0, 2, 1),
        (0.0, 2, 1),
        (1.0, 2, 2),
        (1.0, 2, 2),
    ]
    first_calls = list(counting_generate)
    responses = out / "four_responses.jsonl"
    full_text = responses.read_text()
    lines = full_text.splitlines(keepends=True)
    assert len(lines) == 12
    uninterrupted = _without_run(out / "results.json")
    assert set(res["benchmarks"]["four"]) >= {
        "greedy",
        "avg@2",
        "pass@1",
        "pass@2",
        "sample/mean_length",
        "sample/max_length",
        "sample/truncation_rate",
        "sample/boxed_rate",
        "sample/timeout",
        "sample/parse_error",
        "greedy/truncation_rate",
    }
    assert uninterrupted["settings"]["seed"] == 0 and uninterrupted["prompt_template"] == "none"
    assert "torch" in uninterrupted["versions"] and "| four | 4 |" in capsys.readouterr().out
    assert (out / "results.md").read_text().startswith("| benchmark |")

    # interrupted inside the first sample chunk (3 of its 4 records written): that chunk and the next are redone
    counting_generate.clear()
    responses.write_text("".join(lines[:7]))
    evaluate.main(argv)
    assert [(c["temperature"], c["seed"], c["prompts"]) for c in counting_generate] == [
        (c["temperature"], c["seed"], c["prompts"]) for c in first_calls[2:]
    ]
    assert responses.read_text() == full_text
    assert _without_run(out / "results.json") == uninterrupted
    assert json.loads((out / "results.json").read_text())["run"]["reused_responses"]["four"] == 4

    # interrupted at a chunk boundary, with half a line written: only the last chunk is redone
    counting_generate.clear()
    responses.write_text("".join(lines[:8]) + lines[8][:25])
    evaluate.main(argv)
    assert [(c["temperature"], c["seed"]) for c in counting_generate] == [
        (first_calls[3]["temperature"], first_calls[3]["seed"])
    ]
    assert responses.read_text() == full_text
    assert _without_run(out / "results.json") == uninterrupted

    # complete: nothing is generated, and it says so (item 7 of "Nothing lost, nothing silent")
    counting_generate.clear()
    capsys.readouterr()
    evaluate.main(argv)
    assert counting_generate == []
    assert (
        f"[reused] four: 12 of 12 responses from {responses} (the same settings; --resample generates them "
        "anew)" in capsys.readouterr().out
    )
    evaluate.main(argv + ["--resample"])  # every chunk generated again: the same seeds, the same responses
    assert [(c["temperature"], c["seed"]) for c in counting_generate] == [
        (c["temperature"], c["seed"]) for c in first_calls
    ]
    assert responses.read_text() == full_text and "[reused]" not in capsys.readouterr().out
    counting_generate.clear()

    # other settings in the same folder are refused, --overwrite starts again
    with pytest.raises(ValueError, match="different settings"):
        evaluate.main(argv + ["--temperature", "0.7"])
    evaluate.main(argv + ["--temperature", "0.7", "--overwrite"])
    assert len(counting_generate) == 4
    assert json.loads((out / "results.json").read_text())["settings"]["temperature"] == 0.7


def test_cut_torn_tail_by_hand(tmp_path):
    """cut_torn_tail: a torn last line is cut (its byte count returned), a whole record without its newline gets one,
    a file ending in a newline, an empty file and a missing one are left as they are."""
    f = tmp_path / "r.jsonl"
    f.write_text('{"a": 1}\n{"b": 2}\n{"c": ')
    assert responses_file.cut_torn_tail(f) == len('{"c": ') and f.read_text() == '{"a": 1}\n{"b": 2}\n'
    assert responses_file.cut_torn_tail(f) == 0 and f.read_text() == '{"a": 1}\n{"b": 2}\n'
    f.write_text('{"a": 1}\n{"b": 2}')
    assert responses_file.cut_torn_tail(f) == 0 and f.read_text() == '{"a": 1}\n{"b": 2}\n'
    f.write_text('{"only": "torn')  # no complete line at all: nothing is left
    assert responses_file.cut_torn_tail(f) == len('{"only": "torn') and f.read_text() == ""
    long = json.dumps({"x": "é" * 70000})  # a torn line longer than the 64 KiB read-back window
    f.write_text('{"a": 1}\n' + long[:-3], encoding="utf-8")
    assert responses_file.cut_torn_tail(f) == len(long[:-3].encode()) and f.read_text() == '{"a": 1}\n'
    f.write_text("")
    assert responses_file.cut_torn_tail(f) == 0 and responses_file.cut_torn_tail(tmp_path / "missing.jsonl") == 0


def test_resume_after_a_torn_last_line_redoes_its_record_once(tmp_path, tiny_model_path, monkeypatch):
    """A responses file whose last line is half a record (the first of its chunk): the resume cuts it off before it
    appends, so the chunk's new records each get a line of their own. Interrupted right after that chunk, the file
    holds every complete line once and nothing merged; the next resume redoes only the chunk after it (without the
    cut, the first new record was appended onto the half-line and lost, and its chunk was redone a second time)."""
    import toy

    data = tmp_path / "four.jsonl"
    rows = sorted(toy.make_split("test", n=4), key=lambda r: len(r["problem"]))
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    argv = [
        "--model",
        tiny_model_path,
        "--benchmarks",
        str(data),
        "--prompt_template",
        "none",
        "--num_samples",
        "2",
        "--max_new_tokens",
        "6",
        "--chunk_size",
        "2",
        "--output_dir",
        str(out),
        "--no_progress",
        "--grade_workers",
        "1",
    ]
    evaluate.main(argv)
    responses = out / "four_responses.jsonl"
    full_text = responses.read_text()
    lines = full_text.splitlines(keepends=True)
    # greedy chunks: lines 0-1, 2-3; sample chunks: lines 4-7, 8-11. Torn: the first record of sample chunk 0
    recs = [json.loads(x) for x in lines]
    assert [r["mode"] for r in recs] == ["greedy"] * 4 + ["sample"] * 8
    assert len({r["chunk"] for r in recs[4:8]}) == 1 and recs[4]["chunk"] != recs[8]["chunk"]
    responses.write_text("".join(lines[:4]) + lines[4][:25])

    calls, real = [], rollout.generate

    def generate_then_stop(*args, **kwargs):  # the run is killed after its first chunk is written
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(rollout, "generate", generate_then_stop)
    with pytest.raises(KeyboardInterrupt):
        evaluate.main(argv)
    after = responses.read_text()
    assert after == "".join(lines[:8])  # every line whole, each once, the torn half gone
    assert all(isinstance(json.loads(x), dict) for x in after.splitlines())

    redone = []

    def counting(*args, **kwargs):
        redone.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(rollout, "generate", counting)
    evaluate.main(argv)
    assert len(redone) == 1  # only sample chunk 1: the torn record's chunk is not redone again
    assert responses.read_text() == full_text


def test_evaluate_rows_keeps_the_trainer_keys(tiny_model_path):
    import toy

    model, tokenizer = policy.load_model_and_tokenizer(tiny_model_path)
    rows = toy.make_split("test", n=3)
    res = evaluate.evaluate_rows(model, tokenizer, rows, "none", evaluate.EvalSettings(2, max_new_tokens=4, seed=1))
    for key in ("greedy", "avg@2", "pass@2", "sample/mean_length", "sample/truncation_rate", "sample/boxed_rate"):
        assert key in res
    assert len(res["responses"]) == 3 + 6
    assert res["sample/mean_length"] == pytest.approx(
        sum(r["length"] for r in res["responses"] if r["mode"] == "sample") / 6
    )


def test_default_folder_keeps_each_settings_and_model_apart(tmp_path, tiny_model_path, monkeypatch, capsys):
    """The README's two evaluation commands (other settings) no longer write the same results.json: the default
    folder is eval_results/<model>-<settings hash>; the same settings in one folder keep every benchmark."""
    import toy

    monkeypatch.chdir(tmp_path)
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in toy.make_split("test", n=2)))
    argv = [
        "--model",
        tiny_model_path,
        "--prompt_template",
        "none",
        "--num_samples",
        "1",
        "--max_new_tokens",
        "4",
        "--no_progress",
        "--no_plot",
        "--grade_workers",
        "1",
    ]
    first = evaluate.main(argv + ["--benchmarks", str(tmp_path / "a.jsonl")])
    evaluate.main(argv + ["--benchmarks", str(tmp_path / "b.jsonl")])  # same settings: the same folder, kept
    other = evaluate.main(argv + ["--benchmarks", str(tmp_path / "a.jsonl"), "--temperature", "0.5"])
    slug = eval_results.model_slug(tiny_model_path)  # the folder's last two parts, e.g. "tiny0-model"
    assert slug == "-".join(Path(tiny_model_path).parts[-2:])
    assert sorted(p.name for p in (tmp_path / "eval_results").iterdir()) == sorted(
        f"{slug}-{r['settings_hash'][:8]}" for r in (first, other)
    )
    same = json.loads((tmp_path / "eval_results" / f"{slug}-{first['settings_hash'][:8]}" / "results.json").read_text())
    assert sorted(same["benchmarks"]) == ["a", "b"] and same["overall"]["num_problems"] == 4
    assert other["settings_hash"] != first["settings_hash"]
    assert "[template] none (--prompt_template)" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_errors_are_one_line(tmp_path):
    """evaluate.py's errors read like grpo.py's: one line, no traceback (missing data folder, --compare on missing
    files, a model folder that does not exist)."""
    import subprocess

    root = Path(problems.__file__).resolve().parents[1]  # the repository (problems.py is in trainer/)
    env = {**__import__("os").environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}
    (tmp_path / "bad.json").write_text("{not json")
    for argv, expected in [
        (["--benchmarks", "math500", "--data_dir", str(tmp_path / "missing")], "no local file and cannot download"),
        (["--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")], "a.json"),
        (
            ["--compare", str(tmp_path / "bad.json"), str(tmp_path / "b.json")],
            "--compare " + str(tmp_path / "bad.json"),
        ),
        (["--model", str(tmp_path / "no_model"), "--benchmarks", "toy"], "does not exist"),
        (
            ["--benchmarks", "delta_papr"],
            "unknown benchmark 'delta_papr' in --benchmarks: use a suite (all, delta_paper)",
        ),
        (["--benchmarks", "delta_paper", "--protocol", "deltaa"], "argument --protocol: invalid choice: 'deltaa'"),
    ]:
        res = subprocess.run(
            [sys.executable, "evaluate.py", *argv], cwd=root, env=env, capture_output=True, text=True, timeout=120
        )
        assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
        lines = [line for line in res.stderr.strip().splitlines() if line.startswith("evaluate.py: error:")]
        assert len(lines) == 1 and expected in lines[0], res.stderr


def test_a_checkpoint_of_a_run_is_set_beside_the_trainers_figures(toy_model_path, tmp_path, capsys):
    """evaluate.py on <run>/final, on the run's held-out set, prints what grpo.py logged for that checkpoint next to
    its own figures and why sampled ones differ (other random draws, with their standard deviation)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(toy_model_path, run / "final")
    (run / "config.json").write_text(
        json.dumps({"config": {"data": "toy", "eval_data": "", "seed": 0, "max_steps": 60}})
    )
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "eval/avg@2": 0.1, "eval/greedy": 0.2})
        + "\n"
        + json.dumps({"step": 60, "eval/avg@2": 0.853, "eval/greedy": 0.9})
        + "\n"
    )
    evaluate.main(
        [
            "--model",
            str(run / "final"),
            "--benchmarks",
            "toy",
            "--num_samples",
            "2",
            "--limit",
            "8",
            "--output_dir",
            str(tmp_path / "eval"),
            "--no_plot",
            "--no_progress",
        ]
    )
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "eval" / "results.json").read_text())["benchmarks"]["toy"]
    p = res["avg@2"]
    assert (
        f"grpo.py logged for this checkpoint (step 60): avg@2 0.853, greedy 0.900; here: avg@2 {p:.3f}, "
        f"greedy {res['greedy']:.3f}."
    ) in out
    assert f"one standard deviation of avg@2 over 16 responses is {(p * (1 - p) / 16) ** 0.5:.3f}" in out
    no_run = eval_results.trainer_figures(toy_model_path, {"benchmarks": {"toy": res}}, {"num_samples": 2}, None)
    assert no_run == []


@pytest.mark.slow
def test_a_trained_run_is_evaluated_as_the_trainer_evaluates_it(toy_model_path, tmp_path, counting_generate, capsys):
    """One checkpoint, one number: evaluate.py on <run>/final (no flag) draws what grpo.py's held-out evaluation
    (evaluate.heldout) drew, with the run's held-out settings, seed + 12345 and the trainer's batches (200 problems x
    2 samples = 2 batches of 256 rows): every logged figure and every response are the same, exactly."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(toy_model_path, run / "final")
    cfg = {
        "data": "toy",
        "eval_data": "",
        "seed": 3,
        "max_steps": 60,
        "eval_num_generations": 2,
        "temperature": 1.0,
        "top_p": 1.0,
        "eval_temperature": None,
        "eval_top_p": 0.9,
        "max_completion_length": 40,
    }
    (run / "config.json").write_text(json.dumps({"config": cfg, "num_processes": 1}))
    model, tokenizer = policy.load_model_and_tokenizer(str(run / "final"))
    rows = problems.load_problems("toy", split="test")
    assert len(rows) * 2 > evaluate.HELDOUT_BATCH_SIZE  # more than one batch of the trainer's
    # grpo.py's run_eval, as it calls it
    settings = evaluate.EvalSettings(2, 1.0, 0.9, 40, seed=3 + 12345)
    logged = evaluate.heldout(model, tokenizer, rows, "none", settings)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 60, **logged}) + "\n")
    in_memory = evaluate.evaluate_rows(model, tokenizer, rows, "none", settings)["responses"]
    counting_generate.clear()
    res = evaluate.main(
        [
            "--model",
            str(run / "final"),
            "--benchmarks",
            "toy",
            "--output_dir",
            str(tmp_path / "ev"),
            "--no_plot",
            "--no_progress",
            "--grade_workers",
            "1",
        ]
    )
    mine, prompts = res["benchmarks"]["toy"], [rollout.apply_template(r["problem"], "none") for r in rows]
    assert res["settings"]["sampling"] == "trainer" and res["settings"]["seed"] == 3 + 12345
    assert {k: mine[k.removeprefix("eval/")] for k in logged} == logged  # greedy, avg@2, pass@2, lengths: exactly
    assert [(c["prompts"], c["n"], c["seed"]) for c in counting_generate] == [
        (prompts, 1, 12348),
        (prompts, 2, 12348),
    ]  # one pass per mode, rows in file order
    saved = [json.loads(line) for line in (tmp_path / "ev" / "toy_responses.jsonl").read_text().splitlines()]
    assert [(r["mode"], r["id"], r["sample"], r["response"]) for r in saved] == [
        (r["mode"], r["id"], r["sample"], r["response"]) for r in in_memory
    ]
    assert "The same responses as the trainer's evaluation" in capsys.readouterr().out
    # the length-sorted chunks (other seeds, other batches) draw other responses; greedy draws nothing
    other = evaluate.main(
        [
            "--model",
            str(run / "final"),
            "--benchmarks",
            "toy",
            "--sampling",
            "chunks",
            "--output_dir",
            str(tmp_path / "ev2"),
            "--no_plot",
            "--no_progress",
            "--grade_workers",
            "1",
        ]
    )
    assert other["settings_hash"] != res["settings_hash"] and other["benchmarks"]["toy"]["greedy"] == mine["greedy"]
    assert "(--sampling chunks; the trainer's" in capsys.readouterr().out


def test_trainer_sampling_resumes_after_its_first_chunk_byte_for_byte(tmp_path, tiny_model_path, counting_generate):
    """--sampling trainer: each mode is one chunk, drawn in one pass over the rows in file order with --seed. A run
    stopped after its first chunk (the greedy mode), with half a record written, redraws the sample mode alone and
    writes the same bytes as an uninterrupted run."""
    data = tmp_path / "five.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in toy.make_split("test", n=5)))
    out = tmp_path / "out"
    argv = [
        "--model",
        tiny_model_path,
        "--benchmarks",
        str(data),
        "--prompt_template",
        "none",
        "--num_samples",
        "3",
        "--max_new_tokens",
        "6",
        "--sampling",
        "trainer",
        "--batch_size",
        "4",
        "--seed",
        "7",
        "--output_dir",
        str(out),
        "--no_progress",
        "--no_plot",
        "--grade_workers",
        "1",
    ]
    evaluate.main(argv)
    prompts = [rollout.apply_template(json.loads(line)["problem"], "none") for line in data.read_text().splitlines()]
    assert [(c["prompts"], c["n"], c["temperature"], c["seed"]) for c in counting_generate] == [
        (prompts, 1, 0.0, 7),
        (prompts, 3, 1.0, 7),
    ]
    responses = out / "five_responses.jsonl"
    full_text = responses.read_text()
    lines = full_text.splitlines(keepends=True)
    assert len(lines) == 5 + 15
    uninterrupted = _without_run(out / "results.json")
    counting_generate.clear()
    responses.write_text("".join(lines[:5]) + lines[5][:30])  # the greedy chunk and half a sampled record
    evaluate.main(argv)
    assert [(c["n"], c["seed"]) for c in counting_generate] == [(3, 7)]
    assert responses.read_text() == full_text
    assert _without_run(out / "results.json") == uninterrupted


def _paper_cells(line):
    """The cells of one markdown row of the delta_paper table."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_delta_paper_table_end_to_end_on_the_toy(toy_model_path, tmp_path, counting_generate, capsys):
    """--benchmarks delta_paper --protocol delta on the toy: the shipped files are refused (their prompts exceed the
    toy's context); two toy problems under each name print and write DelTA's Table 1 layout; then seven files of toy
    problems of uneven sizes (the toy solves some), whose Avg. is
    checked against the question-weighted average of the per-benchmark numbers, computed here; a rerun reuses every
    chunk, an interrupted one regenerates only what is missing, and both give the same table."""
    head = "| Model | Metric | AIME24 | AIME25 | AIME26 | HMMT25 Feb | HMMT25 Nov | HMMT26 Feb | Brumo25 | Avg. |"
    base = [
        "--model",
        toy_model_path,
        "--benchmarks",
        "delta_paper",
        "--protocol",
        "delta",
        "--num_samples",
        "2",
        "--no_progress",
        "--no_plot",
        "--grade_workers",
        "1",
    ]
    out = tmp_path / "shipped"
    with pytest.raises(ValueError, match="the model's context is 128 positions"):  # the shipped AIME prompts: too long
        evaluate.main(base + ["--max_new_tokens", "8", "--limit", "2", "--output_dir", str(out)])
    assert not out.exists()
    two = tmp_path / "two"  # two toy problems under each of the seven names
    two.mkdir()
    rows = iter(toy.make_split("test", n=14))
    for name in problems.DELTA_PAPER:
        (two / f"{name}.jsonl").write_text("".join(json.dumps(next(rows)) + "\n" for _ in range(2)))
    res = evaluate.main(base + ["--max_new_tokens", "8", "--data_dir", str(two), "--output_dir", str(out)])
    printed = capsys.readouterr().out
    # the protocol's values, except the two flags given
    assert {k: res["settings"][k] for k in ("num_samples", "temperature", "top_p", "max_new_tokens", "greedy")} == {
        "num_samples": 2,
        "temperature": 1.0,
        "top_p": 0.7,
        "max_new_tokens": 8,
        "greedy": False,
    }
    md = (out / "delta_paper.md").read_text().splitlines()
    assert md[0] == head and md[1] == "|---|---|" + "---:|" * 8 and md[0] in printed and md[2] in printed
    assert _paper_cells(md[2])[:2] == [toy_model_path, "avg@2"]
    assert md[3] == "| questions |  | 2 | 2 | 2 | 2 | 2 | 2 | 2 | 14 |"
    assert md[-1] == (
        "Not DelTA's evaluation: 14 questions, not DelTA's 213; num_samples 2 (delta: 16); "
        "max_new_tokens 8 (delta: 30000)."
    )
    assert json.loads((out / "delta_paper.json").read_text()) == res["delta_paper"]

    # toy problems under the seven names, of uneven sizes: the weighted and the plain mean differ
    data = tmp_path / "data"
    data.mkdir()
    sizes = dict(zip(problems.DELTA_PAPER, [3, 1, 2, 5, 1, 4, 2]))
    toy_rows = iter(toy.make_split("test", n=sum(sizes.values())))
    for name, size in sizes.items():
        (data / f"{name}.jsonl").write_text("".join(json.dumps(next(toy_rows)) + "\n" for _ in range(size)))
    out = tmp_path / "toy"
    argv = base + ["--max_new_tokens", "24", "--data_dir", str(data), "--chunk_size", "2", "--output_dir", str(out)]
    res = evaluate.main(argv)
    paper = json.loads((out / "delta_paper.json").read_text())
    md = (out / "delta_paper.md").read_text().splitlines()
    cells = _paper_cells(md[2])
    assert md[0] == head and _paper_cells(md[3]) == ["questions", ""] + [str(n) for n in sizes.values()] + ["18"]
    accs = [res["benchmarks"][name]["avg@2"] for name in problems.DELTA_PAPER]  # the per-benchmark numbers
    assert [res["benchmarks"][name]["num_problems"] for name in problems.DELTA_PAPER] == list(sizes.values())
    assert [paper["benchmarks"][name]["accuracy"] for name in problems.DELTA_PAPER] == accs
    weighted = sum(n * a for n, a in zip(sizes.values(), accs)) / sum(sizes.values())
    assert 0 < weighted < 1 and abs(weighted - sum(accs) / len(accs)) > 0.01  # the check can tell the two apart
    assert paper["avg"] == pytest.approx(weighted, abs=1e-12) and paper["questions"] == 18
    assert cells[2:] == [f"{100 * a:.2f}" for a in accs] + [f"{100 * weighted:.2f}"]

    # resume: a complete run generates nothing; a cut responses file regenerates only its missing chunk
    counting_generate.clear()
    evaluate.main(argv)
    assert counting_generate == [] and json.loads((out / "delta_paper.json").read_text()) == paper
    hmmt = out / "hmmt_feb25_responses.jsonl"  # 5 problems x 2 samples, in chunks of 2 problems (by length)
    last = responses_file.make_chunks(problems.load_problems(str(data / "hmmt_feb25.jsonl")), 2)[-1]  # 1 problem
    lines = hmmt.read_text().splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line)["id"] != last[0]["id"]]
    hmmt.write_text("".join(kept[:-1]))  # the last chunk lost, and one record of another chunk
    assert len(lines) == 10 and len(kept) == 8
    evaluate.main(argv)
    assert sorted(len(c["prompts"]) for c in counting_generate) == [1, 2]  # those two chunks, of hmmt_feb25 only
    assert rollout.apply_template(last[0]["problem"], "none") in [p for c in counting_generate for p in c["prompts"]]
    assert hmmt.read_text().splitlines(keepends=True) == lines
    assert json.loads((out / "delta_paper.json").read_text()) == paper


def test_a_budget_beyond_the_models_context_is_refused_before_any_generation(tmp_path, toy_model_path):
    """DelTA's protocol (30,000 new tokens) on the toy (a 128-position context, AIME prompts longer than that):
    one line naming the model's context, the longest prompt, the protocol's budget and the flag that changes it,
    before any generation, and no results folder left behind."""
    out = tmp_path / "results"
    argv = ["--model", toy_model_path, "--benchmarks", "aime25", "--protocol", "delta", "--output_dir", str(out)]
    with pytest.raises(
        ValueError,
        match=r"^the model's context is 128 positions; the prompt of aime25 problem \S+ "
        r"has \d+ tokens and --protocol delta's --max_new_tokens is 30000: \d+ > 128 \(lower "
        r"--max_new_tokens",
    ):
        evaluate.main(argv)
    assert not out.exists()

"""problems.py's training-data sources beyond jsonl (issue: real training data): a parquet file and a folder of
shards give the same rows as the jsonl file they were written from; --data_problem_field / --data_answer_field map
DeepMath-103K's schema (question / final_answer, extra columns) onto {problem, answer}; bad rows name the shard,
the row and the field; a wrong column name is one line listing the columns. And rollout.py's filter_overlong_prompts
(verl's filter_overlong_prompts) against an independent token count and the rollout's own encoding, on the toy
tokenizer."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import rollout
from trainer import problems

try:  # a requirement (requirements.txt); a Python without it still runs the filter's tests
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError:
    pa = pq = None
needs_pyarrow = pytest.mark.skipif(pa is None, reason="pyarrow is not installed (pip install -r requirements.txt)")

ROOT = Path(problems.__file__).resolve().parents[1]  # the repository (problems.py is in trainer/)
ROWS = [{"id": f"r{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i), "source": "mine"} for i in range(7)]
DEEPMATH_COLUMNS = [
    "question",
    "final_answer",
    "difficulty",
    "topic",
    "r1_solution_1",
    "r1_solution_2",
    "r1_solution_3",
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_parquet(path, rows, columns=None):
    columns = columns or list(rows[0])
    pq.write_table(pa.table({c: [r.get(c) for r in rows] for c in columns}), path)
    return path


def deepmath_rows(n):
    return [
        {
            "question": f"Evaluate the limit {i}.",
            "final_answer": f"\\frac{{{i}}}{{2}}",
            "difficulty": 5.5 + i,
            "topic": "Mathematics -> Calculus",
            **{f"r1_solution_{k}": f"Solution {k}: \\boxed{{{i}/2}}" for k in (1, 2, 3)},
        }
        for i in range(n)
    ]


# ------------------------------------------------------------------------------------------------------
# Parquet files and folders of shards
# ------------------------------------------------------------------------------------------------------
@needs_pyarrow
def test_parquet_file_and_folder_of_shards_equal_the_jsonl_rows(tmp_path):
    expected = problems.load_problems(str(write_jsonl(tmp_path / "all.jsonl", ROWS)))
    assert expected == ROWS
    assert problems.load_problems(str(write_parquet(tmp_path / "all.parquet", ROWS))) == expected
    shards = tmp_path / "shards"
    shards.mkdir()
    # written out of order: the folder is read in the order of the file names, jsonl shards included
    write_parquet(shards / "train-00002-of-00003.parquet", ROWS[5:])
    write_parquet(shards / "train-00000-of-00003.parquet", ROWS[:2])
    write_jsonl(shards / "train-00001-of-00003.jsonl", ROWS[2:5])
    (shards / "README.md").write_text("not data")
    (shards / ".cache").mkdir()  # what `hf download --local-dir` leaves beside the files
    assert problems.load_problems(str(shards)) == expected


@needs_pyarrow
def test_default_ids_sources_and_numbers(tmp_path):
    rows = [{"problem": "p0", "answer": 27.0}, {"problem": "p1", "answer": 2.5}]
    got = problems.load_problems(str(write_parquet(tmp_path / "nums.parquet", rows)))
    # ids count rows from 0 (as pyarrow and pandas do); jsonl ids stay line numbers; numbers become strings
    assert got == [
        {"id": "nums-0", "problem": "p0", "answer": "27", "source": "nums"},
        {"id": "nums-1", "problem": "p1", "answer": "2.5", "source": "nums"},
    ]
    assert [r["id"] for r in problems.load_problems(str(write_jsonl(tmp_path / "nums.jsonl", rows)))] == [
        "nums-1",
        "nums-2",
    ]
    ints = problems.load_problems(str(write_parquet(tmp_path / "ints.parquet", [{"problem": "p", "answer": 3}])))
    assert ints[0]["answer"] == "3"


@needs_pyarrow
def test_deepmath_schema_is_mapped_in_parquet_and_jsonl(tmp_path):
    raw = deepmath_rows(5)
    shards = tmp_path / "data"
    shards.mkdir()
    write_parquet(shards / "train-00000-of-00002.parquet", raw[:3])
    write_parquet(shards / "train-00001-of-00002.parquet", raw[3:])
    got = problems.load_problems(str(shards), problem_field="question", answer_field="final_answer")
    assert got == [
        {
            "id": f"train-0000{s}-of-00002-{j}",
            "problem": r["question"],
            "answer": r["final_answer"],
            "source": f"train-0000{s}-of-00002",
        }
        for s, j, r in [(0, 0, raw[0]), (0, 1, raw[1]), (0, 2, raw[2]), (1, 0, raw[3]), (1, 1, raw[4])]
    ]
    # jsonl: the same mapping; the row keeps its other fields (not the mapped ones under their old names)
    js = problems.load_problems(
        str(write_jsonl(tmp_path / "dm.jsonl", raw)), problem_field="question", answer_field="final_answer"
    )
    assert [(r["problem"], r["answer"]) for r in js] == [(r["question"], r["final_answer"]) for r in raw]
    assert set(js[0]) == {
        "id",
        "problem",
        "answer",
        "source",
        "difficulty",
        "topic",
        "r1_solution_1",
        "r1_solution_2",
        "r1_solution_3",
    }
    assert js[2]["difficulty"] == raw[2]["difficulty"]


@needs_pyarrow
def test_parquet_reads_only_the_columns_it_uses(tmp_path, monkeypatch):
    path = write_parquet(tmp_path / "dm.parquet", deepmath_rows(3))
    read = []
    iter_batches = pq.ParquetFile.iter_batches

    def spy(self, *args, **kwargs):
        read.append(kwargs.get("columns"))
        return iter_batches(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    problems.load_problems(str(path), problem_field="question", answer_field="final_answer")
    assert read == [["question", "final_answer"]]  # the R1 solutions are never decoded


@needs_pyarrow
def test_a_bad_row_in_a_shard_names_the_shard_row_and_field(tmp_path):
    raw = deepmath_rows(6)
    raw[4]["final_answer"] = "  "
    raw[5]["final_answer"] = None
    shards = tmp_path / "data"
    shards.mkdir()
    write_parquet(shards / "train-00000-of-00002.parquet", raw[:3])
    bad = write_parquet(shards / "train-00001-of-00002.parquet", raw[3:])
    with pytest.raises(ValueError) as e:
        problems.load_problems(str(shards), problem_field="question", answer_field="final_answer")
    assert str(e.value).splitlines() == [
        f"2 bad row(s) in {shards}:",
        f"{bad}: row 1: field 'final_answer' is empty",
        f"{bad}: row 2: field 'final_answer' is null",
    ]
    # every shard is checked before any error: bad rows of two files are listed together
    write_jsonl(shards / "train-00002-of-00003.jsonl", [{"question": "q"}, {"question": "q", "final_answer": "1"}])
    with pytest.raises(ValueError) as e:
        problems.load_problems(str(shards), problem_field="question", answer_field="final_answer")
    assert str(e.value).splitlines()[0] == f"3 bad row(s) in {shards}:"
    assert f"{shards / 'train-00002-of-00003.jsonl'}:1: field 'final_answer' is missing" in str(e.value)


def test_a_reference_blank_after_normalisation_or_a_repeated_id_is_refused_at_load(tmp_path):
    """What the grader or the results would meet later, refused when the file is read, naming its file, line and
    field: a reference that normalises to nothing (``$$``, ``\\quad``: verify.normalize_reference refuses it), an id
    that an earlier row has (its first line named)."""
    rows = [dict(r) for r in ROWS[:4]]
    rows[1]["answer"] = "$$"
    rows[3]["answer"] = "\\quad"
    path = write_jsonl(tmp_path / "blank.jsonl", rows)
    with pytest.raises(ValueError) as e:
        problems.load_problems(str(path))
    assert str(e.value).splitlines() == [
        f"2 bad row(s) in {path}:",
        f"{path}:2: field 'answer' '$$' is blank after normalisation (verify.normalize_reference)",
        f"{path}:4: field 'answer' '\\\\quad' is blank after normalisation (verify.normalize_reference)",
    ]
    twice = write_jsonl(tmp_path / "twice.jsonl", [ROWS[0], ROWS[1], {**ROWS[2], "id": "r0"}])
    with pytest.raises(ValueError) as e:
        problems.load_problems(str(twice))
    assert str(e.value).splitlines() == [f"1 bad row(s) in {twice}:", f"{twice}:3: field 'id' 'r0' repeats {twice}:1"]
    assert [r["id"] for r in problems.load_problems(str(write_jsonl(tmp_path / "ok.jsonl", ROWS)))] == [
        r["id"] for r in ROWS
    ]


def test_grpo_refuses_a_repeated_held_out_id_before_any_weights_load(tmp_path):
    """``grpo.py --eval_data`` with a repeated id stops at the data, before the model loads (no ``Loading weights``,
    no run folder)."""
    held_out = write_jsonl(tmp_path / "held_out.jsonl", [ROWS[0], ROWS[0]])
    out = tmp_path / "run"
    flags = ["--eval_data", str(held_out), "--output_dir", str(out), "--max_steps", "1"]
    done = subprocess.run([sys.executable, "grpo.py", *flags], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and f"{held_out}:2: field 'id' 'r0' repeats {held_out}:1" in done.stderr
    assert "Loading weights" not in done.stderr + done.stdout and not out.exists()


@needs_pyarrow
def test_a_missing_column_is_one_line_naming_the_columns(tmp_path):
    path = write_parquet(tmp_path / "dm.parquet", deepmath_rows(2))
    with pytest.raises(ValueError) as e:
        problems.load_problems(str(path))  # the default problem field on DeepMath's schema
    assert (
        str(e.value) == f"--data_problem_field problem: no such column in {path} (columns: "
        f"{', '.join(DEEPMATH_COLUMNS)})"
    )
    with pytest.raises(ValueError) as e:
        problems.load_problems(str(path), problem_field="question", answer_field="answer")
    assert str(e.value).startswith(f"--data_answer_field answer: no such column in {path} (columns: question, ")
    # jsonl: a field in no row (of two or more) is the same mistake, one line naming the fields of its first row
    js = write_jsonl(tmp_path / "dm.jsonl", [{"question": "q", "final_answer": "1"}] * 3)
    with pytest.raises(ValueError) as e:
        problems.load_problems(str(js), problem_field="question")
    assert (
        str(e.value) == f"--data_answer_field answer: no such field in {js} (fields of its first row: question, "
        f"final_answer)"
    )


@needs_pyarrow
def test_folders_without_data_and_unreadable_files_fail_in_one_line(tmp_path):
    (tmp_path / "deepmath" / "data").mkdir(parents=True)  # `hf download --local-dir` puts the shards in data/
    with pytest.raises(
        FileNotFoundError,
        match=r"no \*\.parquet or \*\.jsonl file in the folder .*deepmath "
        r"\(its subfolders: data\)$",
    ):
        problems.load_problems(str(tmp_path / "deepmath"))
    fake = tmp_path / "truncated.parquet"
    fake.write_bytes(b"version https://git-lfs.github.com/spec/v1\n")  # an LFS pointer, not the file
    with pytest.raises(ValueError) as e:
        problems.load_problems(str(fake))
    assert str(e.value).startswith(f"{fake}: not a readable parquet file (") and "\n" not in str(e.value)
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"problem": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), empty)
    with pytest.raises(ValueError, match=r"empty\.parquet: no rows$"):
        problems.load_problems(str(empty))


@needs_pyarrow
def test_pyarrow_is_imported_only_for_parquet(tmp_path):
    path = write_parquet(tmp_path / "one.parquet", ROWS[:1])
    code = (
        "import sys; from trainer import problems; problems.load_problems('math_train'); "
        "print('pyarrow' in sys.modules); problems.load_problems(sys.argv[1]); print('pyarrow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


# ------------------------------------------------------------------------------------------------------
# filter_overlong_prompts (verl's data.filter_overlong_prompts) on the toy tokenizer
# ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def toy_tokenizer(toy_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(toy_model_path)


@pytest.mark.parametrize("template", ["none", "qwen_math"])
def test_filter_drops_exactly_the_prompts_longer_than_the_limit(toy_tokenizer, template):
    rows = problems.load_problems("math_train")[:60]
    before = json.dumps(rows)
    prompts = [rollout.apply_template(r["problem"], template) for r in rows]
    counts = [len(toy_tokenizer(p).input_ids) for p in prompts]  # independent: one prompt at a time
    # the rollout's own encoding (left-padded batch) has the same number of real tokens per prompt
    _, enc = rollout.encode_prompts(toy_tokenizer, prompts, 1)
    assert enc["attention_mask"].sum(1).tolist() == counts
    limit = sorted(counts)[len(counts) // 2]  # a row exactly at the limit is kept (verl: len <= max_prompt_length)
    expect = [r for r, n in zip(rows, counts) if n <= limit]
    assert 0 < len(expect) < len(rows)
    for batch_size in (1, 7, 1024):
        got = rollout.filter_overlong_prompts(rows, toy_tokenizer, template, limit, batch_size=batch_size)
        assert got.rows == expect
        assert got.dropped == len(rows) - len(expect) == sum(n > limit for n in counts)
        assert got.longest == limit == max(n for n in counts if n <= limit)
    assert json.dumps(rows) == before  # pure: the input rows are not changed


def test_filter_limit_zero_keeps_every_row_and_reports_the_longest(toy_tokenizer):
    rows = problems.load_problems("math_train")[:25]
    counts = [len(toy_tokenizer(rollout.apply_template(r["problem"], "qwen_math")).input_ids) for r in rows]
    got = rollout.filter_overlong_prompts(rows, toy_tokenizer, "qwen_math", 0)
    assert got == (rows, 0, max(counts))
    assert rollout.filter_overlong_prompts([], toy_tokenizer, "none", 16) == ([], 0, 0)


def test_filter_refuses_a_negative_limit_and_leaving_nothing(toy_tokenizer):
    rows = ROWS[:3]
    shortest = min(len(toy_tokenizer(rollout.apply_template(r["problem"], "none")).input_ids) for r in rows)
    with pytest.raises(ValueError, match=r"^--max_prompt_length must be >= 0"):
        rollout.filter_overlong_prompts(rows, toy_tokenizer, "none", -1)
    with pytest.raises(
        ValueError,
        match=rf"^--max_prompt_length 2: all 3 prompts are longer \(the shortest has "
        rf"{shortest} tokens under the template 'none'\)$",
    ):
        rollout.filter_overlong_prompts(rows, toy_tokenizer, "none", 2)

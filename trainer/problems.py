"""Training and evaluation problems as ``{id, problem, answer, source}`` rows: the files they come from, the benchmark
names the repository ships, and the checks every row passes before anything else runs.

* ``load_problems``: a jsonl file, a parquet file (read batch by batch, only its used columns), a folder of shards,
  a training set's name (``data/train/<name>.jsonl``), a benchmark name, or a registered task's ``train`` /
  ``test`` split (``register_source``: the toy's, toy/); grpo.py's ``--data`` / ``--eval_data``, evaluate.py's
  and cscr_diagnostics.py's problems;
* ``--data_problem_field`` / ``--data_answer_field``: the fields of a file's rows that hold the problem and the
  answer (DeepMath: ``question`` / ``final_answer``), renamed to ``problem`` / ``answer``;
* row checks: a bad row is one error naming the file and line (``file:line: field 'answer' is missing``) or the
  parquet row, for the first ten bad rows of all files; a wrong field name is one line listing the fields there are;
* the shipped benchmarks of ``data/`` (:data:`BENCHMARKS`, DelTA's seven :data:`DELTA_PAPER`, the named
  :data:`SUITES`), their Hugging Face copies (:data:`HF_DATASETS`, ``load_hf_benchmark``, used when a local file is
  missing), and ``--benchmarks`` parsed into sources (``resolve_benchmarks``, ``load_benchmark``).

No model, tokenizer or torch here: the data is read and checked before any weights load, and a script that only
reads problems loads none of them. Left out on purpose: prompt templates and the tokenised prompt length (rollout.py:
``apply_template``, ``filter_overlong_prompts``), grading (verify.py), shuffling and batching (rollout.py's
``PromptSampler``), streaming data sets larger than memory. Read next: data/README.md (the files and their sources).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import verify
from trainer import hub

# Generated tasks an entry point adds (``register_source``): ``--data name`` / ``--benchmarks name`` read
# ``SOURCES[name](split)`` (``toy.register_data`` adds ``toy``: its ``train`` and held-out ``test`` splits).
SOURCES: dict = {}


def register_source(name: str, load_split) -> None:
    """Make ``load_problems(name, split)`` return ``load_split(split)`` (rows ``{id, problem, answer, source}``) and
    ``--benchmarks name`` its ``test`` split."""
    SOURCES[name] = load_split


REQUIRED_FIELDS = ("problem", "answer")

# The eight benchmark files of data/, in the order they are reported (``--benchmarks all``).
BENCHMARKS = ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench", "gsm8k", "hmmt_feb25")
# DelTA's seven benchmarks in the column order of its Table 1 (``--benchmarks delta_paper``; docs/specs/delta.md,
# section 5; eval_results.DELTA_PAPER_COLUMNS: the table's column headers). aime26, hmmt_nov25, hmmt_feb26 (33
# problems) and brumo25 are MathArena's sets, CC BY-NC-SA 4.0 (data/README.md, "Evaluation sets added for the DelTA
# protocol").
DELTA_PAPER = ("aime24", "aime25", "aime26", "hmmt_feb25", "hmmt_nov25", "hmmt_feb26", "brumo25")
# DelTA's question count over the seven (30 each, 33 for HMMT26 Feb: the counts that reproduce every reported Avg,
# docs/specs/delta.md section 5, confirmed by MathArena's configs: data/README.md, "Counts").
DELTA_PAPER_QUESTIONS = 213
# Every benchmark name that resolves to a file of data/ (or its hub copy): the eight and DelTA's four more.
KNOWN_BENCHMARKS = BENCHMARKS + tuple(n for n in DELTA_PAPER if n not in BENCHMARKS)
# Named suites of ``--benchmarks``: a name that expands to several benchmarks, in their report order.
SUITES = {"all": BENCHMARKS, "delta_paper": DELTA_PAPER}

# The same benchmarks on the Hugging Face hub (used when the local file is missing and the machine is online).
# ``problem`` may list several field names: the first one present is used. ``id`` None = the row number.
# The hub copies can differ from the local files (see data/README.md): math500 has all 500
# problems there too, OlympiadBench's OE_TO_maths_en_COMP subset 674 rows (675 here).
HF_DATASETS = {
    "aime24": dict(
        path="HuggingFaceH4/aime_2024", config=None, split="train", problem="problem", answer="answer", id="id"
    ),
    "aime25": dict(path="math-ai/aime25", config=None, split="test", problem="problem", answer="answer", id="id"),
    "amc23": dict(
        path="math-ai/amc23", config=None, split="test", problem=("question", "problem"), answer="answer", id="id"
    ),
    "math500": dict(
        path="HuggingFaceH4/MATH-500", config=None, split="test", problem="problem", answer="answer", id="unique_id"
    ),
    "minerva": dict(
        path="math-ai/minervamath", config=None, split="test", problem=("question", "problem"), answer="answer", id=None
    ),
    "olympiadbench": dict(
        path="Hothan/OlympiadBench",
        config="OE_TO_maths_en_COMP",
        split="train",
        problem="question",
        answer="final_answer",
        id="id",
    ),
    "gsm8k": dict(path="openai/gsm8k", config="main", split="test", problem="question", answer="answer", id=None),
    "hmmt_feb25": dict(
        path="MathArena/hmmt_feb_2025", config=None, split="train", problem="problem", answer="answer", id="problem_idx"
    ),
    # DelTA's four more; the local files' ids name the contest (2026-I-1, hmmt-nov-2025-1), the hub's problem_idx
    # counts 1, 2, ... (aime26: II-k is 15 + k)
    "aime26": dict(
        path="MathArena/aime_2026", config=None, split="train", problem="problem", answer="answer", id="problem_idx"
    ),
    "hmmt_nov25": dict(
        path="MathArena/hmmt_nov_2025", config=None, split="train", problem="problem", answer="answer", id="problem_idx"
    ),
    "hmmt_feb26": dict(
        path="MathArena/hmmt_feb_2026", config=None, split="train", problem="problem", answer="answer", id="problem_idx"
    ),
    "brumo25": dict(
        path="MathArena/brumo_2025", config=None, split="train", problem="problem", answer="answer", id="problem_idx"
    ),
}


# ----------------------------------------------------------------------------------------------------------
# Files and their rows
# ----------------------------------------------------------------------------------------------------------
def default_data_dir() -> Path:
    """``$RLVR_DATA_DIR``, else the repository's ``data/`` folder (the benchmarks and the MATH training set)."""
    env = os.environ.get("RLVR_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "data"


def _row_errors(row, label: str, fields: tuple[str, str] = REQUIRED_FIELDS) -> list[str]:
    """What is wrong with one row's ``fields`` (the problem's and the answer's; numbers become strings in place),
    as messages starting with ``label`` (``file:line``, ``file: row i`` or ``source[i]``)."""
    if not isinstance(row, dict):
        return [f"{label}: expected a JSON object, got {type(row).__name__}"]
    errors = []
    for key in fields:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = row[key] = _number_to_str(value)  # e.g. a numeric answer written as a JSON number
        if not isinstance(value, str) or not value.strip():
            what = (
                "missing"
                if key not in row
                else "null"
                if value is None
                else "empty"
                if isinstance(value, str)
                else "not a string"
            )
            errors.append(f"{label}: field '{key}' is {what}")
        elif key == fields[1] and not _graded(value):  # the grader would refuse it at the first step that samples it
            errors.append(f"{label}: field '{key}' {value!r} is blank after normalisation (verify.normalize_reference)")
    return errors


def _graded(reference: str) -> bool:
    """Whether verify.py can grade against ``reference`` (it is not blank once normalised: ``$$``, ``\\quad``)."""
    try:
        verify.normalize_reference(reference)
    except ValueError:
        return False
    return True


def _repeated_ids(rows: list[dict], labels: list[str]) -> list[str]:
    """One message per row whose ``id`` an earlier row has (``file:line: field 'id' ... repeats file:line``): a
    problem's responses and results are kept by its id."""
    first = {}
    errors = []
    for row, label in zip(rows, labels):
        if row["id"] in first:
            errors.append(f"{label}: field 'id' {row['id']!r} repeats {first[row['id']]}")
        first.setdefault(row["id"], label)
    return errors


def _raise_if_bad(errors: list[str], rows: list, where) -> None:
    """One ValueError listing the first ten bad rows (and how many more), or for an empty source."""
    if errors:
        more = f"\n... and {len(errors) - 10} more" if len(errors) > 10 else ""
        raise ValueError(f"{len(errors)} bad row(s) in {where}:\n" + "\n".join(errors[:10]) + more)
    if not rows:
        raise ValueError(f"{where}: no rows")


def _check_rows(rows: list, where: str) -> list[dict]:
    """Validate ``{problem, answer}`` rows (numbers become strings); one ValueError listing every bad row."""
    labels = [f"{where}[{i}]" for i in range(len(rows))]
    errors = [e for row, label in zip(rows, labels) for e in _row_errors(row, label)]
    if not errors and all(isinstance(row.get("id"), str) for row in rows):
        errors = _repeated_ids(rows, labels)
    _raise_if_bad(errors, rows, where)
    return rows


def _number_to_str(value) -> str:
    """A JSON number as an answer string: ``27.0`` -> ``"27"`` (amc23 stores whole numbers as floats)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def load_problems(
    source: str,
    split: str = "train",
    data_dir: str | os.PathLike | None = None,
    problem_field: str = "problem",
    answer_field: str = "answer",
) -> list[dict]:
    """Problems as ``{id, problem, answer, source}`` rows: a jsonl or parquet file, a folder of shards, a benchmark
    name, or a registered task (``SOURCES``: the toy, once ``toy.register_data`` ran).

    ``source`` is resolved in this order: a name of ``SOURCES`` (that task's ``split``); an existing file: ``*.parquet``
    is read with pyarrow, any other file as jsonl (one JSON object per line with string ``problem`` and
    ``answer``; ``id`` defaults to ``<stem>-<line>``, ``source`` to the file stem); an existing folder: every
    ``*.parquet`` and ``*.jsonl`` file directly in it (not in subfolders), in the order of their names (Hugging Face
    shards ``train-00000-of-00010.parquet``, ...), as one data set; a training set's name
    (``<data_dir>/train/<name>.jsonl``, e.g. ``math_train``); a benchmark name of :data:`KNOWN_BENCHMARKS`
    (``<data_dir>/<name>.jsonl`` when it exists, else the Hugging Face dataset of :data:`HF_DATASETS`, see
    :func:`load_hf_benchmark`). Rows are returned as the source gives them (answers like ``2,125`` or ``025`` are
    compared by verify.py); numbers become strings (``27.0`` -> ``"27"``).

    A parquet file (DeepMath-103K's shards: data/README.md) is read batch by batch and only in the columns used:
    ``problem_field``, ``answer_field``, and ``id`` and ``source`` when it has them (``id`` defaults to
    ``<stem>-<row>``, rows counted from 0 as pyarrow and pandas count them; ``source`` to the file stem); its other
    columns are not read (DeepMath's three R1 solutions are 4.9 GB of text). A jsonl row keeps all its fields.

    ``problem_field`` / ``answer_field`` (grpo.py's ``--data_problem_field`` / ``--data_answer_field``) name the
    fields that hold the problem and the answer in a file's rows (DeepMath: ``question`` / ``final_answer``); they
    become ``problem`` / ``answer`` (the original keys are removed; an existing ``problem`` / ``answer`` field is
    replaced). They apply to jsonl and parquet files, not to the toy task or the hub copies of the benchmarks.

    Every row is checked before anything else runs: a line that is not a JSON object, or a missing, null,
    non-string or empty problem/answer field, raises one error naming the file, the line (jsonl: ``file:line:
    field 'answer' is missing``) or row (parquet: ``file.parquet: row 17: field 'final_answer' is empty``) and
    the field, for the first ten bad rows of all files. A field that is not a column of a parquet file, or in no
    row of a jsonl file of two rows or more, is one line naming it and the columns (the first row's fields) there are.

    Args:
        source: a ``.jsonl`` or ``.parquet`` path, a folder of them, a training set or benchmark name, or a name of
            ``SOURCES``.
        split: for a name of ``SOURCES``: ``"train"`` or ``"test"`` (ignored otherwise).
        data_dir: folder of the benchmark files (default :func:`default_data_dir`).
        problem_field: the field (column) that holds the problem.
        answer_field: the field (column) that holds the reference answer.
    Raises:
        FileNotFoundError: the file does not exist, a folder holds no ``*.parquet`` / ``*.jsonl`` file, or a
            benchmark has no local file and cannot be downloaded (message starts with ``no local file and cannot
            download``).
        ValueError: a bad row (message ``file:line: ...`` / ``file: row i: ...``), a missing column, a file that
            is not parquet, pyarrow not installed, or no rows at all.
    """
    if source in SOURCES:
        return SOURCES[source](split)
    fields = (problem_field, answer_field)
    path = Path(source)
    train = Path(data_dir or default_data_dir()) / "train" / f"{source}.jsonl"
    if not path.exists() and train.is_file():  # a training set's name, e.g. math_train
        return _load_files([train], fields, train)
    if path.is_dir():
        return _load_files(_data_files(path), fields, path)
    if not path.is_file():
        if source in HF_DATASETS:
            local = Path(data_dir or default_data_dir()) / f"{source}.jsonl"
            return _load_files([local], fields, local) if local.is_file() else load_hf_benchmark(source, local)
        trains = sorted(f.stem for f in (Path(data_dir or default_data_dir()) / "train").glob("*.jsonl"))
        raise FileNotFoundError(
            f"data file not found: {source} (benchmark names: {', '.join(KNOWN_BENCHMARKS)}; "
            f"training sets: {', '.join(trains) or 'none'}" + "".join(f"; or {name}" for name in SOURCES) + ")"
        )
    return _load_files([path], fields, path)


def _data_files(folder: Path) -> list[Path]:
    """The ``*.parquet`` and ``*.jsonl`` files directly in ``folder``, sorted by name (FileNotFoundError: none)."""
    files = sorted(
        (p for p in folder.iterdir() if p.suffix in (".parquet", ".jsonl") and p.is_file()), key=lambda p: p.name
    )
    if not files:
        subs = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        raise FileNotFoundError(
            f"no *.parquet or *.jsonl file in the folder {folder}"
            + (f" (its subfolders: {', '.join(subs)})" if subs else "")
        )
    return files


def _load_files(paths: list[Path], fields: tuple[str, str], where: Path) -> list[dict]:
    """The rows of every file in ``paths``, in order, all checked first (ids unique over them all); one ValueError
    for the bad ones."""
    rows, errors, labels = [], [], []
    for path in paths:
        read = _read_parquet if path.suffix == ".parquet" else _read_jsonl
        more_rows, more_errors, more_labels = read(path, fields)
        rows += more_rows
        errors += more_errors
        labels += more_labels
    _raise_if_bad(errors + _repeated_ids(rows, labels), rows, where)
    return rows


def _as_problem_and_answer(row: dict, fields: tuple[str, str]) -> None:
    """Rename the row's problem and answer fields to ``problem`` / ``answer`` (in place)."""
    if fields != REQUIRED_FIELDS:
        problem, answer = row.pop(fields[0], None), row.pop(fields[1], None)
        row["problem"], row["answer"] = problem, answer


def _missing_column(path: Path, fields: tuple[str, str], present, listing: str, noun: str = "column") -> None:
    """ValueError in one line when ``fields`` names a column (field) that is not in ``present``."""
    for flag, field in zip(("--data_problem_field", "--data_answer_field"), fields):
        if field not in present:
            raise ValueError(f"{flag} {field}: no such {noun} in {path} ({listing})")


def _read_jsonl(path: Path, fields: tuple[str, str] = REQUIRED_FIELDS) -> tuple[list[dict], list[str], list[str]]:
    """The rows of a jsonl file, the messages of its bad lines (``file:line: ...``) and each row's ``file:line``."""
    rows, errors, seen, first = [], [], set(), None
    labels = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                errors.append(f"{path}:{lineno}: not valid JSON ({e.msg})")
                continue
            errors += _row_errors(row, f"{path}:{lineno}", fields)
            if not isinstance(row, dict):
                continue
            first = list(row) if first is None else first
            seen.update(k for k in fields if k in row)
            _as_problem_and_answer(row, fields)
            row.setdefault("id", f"{path.stem}-{lineno}")
            row["id"] = str(row["id"])
            row.setdefault("source", path.stem)
            rows.append(row)
            labels.append(f"{path}:{lineno}")
    if len(rows) > 1 and len(seen) < len(set(fields)):  # a field of no row: the wrong name, not bad rows
        _missing_column(path, fields, seen, f"fields of its first row: {', '.join(first) or 'none'}", "field")
    return rows, errors, labels


def _read_parquet(path: Path, fields: tuple[str, str]) -> tuple[list[dict], list[str], list[str]]:
    """The rows of a parquet file, the messages of its bad rows (``file: row i: ...``, i from 0) and each row's label.

    Read with pyarrow (imported here) one record batch of 4096 rows at a time and only in the columns used: the
    file's other columns are never decompressed, one batch's Arrow buffers are held at a time, and the Python strings
    made from them are the rows' own (DeepMath's 103k problems and answers: ~60 MB of text, one copy)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"reading {path} needs pyarrow (pip install -r requirements.txt)") from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow.ArrowInvalid: not a parquet file (wrong suffix, truncated download)
        raise ValueError(f"{path}: not a readable parquet file ({str(e).splitlines()[0] if str(e) else e!r})") from None
    names = pf.schema_arrow.names
    _missing_column(path, fields, names, f"columns: {', '.join(names) or 'none'}")
    columns = list(dict.fromkeys([*fields, *(c for c in ("id", "source") if c in names)]))
    rows, errors, i = [], [], 0
    for batch in pf.iter_batches(batch_size=4096, columns=columns):
        values = [batch.column(c).to_pylist() for c in columns]
        for record in zip(*values):
            row = dict(zip(columns, record))  # a null stays None: "field 'x' is null"
            errors += _row_errors(row, f"{path}: row {i}", fields)
            rows.append(
                {
                    "id": f"{path.stem}-{i}" if row.get("id") is None else str(row["id"]),
                    "problem": row[fields[0]],
                    "answer": row[fields[1]],
                    "source": path.stem if row.get("source") is None else str(row["source"]),
                }
            )
            i += 1
    return rows, errors, [f"{path}: row {j}" for j in range(len(rows))]


# ----------------------------------------------------------------------------------------------------------
# The benchmarks: their hub copies, and --benchmarks as sources
# ----------------------------------------------------------------------------------------------------------
def _hf_answer(name: str, raw) -> str:
    """The reference answer of a hub row, converted with the rules of data/README.md."""
    if name == "gsm8k":  # the text after '####' in the worked answer
        if not isinstance(raw, str) or "####" not in raw:
            raise ValueError(f"gsm8k: field 'answer' has no '####': {str(raw)[:80]!r}")
        return raw.split("####")[-1].strip()
    if name == "olympiadbench":  # final_answer is a one-element list of '$...$' strings
        raw = raw[0] if isinstance(raw, (list, tuple)) and raw else raw
        return raw.replace("$", "").strip() if isinstance(raw, str) else raw
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return _number_to_str(raw)
    if isinstance(raw, str) and "\\boxed" in raw:  # a solution rather than an answer (minerva copies)
        boxed = verify.extract_boxed(raw)
        return boxed if boxed is not None else raw.strip()
    return raw.strip() if isinstance(raw, str) else raw


def load_hf_benchmark(name: str, local_path: str | os.PathLike | None = None) -> list[dict]:
    """Load benchmark ``name`` from the Hugging Face hub (``datasets.load_dataset``) as ``{id, problem, answer,
    source}`` rows; ids, problems and answers follow the conversion rules of data/README.md.

    ``datasets`` is imported here, only when needed (it is not a requirement of this repository).
    Args:
        name: a key of :data:`HF_DATASETS`.
        local_path: the local file that was looked for first (named in the error message).
    Raises:
        ValueError: unknown name, or a row without the expected fields.
        FileNotFoundError: ``datasets`` is not installed or the download failed (offline, unknown id); the
            message starts with ``no local file and cannot download``.
    """
    if name not in HF_DATASETS:
        raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(HF_DATASETS)}")
    spec = HF_DATASETS[name]
    copy = spec["path"] + (f" ({spec['config']})" if spec["config"] else "") + f" split {spec['split']}"
    local = f"{local_path} does not exist" if local_path else "no local file given"
    try:
        import datasets
    except ImportError:
        raise FileNotFoundError(
            f"no local file and cannot download: {name} ({local}; the hub copy {copy} needs "
            f"the 'datasets' package: pip install datasets)"
        ) from None
    try:
        if os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("1", "true", "yes", "on"):
            hub.require_hub(spec["path"], "benchmark")  # no network: fail now, not after the client's retries
        ds = datasets.load_dataset(spec["path"], spec["config"], split=spec["split"])
    except Exception as e:  # offline, unknown id, hub error: one clear line instead of a deep traceback
        first = str(e).splitlines()[0] if str(e) else ""
        raise FileNotFoundError(
            f"no local file and cannot download: {name} ({local}; loading {copy} failed: {type(e).__name__}: {first})"
        ) from None
    fields = spec["problem"] if isinstance(spec["problem"], tuple) else (spec["problem"],)
    rows = []
    for i, raw in enumerate(ds):
        field = next((f for f in fields if f in raw), None)
        if field is None or spec["answer"] not in raw:
            raise ValueError(
                f"{spec['path']} row {i}: expected fields {fields} and '{spec['answer']}', got {sorted(raw)}"
            )
        problem = raw[field].strip() if isinstance(raw[field], str) else raw[field]
        row_id = raw[spec["id"]] if spec["id"] and spec["id"] in raw else i
        rows.append(
            {"id": str(row_id), "problem": problem, "answer": _hf_answer(name, raw[spec["answer"]]), "source": name}
        )
    return _check_rows(rows, f"{spec['path']} ({name})")


def resolve_benchmarks(spec: str, data_dir: str | os.PathLike | None = None) -> list[tuple[str, str]]:
    """Parse ``--benchmarks`` into ``(name, source)`` pairs; ``source``: a file path, a name of ``SOURCES`` or ``"hf"``.

    ``spec`` is comma-separated; each item is a suite of :data:`SUITES` (``all``: the eight benchmarks of
    :data:`BENCHMARKS`; ``delta_paper``: DelTA's seven of :data:`DELTA_PAPER`, in its Table 1's order), a name of
    ``SOURCES`` (that task's held-out split, e.g. ``toy``), a path to a ``.jsonl`` file (name = its stem), or a
    benchmark name of :data:`KNOWN_BENCHMARKS` (``<data_dir>/<name>.jsonl`` if it exists, else ``"hf"``: the Hugging
    Face copy).
    Raises:
        FileNotFoundError: a ``.jsonl`` path that does not exist.
        ValueError: an unknown name, an empty spec, or two items with the same name (their outputs would
            overwrite each other).
    """
    data_dir = Path(data_dir or default_data_dir())
    items = [s.strip() for s in str(spec).split(",") if s.strip()]
    if not items:
        raise ValueError("--benchmarks is empty")
    out: list[tuple[str, str]] = []
    for item in items:
        if item in SUITES:
            out += [
                (n, str(data_dir / f"{n}.jsonl") if (data_dir / f"{n}.jsonl").is_file() else "hf") for n in SUITES[item]
            ]
        elif item in SOURCES:  # a registered task's held-out split
            out.append((item, item))
        elif item.endswith(".jsonl") or os.sep in item or Path(item).is_file():
            if not Path(item).is_file():
                raise FileNotFoundError(f"benchmark file not found: {item}")
            out.append((Path(item).stem, item))
        elif item in HF_DATASETS:
            local = data_dir / f"{item}.jsonl"
            out.append((item, str(local) if local.is_file() else "hf"))
        else:
            raise ValueError(
                f"unknown benchmark {item!r} in --benchmarks: use a suite ({', '.join(SUITES)}), "
                f"{''.join(name + ', ' for name in SOURCES)}a "
                f".jsonl path or one of {', '.join(KNOWN_BENCHMARKS)}"
            )
    names = [n for n, _ in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"--benchmarks names {dup} more than once (a suite counts its benchmarks)")
    return out


def load_benchmark(name: str, source: str, data_dir: str | os.PathLike | None = None) -> list[dict]:
    """The rows of one ``(name, source)`` pair from :func:`resolve_benchmarks` (errors: see load_problems)."""
    if source in SOURCES:
        return load_problems(source, split="test")
    if source == "hf":
        return load_hf_benchmark(name, local_path=Path(data_dir or default_data_dir()) / f"{name}.jsonl")
    return load_problems(source)

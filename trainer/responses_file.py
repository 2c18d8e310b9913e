"""A benchmark's graded responses as a resumable jsonl file (evaluate.py's ``run_benchmark``): records tagged with a
hash of the settings that drew them and the key of their chunk of problems, appended one chunk per synced write, a
torn last line cut before appending, read back by (mode, chunk), rewritten in file order at the end. The chunks and
their seeds are functions of the data and the seed alone, so a resumed run draws what an uninterrupted one draws.
Imported by evaluate.py; imports no project module.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import NamedTuple


def settings_hash(generation: dict) -> str:
    """A short hash of everything that decides the responses (model, template, stop ids, sampling, seed,
    chunking, batch size); stored in every response record."""
    return hashlib.sha256(json.dumps(generation, sort_keys=True).encode()).hexdigest()[:16]


def chunk_seed(seed: int, benchmark: str, mode: str, chunk: int) -> int:
    """The sampler seed of one chunk: a hash of (seed, benchmark, mode, chunk index), never of the run's
    history, so a resumed run samples every chunk exactly as an uninterrupted one."""
    return int.from_bytes(hashlib.sha256(f"{seed}|{benchmark}|{mode}|{chunk}".encode()).digest()[:4], "big") >> 1


def chunk_key(index: int, rows: list[dict]) -> str:
    """Identifies a chunk's content: its index and a hash of its problems (a changed data file or --limit
    that cuts the chunk short gives another key, so those records are not reused)."""
    h = hashlib.sha256(json.dumps([[r["id"], r["problem"], r["answer"]] for r in rows]).encode()).hexdigest()
    return f"{index}:{h[:12]}"


def make_chunks(rows: list[dict], chunk_size: int) -> list[list[dict]]:
    """Problems in chunks of ``chunk_size``, after a stable sort by problem length (characters; ties keep file
    order), so a batch pads to similar prompt lengths. A function of the rows alone: the same data always gives
    the same chunks, whatever was generated before."""
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i]["problem"]), i))
    ordered = [rows[i] for i in order]
    return [ordered[i : i + chunk_size] for i in range(0, len(ordered), chunk_size)]


def load_responses(path: str | os.PathLike, expected_hash: str, overwrite: bool = False) -> dict:
    """Records already written to a responses file, keyed by ``(mode, chunk key)`` then ``(id, sample)``.

    A last line cut off mid-write (an interrupted run) is ignored, as is any undecodable line.
    Raises:
        ValueError: the file holds records written with other settings (unless ``overwrite``, which deletes it).
    """
    path = Path(path)
    if not path.exists():
        return {}
    if overwrite:
        path.unlink()
        return {}
    found: dict = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
                key = (rec["mode"], rec["chunk"])
                item = (rec["id"], rec["sample"])
                h = rec["settings_hash"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
            if h != expected_hash:
                raise ValueError(
                    f"{path} was written with different settings (hash {h}, now {expected_hash}): "
                    "rerun with the same settings to resume, or use another --output_dir or "
                    "--overwrite"
                )
            found.setdefault(key, {})[item] = rec  # a regenerated chunk comes later and wins
    return found


def cut_torn_tail(path: str | os.PathLike) -> int:
    """Cut ``path`` back to its last complete line (the end of its last ``\\n``); returns the bytes cut (0 when
    the file ends with a newline, is empty or is missing).

    An interrupted run can leave half a record at the end (:func:`append_records` writes one chunk per call, so a crash
    leaves at most one partial line). Appending to it would merge the next record into that half-line and lose it,
    so the chunk would be redone again on the next resume; :func:`load_responses` already ignores the half-line.
    A last line that is a whole JSON object written without its newline is kept and given one.
    """
    path = Path(path)
    try:
        f = open(path, "r+b")
    except FileNotFoundError:
        return 0
    with f:
        size = f.seek(0, os.SEEK_END)
        end = size
        while end > 0:  # scan back for the last newline, 64 KiB at a time (a record can be long)
            start = max(0, end - (1 << 16))
            f.seek(start)
            nl = f.read(end - start).rfind(b"\n")
            if nl >= 0:
                end = start + nl + 1
                break
            end = start
        if end == size:
            return 0
        f.seek(end)
        tail = f.read()
        try:
            whole = isinstance(json.loads(tail), dict)
        except (json.JSONDecodeError, UnicodeDecodeError):
            whole = False
        if whole:
            f.write(b"\n")
            return 0
        f.truncate(end)
        f.flush()
        os.fsync(f.fileno())
        return size - end


def append_records(path: Path, records: list[dict]) -> None:
    """Append records as jsonl in one write, flushed and synced: a crash leaves at most one partial line, which
    the next resume cuts off before it appends (:func:`cut_torn_tail`)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


class ResponsesFile(NamedTuple):
    """Where a benchmark's graded responses are saved and resumed from: the jsonl ``path``, the ``run_hash`` every
    record carries (:func:`settings_hash`), and ``overwrite``: delete a file of other settings instead of refusing."""

    path: str | os.PathLike
    run_hash: str
    overwrite: bool = False


def rewrite_in_file_order(path: Path, records: list[dict], rows: list[dict]) -> None:
    """Sort ``records`` in place (mode, problem in file order, sample) and rewrite ``path`` with exactly them."""
    position = {r["id"]: i for i, r in enumerate(rows)}
    mode_rank = {"greedy": 0, "sample": 1}
    records.sort(key=lambda r: (mode_rank[r["mode"]], position[r["id"]], r["sample"]))  # file order
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    os.replace(tmp, path)

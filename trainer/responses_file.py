"""A benchmark's graded responses as a resumable jsonl file, and the resumable runner that fills it (``run_benchmark``,
evaluate.py's benchmarks): records tagged with a hash of the settings that drew them and the key of their chunk of
problems, appended one chunk per synced write, a torn last line cut before appending, read back by (mode, chunk),
rewritten in file order at the end.

Resuming: a rerun of the same command reuses every (mode, chunk) that is complete and draws the rest, each chunk
whole; a rerun with other settings is refused (``--overwrite`` starts again). The chunks (problems sorted by length,
then cut into ``--chunk_size``) and their seeds (a hash of seed, benchmark, mode and chunk index) are functions of the
data and the seed alone, so an interrupted and resumed run writes the same responses as an uninterrupted one, wherever
it was interrupted (exact on the CPU; on a GPU as deterministic as its kernels). A response depends on its chunk-mates
(batch padding, a shared random stream), so the chunk and batch sizes are part of the settings. ``--sampling
trainer``: one chunk per mode, every problem in file order with the seed itself, as the trainer's evaluation draws.

Imported by evaluate.py and trainer/eval_results.py; imports no project module (the responses are drawn by the
function evaluate.py hands to ``run_benchmark``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Callable, NamedTuple


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


# How responses are drawn (evaluate.py's --sampling), with the settings hash's name of each rule. "chunks": problems
# sorted by length, cut into chunks of chunk_size, each drawn with its own seed (chunk_seed), resumed chunk by chunk.
# "trainer": as the trainer's held-out evaluation (evaluate.heldout): rows in file order, one chunk per mode drawn with
# the seed itself, resumed mode by mode. A trained run's checkpoint defaults to "trainer", anything else to "chunks".
CHUNKING = {"chunks": "by-length", "trainer": "trainer"}
SAMPLINGS = ("chunks", "trainer")


class ChunkPlan(NamedTuple):
    """How :func:`run_benchmark` cuts and seeds a benchmark's responses: the ``modes`` ((mode, responses per problem)
    pairs, evaluate.modes), the base ``seed``, the ``sampling`` rule (:data:`SAMPLINGS`) and its ``chunk_size``."""

    modes: list[tuple[str, int]]
    seed: int
    sampling: str = "chunks"
    chunk_size: int = 32


def run_benchmark(
    name: str,
    rows: list[dict],
    plan: ChunkPlan,
    saved: ResponsesFile,
    draw: Callable[[list[dict], str, int], list[dict]],
    progress: bool = True,
) -> tuple[list[dict], int]:
    """Draw, grade and save the responses of benchmark ``name``, resuming from ``saved.path``.

    For each mode and chunk (:func:`make_chunks`; with ``plan.sampling == "trainer"`` one chunk of every row in file
    order): if the file holds all its records (same settings hash and chunk key) they are reused; otherwise
    ``draw(chunk rows, mode, seed)`` (evaluate.generate_records: the graded records, in order) draws it whole, with
    :func:`chunk_seed` (or ``plan.seed`` itself for "trainer"), and the records are appended at once. At the end the
    file is rewritten in file order with exactly this run's records. On Ctrl-C, says where the responses so far are.

    Returns (records in file order, number reused from the file). Raises ValueError: the file holds other settings.
    """
    from tqdm import tqdm

    path = Path(saved.path)
    found = load_responses(path, saved.run_hash, overwrite=saved.overwrite)
    cut_torn_tail(path)  # appending onto a torn half-line would merge (and lose) the first new record
    chunks = [rows] if plan.sampling == "trainer" else make_chunks(rows, plan.chunk_size)
    total = sum(n * len(rows) for _, n in plan.modes)
    bar = tqdm(total=total, desc=name, unit="resp", disable=not progress, dynamic_ncols=True, mininterval=1.0)
    records = []
    reused = 0
    try:
        for mode, n in plan.modes:
            for index, chunk in enumerate(chunks):
                key = chunk_key(index, chunk)
                have = found.get((mode, key), {})
                wanted = [(r["id"], s) for r in chunk for s in range(n)]
                if all(w in have for w in wanted):  # complete: reuse
                    records += [have[w] for w in wanted]
                    reused += len(wanted)
                else:  # missing or partial: draw the whole chunk (same seed, same batch -> same responses)
                    seed = plan.seed if plan.sampling == "trainer" else chunk_seed(plan.seed, name, mode, index)
                    new = draw(chunk, mode, seed)
                    for rec in new:
                        rec.update(chunk=key, settings_hash=saved.run_hash)
                    append_records(path, new)
                    records += new
                bar.set_postfix_str(mode)
                bar.update(len(wanted))
    except KeyboardInterrupt:
        bar.close()  # before the message, not over it
        print(f"\ninterrupted: the responses so far are in {path}; rerun the same command to resume", file=sys.stderr)
        raise
    finally:
        bar.close()
    rewrite_in_file_order(path, records, rows)
    if reused:  # said, so that a run of saved responses is never mistaken for a new one
        print(
            f"[reused] {name}: {reused} of {len(records)} responses from {path} (the same settings; --resample "
            "generates them anew)"
        )
    return records, reused

"""Prompt sets for distillation, calibration and benchmarks.

The prompt data lives outside the package (``shared/data`` beside the project: ``train/`` for
distillation and calibration, ``eval/`` for benchmarks only). ``default_data_dir`` finds it without
assuming a source checkout; every function takes ``data_dir`` to point elsewhere.

Training prompts are split by a stable hash of their id into a training part and a held-out
calibration part (``split_of``); regenerated sequences are held out for validation by another
salted hash (``held_out_for_validation``). Nothing here ever reads ``eval/`` for training.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import re
from pathlib import Path

import attrs

__all__ = [
    "DATA_DIR_VARIABLE",
    "EvalPrompt",
    "PromptRecord",
    "TRAIN_SOURCES",
    "default_data_dir",
    "eval_prompts",
    "held_out_for_validation",
    "spec_bench_questions",
    "split_of",
    "training_prompts",
]

DATA_DIR_VARIABLE = "DSPARK_DATA_DIR"


def _instruction(record: dict) -> str:
    return (record["instruction"] + "\n" + record["input"]).strip()


# Per source file: the prompt text of a record, and its dataset answer (None where the source has none).
TRAIN_SOURCES = {
    "sharegpt_prompts.jsonl": (lambda record: record["prompt"], lambda record: None),
    "alpaca_5k.jsonl": (_instruction, lambda record: record["output"]),
    "code_alpaca_2k.jsonl": (_instruction, lambda record: record["output"]),
    # GSM8K's calculator annotations (<<48/2=24>>) are tool markup no chat model writes.
    "gsm8k_train.jsonl": (lambda record: record["question"], lambda record: re.sub(r"<<[^>]*>>", "", record["answer"])),
}


@attrs.frozen
class PromptRecord:
    """One training prompt: a stable id (source and line), its text and the dataset's answer if any."""

    id: str
    text: str
    reference: str | None = None


@attrs.frozen
class EvalPrompt:
    """One evaluation prompt: its set ('spec_bench', 'humaneval', 'gsm8k'), category and user message."""

    set: str
    category: str
    message: str


def default_data_dir() -> Path:
    """The prompt-data folder (holding ``train/`` and ``eval/``).

    ``$DSPARK_DATA_DIR`` when set; else the first ``shared/data`` found in the working directory or
    one of its parents (the project's layout keeps it beside the checkout). Raises ValueError naming
    the places it looked when there is none: pass ``data_dir`` (``--data-dir``) instead.
    """
    if os.environ.get(DATA_DIR_VARIABLE):
        return Path(os.environ[DATA_DIR_VARIABLE])
    cwd = Path.cwd().resolve()
    candidates = [base / "shared" / "data" for base in (cwd, *cwd.parents)]
    for candidate in candidates:
        if (candidate / "train").is_dir() or (candidate / "eval").is_dir():
            return candidate
    raise ValueError(
        f"no prompt data found: set ${DATA_DIR_VARIABLE} or pass data_dir (--data-dir) to a folder holding train/ "
        f"and eval/; looked for shared/data in {str(cwd)!r} and its parents"
    )


def _folder(data_dir: str | Path | None, name: str) -> Path:
    """``data_dir/name``, or ``data_dir`` itself when it already is that folder."""
    root = default_data_dir() if data_dir is None else Path(data_dir)
    folder = root if root.name == name else root / name
    if not folder.is_dir():
        raise ValueError(f"data_dir {str(root)!r} has no {name}/ folder; expected the shared/data folder (train/ and eval/)")
    return folder


def _stable_fraction(key: str) -> float:
    """A number in [0, 1] fixed by ``key`` alone (the first 32 bits of its SHA-256)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def split_of(prompt_id: str, calibration_share: float = 0.05) -> str:
    """'calibration' for a stable ``calibration_share`` of prompt ids, else 'train'."""
    return "calibration" if _stable_fraction(prompt_id) < calibration_share else "train"


def held_out_for_validation(record_id: str, share: float) -> bool:
    """True for a stable ``share`` of record ids (all answers to one prompt alike), scored by
    ``dspark.training.validate`` and never trained on."""
    if isinstance(share, bool) or not 0.0 <= share < 1.0:
        raise ValueError(f"share must be a float in [0, 1), got {share!r}")
    # Salted, so the validation hold-out is independent of the calibration split.
    return _stable_fraction(f"validation:{record_id}") < share


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def training_prompts(data_dir: str | Path | None = None, split: str = "train", limit: int | None = None, seed: int = 0) -> list[PromptRecord]:
    """Prompts of every source in ``data_dir``'s ``train/`` folder, interleaved source by source.

    ``data_dir``: the prompt-data folder or its ``train/`` folder (default: ``default_data_dir()``).
    ``split`` is 'train' or 'calibration' (see ``split_of``); ``limit`` keeps the first prompts of a
    seeded shuffle of each source, taken in turn so every source is represented.
    """
    if data_dir is not None and (Path(data_dir).name == "eval" or "eval" in Path(data_dir).parts[-2:]):
        raise ValueError(f"data_dir must be a training folder, never eval/: got {str(data_dir)!r}")
    if split not in ("train", "calibration"):
        raise ValueError(f"split must be 'train' or 'calibration', got {split!r}")
    folder = _folder(data_dir, "train")
    per_source = []
    for name, (text_of, reference_of) in TRAIN_SOURCES.items():
        path = folder / name
        if not path.is_file():
            raise ValueError(f"data_dir {str(folder)!r} lacks {name}; expected the shared/data/train folder")
        # Ids count every line, blank ones too, so they never shift.
        rows = [(line_number, json.loads(line)) for line_number, line in enumerate(path.read_text().splitlines()) if line.strip()]
        records = [PromptRecord(id=f"{name}:{line_number}", text=text_of(row), reference=reference_of(row)) for line_number, row in rows]
        records = [record for record in records if record.text and split_of(record.id) == split]
        random.Random(f"{seed}:{name}").shuffle(records)
        per_source.append(records)
    interleaved = [record for group in zip(*per_source) for record in group]
    return interleaved[:limit] if limit is not None else interleaved


def spec_bench_questions(data_dir: str | Path | None = None, per_category: int | None = None) -> list[dict]:
    """Spec-Bench questions (``eval/spec_bench.jsonl``) in file order, the first ``per_category`` of
    every category when given. For benchmarks only."""
    if per_category is not None and per_category < 1:
        raise ValueError(f"per_category must be at least 1 or None, got {per_category!r}")
    taken, questions = collections.Counter(), []
    for question in _read_jsonl(_folder(data_dir, "eval") / "spec_bench.jsonl"):
        if per_category is None or taken[question["category"]] < per_category:
            taken[question["category"]] += 1
            questions.append(question)
    return questions


def eval_prompts(data_dir: str | Path | None = None, spec_per_category: int = 4, humaneval: int = 0, gsm8k: int = 0) -> list[EvalPrompt]:
    """First turns of Spec-Bench (``spec_per_category`` per category), the first ``humaneval`` HumanEval
    functions to complete and the first ``gsm8k`` GSM8K test questions. For benchmarks only."""
    if min(humaneval, gsm8k) < 0:
        raise ValueError(f"humaneval and gsm8k must be >= 0, got {humaneval!r} and {gsm8k!r}")
    folder = _folder(data_dir, "eval")
    prompts = [EvalPrompt("spec_bench", q["category"], q["turns"][0]) for q in spec_bench_questions(folder.parent, spec_per_category)]
    for row in _read_jsonl(folder / "humaneval.jsonl")[:humaneval]:
        prompts.append(EvalPrompt("humaneval", "humaneval", "Complete this Python function:\n\n" + row["prompt"]))
    for row in _read_jsonl(folder / "gsm8k_test.jsonl")[:gsm8k]:
        prompts.append(EvalPrompt("gsm8k", "gsm8k", row["question"]))
    return prompts

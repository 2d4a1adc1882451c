"""Calibration rows: where they come from, which are picked (a sha256 permutation) and how they are
tokenized."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from fp8eval.calibrate.config import PRESETS, CalibConfig, CalibrationError
from fp8eval.core.filehash import file_sha256
from fp8eval.core.seeds import permutation


@dataclass
class DatasetSource:
    kind: str  # hub | file
    id: str  # hub id or resolved file path
    split: Optional[str] = None
    revision: Optional[str] = None
    sha256: Optional[str] = None  # of a local file's bytes

    def key(self) -> dict:
        return dataclasses.asdict(self) if self.kind == "hub" else {"kind": "file", "sha256": self.sha256,
                                                                      "name": Path(self.id).name}


def resolve_dataset(calib: CalibConfig) -> DatasetSource:
    spec = PRESETS.get(calib.dataset)
    if spec is None:
        path = Path(calib.dataset).expanduser()
        if path.suffix in (".jsonl", ".json", ".parquet"):
            spec = {"kind": "file", "path": str(path)}
        elif path.exists():
            raise CalibrationError(f"calib.dataset={calib.dataset!r}: local data must be .jsonl, .json or .parquet")
        else:
            spec = {"kind": "hub", "id": calib.dataset, "split": "train"}
    if spec["kind"] == "file":
        path = Path(spec["path"]).resolve()
        if not path.is_file():
            raise CalibrationError(f"calibration data {path} does not exist")

        return DatasetSource("file", str(path), sha256=file_sha256(path))
    return DatasetSource("hub", spec["id"], split=calib.split or spec["split"], revision=calib.dataset_revision)


def load_rows(src: DatasetSource):
    """Rows (anything with len() and [i] -> dict) holding `messages` (a chat) or `text`."""
    if src.kind == "hub":
        try:
            import datasets
        except ImportError as e:
            raise CalibrationError("hub calibration data needs the `datasets` package (pip install datasets)") from e
        try:
            return datasets.load_dataset(src.id, split=src.split, revision=src.revision)
        except Exception as e:
            raise CalibrationError(
                f"cannot load hub dataset {src.id} split {src.split}: {type(e).__name__}: {e}. Offline? Use the "
                f"shipped set (calib=offline or calib.dataset=haystack_chat) or a local .jsonl/.parquet."
            ) from e
    path = Path(src.id)
    if path.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict(orient="records")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        rows = json.loads(text)
        if not isinstance(rows, list):
            raise CalibrationError(f"{path}: a .json calibration file must hold a list of rows")
        return rows
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def select_rows(n_rows: int, samples: int, seed: int, dataset_key: dict) -> list[int]:
    """Which rows calibrate: a sha256-driven permutation of all rows, first `samples` of it."""

    if samples > n_rows:
        raise CalibrationError(
            f"calib.samples={samples} but the calibration data has only {n_rows} rows; lower calib.samples "
            f"or use a larger dataset"
        )
    key = json.dumps(dataset_key, sort_keys=True)
    return permutation(n_rows, "calib", key, seed)[:samples]


def row_text(row: dict, tokenizer, use_chat_template: bool) -> tuple[str, bool]:
    """(text, whether special tokens still need adding)."""
    if "messages" in row and row["messages"] is not None:
        messages = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
        if use_chat_template and getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(messages, tokenize=False), False
        return "\n\n".join(m["content"] for m in messages), True
    if "text" in row and isinstance(row["text"], str):
        return row["text"], True
    raise CalibrationError(f"a calibration row needs `messages` (a chat) or `text`; got keys {sorted(row)}")


@dataclass
class TokenizedSet:
    input_ids: list[list[int]]
    row_indices: list[int]
    n_truncated: int
    n_tokens: int


def tokenize_rows(rows, indices: list[int], tokenizer, seq_len: int, use_chat_template: bool) -> TokenizedSet:
    ids, truncated = [], 0
    for i in indices:
        text, add_special = row_text(dict(rows[i]), tokenizer, use_chat_template)
        toks = tokenizer(text, add_special_tokens=add_special)["input_ids"]
        if len(toks) > seq_len:
            truncated += 1
            toks = toks[:seq_len]  # calibration length, as llm-compressor's max_seq_length; reported
        if not toks:
            raise CalibrationError(f"calibration row {i} tokenizes to nothing")
        ids.append(list(toks))
    return TokenizedSet(ids, list(indices), truncated, sum(len(t) for t in ids))


# --- the cache key ---------------------------------------------------------------------------------------

"""OpenAI MRCR (multi-round co-reference), up to 1M tokens, graded and bucketed exactly as published.

Rows come from `openai/mrcr` at a pinned revision, from local files with the same columns
(`data_files`), or from the offline generator (`synthetic: true`, labelled as such everywhere).
Each row's bin is its o200k_base token count (the dataset card's n_tokens), computed once into a
cached manifest. A row is posed only if it fits the model (prompt under the chat template +
max_tokens <= max_model_len); otherwise it is recorded as skipped, never truncated.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from fp8eval.config import TaskConfig
from fp8eval.core.errors import Fp8evalError
from fp8eval.core.hub import offline_reason
from fp8eval.core.paths import cache_root
from fp8eval.metrics.arm import grouped
from fp8eval.metrics.auc import EDGE_OF_LABEL, MRCR_EDGES, MRCR_LABELS, context_arena_auc
from fp8eval.scoring import mrcr_grade
from fp8eval.tasks.base import Prompt, Sample, Score, SkipSample, Task
from fp8eval.tasks.mrcr.data import RowReader, RowRef, files_sha256, load_or_build_manifest, row_id
from fp8eval.tasks.mrcr.synth import GENERATOR_VERSION, default_haystack_dir, synth_rows, write_jsonl

# openai/mrcr after the December 2025 fix (date_added column, {N}needle/{N}needle_{0,1}.parquet).
MRCR_REVISION = "f4c69fae7cf81f7ca26b9fee34b392a50f6b8a1d"
NEEDLE_COUNTS = (2, 4, 8)
DEFAULT_MAX_TOKENS = 4096  # answers are <= 3.89k chars; reasoning models need the model's own budget


class MrcrDataUnavailable(Fp8evalError):
    """The benchmark's parquet files cannot be had (offline and not cached, or the hub refused): one line."""


@dataclass
class MrcrConfig(TaskConfig):
    name: str = "mrcr"
    repeats: int = 5
    needles: list[int] = field(default_factory=lambda: [2])
    dataset: str = "openai/mrcr"
    revision: str = MRCR_REVISION
    # Local parquet / JSON-lines files with the openai/mrcr columns (globs allowed); replaces the hub.
    # data_files: inherited from TaskConfig
    synthetic: bool = False  # generate rows offline from the haystack books (not the benchmark)
    synthetic_rows: int = 2  # per (needle count, bin)
    synthetic_seed: int = 0
    buckets: Optional[list[str]] = None  # bin labels to keep (8k ... 1M); null = all
    max_bucket: Optional[str] = None  # drop bins above this label
    # Rows whose o200k count exceeds this multiple of the model's token budget are skipped without
    # being tokenised by the model (a 5 MB row through a 128k model's tokenizer is minutes of work
    # for a certain skip); 0 counts every row exactly.
    o200k_prefilter: float = 4.0
    manifest_dir: Optional[str] = None  # default $FP8EVAL_CACHE/mrcr (~/.cache/fp8eval/mrcr)
    workers: Optional[int] = None  # bucketing processes; default all cores
    # limit (inherited): rows kept per (needle count, bin), the first in file order, so every bin
    # stays represented in a short run


def _cache_root() -> Path:
    return cache_root() / "mrcr"


def _check_config(cfg: MrcrConfig) -> None:
    bad = [n for n in cfg.needles if n not in NEEDLE_COUNTS]
    if bad or not cfg.needles:
        raise ValueError(f"task.needles={list(cfg.needles)}: each must be one of {list(NEEDLE_COUNTS)}")
    for label in list(cfg.buckets or []) + ([cfg.max_bucket] if cfg.max_bucket else []):
        if label not in MRCR_LABELS:
            raise ValueError(f"unknown MRCR bucket {label!r}; valid: {list(MRCR_LABELS)}")
    if cfg.synthetic and cfg.data_files:
        raise ValueError("task.synthetic=true and task.data_files are exclusive: pick one data source")


def selected_buckets(cfg: MrcrConfig) -> list[str]:
    """The MRCR length buckets the config selects (task.buckets, capped at task.max_bucket), in MRCR_LABELS order."""
    labels = [b for b in MRCR_LABELS if cfg.buckets is None or b in cfg.buckets]
    if cfg.max_bucket:
        labels = [b for b in labels if MRCR_LABELS.index(b) <= MRCR_LABELS.index(cfg.max_bucket)]
    return labels


def group_labels(bucket: str, n_needles: int, several_needle_counts: bool) -> tuple[str, ...]:
    """A sample's groups: its bucket, plus its needle count and needle count/bucket when the run mixes several needle
    counts."""
    if not several_needle_counts:
        return (bucket,)
    return (bucket, f"{n_needles}needle", f"{n_needles}needle/{bucket}")


class MrcrTask(Task):
    name = "mrcr"
    version = "1"
    config_class = MrcrConfig
    prompt_varies_by_repeat = False
    # summary extras whose variant/baseline ratio the runner reports as recovery
    recovery_keys = ("auc", "auc_1m")

    def __init__(self, cfg: MrcrConfig, ctx):
        super().__init__(cfg, ctx)
        _check_config(cfg)
        self._files: list[Path] | None = None
        self._data_key: dict | None = None
        self._manifest_path: Path | None = None
        self._manifest_built = False
        self._samples: list[Sample] | None = None
        self._selected_note_at = 0
        self._reader = None
        self._tokens: dict[str, int] = {}  # sample id -> prompt tokens under the model's template
        self._last: tuple[str, Prompt] | None = None  # repeats of one sample reuse the loaded row
        self._skips: dict[str, str] = {}  # sample id -> why it does not fit (asked once per repeat)
        self._notes: list[str] = []

    # --- data ---------------------------------------------------------------------------------
    def _manifest_dir(self) -> Path:
        return Path(self.cfg.manifest_dir).expanduser() if self.cfg.manifest_dir else _cache_root()

    def _resolve_files(self) -> tuple[list[Path], dict]:
        cfg = self.cfg
        if cfg.synthetic:
            return self._synthetic_files()
        if cfg.data_files:
            files: list[Path] = []
            for pattern in cfg.data_files:
                matches = sorted(glob.glob(os.path.expanduser(pattern)))
                if not matches:
                    raise FileNotFoundError(f"task.data_files: nothing matches {pattern!r}")
                files += [Path(m) for m in matches]
            return files, {"local_files": [[p.name, s] for p, s in zip(files, files_sha256(files))]}
        return self._hub_files()

    def _hub_files(self) -> tuple[list[Path], dict]:
        cfg = self.cfg
        names = [f"{n}needle/{n}needle_{k}.parquet" for n in sorted(cfg.needles) for k in (0, 1)]
        advice = ("point task.data_files at local copies of those parquet files, or run task.synthetic=true "
                  "(synthetic rows, not the benchmark)")
        offline = offline_reason()  # decided in ~1.5 s: no minute of hub retries on an offline machine
        try:
            from huggingface_hub import hf_hub_download, try_to_load_from_cache

            if offline is not None:
                cached = [try_to_load_from_cache(cfg.dataset, n, revision=cfg.revision, repo_type="dataset")
                          for n in names]
                if all(isinstance(c, str) for c in cached):
                    return [Path(c) for c in cached], {"dataset": cfg.dataset, "revision": cfg.revision,
                                                       "files": names}
                raise MrcrDataUnavailable(f"the hub is unreachable ({offline}) and {cfg.dataset}@{cfg.revision[:12]} "
                                          f"({', '.join(names)}) is not in its local cache: {advice}")
            files = [
                Path(hf_hub_download(cfg.dataset, name, repo_type="dataset", revision=cfg.revision))
                for name in names
            ]
        except MrcrDataUnavailable:
            raise
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise MrcrDataUnavailable(f"could not fetch {cfg.dataset}@{cfg.revision} ({', '.join(names)}) from the "
                                      f"hub ({first}): {advice}") from e
        return files, {"dataset": cfg.dataset, "revision": cfg.revision, "files": names}

    def _synthetic_files(self) -> tuple[list[Path], dict]:
        import hashlib

        cfg = self.cfg
        books = sorted(default_haystack_dir().glob("pg*.txt"))
        spec = {
            "generator": GENERATOR_VERSION,
            "seed": cfg.synthetic_seed,
            "needles": sorted(cfg.needles),
            "bins": selected_buckets(cfg),
            "rows_per_bin": cfg.synthetic_rows,
            "books": [[p.name, s] for p, s in zip(books, files_sha256(books))],
        }
        digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]
        path = self._manifest_dir() / f"synthetic-{digest}.jsonl"
        if not path.is_file():
            write_jsonl(
                synth_rows(spec["bins"], spec["needles"], cfg.synthetic_rows, cfg.synthetic_seed,
                           haystack_dir=books[0].parent),
                path,
            )
        self._notes.append(
            "MRCR rows are SYNTHETIC (generated offline from public-domain books): they exercise the "
            "protocol but are not the openai/mrcr benchmark; do not compare with published numbers."
        )
        return [path], {"synthetic": spec}

    def samples(self) -> list[Sample]:
        if self._samples is not None:
            return self._samples

        cfg = self.cfg
        self._files, self._data_key = self._resolve_files()
        refs, self._manifest_path, self._manifest_built = load_or_build_manifest(
            self._files, self._data_key, self._manifest_dir(), workers=cfg.workers
        )
        self._reader = RowReader(self._files)
        keep = set(selected_buckets(cfg))
        several = len(set(cfg.needles)) > 1
        chosen = [r for r in refs if r.n_needles in cfg.needles and r.bucket in keep]
        # file order, so prompts stream through the data once (see RowReader); groups carry the bins
        chosen.sort(key=lambda r: (r.file, r.loc))
        self._samples = [
            Sample(id=r.id, data=asdict(r), groups=group_labels(r.bucket, r.n_needles, several))
            for r in chosen
        ]
        self._selected_note_at = len(self._notes)  # notes(): the rows the run does (after task.limit)
        outside = sum(1 for r in refs if r.n_needles in cfg.needles and r.bucket is None)
        if outside:
            self._notes.append(f"{outside} row(s) fall outside the 4k-1M bins and are left out")
        return self._samples

    # --- prompts ------------------------------------------------------------------------------
    def _max_tokens(self) -> int:
        # the runner's resolved value when the context carries one, else the task's own setting
        resolved = getattr(self.ctx, "max_tokens", None)
        return int(resolved or self.cfg.sampling.max_tokens or DEFAULT_MAX_TOKENS)

    def prompt(self, sample: Sample, repeat: int) -> Prompt:
        if self._last is not None and self._last[0] == sample.id:
            return self._last[1]
        if sample.id in self._skips:
            raise SkipSample(self._skips[sample.id])
        try:
            prompt = self._fitting_prompt(sample)
        except SkipSample as e:
            self._skips[sample.id] = str(e)
            raise
        self._last = (sample.id, prompt)
        return prompt

    def _fitting_prompt(self, sample: Sample) -> Prompt:
        ref = sample.data
        budget = self.ctx.max_model_len - self._max_tokens()
        ratio = self.cfg.o200k_prefilter
        if ratio and ref["n_tokens"] > ratio * budget:
            raise SkipSample(
                f"does not fit: {ref['n_tokens']} o200k tokens is over {ratio:g}x the prompt budget "
                f"{budget} (max_model_len {self.ctx.max_model_len} - max_tokens {self._max_tokens()})"
            )
        prompt = Prompt(messages=tuple(self._load_messages(sample)))
        if sample.id not in self._tokens:
            self._tokens[sample.id] = self.ctx.count_tokens(prompt)
        n = self._tokens[sample.id]
        if n > budget:
            raise SkipSample(
                f"does not fit: prompt {n} tokens + max_tokens {self._max_tokens()} > "
                f"max_model_len {self.ctx.max_model_len}"
            )
        return prompt

    def _load_messages(self, sample: Sample) -> list[dict]:
        if self._reader is None:
            self.samples()
        ref = RowRef(**{**sample.data, "loc": tuple(sample.data["loc"])})
        row = self._reader.read(ref)
        if row_id(int(row["n_needles"]), row["prompt"], row["answer"]) != sample.id:
            raise RuntimeError(
                f"{self._files[ref.file]} changed since its manifest {self._manifest_path} was built "
                f"(row {sample.id}); delete the manifest to rebuild it"
            )
        return json.loads(row["prompt"])

    # --- scoring ------------------------------------------------------------------------------
    def score(self, sample: Sample, completion: str, repeat: int = 0) -> Score:
        ref = sample.data
        prefix = ref["random_string_to_prepend"]
        value = mrcr_grade(completion, ref["answer"], prefix)
        return Score(
            value=value,
            extracted=completion[: len(prefix)],
            details={"prefix_ok": completion.startswith(prefix), "bucket": ref["bucket"],
                     "o200k_tokens": ref["n_tokens"]},
        )

    # --- reporting ----------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        if self._data_key is None:
            self.samples()
        return {
            "data": self._data_key,
            "bins": "o200k_base message tokens, [4096,8192] then (lo,hi] up to 1048576",
            "grader": "openai/mrcr card: prefix check, SequenceMatcher(None, a, b).ratio()",
            "fit": "prompt (chat template) + max_tokens <= max_model_len, else skipped",
            "o200k_prefilter": self.cfg.o200k_prefilter,
        }

    def summarize(self, arm_summary: dict[str, Any], records: list[dict]) -> dict[str, Any]:
        return summarize_records(records, self.cfg.needles, self.cfg.synthetic)

    def limit_samples(self, samples) -> list[Sample]:
        """MRCR's rule for `task.limit`: the first `limit` rows of each (needles, bucket) cell, in file order."""
        if not self.cfg.limit:
            return list(samples)
        taken: dict[tuple[int, str], int] = {}
        kept = []
        for s in samples:
            cell = (s.data["n_needles"], s.data["bucket"])
            if taken.get(cell, 0) < self.cfg.limit:
                taken[cell] = taken.get(cell, 0) + 1
                kept.append(s)
        return kept

    def notes(self) -> list[str]:
        lines = list(self._notes)
        if self._samples is not None and not self.cfg.synthetic:
            chosen = self.limit_samples(self._samples)
            fixed = sum(1 for s in chosen if s.data["date_added"] != "04-12-2025")
            lines.insert(self._selected_note_at,
                         f"{len(chosen)} MRCR rows selected; {fixed} of them were regenerated by the December "
                         "2025 fix (date_added other than 04-12-2025)")
        if self._manifest_path is not None:
            how = "built now" if self._manifest_built else "cached"
            lines.append(f"MRCR bins from manifest {self._manifest_path} ({how})")
        return lines


def bucket_table(records: list[dict], bucket_of_record) -> dict[str, dict]:
    """Per MRCR bucket with records: score, stderr and the counts of scored, skipped and errored records;
    `bucket_of_record(r)` gives a record's bucket."""
    numbers = grouped(records, lambda r: (bucket_of_record(r),))  # the harness's one grouped metric
    return {label: {k: numbers[label][k] for k in ("score", "stderr", "n_scored", "n_skipped", "n_errors")}
            for label in MRCR_LABELS if label in numbers}


def auc_from_table(table: dict[str, dict]) -> dict[str, Any]:
    """AUC at the largest bin with a score (Context Arena's "model AUC") and AUC@1M."""

    scores = {EDGE_OF_LABEL[b]: row["score"] for b, row in table.items() if row["score"] is not None}
    out: dict[str, Any] = {"auc": None, "auc_up_to": None, "auc_1m": None, "auc_note": None}
    if not scores:
        out["auc_note"] = "no bin has a scored row"
        return out
    top = max(scores)
    out["auc_up_to"] = MRCR_LABELS[MRCR_EDGES.index(top)]
    try:
        out["auc_1m"] = context_arena_auc(scores, MRCR_EDGES[-1])
        if top > MRCR_EDGES[0]:
            out["auc"] = context_arena_auc(scores, top)
        else:
            out["auc_note"] = "only the 8k bin has scores: AUC needs two edges"
    except ValueError as e:  # a gap between bins (e.g. task.buckets skips one)
        out["auc_note"] = str(e)
    return out


def summarize_records(records: list[dict], needles: list[int], synthetic: bool) -> dict[str, Any]:
    """Per-bin mean pass@1 (mean SequenceMatcher ratio), stderr over repeats, AUC at the model's own
    largest reachable bin and AUC@1M, from one arm's records."""

    def bucket(r: dict) -> str | None:
        return next((g for g in r.get("groups", []) if g in MRCR_LABELS), None)

    table = bucket_table(records, bucket)
    out: dict[str, Any] = {"buckets": table, **auc_from_table(table), "synthetic": synthetic}
    if len(set(needles)) > 1:
        per: dict[str, Any] = {}
        for n in sorted(set(needles)):
            tag = f"{n}needle"
            mine = [r for r in records if tag in r.get("groups", [])]
            sub = bucket_table(mine, bucket)
            per[tag] = {"buckets": sub, **auc_from_table(sub)}
        out["by_needles"] = per
    return out

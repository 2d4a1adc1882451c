"""task=lm_eval: any lm-eval task, paired. lm-eval builds the requests (TaskManager, prompts, few-shot,
filters) and scores them (its filters, process_results and aggregations); fp8eval's engines run them with
its pairing, seeds, records, fingerprints and resume.

One fp8eval sample is one lm-eval document (`<task>:<doc_id>`); each repeat is one full lm-eval evaluation
of that document. generate_until documents are generation requests with the task's own stops and
max_gen_toks; multiple_choice and loglikelihood documents are scoring requests (`Prompt.logprob_pairs`)
answered by the engine's optional loglikelihood(). The record's score is the primary metric (task.metric,
default the task's first metric under its first filter); every metric under every filter is in
score_details, and the arm summary's `lm_eval` block holds them aggregated as lm-eval aggregates them.
Groups: `task=<name>` (several tasks), `group=<name>` for each lm-eval group above the task, and
`<field>=<value>` for each task.doc_groups field a document has (RULER's max_length: the lengths as buckets).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from fp8eval.config import TaskConfig
from fp8eval.core.progress import stage
from fp8eval.tasks.base import Prompt, Sample, Score, Task

BRIDGE_VERSION = "1"  # bump when the mapping between lm-eval and fp8eval changes a prompt or a score


@dataclass
class LmEvalConfig(TaskConfig):
    name: str = "lm_eval"
    # lm-eval task, group or tag names, YAML paths, or {task: NAME, ...overrides} (e.g. local data_files).
    tasks: list[Any] = field(default_factory=list)
    include_path: Optional[str] = None  # a folder of your own lm-eval YAML tasks
    num_fewshot: Optional[int] = None  # null: each task's own (lm-eval's default, 0 where unset)
    fewshot_seed: int = 1234  # lm-eval's default few-shot sampler seed
    system_instruction: Optional[str] = None
    apply_chat_template: bool = False  # lm-eval's default: raw prompts
    metric: Optional[str] = None  # the primary "metric,filter" (e.g. "exact_match,flexible-extract")
    metadata: dict[str, Any] = field(default_factory=dict)  # TaskManager metadata (RULER: max_seq_lengths)
    offline: Optional[bool] = None  # null: HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, else probe the hub
    doc_groups: list[str] = field(default_factory=lambda: ["max_length"])


class LmEvalTask(Task):
    name = "lm_eval"
    version = "1"
    config_class = LmEvalConfig
    prompt_varies_by_repeat = False
    parallel_scoring = False  # lm-eval's task objects stay in this process
    score_range = None  # the user picks the metric (bleu, perplexity, ...): any finite number

    def __init__(self, cfg: LmEvalConfig, ctx):
        super().__init__(cfg, ctx)
        self._loaded = None

    def loaded(self):
        """lm-eval's tasks and requests, built once."""
        if self._loaded is None:
            from fp8eval.tasks.lm_eval import bridge

            cfg = self.cfg
            names = ", ".join(str(t if not isinstance(t, dict) else t.get("task", t)) for t in cfg.tasks)[:120]
            with stage(f"lm-eval: indexing its tasks and building the requests of {names or 'no task'}"):
                loaded = bridge.load(list(cfg.tasks), cfg.include_path, dict(cfg.metadata), cfg.offline)
                bridge.build_instances(loaded, limit=cfg.limit, num_fewshot=cfg.num_fewshot,
                                       fewshot_seed=cfg.fewshot_seed, system_instruction=cfg.system_instruction,
                                       apply_chat_template=cfg.apply_chat_template)
            self._loaded = loaded
        return self._loaded

    def samples(self) -> Sequence[Sample]:
        loaded = self.loaded()
        out = []
        for name, by_doc in loaded.instances.items():
            for doc_id, insts in by_doc.items():
                groups = [f"task={name}"] if len(loaded.tasks) > 1 else []
                groups += [f"group={g}" for g in loaded.groups[name]]
                doc = insts[0].doc
                groups += [f"{k}={doc[k]}" for k in self.cfg.doc_groups if isinstance(doc, dict) and k in doc]
                out.append(Sample(id=f"{name}:{doc_id}", data={"task": name, "doc_id": doc_id},
                                  groups=tuple(groups)))
        return out

    def limit_samples(self, samples) -> list[Sample]:
        """lm-eval's rule for `task.limit`: the first `limit` documents of each lm-eval task. (`loaded()` hands
        the same limit to lm-eval so that it builds only those documents' requests.)"""
        if not self.cfg.limit:
            return list(samples)
        taken: dict[str, int] = {}
        kept = []
        for s in samples:
            name = s.data["task"]
            if taken.get(name, 0) < self.cfg.limit:
                taken[name] = taken.get(name, 0) + 1
                kept.append(s)
        return kept

    def _instances(self, sample: Sample) -> list:
        return self.loaded().instances[sample.data["task"]][sample.data["doc_id"]]

    def prompt(self, sample: Sample, repeat: int) -> Prompt:
        from fp8eval.tasks.lm_eval import scoring

        return scoring.prompt(self._instances(sample), self.cfg.apply_chat_template)

    def score(self, sample: Sample, completion: str, repeat: int = 0) -> Score:
        from fp8eval.tasks.lm_eval import scoring

        task = self.loaded().tasks[sample.data["task"]]
        return scoring.score(task, self._instances(sample), completion, self.cfg.metric, tuple(self.cfg.doc_groups))

    def fingerprint(self) -> dict[str, Any]:
        from fp8eval.tasks.lm_eval import bridge

        loaded = self.loaded()
        return {"lm_eval": loaded.version, "bridge": BRIDGE_VERSION,
                "task_configs": {n: bridge.config_hash(t) for n, t in sorted(loaded.tasks.items())}}

    def summarize(self, arm_summary: dict[str, Any], records: list[dict]) -> dict[str, Any]:
        from fp8eval.tasks.lm_eval import scoring

        return {"lm_eval": scoring.aggregate(self.loaded().tasks, records)}

    def notes(self) -> list[str]:
        from fp8eval.tasks.lm_eval import scoring

        loaded = self.loaded()
        lines = [f"lm-eval {loaded.version}: " + ", ".join(
            f"{n} ({t.OUTPUT_TYPE}, {len(loaded.instances[n])} docs, score = "
            f"{scoring.primary_key(t, self.cfg.metric)})" for n, t in loaded.tasks.items())]
        for n, t in loaded.tasks.items():
            metric = scoring.primary_key(t, self.cfg.metric).split(",")[0]
            agg = scoring.aggregation_name(t, metric)
            if agg != "mean":
                lines.append(f"{n}: lm-eval aggregates {metric} with {agg}, not a mean: the score and recovery "
                             f"are per-document means; the summary's lm_eval block has lm-eval's own number")
        return lines

"""Runs one task for a kv arm and its baseline, resumably, and writes summary.json."""

from __future__ import annotations

import dataclasses
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

import fp8eval.anatomy as anatomy
import fp8eval.control as controls
import fp8eval.export as export
import fp8eval.shard as shards
from fp8eval.arms import ArmSpec, arm_material, open_engines, resolve_arms
from fp8eval.config import RunConfig, SamplingConfig, effective_sampling, plain
from fp8eval.core.errors import Fp8evalError
from fp8eval.core.jsonio import write_json
from fp8eval.core.progress import Progress
from fp8eval.core.reasoning import split_reasoning
from fp8eval.core.secrets import redact_obj
from fp8eval.core.seeds import derive_seed
from fp8eval.core.timing import EngineClock
from fp8eval.engines import capabilities
from fp8eval.engines.attention import check as check_attention_backend
from fp8eval.engines.base import Request
from fp8eval.engines.loglikelihood import send
from fp8eval.engines.parallel import fingerprint_view
from fp8eval.engines.prompting import prompt_text_for
from fp8eval.metrics.arm import arm_summary, paired_recovery, paired_verdicts
from fp8eval.metrics.noise import control_comparison
from fp8eval.metrics.pairing import value_recovery
from fp8eval.metrics.verdict import GateSettings
from fp8eval.records import RECORD_SCHEMA, ArmRecords, ArmStore, fingerprint_hash
from fp8eval.scoring.pool import Scorer, auto_workers
from fp8eval.stopping import Rounds
from fp8eval.stopping import check as check_stop
from fp8eval.tasks import task_class
from fp8eval.tasks.base import Prompt, Sample, SkipSample, Task
from fp8eval.token_counts import (
    PromptCounter,
    counter_for,
    early_abandoned_on_error,
    finish_early_plan,
    plan_task,
    start_early_plan,
)
from fp8eval.validate import check_audit_config, check_samples, check_task_config


class RunError(Fp8evalError):
    """A run cannot proceed; the message says why and what to do."""


def check_greedy_repeats(cfg: RunConfig, sampling: dict) -> None:
    """Refuse repeats > 1 with greedy sampling (temperature 0), for every engine but fake, before any request.

    Greedy repeats are the same completion n times: wasted compute, a stderr that claims a spread it does
    not have, and vLLM refuses them outright ("n must be 1 when using greedy sampling"). Refusing, not
    collapsing to one repeat, because the user asked for repeats and should choose what they meant.
    """
    repeats = int(cfg.task.repeats)
    # An engine that ignores sampling (the fake one's scripts exercise the harness's bookkeeping) is not refused.
    if repeats <= 1 or sampling.get("temperature") is None or float(sampling["temperature"]) != 0.0 \
            or not capabilities(cfg).follows_sampling:
        return
    origin = next(where for layer, where in ((cfg.sampling, "sampling.temperature"),
                                             (cfg.task.sampling, f"task {cfg.task.name}'s sampling"),
                                             (cfg.model.sampling, f"model {cfg.model.name}'s sampling defaults"))
                  if layer.temperature is not None)
    raise RunError(
        f"task.repeats={repeats} with greedy sampling (temperature 0, from {origin}): every repeat would be "
        f"the same completion, and vLLM refuses n > 1 with greedy sampling. Nothing was run. Either sample "
        f"the repeats (e.g. `sampling.temperature=0.6`) or run one (`task.repeats=1`).")


@dataclasses.dataclass
class PlannedItem:
    sample: Sample
    repeat: int
    prompt: Prompt | None
    prompt_hash: str | None
    prompt_tokens: int | None
    skip_reason: str | None


class Runner:
    def __init__(self, cfg: RunConfig, run_dir: Path, out=print):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.out = out
        self.sampling = effective_sampling(cfg)
        self.records_root = Path(cfg.records_dir).expanduser()
        if not self.records_root.is_absolute():
            self.records_root = Path.cwd() / self.records_root
        self.views: dict[str, ArmRecords] = {}  # kv name -> the arm's valid records (fp8eval.records.read_arm)
        self.claim_poll_s = 2.0  # how often to look again while another process holds claims
        self.clock = EngineClock()  # engine time vs harness time (summary.json "timing")
        self.rounds: Rounds | None = None  # stop=sequential: which samples each round takes (fp8eval.stopping)

    # --- arms -------------------------------------------------------------------------------------------
    def arms(self) -> list[ArmSpec]:
        """Listed baseline first (the order of summary.json's arms), then the variant; one arm alone when
        `baseline` is none. Both resolved through Hydra the same way (fp8eval.arms). `run()` runs them
        in the other order: the variant first. A `control=<name>` arm comes last (fp8eval.control)."""
        return resolve_arms(self.cfg, control=True)

    # --- planning ----------------------------------------------------------------------------------------
    def plan(self, task: Task, engine) -> list[PlannedItem]:
        items: list[PlannedItem] = []
        count = task.ctx.count_tokens
        max_len = engine.max_model_len()
        every = list(task.samples())
        check_samples(task.name, every, getattr(self.cfg.task, "data_files", None))
        all_samples = task.limit_samples(every)  # task.limit, by the task's rule (Task.limit_samples)
        # A shard plans (and counts the tokens of) only its own samples.
        samples = shards.mine(all_samples, shards.parse(self.cfg.shard), key=lambda s: s.id)
        task.prepare(samples)  # NIAH fits its haystacks here, counting each round's prompts in one batch
        bar = Progress(len(samples), "building prompts", self.cfg.progress and len(samples) > 20)
        for sample in samples:
            shared_prompt = None
            for repeat in range(self.cfg.task.repeats):
                try:
                    if task.prompt_varies_by_repeat or shared_prompt is None:
                        prompt = task.prompt(sample, repeat)
                        tokens = count(prompt)
                        shared_prompt = (prompt, prompt.hash(), tokens)
                    prompt, phash, tokens = shared_prompt
                except SkipSample as e:
                    items.append(PlannedItem(sample, repeat, None, None, None, str(e)))
                    continue
                skip = None
                # A scoring prompt generates nothing; a prompt may bring its own max_tokens (lm-eval tasks).
                budget = 0 if prompt.logprob_pairs else int(self.prompt_sampling(prompt)["max_tokens"])
                if tokens + budget > max_len:
                    skip = (f"prompt {tokens} + max_tokens {budget} tokens exceed max_model_len {max_len}; "
                            f"skipped, never truncated")
                items.append(PlannedItem(sample, repeat, prompt, phash, tokens, skip))
            bar.update(1)
        bar.close()
        return items

    def token_counter(self, engine) -> PromptCounter:
        """Prompt tokens under the engine's template (fp8eval.token_counts.PromptCounter), kept on disk where
        the engine names its tokenizer, so a rerun plans without loading it."""
        return counter_for(engine, self.records_root, self.cfg, lambda p: self.request("count", p, 1, [0]))

    def request(self, rid: str, prompt: Prompt, n: int, seeds: list[int]) -> Request:
        """The engine request for `prompt` (`n` sequences, one seed each) under the run's sampling and template."""
        return Request(id=rid, messages=tuple(prompt.messages), n=n, seeds=tuple(seeds),
                       sampling=dict(self.prompt_sampling(prompt)),
                       chat_template_kwargs=dict(self.cfg.model.chat_template_kwargs),
                       prompt_text=prompt_text_for(prompt.messages, prompt.prompt_text, self.cfg.model.chat_template),
                       logprob_pairs=tuple(prompt.logprob_pairs))

    def prompt_sampling(self, prompt: Prompt | None) -> dict:
        """The run's sampling, with a prompt's own settings (an lm-eval task's stops) over the model's and the
        task config's, and the user's top-level overrides over both."""
        if prompt is None or not prompt.sampling:
            return self.sampling
        out = {**self.sampling, **prompt.sampling}
        for f in dataclasses.fields(SamplingConfig):
            v = getattr(self.cfg.sampling, f.name)
            if v is not None:
                out[f.name] = list(v) if f.name == "stop" else v
        return out

    # --- fingerprint ---------------------------------------------------------------------------------------
    def fingerprint_material(self, task: Task, engine, arm: ArmSpec) -> dict:
        """The arm's fingerprint material (fp8eval.arms.arm_material): the kv option as composed, the engine less
        data parallelism, the sampling, the task (less what only selects samples) and the seed; an explicit
        "bfloat16" cache spelt as the "auto" it replaced; a control arm's settings."""
        task_cfg = plain(self.cfg.task)
        for k in ("repeats", "limit", "sampling", *task.selection_keys):
            task_cfg.pop(k, None)
        return arm_material(self.cfg, arm, fingerprint_view(engine.describe()), {
            "record_schema": RECORD_SCHEMA, "sampling": self.sampling, "seed": self.cfg.seed,
            "task": {"name": task.name, "version": task.version, "config": task_cfg, **task.fingerprint()},
        }, dtype=arm.engine_args.get("dtype"),
            control=controls.control_of(self.cfg) if arm.role == controls.ROLE else None)

    def seed_of(self, arm: ArmSpec) -> int:
        """The run's seed for this arm: a control arm may shift it (control.seed_offset)."""
        return int(self.cfg.seed) + int(getattr(arm, "seed_offset", 0) or 0)

    # --- one arm ---------------------------------------------------------------------------------------
    def run_arm(self, task: Task, engine, arm: ArmSpec, items: list[PlannedItem]) -> dict:
        kv = arm
        with self.clock.engine("describe"):  # a vLLM engine's describe() may start it
            material = self.fingerprint_material(task, engine, arm)
        fp = fingerprint_hash(material)
        store = ArmStore(self.records_root, task.name, fp, material, score_range=task.score_range,
                         commit_s=float(self.cfg.records_commit_s)).open()
        try:
            sent, view = self._fill_arm(store, fp, task, engine, kv, items, shard := shards.parse(self.cfg.shard))
        finally:
            store.close()
        if shard is not None:  # reached only when this shard's share is all recorded
            shards.mark_done(store.path, shard, len(items))
        self.views[kv.name] = view
        if view.problems:
            first = view.problems[0]
            print(f"warning: {len(view.problems)} line(s) of kv={kv.name}'s records set aside, not counted "
                  f"(first: {first}); `python -m fp8eval.records check {store.path}` lists them",
                  file=sys.stderr)
        summary = arm_summary(view.records)
        summary.update({"records": str(store.path), "fingerprint": fp, "requests_sent": sent,
                        "n_ignored": view.ignored, "kv_name": kv.name, "records_io": store.io_summary(),
                        "engine": material["engine"].get("kind")})
        if engine.knob_audit is not None:  # fp8eval.knobaudit: what the engine really ran
            summary["knob_audit"] = engine.knob_audit
        with self.clock.engine("stats"):
            stats = engine.prefill_stats() if sent else None
        if stats:  # this invocation's prefill work, from the engine's own counters
            summary["engine_prefill"] = stats
        if (pool := engine.pool_stats()) is not None:  # a replica pool: replicas dropped or ejected, failures
            summary["replica_pool"] = pool
        summary.update(task.summarize(summary, view.records))
        return summary

    def _fill_arm(self, store: ArmStore, fp: str, task: Task, engine, kv: ArmSpec,
                  items: list[PlannedItem], shard: tuple[int, int] | None) -> tuple[int, ArmRecords]:
        """Do every planned (sample, repeat) that has no done record, exactly once across all writers of
        the arm: claim what is free, re-read (a claim may have been finished and released meanwhile), do
        it; wait while other live writers hold claims, taking over those of writers that died. A pair
        that comes back as an error is not retried within this invocation (the next one retries it)."""
        expected = {(it.sample.id, it.repeat): it.prompt_hash for it in items}
        attempted: set[tuple[str, int]] = set()
        sent, waited_since = 0, None
        while True:
            finished = store.read(expected).done_keys() | attempted
            pending = [it for it in items if (it.sample.id, it.repeat) not in finished]
            if not pending:
                break
            if shard is None and not attempted:  # an arm run in shards is finished by its shards
                shards.check_unsharded(store.path, kv.name, [it.sample.id for it in pending])
            got = set(store.claim([(it.sample.id, it.repeat) for it in pending]))
            if got:
                done = store.read(expected).done_keys()
                store.release(got & done)
                todo = got - done
                mine = [it for it in pending if (it.sample.id, it.repeat) in todo]
                attempted |= {(it.sample.id, it.repeat) for it in mine}
                sent += self._do_items(store, fp, task, engine, kv, mine)
                continue
            if waited_since is None:
                waited_since = time.monotonic()
                who = sorted({w for _, w in store.busy_owners((it.sample.id, it.repeat) for it in pending)})
                print(f"note: {len(pending)} (sample, repeat) pairs of kv={kv.name} are being done by another "
                      f"fp8eval process ({'; '.join(who) or 'unknown'}); waiting for them (a dead process's "
                      "claims are taken over)", file=sys.stderr)
            time.sleep(self.claim_poll_s)
        return sent, store.read(expected, durable=True)  # fsynced first: nothing counted can be lost

    def _do_items(self, store: ArmStore, fp: str, task: Task, engine, kv: ArmSpec,
                  pending: list[PlannedItem]) -> int:
        """Record the skipped items and send the rest; returns the number of requests sent."""
        skipped = [it for it in pending if it.prompt is None or it.skip_reason]
        self._write(store, [self._record(fp, kv, task, it, None, None) for it in skipped])
        to_send = [it for it in pending if it.prompt is not None and not it.skip_reason]

        # One request per distinct prompt of a sample and run of consecutive missing repeats: they share
        # one prefill, and vLLM seeds an n-request's children seed, seed+1, ..., which are exactly those
        # repeats' seeds (fp8eval.seeds) only when the repeats are consecutive.
        groups: list[list[PlannedItem]] = []
        for it in sorted(to_send, key=lambda i: (i.sample.id, i.prompt_hash, i.repeat)):
            last = groups[-1][-1] if groups else None
            if last is not None and (last.sample.id, last.prompt_hash, last.repeat + 1) == (
                    it.sample.id, it.prompt_hash, it.repeat):
                groups[-1].append(it)
            else:
                groups.append([it])
        requests: list[Request] = []
        by_id: dict[str, list[PlannedItem]] = {}
        for its in groups:
            sid, phash = its[0].sample.id, its[0].prompt_hash
            rid = f"{sid}|{phash[:12]}|{','.join(str(i.repeat) for i in its)}"
            seeds = [derive_seed(sid, i.repeat, self.seed_of(kv)) for i in its]
            requests.append(self.request(rid, its[0].prompt, len(its), seeds))
            by_id[rid] = its
        # Longest prompts first: fewer stragglers at the end of a batch.
        requests.sort(key=lambda r: -by_id[r.id][0].prompt_tokens)

        sent = 0
        if requests:
            bar = Progress(len(to_send), f"{task.name} kv={kv.name}", self.cfg.progress)
            # Scoring may run in worker processes while the engine works; each completion's records are
            # still appended together (one write, one fsync) once their scores are in.
            scorer = Scorer(task, auto_workers(task, self.cfg.scoring_workers))
            try:
                for comp in self.clock.stream(send(engine, requests), "generate"):
                    sent += 1
                    its = by_id[comp.request_id]
                    if len(comp.choices) != len(its):  # an engine must answer every sequence (or error it)
                        raise RunError(f"engine returned {len(comp.choices)} choices for request {comp.request_id} "
                                       f"of {len(its)} sequences; records so far are kept")
                    recs = [self._record(fp, kv, task, it, comp, ch) for it, ch in zip(its, comp.choices)]
                    scorer.submit(recs, [(it.sample, rec.pop("_answer"), it.repeat)
                                         for it, rec in zip(its, recs) if rec["status"] == "ok"])
                    for done, scores in scorer.finished():
                        bar.update(self._write_scored(store, done, scores))
                for done, scores in scorer.drain():
                    bar.update(self._write_scored(store, done, scores))
            finally:
                scorer.close()
                bar.close()
            if sent != len(requests):  # an engine that stops early without saying why loses pairs silently
                raise RunError(f"the engine answered {sent} of {len(requests)} requests for kv={kv.name} and "
                               "raised no error; records so far are kept, rerun to send the rest")
        return sent

    def _record(self, fp: str, kv: ArmSpec, task: Task, it: PlannedItem, comp, choice) -> dict:
        rec = {
            "schema": RECORD_SCHEMA, "arm": fp, "kv": kv.name, "task": task.name, "task_version": task.version,
            "sample_id": it.sample.id, "repeat": it.repeat,
            "seed": derive_seed(it.sample.id, it.repeat, self.seed_of(kv)), "groups": list(it.sample.groups),
            "prompt_hash": it.prompt_hash, "prompt_tokens": it.prompt_tokens,
            "sampling": self.prompt_sampling(it.prompt),
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        if choice is None:
            rec.update(status="skipped", skip_reason=it.skip_reason, completion=None, reasoning=None,
                       finish_reason=None, output_tokens=None, score=None, extracted=None, score_details={},
                       latency_s=None, cached_prompt_tokens=None)
            return rec
        reasoning, answer = split_reasoning(choice.text)
        if choice.reasoning:
            reasoning = choice.reasoning if reasoning is None else choice.reasoning + "\n" + reasoning
        rec.update(completion=choice.text, reasoning=reasoning, finish_reason=choice.finish_reason,
                   output_tokens=choice.output_tokens, latency_s=round(comp.latency_s, 4),
                   cached_prompt_tokens=comp.cached_prompt_tokens, skip_reason=None)
        if choice.finish_reason == "error":
            rec.update(status="error", score=None, extracted=None, score_details={"error": choice.error})
            return rec
        # Scored by _write_scored (maybe in a worker process); the runner takes the answer out to score it.
        rec.update(status="ok", score=None, extracted=None, score_details={}, _answer=answer)
        return rec

    def _write_scored(self, store: ArmStore, recs: list[dict], scores: list) -> int:
        ok = [r for r in recs if r["status"] == "ok"]
        for rec, score in zip(ok, scores, strict=True):
            rec.update(score=float(score.value), extracted=score.extracted, score_details=score.details)
        return self._write(store, recs)

    def _write(self, store: ArmStore, recs: list[dict]) -> int:
        """Append; the store's group commit releases the claims once an fsync covers the records (a key is
        never unclaimed before its record is durable)."""
        with self.clock.harness("write_records"):
            store.append(recs)
        return len(recs)

    # --- the whole run ------------------------------------------------------------------------------------
    _order = staticmethod(lambda arms: sorted(arms, key=lambda a: {"baseline": 1, controls.ROLE: 2}.get(a.role, 0)))

    def _passes(self, arms: list[ArmSpec]):
        """The arms in run order (the variant first), once; with stop=sequential again after each round that
        left a bucket undecided (`Rounds.advance` on both arms' records)."""
        order = self._order(arms)
        while True:
            yield from order
            if self.rounds is None or not self.rounds.advance(self.views[arms[0].name].records,
                                                              self.views[arms[1].name].records):
                return
            self.out(f"sequential: round {self.rounds.rounds}, {len(self.rounds.items())} (sample, repeat) items; "
                     + ", ".join(f"{b} {r.decision} at {r.n_used}" for b, r in self.rounds.results.items()))

    def run(self) -> dict:
        cfg = self.cfg
        check_greedy_repeats(cfg, self.sampling)
        t0 = time.perf_counter()
        self.clock = EngineClock()
        check_task_config(cfg.task)
        check_audit_config(cfg)
        with self.clock.harness("arms"):  # the kv options composed through Hydra
            arms = self.arms()
            control_info = controls.preflight(cfg, arms, self.sampling, out=self.out)  # before any engine starts
        tcls = task_class(cfg.task.name)
        task_cfg = cfg.task if isinstance(cfg.task, tcls.config_class) else OmegaConf.to_object(cfg.task)
        summaries: dict[str, dict] = {}
        task = items = None
        notes: list[str] = []
        # The variant runs first: a configuration an engine cannot serve (fp8 on a CPU build of vLLM,
        # per-head scales without a scales file) fails before any baseline work is spent.
        check_stop(cfg.stop, len(arms) >= 2, cfg.shard)
        door = open_engines(cfg)  # the arms share what they can (the reference engine's loaded model)
        with self.clock.engine("start"):  # every arm's engine at once where they fit (vLLM on one GPU)
            door.prestart(self._order(arms))
        # The last arm's engine closes in the background while the summary is computed (timing reports the
        # overlap; anatomy waits for it before it opens an engine); not with stop=sequential (last pass unknown).
        last = None if cfg.stop.name == "sequential" else self._order(arms)[-1].name
        for arm in self._passes(arms):  # each arm once; again per round with stop=sequential
            name, role, done = arm.name, arm.role, False
            early = None if task is not None else start_early_plan(self, tcls, task_cfg, arm, door.kind)
            with self.clock.engine("start"), early_abandoned_on_error(early):
                engine = door.open(arm)
            try:
                with self.clock.engine("start"):
                    backend = check_attention_backend(cfg, engine)  # before any request
                if task is None:  # planned while the engine started if it counts the same, else now
                    task, items = finish_early_plan(self, early, engine) or plan_task(self, tcls, task_cfg, engine)
                    if cfg.stop.name == "sequential":
                        self.rounds = Rounds(items, cfg.stop, cfg.stats, cfg.seed)
                    notes = task.notes()
                    for line in notes:
                        self.out(f"note: {line}")
                sent_before = summaries.get(name, {}).get("requests_sent", 0)  # earlier rounds (stop=sequential)
                summaries[name] = self.run_arm(task, engine, arm, items if self.rounds is None else self.rounds.items())
                summaries[name]["requests_sent"] += sent_before
                summaries[name]["role"] = role
                if backend is not None:
                    summaries[name]["attention_backend"] = backend
                if (warned := engine.startup_warnings()) is not None:  # vLLM engines: uncalibrated scales, ...
                    summaries[name]["engine_warnings"] = warned
                done = True
            finally:  # closed before the next arm starts (vLLM frees the GPU)
                if done and name == last:
                    self.clock.background("close", door.close, engine)
                else:
                    with self.clock.engine("close"):
                        door.close(engine)
        try:
            with self.clock.harness("summary"):  # statistics of the pairs, verdicts, the control's comparison
                summary = self._summary(task, door, items, arms, summaries, notes, control_info)
        finally:
            self.clock.settle()
        if cfg.anatomy and len(arms) >= 2 and cfg.shard is None:  # where each flip's completions part
            # engine time: it opens the arm again and teacher-forces through it (on the H200 with the 60-sample
            # NIAH grid, 27 s of vLLM start-up that was once counted as the harness's "summary")
            with self.clock.engine("anatomy"):
                summary["anatomy"] = anatomy.dissect(
                    self.views, self.records_root, self.request, door, task, items, arms,
                    {a.name: summaries[a.name]["fingerprint"] for a in arms}, self.out, settle=self.clock.settle)
        with self.clock.engine("close"):  # the engines kept open since prestart (side by side), if any
            door.close_all()
        summary["wall_s"] = round(time.perf_counter() - t0, 2)
        summary["timing"] = self.clock.report()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_json(self.run_dir / "summary.json", redact_obj(summary))  # redacted, never NaN/inf; one line on a disk error
        export.after_run(cfg, self.run_dir, summary, self.views, items, task, self.out)  # lm-eval file, parquet, card
        return summary

    def _summary(self, task, door, items, arms: list[ArmSpec], summaries: dict, notes: list[str], control_info):
        cfg = self.cfg
        summary: dict[str, Any] = {
            "model": cfg.model.name,
            "task": cfg.task.name,
            "baseline": arms[0].name if arms[0].role == "baseline" else None,
            "arms": {a.name: summaries[a.name] for a in arms},
            "recovery": None,
            "notes": notes,
            "sampling": self.sampling,
            "seed": cfg.seed,
            "wall_s": None,
        }
        if door.prestarted:  # the arms' engines started at once, each with this share of the GPU
            summary["parallel_start"] = door.prestarted
        if getattr(cfg.model, "dummy", False):  # random weights: the scores only prove the path
            from fp8eval.models import DUMMY_NOTE
            summary.update({"dummy_weights": True, "accuracy_meaningful": False, "accuracy_note": DUMMY_NOTE})
        if cfg.shard is not None:  # this summary covers only the shard's samples
            summary["shard"] = cfg.shard
        if len(arms) >= 2:
            summary["recovery"] = paired_recovery(self.views[arms[0].name].records,
                                                  self.views[arms[1].name].records)
            for key in getattr(task, "recovery_keys", ()):  # task metrics that are not a mean (MRCR AUC)
                b, v = summaries[arms[0].name].get(key), summaries[arms[1].name].get(key)
                summary["recovery"][key] = value_recovery(b, v)
            summary["verdict"] = paired_verdicts(self.views[arms[0].name].records, self.views[arms[1].name].records,
                                                 GateSettings(**plain(cfg.stats)), task.cluster_of)
        if self.rounds is not None:
            summary["sequential"] = self.rounds.summary(self.views[arms[0].name].records,
                                                        self.views[arms[1].name].records, summary.get("verdict"))
        if control_info is not None:  # the variant's flips next to the control's, and the excess
            views = [self.views[a.name].records for a in arms]
            summary["control"] = {**control_info, **control_comparison(views[0], views[1], views[2])}
        return summary

"""Prompt token counts kept on disk between runs, so a rerun plans without loading a tokenizer.

Counting a prompt's tokens is the only reason planning needs the engine's tokenizer (niah also counts
while it fills a haystack to length). On the reference engine that means importing transformers and
torch: ~9 s on a 2-core CPU for a run whose records are all there already. The counts are a pure
function of the tokenizer and the rendered prompt, so they are cached under a key naming exactly that:
the engine's `token_count_key()` (tokenizer identity and library versions) plus the chat-template
kwargs. An engine without that method is simply not cached.

Format: `<records_dir>/token_counts/<key[:20]>.jsonl`, one `{"h": prompt hash, "n": tokens}` per line,
appended with one write per line; a torn or unreadable line is ignored (it is a cache: the worst
case is counting again).
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Protocol

from fp8eval.core.progress import stage
from fp8eval.core.types import Prompt, Request
from fp8eval.engines.base import EngineError
from fp8eval.records import canonical_json, fingerprint_hash
from fp8eval.records.store import io_error


class PromptCounter:
    """Prompt tokens under the engine's template, counted once per distinct prompt (a 1M-token MRCR row is
    tokenised once even though the task and the length budget both ask) and, with `disk`, kept between runs.
    `many()` sends the prompts not known yet to the engine together: `count_prompt_tokens_many` where the
    engine has it (vLLM tokenizes a batch in parallel), one `count_prompt_tokens` each otherwise."""

    def __init__(self, engine, request_of: Callable[[Prompt], Request], disk: "TokenCountCache | None"):
        self.engine, self.request_of, self.disk = engine, request_of, disk
        self.counts: dict[str, int] = {}
        self.engine_calls = 0  # engine round trips (a batch is one), for summary.json's timing

    def __call__(self, prompt: Prompt) -> int:
        return self.many([prompt])[0]

    def many(self, prompts: list[Prompt]) -> list[int]:
        """The token counts of `prompts`, in order."""
        hashes = [p.hash() for p in prompts]
        todo: dict[str, Prompt] = {}
        for h, p in zip(hashes, prompts):
            if h in self.counts or h in todo:
                continue
            n = self.disk.get(h) if self.disk is not None else None
            if n is None:
                todo[h] = p
            else:
                self.counts[h] = n
        if todo:
            requests = [self.request_of(p) for p in todo.values()]
            if len(requests) > 1:  # one call (engines.base.EngineBase: a loop where the engine has no batch call)
                got = [int(n) for n in self.engine.count_prompt_tokens_many(requests)]
                self.engine_calls += 1
                if len(got) != len(requests):
                    raise EngineError(f"the engine counted the tokens of {len(got)} of the {len(requests)} prompts it was sent")
            else:
                got = [int(self.engine.count_prompt_tokens(r)) for r in requests]
                self.engine_calls += len(requests)
            for h, n in zip(todo, got):
                self.counts[h] = n
                if self.disk is not None:
                    self.disk.put(h, n)
        return [self.counts[h] for h in hashes]


class TokenCountCache:
    def __init__(self, root: Path, key_material: dict):
        self.key = fingerprint_hash(key_material)
        self.path = Path(root) / "token_counts" / f"{self.key[:20]}.jsonl"
        self.material = key_material
        self._counts: dict[str, int] | None = None

    def _load(self) -> dict[str, int]:
        if self._counts is None:
            self._counts = {}
            if self.path.exists():
                with open(self.path, "r", encoding="utf-8") as f:
                    for line in f:
                        try:
                            row = json.loads(line)
                            n = row["n"]
                        except (ValueError, KeyError, TypeError):
                            continue
                        # a count that is not a non-negative integer is not trusted: it is counted again
                        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
                            self._counts[str(row["h"])] = n
        return self._counts

    def get(self, prompt_hash: str) -> int | None:
        return self._load().get(prompt_hash)

    def put(self, prompt_hash: str, n: int) -> None:
        counts = self._load()
        if counts.get(prompt_hash) == n:
            return
        counts[prompt_hash] = n
        if not self.path.exists():
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                meta = self.path.with_suffix(".key.json")
                meta.write_text(json.dumps(self.material, indent=2, sort_keys=True, default=str) + "\n",
                                encoding="utf-8")
            except OSError as e:
                raise io_error(e, "write token counts to", Path(e.filename or self.path)) from None
        line = (canonical_json({"h": prompt_hash, "n": int(n)}) + "\n").encode("utf-8")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)  # one write per line: concurrent runs interleave whole lines
            finally:
                os.close(fd)
        except OSError as e:
            raise io_error(e, "write token counts to", Path(e.filename or self.path)) from None



class EarlyPlan:
    """Plans the run in a thread while the first arm's engine starts, counting through a tokenizer-only worker
    (`fp8eval.engines.start_early_counter`). `make(counter, max_model_len)` builds the task and plans it,
    returning (task, items); `finish(engine)` returns them only if the started engine counts exactly as the
    worker did (same max_model_len, same tokenizer fingerprint), else None and the runner plans with the engine.
    The time the thread spends while the engine starts is reported as overlapped (fp8eval.core.timing)."""

    def __init__(self, helper, make: Callable, ready_timeout_s: float = 600.0):
        import threading

        self.helper, self.result, self.error = helper, None, None

        def body() -> None:
            try:
                helper.wait_ready(ready_timeout_s)
                self.result = make(helper.max_model_len())
            except BaseException as e:  # noqa: BLE001 - planned again with the engine, which says it properly
                self.error = e

        self.thread = threading.Thread(target=body, name="early-plan", daemon=True)
        self.thread.start()

    def finish(self, engine, wait_s: float = 120.0):
        """(task, items) planned through the worker, if `engine` counts the same; None otherwise. Closes the worker."""
        try:
            self.thread.join(wait_s)  # long done on a GPU (planning takes seconds, the start a minute)
            if self.thread.is_alive() or self.result is None or not self.helper.same_counts_as(engine):
                return None
            return self.result
        except Exception:  # noqa: BLE001 - a fingerprint the engine cannot give: plan with it instead
            return None
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Stop the worker, in the background (a Python process takes seconds to exit; it holds no GPU, and one
        still running at exit is stopped then). A plan thread still counting gets an error and stops."""
        import threading

        threading.Thread(target=self.helper.close, name="early-plan-close", daemon=True).start()


def counter_for(engine, records_root: Path, cfg, request_of: Callable[[Prompt], Request]) -> PromptCounter:
    """The run's PromptCounter for `engine`: kept on disk where the engine names its tokenizer."""
    key = engine.token_count_key()
    disk = TokenCountCache(records_root, {"tokenizer": key, "chat_template_kwargs": dict(
        cfg.model.chat_template_kwargs)}) if key is not None else None
    return PromptCounter(engine, request_of, disk)


class Planner(Protocol):
    """What planning needs of the run (the runner gives it): its config and sampling, its clock, a prompt counter for
    an engine and the plan of a task."""

    cfg: Any
    sampling: dict
    clock: Any

    def token_counter(self, engine) -> PromptCounter: ...

    def plan(self, task, engine) -> list: ...


def plan_task(runner: Planner, tcls, task_cfg, engine, max_model_len: int | None = None):
    """The task built for `engine`'s tokenizer and max_model_len, and its plan (harness part "plan")."""
    from fp8eval.tasks.base import TaskContext

    counter = runner.token_counter(engine)
    ctx = TaskContext(count_tokens=counter, count_many=counter.many, model_name=runner.cfg.model.name,
                      max_model_len=engine.max_model_len() if max_model_len is None else max_model_len,
                      seed=runner.cfg.seed, max_tokens=int(runner.sampling["max_tokens"]))
    task = tcls(task_cfg, ctx)
    with runner.clock.harness("plan"), stage(f"planning {task.name}: building and counting its prompts",
                                             bool(runner.cfg.progress)):  # token counting included
        return task, runner.plan(task, engine)


def start_early_plan(runner: Planner, tcls, task_cfg, arm, kind: str | None) -> EarlyPlan | None:
    """Plan in a thread through a tokenizer-only worker while the arm's engine starts, where the engine kind
    has one (fp8eval.engines.start_early_counter); None otherwise."""
    from fp8eval.engines import prepare_early_counter, start_early_counter

    # The arm's model made loadable first (an embedded GGUF converted once, on a fresh machine): work of the
    # engine's start-up, which it would otherwise do itself, so engine time; the worker's start is not.
    with runner.clock.engine("start"):
        if not prepare_early_counter(runner.cfg, arm, kind):
            return None
    with runner.clock.harness("plan_early_start"):
        helper = start_early_counter(runner.cfg, arm, kind)
    if helper is None:
        return None
    return EarlyPlan(helper, lambda max_model_len: plan_task(runner, tcls, task_cfg, helper, max_model_len))


def finish_early_plan(runner: Planner, early: EarlyPlan | None, engine):
    """(task, items) from `early` if the started engine counts the same, its counter switched to the engine."""
    if early is None:
        return None
    with runner.clock.harness("plan_check"):
        got = early.finish(engine)
    if got is None:
        return None
    task, items = got
    task.ctx.count_tokens.engine = engine  # later counts (none for most tasks) by the engine itself
    return task, items


@contextmanager
def early_abandoned_on_error(early: EarlyPlan | None):
    """Stop the early plan's worker if the engine fails to start."""
    try:
        yield
    except BaseException:
        if early is not None:
            early.abandon()
        raise

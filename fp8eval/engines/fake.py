"""A scripted engine for tests: deterministic, instant, and able to crash on cue.

`engine.script` picks how completions are made:
- a rule name from RULES (e.g. `echo`, `needle`),
- `const:<text>`: always that text,
- `module:function`: a callable (request, sample_index) -> str, for task-aware test oracles,
- a path to a JSONL file of {"prompt_hash" or "contains": ..., "completion": ...} lines.
A kv arm whose cache dtype is not auto degrades deterministically when `engine.engine_args.fake_fp8_error`
(a probability) is set, so recovery below 100% can be tested without a model; `fake_delay_s` makes each
request take that long (for crash and resume tests); an arm's own `fake_noise` (control=noise) flips that
share of its answers whatever the cache, independently of the FP8 error (a noise-floor control arm).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

from fp8eval.config import RunConfig
from fp8eval.engines.base import Capabilities, Choice, Completion, EngineBase, EngineError, Request
from fp8eval.engines.spec import ArmSpec


def _last_user(req: Request) -> str:
    if req.prompt_text is not None:
        return req.prompt_text
    return next((m["content"] for m in reversed(req.messages) if m["role"] == "user"), "")


def rule_echo(req: Request, i: int) -> str:
    """The `echo` rule: answer with the prompt text, or else the last user message."""
    return _last_user(req)


_NEEDLE = re.compile(r"The special magic number for (?P<key>[\w-]+) is: (?P<value>\d+)\.")
_QUESTION_KEY = re.compile(r"special magic number for (?P<key>[\w-]+) mentioned")


def rule_needle(req: Request, i: int) -> str:
    """Answers needle questions by reading the haystack like a perfect model would."""
    text = "\n".join(m["content"] for m in req.messages) if req.prompt_text is None else req.prompt_text
    q = _QUESTION_KEY.search(_last_user(req))
    if not q:
        return "I don't know."
    for m in _NEEDLE.finditer(text):
        if m.group("key") == q.group("key"):
            return f"The special magic number for {m.group('key')} is {m.group('value')}."
    return "I don't know."


RULES: dict[str, Callable[[Request, int], str]] = {"echo": rule_echo, "needle": rule_needle}


class FakeEngine(EngineBase):
    kind = "fake"
    capabilities = Capabilities(
        loglikelihood=True, teacher_force=True, follows_sampling=False,  # scripted answers: sampling is ignored
        honoured_args=(("fake_noise", "positive", "the fake engine flips that share of answers"),),
        seed_args=("fake_noise",), control_hint="control=noise")

    def __init__(self, cfg: RunConfig, arm: ArmSpec, shared: dict | None = None):
        self.cfg = cfg
        self.kv = kv = arm
        self.script = cfg.engine.script
        self.cache_dtype = str(kv.engine_args.get("kv_cache_dtype", "auto"))
        self.error_rate = float(arm.engine_args.get("fake_fp8_error", 0.0)) if self.cache_dtype.startswith("fp8") else 0.0
        self.delay_s = float(arm.engine_args.get("fake_delay_s", 0.0))
        # A control arm's `fake_noise`: answers flip at this rate whatever the cache (fp8eval.control).
        self.noise = float(arm.engine_args.get("fake_noise", 0.0))
        self.sent = 0
        self._fn = self._resolve(self.script)

    def _resolve(self, script: str) -> Callable[[Request, int], str]:
        if script in RULES:
            return RULES[script]
        if script.startswith("const:"):
            text = script[len("const:"):]
            return lambda req, i: text
        if ":" in script and not Path(script).exists():
            module, _, fn = script.partition(":")
            try:
                return getattr(importlib.import_module(module), fn)
            except (ImportError, AttributeError) as e:
                raise EngineError(f"engine.script={script!r}: cannot import {fn} from {module}: {e}") from e
        path = Path(script)
        if path.is_file():
            table = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

            def scripted(req: Request, i: int) -> str:
                body = json.dumps(list(req.messages), ensure_ascii=False)
                for row in table:
                    if "contains" in row and row["contains"] in body:
                        return row["completion"]
                return ""

            return scripted
        raise EngineError(
            f"engine.script={script!r} is not a rule ({', '.join(RULES)}), 'const:TEXT', 'module:function' "
            f"or an existing JSONL file."
        )

    def describe(self) -> dict:
        return {"kind": self.kind, "script": self.script, "cache_dtype": self.cache_dtype,
                "skip_layers": list(self.kv.engine_args.get("kv_cache_dtype_skip_layers") or []),
                "scales": self.kv.scales, "error_rate": self.error_rate,
                "engine_args": dict(self.cfg.engine.engine_args),
                **({"noise": self.noise} if self.noise else {})}

    def max_model_len(self) -> int:
        return int(self.cfg.model.max_model_len)

    def count_prompt_tokens(self, request: Request) -> int:
        # ~4 characters a token: enough for budgeting tests, and deterministic.
        text = request.prompt_text if request.prompt_text is not None else "".join(
            m["content"] for m in request.messages)
        return max(1, len(text) // 4)

    def generate(self, requests: Iterable[Request]) -> Iterator[Completion]:
        fail_after = self.cfg.engine.fail_after
        for req in requests:
            if fail_after is not None and self.sent >= fail_after:
                raise RuntimeError(f"fake engine: scripted crash after {fail_after} requests")
            self.sent += 1
            if self.delay_s:
                time.sleep(self.delay_s)
            choices = []
            max_tokens = int(req.sampling.get("max_tokens") or 256)
            for i in range(req.n):
                text = self._fn(req, i)
                if self.error_rate and _unit(req.seeds[i], req.id) < self.error_rate:
                    text = "I could not find it."
                if self.noise and _unit(req.seeds[i], "noise:" + req.id) < self.noise:
                    text = "I could not find it." if text != "I could not find it." else self._fn(req, i)
                words = text.split()
                finish = "stop"
                if len(words) > max_tokens:
                    text, finish = " ".join(words[:max_tokens]), "length"
                choices.append(Choice(text=text, finish_reason=finish, output_tokens=min(len(words), max_tokens)))
            yield Completion(request_id=req.id, choices=choices, prompt_tokens=self.count_prompt_tokens(req),
                             cached_prompt_tokens=0)

    def loglikelihood(self, requests: Iterable[Request]) -> Iterator[Completion]:
        """Scoring requests: a `module:function` script that returns a list of (logprob, is_greedy) answers
        them; otherwise each pair gets a deterministic logprob in (-10, 0] from its text. The fp8 error
        rate, where set, draws a fresh logprob for every pair of the affected requests."""
        from fp8eval.engines.loglikelihood import completion

        for req in requests:
            self.sent += 1
            scripted = self._fn(req, 0)
            if isinstance(scripted, (list, tuple)):
                pairs = [(float(lp), bool(g)) for lp, g in scripted]
            else:
                pairs = [(-10.0 * _unit(0, f"{c}\x00{x}"), False) for c, x in req.logprob_pairs]
            if self.error_rate and _unit(req.seeds[0], req.id) < self.error_rate:
                pairs = [(-10.0 * _unit(1, f"{req.id}:{j}"), False) for j in range(len(pairs))]
            yield completion(req, pairs, self.count_prompt_tokens(req))

    def teacher_force(self, req: Request, forced_text: str, other_text: str) -> dict:
        """Scripted anatomy of a flip (fp8eval.engines.forcing): words are tokens; the forced word gets a
        deterministic log-probability and a rank of 2 or more, this arm's own word is its top-1."""
        from fp8eval.engines import forcing

        words: dict[str, int] = {}
        forced = [words.setdefault(w, len(words)) for w in forced_text.split()]
        other = [words.setdefault(w, len(words)) for w in other_text.split()]
        names = {i: w for w, i in words.items()}
        ids, p = forcing.forced_ids(forced, other, None)
        row = None
        if p < len(ids):
            u = _unit(0, f"force:{req.id}:{p}")
            row = {"logprob": -1.0 - 9.0 * u, "rank": 2 + int(8 * u), "top1": other[p] if p < len(other) else None}
        return forcing.answer(p, forced, other, row, lambda t: names.get(t, "?"))

    def close(self) -> None:
        pass


def _unit(seed: int, key: str) -> float:
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "big") / 2**64

"""Can vLLM serve a skip list the sensitivity ranking chose? (fp8eval.feasibility, memoised); when it cannot, the
best list it can serve (ranking.feasible_options / best_feasible)."""

from __future__ import annotations

from fp8eval.sensitivity import ranking
from fp8eval.sensitivity.passes import SensitivityError


class Feasibility:
    """Whether vLLM can serve a skip list (fp8eval.feasibility), memoised; `mode` is sensitivity.feasibility."""

    def __init__(self, cfg, passes, mode: str):
        from fp8eval.feasibility import Layout

        self.mode = mode
        c = passes.config
        c = c.get_text_config() if hasattr(c, "get_text_config") else c
        types = tuple(f"sliding:{getattr(c, 'sliding_window', 0)}" if "sliding" in t else "full" for t in passes.types)
        heads = int(getattr(c, "num_key_value_heads", None) or c.num_attention_heads)
        head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
        self.layout = Layout(types, heads, head_dim)
        self.cache_dtype = passes.engine.cache_dtype
        self.full = [i for i, t in enumerate(types) if t == "full"]
        self.known: dict[tuple, object] = {}
        self.rejected: list[list[int]] = []

    def _python(self):
        if self.mode in ("auto", "oracle"):
            from fp8eval.engines.vllm.args import vllm_python

            return vllm_python()
        return None

    def _check(self, cands: list[list[int]]) -> None:
        from fp8eval.feasibility import check_many, rule_check

        todo = [c for c in cands if tuple(c) not in self.known]
        if not todo:
            return
        if self.mode == "off":
            got = [None] * len(todo)
        elif self.mode == "rule":
            got = [rule_check(self.layout, self.cache_dtype, c) for c in todo]
        else:
            got = check_many(self.layout, [(self.cache_dtype, c) for c in todo], self._python())
        for c, v in zip(todo, got):
            self.known[tuple(c)] = v

    def ok(self, skip: list[int]) -> bool:
        """Feasible (always, with sensitivity.feasibility=off)."""
        self._check([skip])
        v = self.known[tuple(skip)]
        if v is not None and not v.feasible:
            self.rejected.append(list(skip))
        return v is None or v.feasible

    def best(self, order, scores, target, values, chosen, log) -> list[int]:
        """The ranked choice if vLLM can serve it, else the best feasible list (ranking.best_feasible)."""
        if self.mode == "off" or self.ok(list(chosen)):
            return list(chosen)
        opts = ranking.feasible_options(order, self.full)
        self._check(opts)
        feasible = {tuple(o): (self.known[tuple(o)] is None or self.known[tuple(o)].feasible) for o in opts}
        best = ranking.best_feasible(opts, feasible, scores, target, values)
        why = self.known[tuple(chosen)].reason
        if best is None:
            raise SensitivityError(f"no skip list vLLM can serve was found for kv={self.cache_dtype} ({why})")
        log(f"sensitivity: the ranked skip list {list(chosen)} cannot be served ({why}); recommending the best "
            f"feasible one instead: {best}")
        return best

    def summary(self, chosen: list[int]) -> dict:
        """What sensitivity.json says about feasibility."""
        v = self.known.get(tuple(chosen))
        return {"mode": self.mode, "how": v.how if v else None, "reason": v.reason if v else "not checked",
                "checked": len(self.known), "rejected": self.rejected}

"""Which kernel path the divergence probe reads (issue 35), and the gap between the two paths.

- `prefill`: every position's next-token distribution from one prefill of the passage (reference: the passage in
  `engine.prefill_chunk` chunks; vLLM: `prompt_logprobs`, the prefill kernel).
- `decode`: the same distributions as decode steps compute them: the passage's first token alone, then each next
  token forced, one decode step per token, through the arm's KV cache (reference: `engine.probe().decode_hidden`,
  every row computed as its decode step computes it, in one pass; vLLM: `fp8eval.engines.vllm.forced`, a forcing
  logits processor with raw log-probs, the decode kernel every generated answer takes, a length's passages decoded
  together). What users' answers see: the default.
- `both`: both, and the path gap: per arm, |log p_decode(t) - log p_prefill(t)| of the passage's own next token t
  at every position, per position bucket (mean, max, share above GAP_THRESHOLD). A BF16 arm's gap is the floor (the
  two paths sum in different orders); an FP8 arm's gap above it is what its cache does to the paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fp8eval.divergence import measures as M

PATHS = ("prefill", "decode", "both")
GAP_THRESHOLD = 1e-3  # nats: a position whose two paths differ by more counts in `share_above`


def paths_of(path: str) -> list[str]:
    """The paths one run computes (ValueError for an unknown name)."""
    if path not in PATHS:
        raise ValueError(f"divergence.path={path!r}; valid: {', '.join(PATHS)}")
    return ["prefill", "decode"] if path == "both" else [path]


def primary(path: str) -> str:
    """The path whose numbers a run reports at its top level: decode unless only prefill is asked for."""
    return "prefill" if paths_of(path) == ["prefill"] else "decode"


def token_logprobs(result: dict, ids, probe, n_pos: int) -> np.ndarray:
    """log p(ids[j + 1]) at positions j = 0..n_pos-1 from one arm's result on one path: exact from hidden states (`probe`:
    the engine's probe that made them, `engine.probe()`), else the engine's own token log-probs (NaN where a result
    lacks them)."""
    if "hidden" in result:
        import torch

        step, out = 256, []  # positions per slice of logits (~12M logits for a 49k vocabulary)
        for s in range(0, n_pos, step):
            e = min(s + step, n_pos)
            lp = torch.log_softmax(probe.logits(result["hidden"][s:e]).double(), -1)
            t = torch.tensor([int(x) for x in ids[s + 1:e + 1]], device=lp.device).view(-1, 1)
            out.append(lp.gather(-1, t)[:, 0].cpu().numpy())
        return np.concatenate(out) if out else np.zeros(0)
    if "token_logprobs" in result:
        return np.asarray(result["token_logprobs"][:n_pos], dtype=np.float64)
    return np.full(n_pos, np.nan)


@dataclass
class GapAccumulator:
    """|decode - prefill| log-prob gaps summed per position bucket; NaN gaps (a token log-prob an engine did not
    return) are counted in `n_missing`, never dropped silently."""

    edges: tuple[int, ...] = M.DEFAULT_EDGES
    sums: dict = field(default_factory=dict)

    def add(self, positions, gap) -> None:
        """Add one chunk: 0-based positions and their signed gaps (equal lengths)."""
        idx = M.bucket_index(positions, self.edges)
        gap = np.abs(np.asarray(gap, dtype=np.float64))
        for b in np.unique(idx):
            if b < 0:
                continue
            g = gap[idx == b]
            ok = g[np.isfinite(g)]
            s = self.sums.setdefault(int(b), {"n": 0, "n_ok": 0, "sum": 0.0, "max": 0.0, "above": 0})
            s["n"] += len(g)
            s["n_ok"] += len(ok)
            s["sum"] += float(ok.sum())
            s["max"] = max(s["max"], float(ok.max()) if len(ok) else 0.0)
            s["above"] += int((ok > GAP_THRESHOLD).sum())

    @staticmethod
    def _stats(s: dict) -> dict:
        ok = s["n_ok"]
        out = {"mean_abs": s["sum"] / ok if ok else None, "max_abs": s["max"] if ok else None,
               "share_above_1e-3": s["above"] / ok if ok else None, "n_tokens": s["n"]}
        if s["n"] != ok:
            out["n_missing"] = s["n"] - ok
        return out

    def result(self) -> dict[str, dict]:
        """{label: {mean_abs, max_abs, share_above_1e-3, n_tokens[, n_missing]}} for non-empty buckets, in order."""
        labels = M.bucket_labels(self.edges)
        return {labels[b]: self._stats(self.sums[b]) for b in sorted(self.sums)}

    def overall(self) -> dict:
        """The same over every position added."""
        tot = {"n": 0, "n_ok": 0, "sum": 0.0, "max": 0.0, "above": 0}
        for s in self.sums.values():
            for k in ("n", "n_ok", "sum", "above"):
                tot[k] += s[k]
            tot["max"] = max(tot["max"], s["max"])
        return self._stats(tot)


def path_gap(docs, prefill: dict, decode: dict, probe, edges) -> dict:
    """One arm's decode-vs-prefill gap over every passage ({passage key: result} per path): buckets and overall."""
    acc = GapAccumulator(edges=tuple(edges))
    for p in docs:
        n_pos = p.length - 1
        a = token_logprobs(prefill[p.key], p.ids, probe, n_pos)
        b = token_logprobs(decode[p.key], p.ids, probe, n_pos)
        acc.add(np.arange(n_pos), b - a)
    return {"buckets": acc.result(), "overall": acc.overall()}


def format_gaps(result: dict) -> list[str]:
    """The path-gap lines of the terminal table (empty unless the run had divergence.path=both)."""
    gaps = result.get("path_gap")
    if not gaps:
        return []
    fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    lines = ["path gap |log p_decode - log p_prefill| of the passage's token, per arm:",
             f"{'arm':>14} {'bucket':>10} {'n':>7} {'mean':>10} {'max':>10} {'>1e-3':>7}"]
    for arm, g in gaps.items():
        for label, b in [*g["buckets"].items(), ("overall", g["overall"])]:
            lines.append(f"{arm:>14} {label:>10} {b['n_tokens']:>7} {fmt(b['mean_abs'], '.3e'):>10} "
                         f"{fmt(b['max_abs'], '.3e'):>10} {fmt(b['share_above_1e-3'], '.3f'):>7}")
    return lines

"""What makes a sensitivity run resumable: its fingerprint and its per-passage results on disk.

Like `python -m fp8eval.divergence`, each passage's results are kept under
`<records_dir>/sensitivity/<fingerprint[:20]>/<passage key>.npz`: the per-position measures of every pass
(full FP8, only layer i, all but layer i, sliding-window layers in BF16, and each re-measured skip list) and
the passage's K/V statistics. The fingerprint covers the model, the engine's describe(), both arms' kv
settings and the bucket edges; skip lists are normalised (`normal_skip`) before hashing, so [2, 7],
["7", "2"] and [2, 2, 7] name one setting. A rerun replays what exists, in the order a fresh run adds it
(the same sums), and computes only what is missing.
"""

from __future__ import annotations

import numpy as np

from fp8eval.arms import arm_material, kv_view, model_view
from fp8eval.core.hashing import canonical_json, fingerprint_hash
from fp8eval.divergence.documents import Passage

SCHEMA = 1
SKIP_KEY = "kv_cache_dtype_skip_layers"


def normal_skip(skip) -> list:
    """A skip list as one spelling: layer indices as ints (from ints or digit strings), sorted, without
    duplicates, then the named groups ("sliding_window") sorted."""
    ints, names = set(), set()
    for x in skip or ():
        s = str(x).strip()
        if s.lstrip("-").isdigit():
            ints.add(int(s))
        else:
            names.add(s)
    return sorted(ints) + sorted(names)


def skip_key(skip) -> str:
    """The normalised skip list as a short stable name ("2,7", "sliding_window", "" for none)."""
    return ",".join(str(x) for x in normal_skip(skip))


def fingerprint(cfg, describe: dict, variant_kv, baseline_kv) -> tuple[str, dict]:
    """sha256 over everything that can change a passage's sensitivity results, and its material
    (fp8eval.arms.arm_material: the model with its env, skip lists normalised, both arms' kv, the edges)."""
    engine = dict(describe)
    if isinstance(engine.get("kv"), dict) and "skip_layers" in engine["kv"]:
        engine["kv"] = {**engine["kv"], "skip_layers": normal_skip(engine["kv"]["skip_layers"])}
    extra = {"sensitivity_schema": SCHEMA, "baseline": kv_view(baseline_kv, normal_skip),
             "edges": [int(e) for e in cfg.sensitivity.edges]}
    if str(getattr(cfg.sensitivity, "path", "prefill")) != "prefill":  # only then: prefill runs keep theirs
        extra["path"] = str(cfg.sensitivity.path)
        if extra["path"] == "decode":  # computed in one pass (Probe.decode_hidden), not the earlier step loop
            extra["decode"] = "one_pass"
    material = arm_material(cfg, variant_kv, engine, extra,
                            model=model_view(cfg.model, ("name", "notes", "sampling"), keep_dummy=True),
                            kv_d=kv_view(variant_kv, normal_skip))
    return fingerprint_hash(material), material


class PassageCache:
    """One run's per-passage results, named by fingerprint and passage key; `put` writes a passage whole."""

    def __init__(self, root, fp: str, material: dict):
        self.dir = root / "sensitivity" / fp[:20]
        self.dir.mkdir(parents=True, exist_ok=True)
        fp_file = self.dir / "fingerprint.json"
        if not fp_file.exists():
            fp_file.write_text(canonical_json({"fingerprint": fp, "material": material}) + "\n")

    def load(self, p: Passage) -> dict[str, np.ndarray]:
        """A passage's stored arrays ({} when absent or unreadable)."""
        try:
            with np.load(self.dir / f"{p.key}.npz") as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError):
            return {}

    def save(self, p: Passage, arrays: dict[str, np.ndarray]) -> None:
        """Write a passage's arrays atomically (whole or absent)."""
        path = self.dir / f"{p.key}.npz"
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **arrays)
        tmp.replace(path)

"""Needle in a haystack, RULER multi-key style (NVIDIA/RULER `niah_multikey`): one target needle and
distractor needles with other keys in public-domain filler, over a context-length x depth grid counted in
the model's own tokens under its chat template."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generator, Optional

from fp8eval.config import SamplingConfig, TaskConfig
from fp8eval.core.seeds import rng_for
from fp8eval.metrics.groups import cell_key
from fp8eval.scoring.niah import niah_score
from fp8eval.tasks.base import TASK_DATA_ROOT, Prompt, Sample, Score, SkipSample, Task, file_sha256
from fp8eval.tasks.niah.haystack import HAYSTACK_DIR, haystack_text, sentence_boundary_before

_WORDS_A = ("amber", "brisk", "calm", "dusty", "eager", "faint", "gentle", "hollow", "icy", "jolly", "keen",
            "lofty", "mellow", "noble", "odd", "pale", "quiet", "rapid", "silent", "tidy", "vivid", "witty")
_WORDS_B = ("anchor", "badger", "candle", "dagger", "falcon", "garden", "harbor", "island", "jacket", "kettle",
            "lantern", "meadow", "needle", "orchard", "pepper", "quarry", "ribbon", "saddle", "thimble", "violin")
NEEDLE = "The special magic number for {key} is: {value}."


@dataclass
class NiahConfig(TaskConfig):
    # Whole-prompt lengths in the model's tokens (chat template included).
    lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8000])
    depths: list[float] = field(default_factory=lambda: [0.0, 25.0, 50.0, 75.0, 100.0])  # percent
    needles_per_cell: int = 1  # samples per (length, depth) cell, each with its own keys and values
    distractors: int = 3  # other needles in the same haystack (RULER multi-key)
    value_digits: int = 7
    haystack_dir: Optional[str] = None
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=0.0, max_tokens=32))


class NiahTask(Task):
    name = "niah"
    version = "1"
    config_class = NiahConfig
    selection_keys = ("lengths", "depths", "needles_per_cell")

    def __init__(self, cfg: NiahConfig, ctx):
        super().__init__(cfg, ctx)
        self.template = (TASK_DATA_ROOT / "niah" / "prompt.txt").read_text(encoding="utf-8")
        self._chars_per_token: float | None = None
        self._notes: list[str] = []
        self._prepared: dict[str, Prompt | SkipSample] = {}  # sample id -> prepare()'s result
        self._lengths = self._fit_lengths()

    def _max_tokens(self) -> int:
        return int(self.ctx.max_tokens or self.cfg.sampling.max_tokens or 32)

    def _fit_lengths(self) -> list[int]:
        cap = self.ctx.max_model_len - self._max_tokens()
        lengths = sorted({min(int(n), cap) for n in self.cfg.lengths})
        if any(int(n) > cap for n in self.cfg.lengths):
            self._notes.append(
                f"niah: lengths above {cap} tokens do not fit {self.ctx.model_name}'s max_model_len "
                f"{self.ctx.max_model_len} minus {self._max_tokens()} output tokens; the grid stops at {cap}."
            )
        return lengths

    def notes(self) -> list[str]:
        return list(self._notes)

    @staticmethod
    def cluster_of(sample_id: str, groups: tuple[str, ...]) -> str:
        """A (length, depth) cell: its samples (needles_per_cell > 1) share one haystack text."""
        return cell_key(groups) or sample_id

    def fingerprint(self) -> dict[str, Any]:
        return {"prompt_sha256": file_sha256(TASK_DATA_ROOT / "niah" / "prompt.txt"), "needle": NEEDLE,
                "haystack": "default" if not self.cfg.haystack_dir else self.cfg.haystack_dir}

    def samples(self) -> list[Sample]:
        out = []
        for length in self._lengths:
            for depth in self.cfg.depths:
                for k in range(self.cfg.needles_per_cell):
                    sid = f"len{length}-depth{depth:g}-n{k}"
                    rng = rng_for("niah", self.ctx.seed, sid)
                    keys = _distinct_keys(rng, 1 + self.cfg.distractors)
                    values = [str(rng.randrange(10 ** (self.cfg.value_digits - 1), 10 ** self.cfg.value_digits))
                              for _ in keys]
                    distractor_depths = [rng.uniform(0, 100) for _ in keys[1:]]
                    out.append(Sample(
                        id=sid,
                        data={"length": length, "depth": float(depth), "keys": keys, "values": values,
                              "distractor_depths": distractor_depths},
                        groups=(f"ctx={length}", f"depth={depth:g}"),
                    ))
        return out

    # --- prompt building ------------------------------------------------------------------------------
    def _render(self, sample: Sample, n_chars: int) -> Prompt:
        d = sample.data
        filler = haystack_text(n_chars, self.cfg.haystack_dir or HAYSTACK_DIR)
        needles = [(d["depth"], NEEDLE.format(key=d["keys"][0], value=d["values"][0]))]
        needles += [(dd, NEEDLE.format(key=k, value=v))
                    for dd, k, v in zip(d["distractor_depths"], d["keys"][1:], d["values"][1:])]
        # Insert from the deepest position backwards so earlier offsets stay valid.
        spots = sorted(((sentence_boundary_before(filler, int(len(filler) * dep / 100.0)), text)
                        for dep, text in needles), key=lambda s: s[0], reverse=True)
        context = filler
        for pos, text in spots:
            sep_before = "" if pos == 0 or context[pos - 1] in " \n" else " "
            context = context[:pos] + sep_before + text + " " + context[pos:]
        content = self.template.format(context=context.strip(), key=d["keys"][0]).strip()
        return Prompt(messages=({"role": "user", "content": content},))

    def _calibrate(self) -> None:
        if self._chars_per_token is None:
            # Calibrated on the grid's first sample, whichever sample is asked first, so a prompt never
            # depends on which samples a run plans (a shard plans only its own).
            probe = self._render(self.samples()[0], 20000)
            self._chars_per_token = 20000 / max(1, self.ctx.count_tokens(probe))

    def _search(self, sample: Sample) -> Generator[Prompt, int, Prompt]:
        """The haystack fitted to the sample's length: yields each prompt whose token count it needs and is
        sent that count back; returns the prompt (raises SkipSample). One search for one prompt at a time
        (`prompt`) and for many in step (`prepare`): the same counts, so the same prompts."""
        target = int(sample.data["length"])
        overhead = yield self._render(sample, 0)
        if overhead >= target:
            raise SkipSample(f"the prompt without filler is already {overhead} tokens, over the {target} asked")
        n_chars = int((target - overhead) * self._chars_per_token)
        for _ in range(8):
            prompt = self._render(sample, n_chars)
            tokens = yield prompt
            if target - 16 <= tokens <= target:
                return prompt
            n_chars = max(0, int(n_chars + (target - 4 - tokens) * self._chars_per_token))
        if tokens <= target:
            return prompt
        raise SkipSample(f"could not fit the haystack into {target} tokens (last try: {tokens})")

    def prepare(self, samples) -> None:
        """Every sample's search run in step, each round's prompts counted in one `ctx.count_many` batch
        (the engine may tokenize them in parallel); the prompts (or SkipSample) are kept for `prompt()`."""
        if self.ctx.count_many is None:
            return
        self._calibrate()
        live: dict[str, tuple[Generator[Prompt, int, Prompt], Prompt]] = {}
        for sample in samples:
            if sample.id not in live and sample.id not in self._prepared:
                gen = self._search(sample)
                live[sample.id] = (gen, next(gen))
        while live:
            counts = self.ctx.count_many([asked for _, asked in live.values()])
            for (sid, (gen, _)), n in zip(list(live.items()), counts, strict=True):
                try:
                    live[sid] = (gen, gen.send(n))
                except StopIteration as done:
                    self._prepared[sid] = done.value
                    del live[sid]
                except SkipSample as skip:
                    self._prepared[sid] = skip
                    del live[sid]

    def prompt(self, sample: Sample, repeat: int) -> Prompt:
        got = self._prepared.pop(sample.id, None)  # prepare()'s result, used once (the runner keeps it)
        if isinstance(got, SkipSample):
            raise got
        if got is not None:
            return got
        self._calibrate()
        gen = self._search(sample)
        asked = next(gen)
        while True:
            try:
                asked = gen.send(self.ctx.count_tokens(asked))
            except StopIteration as done:
                return done.value

    def score(self, sample: Sample, completion: str, repeat: int = 0) -> Score:
        value = sample.data["values"][0]
        return Score(value=niah_score(completion, value), extracted=value if value in completion else None,
                     details={"expected": value})


def _distinct_keys(rng, n: int) -> list[str]:
    keys: list[str] = []
    while len(keys) < n:
        k = f"{rng.choice(_WORDS_A)}-{rng.choice(_WORDS_B)}"
        if k not in keys:
            keys.append(k)
    return keys

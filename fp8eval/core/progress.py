"""Progress on stderr: a bar for counted work, a stage line for the rest, and third-party noise kept out.

- `Progress`: a tqdm bar that is a no-op when disabled or when there is nothing to count; in a terminal its clock
  moves even before the first sample ends.
- `stage(text, enabled)`: a `with` block that prints `fp8eval: <text> ...` when it starts and `... done in N s`
  when it ends, for work that has no count (a model load, lm-eval's task index, the report): the output moves
  while nothing can be counted. Printed through tqdm, so a bar on screen is not torn.
- `quiet_third_party()`: outside a terminal (a log file, CI) other libraries' bars are turned off (transformers'
  nested "Loading weights" bar leaves cursor-up escapes, `ESC[A`, in a log), and known noise is filtered: the
  transformers tokenizer warning about `clean_up_tokenization_spaces` on BPE tokenizers (the cleanup it names
  is skipped either way, so nothing fp8eval decodes changes).
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from contextlib import contextmanager

from tqdm import tqdm


class Progress:
    """tqdm on stderr, or nothing (`enabled` false or `total` 0). In a terminal the bar is redrawn every
    `tick` seconds, so its clock moves while the first (longest) prompts are still running."""

    def __init__(self, total: int, desc: str, enabled: bool, unit: str = "sample", tick: float = 1.0):
        self.bar = None
        self._done = threading.Event()
        if enabled and total:
            self.bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)
            if getattr(sys.stderr, "isatty", lambda: False)():  # in a log, every redraw would be one more line
                threading.Thread(target=self._redraw, args=(tick,), daemon=True).start()

    def _redraw(self, tick: float) -> None:
        while not self._done.wait(tick):
            self.bar.refresh()

    def update(self, n: int) -> None:
        """Advance by n."""
        if self.bar:
            self.bar.update(n)

    def close(self) -> None:
        """Close the bar (if any)."""
        self._done.set()
        if self.bar:
            self.bar.close()


@contextmanager
def stage(text: str, enabled: bool = True):
    """Say on stderr that `text` started, and when the block ends how long it took (nothing when disabled). Other
    libraries' bars and known noise are kept out of a log either way (`quiet_third_party`)."""
    quiet_third_party()
    if not enabled:
        yield
        return
    t0 = time.perf_counter()
    tqdm.write(f"fp8eval: {text} ...", file=sys.stderr)
    yield
    tqdm.write(f"fp8eval: {text}: done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)


# Messages of other libraries that say nothing to an fp8eval user, by logger name and first words.
NOISE = {"transformers.tokenization_utils_tokenizers": ("Ignoring clean_up_tokenization_spaces=True",)}


class _DropNoise(logging.Filter):
    def __init__(self, starts: tuple[str, ...]):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.starts)


def quiet_third_party(stream=None) -> None:
    """Filter the known noise (NOISE) and, when `stream` (default stderr) is not a terminal, turn off the
    progress bars of huggingface_hub, transformers and datasets. Idempotent; call it before loading a model."""
    for name, starts in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in logger.filters):
            logger.addFilter(_DropNoise(starts))
    stream = sys.stderr if stream is None else stream
    if getattr(stream, "isatty", lambda: False)():
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read by huggingface_hub at import
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if "huggingface_hub" in sys.modules:  # imported already: its switch, which transformers' bars follow too
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if "datasets" in sys.modules:
        import datasets

        datasets.disable_progress_bars()

"""A progress bar on stderr that is a no-op when disabled or when there is nothing to count."""
from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    """tqdm on stderr, or nothing (`enabled` false or `total` 0)."""

    def __init__(self, total: int, desc: str, enabled: bool, unit: str = "sample"):
        self.bar = None
        if enabled and total:
            self.bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)

    def update(self, n: int) -> None:
        """Advance by n."""
        if self.bar:
            self.bar.update(n)

    def close(self) -> None:
        """Close the bar (if any)."""
        if self.bar:
            self.bar.close()

"""A seeded Zipf(s) sampler over ranks 0..n-1 (rank 0 the most popular) and the share of draws the top k ranks
take. Pure Python, no numpy (the lab guest runs the host's interpreter and the benchmark must not depend on more)."""

from __future__ import annotations

import bisect
import itertools
import random


class Zipf:
    """P(rank k) proportional to 1 / (k + 1) ** s; one bisect on the cumulative weights per draw."""

    def __init__(self, n: int, s: float, rnd: random.Random) -> None:
        if n < 1 or s < 0:
            raise ValueError(f"Zipf needs n >= 1 and s >= 0 (got n={n}, s={s})")
        self.cum = list(itertools.accumulate((k + 1) ** -s for k in range(n)))
        self.rnd = rnd

    def __call__(self) -> int:
        # min(): a draw equal to the total (float rounding) still lands on the last rank
        return min(len(self.cum) - 1, bisect.bisect_right(self.cum, self.rnd.random() * self.cum[-1]))

    def top_share(self, k: int) -> float:
        """The share of draws that land on the k most popular ranks: the hit ratio of an ideal cache of k files."""
        return 0.0 if k <= 0 else self.cum[min(k, len(self.cum)) - 1] / self.cum[-1]

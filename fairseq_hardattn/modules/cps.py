"""Counting the score computations per decoding step (CPS, the flexible
attention paper's cost metric) of windowed attention."""

from torch import Tensor


class CpsCounter:
    """Counts score computations per decoding step (CPS) while ``enabled``.

    ``scored`` sums the positions scored, ``queries`` counts (hypothesis, head,
    step) triples, ``available`` sums the positions global attention would
    score. Kept as tensors: counting adds no synchronisation to decoding.
    """

    def __init__(self):
        self.enabled = False
        self.reset()

    def reset(self):
        self.scored, self.queries, self.available = 0, 0, 0

    def add(self, scored: Tensor, available: Tensor):
        if self.enabled:
            self.scored = self.scored + scored.sum()
            self.available = self.available + available.sum()
            self.queries += scored.numel()

    def summary(self):
        if not self.queries:
            return None
        return {"cps": float(self.scored) / self.queries,
                "global_cps": float(self.available) / self.queries,
                "queries": self.queries}


def combined_summary(counters):
    """CPS over several counters (layers), weighted by their queries: cps,
    global_cps and the reduction, or None before any counted step."""
    summaries = [s for s in (counter.summary() for counter in counters) if s]
    if not summaries:
        return None
    queries = sum(s["queries"] for s in summaries)
    cps = sum(s["cps"] * s["queries"] for s in summaries) / queries
    global_cps = sum(s["global_cps"] * s["queries"] for s in summaries) / queries
    return {"cps": cps, "global_cps": global_cps,
            "reduction": 1 - cps / global_cps if global_cps else 0.0}

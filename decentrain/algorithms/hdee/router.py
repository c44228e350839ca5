"""A closed-form ridge-regression router over hidden states (DUME, arXiv 2603.29765; IR3DE).

The router maps a feature vector h (a hidden state) to one score per expert:
    W = (HᵀH + λI)⁻¹ HᵀY,   scores = h W,
with H the calibration set's hidden states [N, d] and Y the one-hot of each row's domain
[N, K] (the expert trained on that domain). Nothing is trained by gradient.

Both factors are sums over calibration rows, so the router keeps them per class (per domain):
G_c = H_cᵀH_c and s_c = H_cᵀ1 (HᵀY's column c, since Y is one-hot). A class's statistics are
accumulated once, from its own calibration text only. Then:
  - removing an expert drops its column of HᵀY: every other column of W is unchanged, and W
    equals a refit on the same calibration pool with that expert's targets removed;
    `drop_calibration=True` also takes its text out of HᵀH (a refit on the remaining data only);
  - adding an expert adds its (G_c, s_c) and solves one d x d system again; no other domain's
    calibration text is read again.
Departure from DUME: no bias column (the formula as written); λ is absolute, as in the formula.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RouterStats:
    """Per-class sufficient statistics: G_c = H_cᵀH_c [d, d], s_c = H_cᵀ1 [d], n_c rows (float64)."""

    gram: dict[str, torch.Tensor] = field(default_factory=dict)
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, features: torch.Tensor) -> None:
        """Accumulate rows `features` [N, d] of class `name` (calls for one class add up)."""
        h = features.detach().reshape(-1, features.shape[-1]).double().cpu()
        if name not in self.gram:
            self.gram[name] = torch.zeros(h.shape[1], h.shape[1], dtype=torch.float64)
            self.sums[name] = torch.zeros(h.shape[1], dtype=torch.float64)
            self.counts[name] = 0
        self.gram[name] += h.T @ h
        self.sums[name] += h.sum(0)
        self.counts[name] += h.shape[0]

    def remove(self, name: str) -> None:
        for d in (self.gram, self.sums, self.counts):
            d.pop(name)

    @property
    def classes(self) -> list[str]:
        return list(self.gram)


def ridge_weights(gram: torch.Tensor, targets: torch.Tensor, lam: float) -> torch.Tensor:
    """W = (HᵀH + λI)⁻¹ HᵀY from HᵀH [d, d] and HᵀY [d, K] (one solve, float64)."""
    eye = torch.eye(gram.shape[0], dtype=gram.dtype)
    return torch.linalg.solve(gram + lam * eye, targets)


def fit_router(stats: RouterStats, experts: list[str], lam: float, pool: list[str] | None = None) -> torch.Tensor:
    """Router weights [d, K] for `experts` (columns in that order), HᵀH summed over the calibration
    `pool` (default: every class held, the removed experts' text included)."""
    missing = [e for e in experts if e not in stats.gram]
    if missing:
        raise ValueError(f"router: no calibration statistics for experts {missing}; have {stats.classes}")
    pool = stats.classes if pool is None else pool
    gram = sum(stats.gram[c] for c in pool)
    targets = torch.stack([stats.sums[e] for e in experts], dim=1)
    return ridge_weights(gram, targets, lam)


def route(features: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Top-1 expert index per row of `features` [..., d]: argmax_j (h W)_j."""
    return (features.double() @ weights.to(features.device)).argmax(-1)

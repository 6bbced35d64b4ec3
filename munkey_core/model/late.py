"""Late injection: the MUNKEY variant whose exemplar token joins the sequence only at block L.

Why: in the paper's design (inject_at = 0) the token enters at the first block, so the K-ensemble
runs the whole transformer K times per image. With `ModelConfig.inject_at = L` blocks [0, L) see
only the image tokens, so they run once per image and are shared by its K neighbours; only the last
depth - L blocks run K times. Cost per image: L + K * (depth - L) block passes instead of K * depth
(docs/performance.md has the speed and the Avg Gap of late@3 on the cpu profile).
It is a different model, trained with the same recipe (`munkey train --inject-at L`), not a way to
run a trained paper-design model; MunkeyViT implements both (model.py), this module only names the
variant for code that builds one directly. Tests: tests/test_perf_late.py, tests/test_late.py.
"""

from __future__ import annotations

from dataclasses import replace

from munkey_core.config import ModelConfig
from munkey_core.model.munkey_vit import MunkeyViT


class LateInjectionViT(MunkeyViT):
    """MunkeyViT with `cfg.inject_at` set to `inject_at` (0 <= inject_at < depth, else MunkeyError)."""

    def __init__(self, cfg: ModelConfig, inject_at: int) -> None:
        super().__init__(replace(cfg, inject_at=inject_at))


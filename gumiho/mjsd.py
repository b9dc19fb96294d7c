"""MJSD's verification by joint likelihood (arXiv 2407.09722; docs/design.md §16). The draft is drafters/mjsd.py.

For the drafted chain x_1..x_n, prefix i has the target's joint probability P_i = Π_{j<=i} p(x_j | x_<j) and the
beam probability Q_i the draft recorded. It passes when min(1, P_i / Q_i) >= τ_acc; the accepted length is the
largest passing i (shorter prefixes need not pass). One token from the target follows the accepted prefix.
MJSD trades exactness for fewer target forwards: the output is not distributed as the target's.

Sampling (T > 0) uses the run's temperature with the paper's top-k 20 and top-p 0.9 (the run's own where
narrower) for the draft, for P and for every sampled token. The greedy variant (T = 0): deterministic beam search,
P and Q from the plain softmax (T = 1, no filter), and the target's argmax after the accepted prefix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch

from .sampling import SamplingConfig, pick, probabilities
from .trace import JointCheck
from .tree import DraftTree, TreeSettings
from .verify import Acceptance

PAPER_TOP_K, PAPER_TOP_P = 20, 0.9


def mjsd_sampling(cfg: SamplingConfig) -> SamplingConfig:
    """The run's sampling as MJSD applies it: the paper's top-k and top-p unless the run's are narrower; greedy
    stays greedy."""
    if cfg.greedy:
        return cfg
    top_k = min(cfg.top_k, PAPER_TOP_K) if cfg.top_k else PAPER_TOP_K
    return replace(cfg, top_k=top_k, top_p=min(cfg.top_p, PAPER_TOP_P))


def joint_distribution(cfg: SamplingConfig) -> SamplingConfig:
    """What P (and the draft's Q) are computed from: the sampling distribution; the plain softmax when greedy."""
    return SamplingConfig(temperature=1.0) if cfg.greedy else cfg


def describe(tree: TreeSettings, cfg: SamplingConfig) -> str:
    """Why an MJSD run is approximate, in one line (the trace's settings.approximate, the CLI's note)."""
    note = (f"MJSD accepts the longest draft prefix whose min(1, P/Q) reaches tau_acc {tree.tau_acc:g}: the output "
            "is not the target's own")
    if cfg.greedy:
        return note + "; T = 0: the greedy variant (deterministic beam search, P and Q at T = 1, argmax bonus token)"
    return note + f"; T = {cfg.temperature:g}, top-k {cfg.top_k}, top-p {cfg.top_p:g}"


def joint_checks(p: Sequence[float], q: Sequence[float], threshold: float) -> list[JointCheck]:
    """One check per prefix length i = 1.. from the joint probabilities P_i and Q_i (Q_i > 0)."""
    checks = []
    for i, (p_i, q_i) in enumerate(zip(p, q), start=1):
        ratio = min(1.0, p_i / q_i)
        checks.append(JointCheck(length=i, p=p_i, q=q_i, ratio=ratio, passed=ratio >= threshold))
    return checks


def accepted_length(p: Sequence[float], q: Sequence[float], threshold: float) -> int:
    """The largest prefix length i with min(1, P_i / Q_i) >= threshold, or 0 when none passes."""
    return max((c.length for c in joint_checks(p, q, threshold) if c.passed), default=0)


def verify_joint(tree: DraftTree, logits: torch.Tensor, log_q: Sequence[float], cfg: SamplingConfig,
                 threshold: float, generator: torch.Generator) -> tuple[Acceptance, list[JointCheck]]:
    """Verify a chain tree (root, x_1..x_n) from the target's logits at its n + 1 nodes, with log Q_1..Q_n.
    `cfg` is the run's sampling as MJSD applies it (`mjsd_sampling`)."""
    n = tree.size - 1
    probs = probabilities(logits[:n], joint_distribution(cfg)).double()
    drafted = tree.tokens[1:].cpu()
    steps = probs.gather(1, drafted[:, None])  # node i's row: p of its one child, node i + 1
    p = steps.squeeze(1).cumprod(0).tolist()
    q = [math.exp(x) for x in log_q[:n]]
    length = accepted_length(p, q, threshold)
    bonus = pick(logits[length], cfg, generator)
    return (Acceptance(nodes=list(range(length + 1)), bonus=bonus, path_row=0, per_path=[length],
                       probs=dict(enumerate(steps))), joint_checks(p, q, threshold))

"""MJSD's draft (arXiv 2407.09722; docs/design.md §16): beam search over EAGLE-2's network, the small model.

γ = tree.depth steps with B = tree.top_k beams. At each step every beam's next-token log-probs plus the beam's score
(its cumulative log-prob) form the frontier, filtered per beam by top-k / top-p when sampling; π = softmax over the
whole frontier. 2B candidates are drawn from π without replacement (the greedy variant takes the 2B best by score),
and the B best non-end ones by score become the new beams; each records Q_t = π(its candidate). The top beam comes
back as a chain with Q_1..Q_γ. The beams of one step sit at one draft position, each seeing its own earlier slots,
as in EAGLE-2's expansion.

Step 1 expands the root once. The authors' code starts from B equal copies of it, so one token can be drafted by
several beams (the greedy variant would keep B copies of the best beam) and their Q_1 is 1/B of ours.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..mjsd import describe, mjsd_sampling, verify_joint
from ..sampling import SamplingConfig, nucleus
from ..trace import JointCheck
from ..tree import DraftPool, DraftTree, TreeSettings
from ..verify import Acceptance as Verdict, LazyLogits
from .eagle2 import Eagle2Drafter


@dataclass(frozen=True)
class BeamSearch:
    """How a run draws its beams. `sampling` greedy: deterministic, from the plain draft distribution; else its
    temperature, top-k and top-p shape the draft distribution and `generator` draws the candidates."""

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    eos_ids: frozenset[int] = frozenset()
    generator: torch.Generator | None = None


@dataclass
class BeamDraft(DraftPool):
    """The top beam as a chain (one node per depth), with log Q_t of its prefix of length t = 1, 2, ..., and the
    threshold its verification applies."""

    log_q: list[float] = field(default_factory=list)
    tau_acc: float = 0.9


class MjsdDrafter(Eagle2Drafter):
    kind = "mjsd"
    weights = "eagle2"  # the folder kind it loads (drafters.for_method)
    search = BeamSearch()  # each run's, set by `start`

    def run_sampling(self, sampling: SamplingConfig) -> SamplingConfig:
        return mjsd_sampling(sampling)  # the paper's filters (mjsd.py)

    def approximation(self, tree: TreeSettings, sampling: SamplingConfig) -> str:
        return describe(tree, sampling)

    def start(self, sampling: SamplingConfig, eos_ids: frozenset[int], generator: torch.Generator) -> None:
        self.search = BeamSearch(sampling, eos_ids, generator)

    def accept(self, tree: DraftTree, logits: LazyLogits, pool: BeamDraft, sampling: SamplingConfig,
               generator: torch.Generator) -> tuple[Verdict, list[JointCheck]]:
        """Joint-likelihood verification of the chain (mjsd.py), with its check of each draft prefix."""
        return verify_joint(tree, logits.full(), pool.log_q, sampling, pool.tau_acc, generator)

    def draft(self, features: torch.Tensor, tokens: torch.Tensor, tree: TreeSettings) -> BeamDraft:
        h = self.advance(features, tokens)
        stable, dev = self.cache.length, tokens.device
        out = h[None]  # per beam, the draft output that predicts its next token; step 1 has the root alone
        chain = torch.zeros(1, 0, dtype=torch.long, device=dev)  # per beam: its tokens, cumulative scores, log Q
        scores, log_q = torch.zeros(1, 0, device=dev), torch.zeros(1, 0, device=dev)
        seen = torch.zeros(1, 0, dtype=torch.bool, device=dev)  # per beam: its own slots among the expansion slots
        for step in range(tree.depth):
            logp, ids, log_mass = self._next_tokens(out, tree.top_k)
            score = scores[:, -1] if step else torch.zeros(1, device=dev)
            candidates = score[:, None] + logp  # [beams, k]: -inf where filtered out
            log_pi = candidates - (score + log_mass).logsumexp(0)
            rows, cols = self._select(candidates, log_pi, ids, tree.top_k)
            if rows.numel() == 0:  # every candidate ends the text: the chain stops here
                break
            chain = torch.cat([chain[rows], ids[rows, cols, None]], 1)
            scores = torch.cat([scores[rows], candidates[rows, cols, None]], 1)
            log_q = torch.cat([log_q[rows], log_pi[rows, cols, None]], 1)
            if step + 1 == tree.depth:
                break
            own = torch.cat([seen[rows], torch.eye(len(rows), dtype=torch.bool, device=dev)], 1)
            fused = self.transformer.fuse(self.embed(chain[:, -1]), out[rows])
            out = self.expand(fused, stable + step, stable, own)
            seen = own
        pool = BeamDraft(log_q=log_q[0].tolist(), tau_acc=tree.tau_acc)
        parent = torch.full((1,), -1, device=dev)
        for t in range(chain.shape[1]):
            parent = pool.add(chain[0, t : t + 1], parent, scores[0, t : t + 1], f"mjsd-{t + 1}", t + 1)
        return pool

    def _next_tokens(self, out: torch.Tensor, beams: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per beam: the log-probs and ids of the candidates it may extend with, best first (-inf where top-p drops
        one), and the log of the probability mass they hold."""
        cfg, vocab = self.search.sampling, self.head_weight.shape[0]
        if cfg.greedy:  # the 2B best of each beam hold the frontier's 2B best; nothing is filtered: mass 1
            logp, ids = self.top_tokens(out, min(2 * beams, vocab))
            return logp, ids, torch.zeros(len(out), device=out.device)
        logp, ids = self.top_tokens(out, min(cfg.top_k or vocab, vocab), cfg.temperature)
        if cfg.top_p < 1:
            logp = logp.masked_fill(~nucleus(logp.softmax(-1), cfg.top_p), float("-inf"))
        return logp, ids, logp.logsumexp(-1)

    def _select(self, candidates: torch.Tensor, log_pi: torch.Tensor, ids: torch.Tensor,
                beams: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(beam row, candidate column) of the new beams, best score first: of 2B candidates drawn from π without
        replacement (greedy: the 2B best), the B best that are not an end token."""
        flat, k = candidates.flatten(), candidates.shape[1]
        n = min(2 * beams, int(torch.isfinite(flat).sum()))
        if self.search.sampling.greedy:
            drawn = flat.topk(n).indices
        else:
            pi = log_pi.flatten().exp().cpu()
            drawn = torch.multinomial(pi, n, replacement=False, generator=self.search.generator).to(flat.device)
            drawn = drawn[flat[drawn].argsort(descending=True, stable=True)]
        eos = self.search.eos_ids
        kept = [i for i, token in zip(drawn.tolist(), ids.flatten()[drawn].tolist()) if token not in eos][:beams]
        kept_t = torch.tensor(kept, dtype=torch.long, device=flat.device)
        return kept_t // k, kept_t % k

"""Draft trees: a drafter's scored candidate pool -> the tree the target verifies in one forward.

Knows nothing about models. A drafter fills a `DraftPool` (token, parent, cumulative log-prob, source per node);
`build_tree` keeps the best `total_tokens - 1` nodes under the root and derives the tree attention mask, the
position ids (depths) and the root-to-leaf paths. `DraftTree.with_fta` applies Full Tree Attention.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Any, Callable, Mapping

import torch

from .static_tree import CHOICES, choices_for, layout

FIRST_LEVEL_METHODS = ("eagle2", "gumiho")  # the dynamic drafters, whose first level holds the root's top_k
RECYCLE_WIDTH = 16  # Token Recycling: next tokens its table keeps per token, so the widest top_k of its trees


@dataclass
class DraftPool:
    """Every node a drafter scored, in the order it scored them. Parents index this pool; -1 is the root.

    A parent always comes before its children, and a child's score (cumulative log-prob) is never above its
    parent's, so the best-scored subset is closed under "parent of" (ties go to the earlier node, the ancestor).
    A static tree (static_tree.py) also gives each node a `priority` (higher first, a parent above its children):
    the tree then keeps the best nodes by priority, and the scores are only shown.
    """

    tokens: list[torch.Tensor] = field(default_factory=list)
    parents: list[torch.Tensor] = field(default_factory=list)
    scores: list[torch.Tensor] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    priorities: list[torch.Tensor] = field(default_factory=list)
    size: int = 0

    def add(self, tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor, source: str,
            depth: int | list[int], priority: torch.Tensor | None = None) -> torch.Tensor:
        """Append one layer of nodes (1-D tensors of equal length), or nodes of several depths (`depth` one per
        node, parents first); returns their pool indices. Give `priority` for every layer of a pool or for none."""
        n = tokens.numel()
        if priority is not None:
            self.priorities.append(priority.reshape(-1).float())
        self.tokens.append(tokens.reshape(-1).long())
        self.parents.append(parents.reshape(-1).long())
        self.scores.append(scores.reshape(-1).float())
        self.sources.extend([source] * n)
        self.depths.extend([depth] * n if isinstance(depth, int) else depth)
        first = self.size
        self.size += n
        return torch.arange(first, first + n, device=tokens.device)

    def best(self, n: int) -> DraftPool:
        """The `n` best-scored nodes as a pool of their own, in pool order (what `build_tree` would keep of a
        dynamic pool: closed under parent-of, ties to the earlier node)."""
        if n >= self.size:
            return self
        scores = torch.cat(self.scores)
        kept = torch.sort(scores, descending=True, stable=True).indices[: max(n, 0)].sort().values
        place = torch.full((self.size,), -1, dtype=torch.long, device=scores.device)
        place[kept] = torch.arange(kept.numel(), device=scores.device)
        parents = torch.cat(self.parents)[kept]
        out = DraftPool()
        if kept.numel():
            out.add(torch.cat(self.tokens)[kept], torch.where(parents >= 0, place[parents.clamp(min=0)], -1),
                    scores[kept], "", [self.depths[i] for i in kept.tolist()])
            out.sources = [self.sources[i] for i in kept.tolist()]
        return out


@dataclass
class DraftTree:
    """A verification tree. Node 0 is the root (the token already decided); a parent comes before its children
    (dynamic trees are ordered depth-major, static trees in their official order).

    mask[i, j] is True when node i may attend to node j (its ancestors and itself; FTA adds borrowed nodes).
    paths holds one row per leaf, root first, padded with -1; filled marks the positions FTA borrowed.
    """

    tokens: torch.Tensor  # [N] long
    parents: list[int]  # -1 for the root
    depths: list[int]
    scores: list[float]  # cumulative draft log-prob; 0 for the root
    sources: list[str]
    mask: torch.Tensor  # [N, N] bool
    paths: torch.Tensor  # [L, D+1] long
    filled: torch.Tensor  # [L, D+1] bool
    picked: list[int] = field(default_factory=list)  # each node's index in the pool it was kept from; -1: the root
    positions: torch.Tensor | None = None  # the depths as a tensor, where build_tree made the tree

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def position_ids(self) -> torch.Tensor:
        return self.positions if self.positions is not None else torch.tensor(self.depths, device=self.tokens.device)

    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in self.parents]
        for node, parent in enumerate(self.parents):
            if parent >= 0:
                kids[parent].append(node)
        return kids

    def with_fta(self) -> DraftTree:
        """Full Tree Attention: pad each short path with the most-travelled node of every missing depth.

        No node is added, so verification costs the same. A short path's leaf may now attend to the borrowed
        nodes; the borrowed tokens are checked against logits computed in their own branch, so FTA is an
        approximation: greedy output can differ from the target's (measure it).
        """
        paths, filled, mask = self.paths.clone(), self.filled.clone(), self.mask.clone()
        leaves = paths.gather(1, ((paths >= 0).sum(1, keepdim=True) - 1)).squeeze(1)
        for col in range(1, paths.shape[1]):
            short = paths[:, col] < 0
            if not short.any():
                continue
            present = paths[~short, col]
            values, counts = torch.unique(present, return_counts=True)  # sorted: argmax picks the smallest on ties
            borrowed = values[counts.argmax()]
            paths[short, col] = borrowed
            filled[short, col] = True
            mask[leaves[short], borrowed] = True
        return replace(self, paths=paths, filled=filled, mask=mask)


def build_tree(root_token: int, pool: DraftPool, total_tokens: int, device: torch.device | None = None) -> DraftTree:
    """Keep the `total_tokens - 1` best-scored pool nodes under the root (EAGLE-2 / Gumiho rerank). The tree's
    tensors live on `device` (default: the pool's; an empty pool, as in AR decoding, needs it given).

    The pool comes to Python lists once: a tree has at most a few dozen nodes, and per-node tensor operations
    would cost more than the work (a tenth of a millisecond a cycle on a CPU)."""
    device = device or (pool.tokens[0].device if pool.tokens else torch.device("cpu"))
    keep_n = min(total_tokens - 1, pool.size)
    tokens, parents, sources, node_scores, picked = [root_token], [-1], ["root"], [0.0], [-1]
    if keep_n > 0:
        if pool.priorities and len(pool.priorities) != len(pool.scores):
            raise ValueError("a draft pool gives a priority for some of its layers only")
        scores = torch.cat(pool.scores).tolist()
        rank_by = torch.cat(pool.priorities).tolist() if pool.priorities else scores
        # A stable sort keeps the earlier node (an ancestor) ahead on ties, so the kept set stays a tree. Kept
        # nodes stay in pool order (depth-major), or in priority order for a static tree (its official order).
        kept = sorted(range(pool.size), key=lambda i: -rank_by[i])[:keep_n]
        if not pool.priorities:
            kept.sort()
        pool_tokens, pool_parents = torch.cat(pool.tokens).tolist(), torch.cat(pool.parents).tolist()
        where = {node: position for position, node in enumerate(kept)}
        for position, node in enumerate(kept):
            parent = pool_parents[node]
            at = where.get(parent, -1) if parent >= 0 else -1
            if parent >= 0 and not 0 <= at < position:
                raise ValueError("draft pool is not closed under parent-of (a child ranked above its parent?)")
            parents.append(at + 1)  # its parent's place among the kept nodes, after the root
            tokens.append(pool_tokens[node])
            sources.append(pool.sources[node])
            node_scores.append(scores[node])
            picked.append(node)
    shape = tree_shape(tuple(parents), device)
    return DraftTree(
        tokens=torch.tensor(tokens, device=device),
        parents=parents,
        depths=list(shape.depths),
        scores=node_scores,
        sources=sources,
        mask=shape.mask,
        paths=shape.paths,
        filled=shape.filled,
        picked=picked,
        positions=shape.positions,
    )


@dataclass(frozen=True)
class TreeShape:
    """What a tree's parents alone decide, its tensors shared by every tree of that shape (never written to:
    `with_fta` copies before it changes them)."""

    depths: tuple[int, ...]
    mask: torch.Tensor
    paths: torch.Tensor
    filled: torch.Tensor
    positions: torch.Tensor


@lru_cache(maxsize=512)
def tree_shape(parents: tuple[int, ...], device: torch.device) -> TreeShape:
    """The shape of a tree with these `parents` (-1 for the root). Cached: a run's sized trees take a few shapes
    over and over, and building these tensors afresh cost about 0.05 ms a cycle on a CPU."""
    n = len(parents)
    depths, ancestors = [0] * n, [[0]]
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
        ancestors.append(ancestors[parents[i]] + [i])
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[[i for i, seen in enumerate(ancestors) for _ in seen], [j for seen in ancestors for j in seen]] = True
    is_parent = [False] * n
    for p in parents[1:]:
        is_parent[p] = True
    leaves = [i for i in range(n) if not is_parent[i]]
    width = max(depths) + 1
    paths = torch.tensor([ancestors[leaf] + [-1] * (width - len(ancestors[leaf])) for leaf in leaves], dtype=torch.long)
    return TreeShape(tuple(depths), mask.to(device), paths.to(device),
                     torch.zeros_like(paths, dtype=torch.bool).to(device), torch.tensor(depths, device=device))


@dataclass
class MergedPool:
    """Several drafters' pools as one: `pool` (sibling tokens distinct; scores the log of each node's calibrated
    chance to be accepted) and, per node, `kinds` (bit k set when input k drafted it) and `own` (its score in the
    first input that drafted it)."""

    pool: DraftPool
    kinds: list[int]
    own: list[float]


def merge_pools(pools: list[DraftPool], chance: Callable[[int, float, int], float]) -> MergedPool:
    """One pool from several (SAM-Decoding's merge of a learned draft and prompt lookup's matches;
    docs/design.md §17.5). Nodes of different inputs with the same token under the same parent are one node. The
    inputs' scores mean different things, so each node's score becomes its calibrated chance to be accepted,
    `chance(kinds, own, depth)` (as in `MergedPool`; the root's children at depth 1), never above its
    parent's: the pool stays closed under parent-of when `build_tree` keeps its best nodes. Depth-major, so parents
    come first."""
    tokens: list[int] = []
    parents: list[int] = []
    sources: list[str] = []
    kinds: list[int] = []
    own: list[float] = []
    where: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    for k, pool in enumerate(pools):
        if not pool.size:
            continue
        if pool.priorities:
            raise ValueError("a static tree's pool cannot be merged: its nodes are ranked by priority")
        merged: list[int] = []  # this pool's node -> merged node
        for token, parent, score, source in zip(torch.cat(pool.tokens).tolist(), torch.cat(pool.parents).tolist(),
                                                torch.cat(pool.scores).tolist(), pool.sources):
            key = (merged[parent] if parent >= 0 else -1, token)
            node = where.get(key)
            if node is None:
                node = where[key] = len(tokens)
                tokens.append(token)
                parents.append(key[0])
                sources.append(source)
                kinds.append(0)
                own.append(score)
            kinds[node] |= 1 << k
            merged.append(node)
    depths, chances = [0] * len(tokens), [0.0] * len(tokens)
    for node, parent in enumerate(parents):  # a parent is always made before its children
        if parent >= 0:
            depths[node] = depths[parent] + 1
        chances[node] = chance(kinds[node], own[node], depths[node] + 1)
        if parent >= 0:
            chances[node] = min(chances[node], chances[parent])
    order = sorted(range(len(tokens)), key=depths.__getitem__)  # stable: depth-major, parents first
    place = {node: i for i, node in enumerate(order)}
    out = DraftPool()
    if order:
        device = next(pool.tokens[0].device for pool in pools if pool.size)
        out.add(torch.tensor([tokens[i] for i in order], device=device),
                torch.tensor([place[parents[i]] if parents[i] >= 0 else -1 for i in order], device=device),
                torch.tensor([math.log(max(chances[i], 1e-9)) for i in order], device=device), "",
                [depths[i] + 1 for i in order])
        out.sources = [sources[i] for i in order]
    return MergedPool(out, [kinds[i] for i in order], [own[i] for i in order])


@dataclass(frozen=True)
class TreeSettings:
    """Draft-tree shape. `depth` follows the reference code: EAGLE-2 expands `depth` times (tree depth depth+1);
    Gumiho drafts `depth + 1` tokens, 2 serially and `depth - 1` with MLP heads (depth 6 = 2 serial + 5 MLP).
    A static tree (EAGLE-1, Medusa, Hydra; static_tree.py) keeps the first total_tokens - 1 official paths no
    deeper than `depth`; its top_k is the widest rank of the full list, for the record.

    mlp_parent_align / serial_tree_mask fix two quirks of the official Gumiho code (docs/design.md §10); False reproduces it.

    MJSD (docs/design.md §16) drafts one chain of γ = `depth` tokens with B = `top_k` beams and verifies all of it
    (total_tokens = depth + 1); `tau_acc`, its acceptance threshold, is set for MJSD only.

    The draft-free methods (docs/design.md §17) draft trees of at most `depth` tokens per path. Prompt lookup
    (`lookup`) merges the continuations of up to `top_k` earlier matches of the sequence's last `max_ngram` down to
    `min_ngram` tokens (set for lookup only); Token Recycling (`recycle`) gives each node the `top_k` tokens its
    table lists after the node's token (at most RECYCLE_WIDTH).

    `lookup_merge` N > 0 (a learned drafter's option, SAM-Decoding's switch; docs/design.md §17.4): when the text's
    last N or more tokens occurred earlier, the cycle verifies prompt lookup's tree instead of drafting (the
    drafter catches up on the next cycle it drafts); 0 is off.

    `first_level` (the dynamic drafters, EAGLE-2 and Gumiho): the drafter stops after the root's `top_k`
    candidates, so a tree of n tokens holds the best n - 1 of them side by side, for the price of a 2-token
    tree's draft (docs/design.md §11).
    """

    top_k: int
    depth: int
    total_tokens: int
    mlptopk: int = 0
    pruning: int = 0
    fta: bool = False
    mlp_parent_align: bool = True
    serial_tree_mask: bool = True
    tau_acc: float | None = None
    max_ngram: int | None = None
    min_ngram: int | None = None
    lookup_merge: int = 0
    lookup_branches: int = 0
    sized: bool = False  # per-cycle sizing (sizing.py): total_tokens is then the most a cycle verifies
    first_level: bool = False

    @classmethod
    def default(cls, method: str, device_type: str = "cpu") -> TreeSettings:
        """The method's tree on this device; a learned drafter's (and on a CPU Token Recycling's) switches to prompt
        lookup on a match of LOOKUP_MERGE tokens, and a dynamic one (EAGLE-2, Gumiho) takes the continuations of
        shorter matches as branches (LOOKUP_BRANCHES)."""
        tree = cls._default(method, device_type)
        if method == "recycle" and device_type != "cuda":  # measured to pay on a CPU (LOOKUP_MERGE)
            return replace(tree, lookup_merge=LOOKUP_MERGE)
        learned = method not in ("mjsd", *DRAFT_FREE) and tree.total_tokens > 1
        if not learned:
            return tree
        branches = LOOKUP_BRANCHES if method not in CHOICES else 0
        return replace(tree, lookup_merge=LOOKUP_MERGE, lookup_branches=branches)

    @classmethod
    def _default(cls, method: str, device_type: str) -> TreeSettings:
        if method == "mjsd":  # the paper's runs, on every device
            return cls(top_k=8, depth=4, total_tokens=5, tau_acc=0.9)
        if method in DRAFT_FREE:
            return DRAFT_FREE[method](cls, device_type)
        if method in CHOICES:  # the official static tree: all of it on a GPU, its first 11 nodes on a CPU
            paths = choices_for(method)
            depth = max(len(p) for p in paths)
            size = len(paths) + 1 if device_type == "cuda" else 12
            return cls(top_k=layout(method, depth, len(paths)).top_k, depth=depth, total_tokens=size)
        if device_type == "cuda":  # the papers' defaults: verifying ~60 tokens is almost free on a GPU
            return {
                "eagle2": cls(top_k=10, depth=5, total_tokens=60),
                "gumiho": cls(top_k=14, depth=6, total_tokens=64, mlptopk=35, pruning=35, fta=True),
            }.get(method, cls(top_k=1, depth=1, total_tokens=1))
        # CPU: every verified token costs time, so the tree is small; `--total-tokens auto` measures the best size
        # (and top-k) on the machine at hand.
        return {
            "eagle2": cls(top_k=4, depth=5, total_tokens=12),
            "gumiho": cls(top_k=4, depth=6, total_tokens=12, mlptopk=6, pruning=6, fta=False),
        }.get(method, cls(top_k=1, depth=1, total_tokens=1))

    @classmethod
    def resolve(cls, method: str, device_type: str = "cpu", overrides: Mapping[str, Any] | None = None,
                base: TreeSettings | None = None) -> TreeSettings | None:
        """`base` (default: the method's default tree on this device; an engine passes its automatic choice,
        `Engine.default_tree`) with the `overrides` (field -> value; None keeps the base's) applied and validated;
        None for AR, which drafts no tree. Raises GumihoError for a tree the method cannot draft."""
        if method == "ar":
            return None
        chosen = {name: value for name, value in (overrides or {}).items() if value is not None}
        if "total_tokens" in chosen:  # a fixed size: no per-cycle sizing, and the method's shape below the root
            chosen.setdefault("sized", False)
            chosen.setdefault("first_level", False)
        tree = replace(base or cls.default(method, device_type), **chosen)
        if base is not None and "top_k" not in chosen and tree.pool_size(method) < tree.total_tokens - 1:
            # The automatic tree is narrower than the size asked for (where drafting is dear it keeps one token a
            # step, top_k 1): the method's default shape then, with the automatic FTA and lookup switch.
            shape = replace(cls.default(method, device_type), fta=base.fta, lookup_merge=base.lookup_merge)
            tree = replace(shape, **chosen)
        if not tree.sized and base is not None and "lookup_branches" not in chosen:
            # A size fixed over the automatic (sized) tree: the method's branches, which pay in a fixed tree.
            tree = replace(tree, lookup_branches=cls.default(method, device_type).lookup_branches)
        tree.validate(method)
        return tree

    @property
    def drafted_depth(self) -> int:
        """The expansion steps a dynamic drafter (EAGLE-2, Gumiho) needs for this tree: its pool reaches depth
        `depth` + 1, but a tree of n tokens keeps the best n - 1 nodes, and a node never ranks above its parent, so
        nothing deeper than n - 1 can be kept. Drafting stops there (what the draft of a small tree costs: a chain
        of two tokens needs no MLP head). FTA pads short paths with deeper tokens, so it keeps every step. A
        first-level tree stops after the root's candidates."""
        if self.first_level:
            return 0
        return self.depth if self.fta else max(0, min(self.depth, self.total_tokens - 2))

    def pool_size(self, method: str) -> int:
        """Candidates the drafter adds to the pool: the most a tree of this shape can verify besides the root."""
        if method in CHOICES:
            return len(choices_for(method, self.depth))
        if method == "mjsd":  # the top beam's chain
            return self.depth
        if method == "lookup":  # a trie of up to top_k continuations of up to `depth` tokens each
            return self.top_k * self.depth
        if self.first_level:  # the root's top_k
            return self.top_k
        if method == "recycle":  # the table's top_k under the root, then top_k children of each of the top_k best
            return self.top_k + (self.depth - 1) * self.top_k**2
        if method != "gumiho":
            return self.top_k + self.depth * self.top_k**2
        size, branches = 2 * self.top_k, self.top_k  # serial-1, serial-2; then a beam per MLP head
        for _ in range(self.depth - 1):
            branches = min(self.pruning, branches * self.mlptopk)
            size += branches
        return size

    def validate(self, method: str) -> None:
        from .errors import GumihoError

        if self.top_k < 1 or self.depth < 1 or self.total_tokens < 1:
            raise GumihoError("top-k, depth and total-tokens must be >= 1")
        if method == "gumiho" and (self.depth < 2 or self.mlptopk < 1 or self.pruning < 1):
            raise GumihoError("gumiho needs depth >= 2, mlptopk >= 1 and pruning >= 1")
        if self.fta and method != "gumiho":
            raise GumihoError("FTA (full tree attention) is a Gumiho option; switch it off for " + method)
        if self.first_level and (method not in FIRST_LEVEL_METHODS or self.fta):
            what = "an FTA tree" if method in FIRST_LEVEL_METHODS else method
            raise GumihoError("a first-level tree is an option of the dynamic-tree drafters (eagle2, gumiho) without "
                              f"FTA, not of {what}")
        if method == "mjsd":
            if self.tau_acc is None or not 0 <= self.tau_acc <= 1:
                raise GumihoError(f"tau-acc must be in [0, 1], got {self.tau_acc}")
            if self.total_tokens != self.depth + 1:
                raise GumihoError(f"mjsd verifies its whole draft: total-tokens must be gamma + 1 = {self.depth + 1}")
        elif self.tau_acc is not None:
            raise GumihoError("tau-acc is an MJSD option; leave it unset for " + method)
        if method == "recycle" and self.top_k > RECYCLE_WIDTH:
            raise GumihoError(f"recycle's table keeps {RECYCLE_WIDTH} next tokens per token: top-k must be at most "
                              f"{RECYCLE_WIDTH}, got {self.top_k}")
        if method == "lookup":
            if self.max_ngram is None or self.min_ngram is None or not 1 <= self.min_ngram <= self.max_ngram:
                raise GumihoError(f"lookup needs 1 <= min-ngram <= max-ngram, got min-ngram {self.min_ngram} and "
                                  f"max-ngram {self.max_ngram}")
        elif self.max_ngram is not None or self.min_ngram is not None:
            raise GumihoError("max-ngram and min-ngram are lookup options; leave them unset for " + method)
        if self.lookup_merge < 0:
            raise GumihoError(f"lookup-merge must be >= 0 (0: off), got {self.lookup_merge}")
        if self.lookup_merge and method in ("mjsd", "lookup"):
            raise GumihoError(f"lookup-merge is an option of the learned drafters and recycle, not of {method}")
        if self.lookup_branches < 0:
            raise GumihoError(f"lookup-branches must be >= 0 (0: off), got {self.lookup_branches}")
        if self.lookup_branches and (method in ("mjsd", *DRAFT_FREE) or method in CHOICES):
            raise GumihoError(f"lookup-branches is an option of the dynamic-tree drafters (eagle2, gumiho), not of "
                              f"{method}")
        if self.pool_size(method) < self.total_tokens - 1:
            raise GumihoError(
                f"total-tokens {self.total_tokens} exceeds the {self.pool_size(method)} candidates this tree drafts"
            )

    def to_dict(self) -> dict:
        """The fields, without the n-gram sizes where they are unset (every method but lookup), so the trees of
        the other methods read as they did before lookup existed (traces, bench journals)."""
        data = asdict(self)
        for name in ("max_ngram", "min_ngram"):
            if data[name] is None:
                del data[name]
        for name in ("lookup_merge", "lookup_branches", "sized", "first_level"):
            if not data[name]:
                del data[name]
        return data

    def lookup_tree(self, device_type: str = "cpu") -> TreeSettings:
        """The prompt-lookup tree a cycle switches to under `lookup_merge`: lookup's default, matching at least
        `lookup_merge` tokens. A fixed tree's size is the most it verifies; a sized one's (or the root alone) is
        only what suits the drafter, whose first token is its surest, so the switch gets lookup's own budget and
        its sizer picks n from lookup's calibration (a 3-token match goes on for several tokens)."""
        base = TreeSettings.default("lookup", device_type)
        own = self.sized or self.total_tokens <= 1
        total = base.total_tokens if own else min(base.total_tokens, self.total_tokens)
        return replace(base, min_ngram=self.lookup_merge, max_ngram=max(base.max_ngram, self.lookup_merge),
                       total_tokens=total)


    def branch_tree(self, device_type: str = "cpu") -> TreeSettings:
        """The prompt-lookup settings whose matches become branches under `lookup_branches`: lookup's default,
        matching at least `lookup_branches` tokens. Its size is the most a merged tree verifies (as the switch's,
        lookup's own budget: the sizer decides from both sources' chances)."""
        base = TreeSettings.default("lookup", device_type)
        return replace(base, min_ngram=self.lookup_branches, max_ngram=max(base.max_ngram, self.lookup_branches),
                       total_tokens=max(base.total_tokens, self.total_tokens))


def _lookup_default(cls: type[TreeSettings], device_type: str) -> TreeSettings:
    """Prompt lookup: the n-gram sizes of the reference implementation (3 down to 1) on every device. The tree
    follows up to 4 matches (8 on a GPU) for up to 6 tokens (8 on a GPU): a match usually continues for a while.
    On a CPU every verified token costs time, so only 8 are verified."""
    if device_type == "cuda":
        return cls(top_k=8, depth=8, total_tokens=32, max_ngram=3, min_ngram=1)
    return cls(top_k=4, depth=6, total_tokens=8, max_ngram=3, min_ngram=1)


def _recycle_default(cls: type[TreeSettings], device_type: str) -> TreeSettings:
    """Token Recycling: 8 children per node and 6 levels on a GPU, where verifying 64 tokens costs about one; on a
    CPU, 4 children, 5 levels and 8 verified tokens."""
    if device_type == "cuda":
        return cls(top_k=8, depth=6, total_tokens=64)
    return cls(top_k=4, depth=5, total_tokens=8)


DRAFT_FREE = {"lookup": _lookup_default, "recycle": _recycle_default}  # method -> its default tree per device
# A learned drafter's tree gives way to prompt lookup's when the text's last 3 tokens occurred earlier: such a match
# is usually copied on (summaries, code edits, quotes), and a lookup draft costs nothing. Token Recycling takes the
# same switch on a CPU, where its table's candidates are accepted less often than such a match's continuation:
# interleaved, 3 prompts a set, 2 rounds, on the 2-core Zen 5 EPYC, 1.016x -> 1.083x over AR (τ 1.30 -> 1.51), its
# lowest set 0.929x -> 0.967x (docs/benchmarks.md). Not measured on a GPU, where its 64-token trees are nearly free:
# off there.
LOOKUP_MERGE = 3
# Shorter matches join a dynamic drafter's tree as branches (design.md §17.5): a one-token match's continuation is
# often right where the drafter's first token is not. Off in the CPU's sized trees (choice.best_tree).
LOOKUP_BRANCHES = 1

"""The decoding loop, the same for every method.

prefill -> first token (the root). Then, per cycle:
  draft   the drafter turns the newly accepted (feature, token) pairs into a tree under the root
          (AR has no drafter: its tree is the root alone);
  verify  one target forward over the whole tree (tree attention mask, position ids = depth), then acceptance;
  update  keep the accepted path's KV, emit accepted tokens + the bonus token, hand the drafter the accepted
          nodes' target features.
After every target forward (the prefill and each verification) the drafter may look at what the target computed
(`Drafter.observe`; Token Recycling fills its table from it). Each cycle yields a `CycleTrace`; `Run.trace` holds
the `GenerationTrace`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import torch

from .choice import Choice
from .drafters import Drafter, weight_free
from .errors import GumihoError
from .kv import keep_accepted
from .node_probs import NodeChecks
from .sampling import SamplingConfig, pick
from .short_match import ShortMatchSwitch
from .sizing import Calibration, Sizer
from .target import Target
from .trace import METHODS, CycleTrace, GenerationTrace, JointCheck, RunSettings, TraceNode, TracePath
from .tree import DraftPool, DraftTree, TreeSettings, build_tree, merge_pools
from .verify import Acceptance, LazyLogits, verify

Learn = Callable[[list[bool]], None]  # a verification's outcome (each draft node accepted or not) -> the sizers
FTA_NOTE = "FTA: borrowed tokens are checked against logits computed in their own branch"


@dataclass
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int = 0
    chat: bool = True
    trace: bool = True  # record tree nodes and paths (timings and acceptance are always kept)
    tree: TreeSettings | None = None  # None: the method's default for the device

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise GumihoError(f"max-new-tokens must be >= 1, got {self.max_new_tokens}")


def sync_device(device: torch.device) -> None:
    """Wait for queued GPU work so that wall-clock timings cover it (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Engine:
    """A target and the drafters that can speculate for it."""

    def __init__(self, target: Target, drafters: dict[str, Drafter] | None = None):
        self.target = target
        self.drafters: dict[str, Drafter] = {}
        self.drafter_names: dict[str, str] = {}
        self._texts: dict[int, str] = {}
        self.choice: Choice | None = None  # the automatic settings (choice.py), when they were made
        for method, drafter in (drafters or {}).items():
            self.add_drafter(method, drafter)

    def add_drafter(self, method: str, drafter: Drafter, name: str = "") -> None:
        if drafter.kind != method:
            raise GumihoError(f"a {drafter.kind} drafter cannot serve method {method}")
        self.drafters[method] = self.target.prepare_drafter(drafter)
        self.drafter_names[method] = name

    def token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.target.tokenizer.decode([token_id])
        return text

    def default_tree(self, method: str) -> TreeSettings:
        """The automatic choice's tree for `method` when one was made, else the method's default for the device."""
        chosen = self.choice.methods.get(method) if self.choice else None
        if chosen is not None and chosen.tree is not None:
            return chosen.tree
        return TreeSettings.default(method, self.target.device.type)

    def tree_settings(self, method: str, config: GenerationConfig) -> TreeSettings | None:
        if method == "ar":
            return None
        tree = config.tree or self.default_tree(method)
        tree.validate(method)
        self.drafters[method].check_tree(tree)
        return tree

    def run(self, prompt: str, method: str = "gumiho", config: GenerationConfig | None = None,
            prompt_ids: list[int] | None = None) -> Run:
        config = config or GenerationConfig()
        if method not in METHODS:
            raise GumihoError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        if method != "ar" and method not in self.drafters:
            raise GumihoError(f"no {method} drafter is loaded")
        if prompt_ids is None:
            if not prompt or not prompt.strip():
                raise GumihoError("the prompt is empty")
            prompt_ids = self.target.encode_prompt(prompt, chat=config.chat)
        if not prompt_ids:
            raise GumihoError("the prompt is empty")
        if len(prompt_ids) >= self.target.max_context:
            raise GumihoError(
                f"the prompt is {len(prompt_ids)} tokens; the model's context is {self.target.max_context}"
            )
        return Run(self, prompt, method, config, prompt_ids, self.tree_settings(method, config))

    def generate(self, prompt: str, method: str = "gumiho", config: GenerationConfig | None = None,
                 prompt_ids: list[int] | None = None) -> GenerationTrace:
        run = self.run(prompt, method, config, prompt_ids)
        for _ in run:
            pass
        return run.trace


class Run:
    """One generation, consumed by iterating (one CycleTrace per cycle). `stop()` cancels it between cycles."""

    def __init__(self, engine: Engine, prompt: str, method: str, config: GenerationConfig,
                 prompt_ids: list[int], tree: TreeSettings | None):
        self.engine, self.method, self.config, self.prompt_ids, self.tree = engine, method, config, prompt_ids, tree
        method_drafter = engine.drafters.get(method)
        # A tree of one node is a plain AR step: where drafting does not pay, the drafter is not called at all.
        self.drafter = method_drafter if tree is not None and tree.total_tokens > 1 else None
        device_type = engine.target.device.type
        # Per-cycle sizing (sizing.py) where the tree is the automatic one and the machine profile is at hand.
        cost = engine.choice.cost if engine.choice else None
        sized = bool(tree and tree.sized and cost)
        self.sizer = Sizer(cost.cycle_ms, cost.head_together) if sized else None
        # Prompt lookup inside a learned drafter's tree (docs/design.md §17.4-17.5). SAM-Decoding's switch
        # (tree.lookup_merge): a cycle whose text repeats earlier text verifies prompt lookup's tree instead; the
        # drafter's pairs wait for the next cycle it drafts. Branches (tree.lookup_branches): the continuations of
        # the other matches join the drafter's own candidates in the cycles it drafts.
        self.lookup_tree = tree.lookup_tree(device_type) if tree and tree.lookup_merge else None
        self.branch_tree = (tree.branch_tree(device_type) if tree and tree.lookup_branches
                            and self.drafter is not None else None)
        self.lookup = (weight_free("lookup", engine.target.model.config)
                       if self.lookup_tree or self.branch_tree else None)
        self.lookup_sizer = Sizer(cost.cycle_ms, cost.head_together) if sized and self.lookup else None
        # Matches one token shorter than the switch's: lookup's tree where it promises more tokens a millisecond
        # than the drafter's path has given (short_match.py). Sized trees only, and not where nothing is drafted.
        near = (replace(self.lookup_tree, min_ngram=self.lookup_tree.min_ngram - 1)
                if self.lookup_tree and self.lookup_tree.min_ngram > 1 and self.lookup_sizer
                and self.drafter is not None and self.branch_tree is None else None)
        self.short_match = (ShortMatchSwitch(near, Sizer(cost.cycle_ms, cost.head_together), cost,
                                             cost.draft_at(method, tree.top_k, tree.total_tokens), tree.total_tokens)
                            if near and method in cost.draft_ms else None)
        self.sizers = [s for s in (self.sizer, self.lookup_sizer, self.short_match and self.short_match.sizer) if s]
        self._drafter_path: bool | None = None  # this cycle: None switched to lookup, else whether it drafted
        self.calibrations: dict[int, Calibration] = {}  # a merged tree's, by the sources of a node (bit mask)
        self._waiting: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._stop = False
        target = engine.target
        # A drafter may run with its own sampling filters (MJSD); the trace records the sampling actually used.
        self.sampling = method_drafter.run_sampling(config.sampling) if method_drafter else config.sampling
        fta_applied = bool(tree and tree.fta and config.sampling.greedy)
        approximate = method_drafter.approximation(tree, self.sampling) if method_drafter else ""
        self.trace = GenerationTrace(
            method=method,
            model=target.name,
            drafter=engine.drafter_names.get(method, ""),
            prompt=prompt,
            prompt_tokens=len(prompt_ids),
            settings=RunSettings(
                sampling=self.sampling.to_dict(),
                tree=tree.to_dict() if tree else None,
                fta_applied=fta_applied,
                max_new_tokens=config.max_new_tokens,
                chat=config.chat,
                seed=config.seed,
                device=target.device.type,
                threads=torch.get_num_threads(),
                dtype=target.precision,
                forward=target.forward,
                choice=engine.choice.summary(method) + "; " + engine.choice.reason if engine.choice else "",
                approximate=approximate or (FTA_NOTE if fta_applied else ""),
                attention=target.attention,
            ),
        )

    def stop(self) -> None:
        self._stop = True

    def _cut(self, emitted: list[int], produced: int) -> tuple[list[int], str]:
        """Truncate at an end token or at max_new_tokens; returns the kept tokens and a finish reason or ''."""
        for i, token in enumerate(emitted):
            if token in self.engine.target.eos_ids:
                return emitted[: i + 1], "eos"
            if produced + i + 1 >= self.config.max_new_tokens:
                return emitted[: i + 1], "length"
        return emitted, ""

    def _draft(self, root: int, features: torch.Tensor, tokens: torch.Tensor,
               kv: int) -> tuple[DraftTree, DraftPool, Learn | None, float | None]:
        """This cycle's tree, the pool it came from, how the run learns from its verification (the sizers'
        calibration) and the accepted length it expects."""
        device = self.engine.target.device
        room = self.engine.target.max_context - kv
        self._drafter_path = None
        if self.lookup is not None:
            self.lookup.extend(tokens)
            pool = self.lookup.candidates(self.lookup_tree, device) if self.lookup_tree else DraftPool()
            chosen = None
            short = self.short_match
            if not pool.size and short is not None:
                near = self.lookup.candidates(short.tree, device)
                if near.size:
                    most = min(self.lookup_tree.total_tokens, room)
                    n, expected = short.sizer.choose(near, most, kv)
                    if short.prefers_lookup(n, expected, kv):
                        pool, chosen = near, (n, expected)
                    else:
                        short.sizer.watch(near, 1, most, kv)
            if pool.size:
                if self.drafter is not None:
                    self._waiting.append((features, tokens))
                return self._sized(root, pool, min(self.lookup_tree.total_tokens, room), kv,
                                   short.sizer if chosen else self.lookup_sizer, chosen)
        if self.drafter is None:
            return build_tree(root, DraftPool(), 1, device), DraftPool(), None, None
        most = min(self.tree.total_tokens, room)
        self._drafter_path = False
        if self.sizer and not self.branch_tree and (first := self.drafter.first_score(root)) is not None \
                and not self.sizer.could_pay(first, most, kv):  # no tree could pay: a plain step, undrafted
            return build_tree(root, DraftPool(), 1, device), DraftPool(), None, 0.0
        self._drafter_path = True
        if self._waiting:
            features = torch.cat([f for f, _ in self._waiting] + [features])
            tokens = torch.cat([t for _, t in self._waiting] + [tokens])
            self._waiting.clear()
        pool = self.drafter.propose(features, tokens, self.tree)
        branches = self.lookup.candidates(self.branch_tree, device) if self.branch_tree else DraftPool()
        if branches.size:
            if self.sizer:  # as the switch, lookup's own budget: the sizer weighs both sources' candidates
                most = min(max(self.tree.total_tokens, self.branch_tree.total_tokens), room)
            tree, pool, learn, expected = self._merged(root, pool, branches, most, kv)
        else:
            tree, pool, learn, expected = self._sized(root, pool, most, kv, self.sizer)
        return (tree.with_fta() if self.trace.settings.fta_applied else tree), pool, learn, expected

    def _sized(self, root: int, pool: DraftPool, most: int, kv: int, sizer: Sizer | None,
               chosen: tuple[int, float] | None = None) -> tuple[DraftTree, DraftPool, Learn | None, float | None]:
        """The tree of the n best nodes of `pool`, n from `sizer` (or `chosen` already), else `most`."""
        n, expected = chosen or (sizer.choose(pool, most, kv) if sizer else (most, None))
        if sizer:
            sizer.watch(pool, n, most, kv)
        tree = build_tree(root, pool, n, self.engine.target.device)
        learn = (lambda hits: sizer.learn(tree.scores[1:], hits, tree.depths[1:])) if sizer else None
        return tree, pool, learn, expected

    def _merged(self, root: int, pool: DraftPool, branches: DraftPool, most: int,
                kv: int) -> tuple[DraftTree, DraftPool, Learn, float | None]:
        """The drafter's candidates and prompt lookup's branches as one tree, ranked by calibrated chances (the
        best `most` - 1, or as many as the sizer finds worth verifying). A node both sources drafted is right more
        often than one only one did while the other proposed something else, so each kind of node (by the sources
        that drafted it) has its own calibration, read at the drafter's score where it drafted the node."""
        fits = self.calibrations

        def chance(kinds: int, score: float, depth: int) -> float:
            fit = fits.get(kinds) or fits.setdefault(kinds, Calibration())
            return fit.probability(score, depth)

        # Of the drafter's pool only what it could keep alone: a GPU tree's pool has hundreds of nodes.
        merged = merge_pools([pool.best(most - 1), branches], chance)
        n, expected = self.sizer.choose(merged.pool, most, kv, calibrated=True) if self.sizer else (most, None)
        tree = build_tree(root, merged.pool, n, self.engine.target.device)
        # The trace shows each node's own score (the drafter's log-prob where it drafted the node, else lookup's
        # pseudo log-prob), not the chance it was ranked by: q stays the drafter's probability.
        tree = replace(tree, scores=[0.0] + [merged.own[node] for node in tree.picked[1:]])

        def learn(hits: list[bool]) -> None:
            for node, hit, depth in zip(tree.picked[1:], hits, tree.depths[1:]):
                fits[merged.kinds[node]].learn([merged.own[node]], [hit], [depth])

        return tree, merged.pool, learn, expected

    def _accept(self, tree: DraftTree, logits: LazyLogits, pool: DraftPool,
                generator: torch.Generator) -> tuple[Acceptance, list[JointCheck]]:
        """The target's verdict on the tree (the drafter's own rule where it has one: MJSD's joint test, which also
        returns its check of each draft prefix)."""
        if self.drafter is None or self._waiting:  # AR or prompt lookup's tree: the plain rule
            return verify(tree, logits, self.sampling, generator), []
        return self.drafter.accept(tree, logits, pool, self.sampling, generator)

    @torch.inference_mode()
    def __iter__(self) -> Iterator[CycleTrace]:
        target, config, trace = self.engine.target, self.config, self.trace
        device = target.device
        generator = torch.Generator().manual_seed(config.seed)
        start = time.perf_counter()

        cache = target.new_cache()
        prompt = torch.tensor(self.prompt_ids, device=device)
        features = target.features(prompt, cache, prefill=True)
        root = pick(target.logits(features[-1]), self.sampling, generator)
        output, (_, reason) = [root], self._cut([root], 0)
        trace.first_token = root
        # The drafter's pairs: the feature at each position with the token that follows it.
        new_features, new_tokens = features, torch.cat([prompt[1:], prompt.new_tensor([root])])
        if self.drafter is not None:
            self.drafter.reset()
            self.drafter.start(self.sampling, frozenset(target.eos_ids), generator)
            self.drafter.observe(prompt, features)
        if self.lookup is not None:
            self.lookup.observe(prompt, features)
        sync_device(device)
        trace.prefill_ms = (time.perf_counter() - start) * 1e3

        while not reason:
            if self._stop:
                reason = "stopped"
                break
            prefix_len = cache.get_seq_length()
            if target.max_context - prefix_len < 1:
                reason = "context"
                break
            t0 = time.perf_counter()
            tree, pool, learn, expected = self._draft(root, new_features, new_tokens, prefix_len)
            sync_device(device)
            t1 = time.perf_counter()

            mask = None
            if tree.size > 1:
                prefix = torch.ones(tree.size, prefix_len, dtype=torch.bool, device=device)
                mask = torch.cat([prefix, tree.mask], 1)[None, None]
            features = target.features(tree.tokens, cache, tree.position_ids + prefix_len, mask)
            logits = LazyLogits(features, target.logits, target.head_batches)  # rows computed as the walk reads them
            acceptance, joint = self._accept(tree, logits, pool, generator)
            sync_device(device)
            t2 = time.perf_counter()
            if self.drafter is not None:  # drafting work, timed with the draft
                self.drafter.observe(tree.tokens, features, logits, tree.parents)
                sync_device(device)
            if learn is not None and tree.size > 1:
                on_path = set(acceptance.nodes)
                learn([i in on_path for i in range(1, tree.size)])
            t3 = time.perf_counter()

            nodes = torch.tensor(acceptance.nodes, device=device)
            keep_accepted(cache, prefix_len, nodes)
            accepted_tokens = tree.tokens[nodes[1:]].tolist()
            emitted, reason = self._cut(accepted_tokens + [acceptance.bonus], len(output))
            if self.short_match is not None and self._drafter_path is not None:
                self.short_match.record(tree.size, len(accepted_tokens), prefix_len, self._drafter_path)
            output.extend(emitted)
            for sizer in self.sizers:
                sizer.settle(output, len(self.prompt_ids))
            new_features, new_tokens = features[nodes], torch.tensor(emitted, device=device)
            root = acceptance.bonus
            trace.cycles += 1
            cycle = CycleTrace(
                index=trace.cycles - 1,
                accepted_nodes=acceptance.nodes,
                accepted_tokens=accepted_tokens,
                bonus_token=acceptance.bonus,
                emitted=emitted,
                draft_ms=(t1 - t0 + t3 - t2) * 1e3,
                verify_ms=(t2 - t1) * 1e3,
                other_ms=0.0,
                tree_size=tree.size,
                tree_depth=max(tree.depths),
                fta_used=bool(tree.filled[acceptance.path_row, : len(acceptance.nodes)].any()),
                joint=joint,
                expected_accepted=None if expected is None else round(expected, 3),
            )
            # Recording the tree below is the trace's cost, not decoding's: other_ms stops before it, so traced and
            # untraced runs time their cycles alike (the wall time still includes it).
            cycle.other_ms = (time.perf_counter() - t3) * 1e3
            if config.trace:
                self._record_tree(cycle, tree, acceptance, logits)
                trace.steps.append(cycle)
            yield cycle

        trace.token_ids = output
        trace.text = target.decode(output)
        trace.finish_reason = reason
        trace.wall_s = time.perf_counter() - start

    def _record_tree(self, cycle: CycleTrace, tree: DraftTree, acceptance: Acceptance, logits: LazyLogits) -> None:
        text = self.engine.token_text
        tokens = tree.tokens.tolist()
        why = NodeChecks.of(tree, logits, acceptance, self.sampling)
        cycle.bonus_text = text(cycle.bonus_token)
        cycle.nodes = [
            TraceNode(id=i, token_id=tokens[i], text=text(tokens[i]), parent=tree.parents[i], depth=tree.depths[i],
                      score=tree.scores[i], source=tree.sources[i], q=why.q[i], p=why.p[i], accept=why.accept[i],
                      draw=why.draw[i])
            for i in range(tree.size)
        ]
        paths, filled = tree.paths.tolist(), tree.filled.tolist()
        cycle.paths = [
            TracePath(nodes=[n for n in row if n >= 0], filled=[f for n, f in zip(row, flags) if n >= 0], accepted=a)
            for row, flags, a in zip(paths, filled, acceptance.per_path)
        ]

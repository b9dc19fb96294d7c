"""What the engine records: one `CycleTrace` per target forward and a `GenerationTrace` per prompt.

Schema (version 3), JSON-serialisable through `to_dict` / `from_dict`. Older files still load: version 1 settings
lack dtype, forward and choice, which read as float32, transformers and ""; the optional fields settings.approximate
and a cycle's joint came later within version 2 and read as "" and [] when absent; version 2 nodes lack q, p, accept
and draw, which read as null.

GenerationTrace
  schema            int, 3
  method            one of METHODS ("ar", "medusa", "hydra", "eagle1", "eagle2", "gumiho", "mjsd", "lookup",
                    "recycle")
  model, drafter    names / paths ("" for AR and the methods without weights, lookup and recycle)
  prompt            the user text; prompt_tokens: its length in tokens after the chat template
  settings          RunSettings: sampling {temperature, top_p, top_k}, tree (TreeSettings or null), fta_applied,
                    max_new_tokens, chat, seed, device, threads, dtype, forward ("lean" | "transformers"),
                    choice (the automatic choice and its reason; "" when every setting was given explicitly),
                    approximate (why the output is not exactly the target's, greedy or in distribution: FTA, or
                    MJSD's joint acceptance; "" for an exact run)
  text, token_ids   the generated text and ids (prompt excluded; an end token, when produced, is the last id)
  new_tokens        len(token_ids)
  first_token       the token the prefill forward produced (the root of cycle 0); prefill_ms its time
  cycles            target forwards after the prefill; tau = (new_tokens - 1) / cycles, i.e. tokens emitted per
                    verification forward, bonus token included (AR: exactly 1)
  wall_s, tokens_per_s   wall time of the whole generation, prefill included, and new_tokens / wall_s
  finish_reason     "eos" | "length" (max_new_tokens) | "context" | "stopped"
  steps             list[CycleTrace] (empty when tracing is off)

CycleTrace
  index             0-based cycle number
  nodes             list[TraceNode]: id (0 = root), token_id, text, parent (-1 for the root), depth,
                    score (cumulative draft log-prob), source ("root", "serial-1", "serial-2", "mlp-3".."mlp-7",
                    "eagle-<depth>", "medusa-<depth>", "hydra-<depth>", "mjsd-<depth>", "lookup", "recycle"); the
                    AR loop's tree is its root alone (MJSD's is a chain; lookup's too when nothing matched);
                    why the target kept or dropped the node's token (null for the root, and where unknown):
                    q       the drafter's probability of the token at its parent, exp(score - parent's score)
                            (null for lookup, whose score is not a probability)
                    p       the target's, from the verification's row at its parent: the plain softmax when greedy
                            (a node passes iff its token is that row's argmax), the run's sampling distribution
                            (temperature, top-k, top-p) when sampling; null where that row was never computed (the
                            target's head computes the rows the acceptance rule reads: under a rejected node, none)
                    accept, draw   sampling only, for each child the rule tested: the test's threshold and the
                            uniform draw; the token passes iff draw < accept. The draft token is a sure proposal
                            (q' = 1), so accept = min(1, p'/q') = p', p with the siblings rejected before it removed
                            and renormalised (p' = p for the first child tested)
  paths             list[TracePath]: nodes (ids root to leaf, FTA-filled included), filled (one flag per
                    position: borrowed by FTA), accepted (draft tokens of this path the target accepted)
  accepted_nodes    node ids of the accepted path, root first
  accepted_tokens   token ids of the accepted draft tokens (root excluded)
  bonus_token, bonus_text   the target's own next token after the accepted path (the next cycle's root)
  emitted           token ids this cycle added to the output (accepted + bonus, cut at EOS / max_new_tokens)
  fta_used          whether the accepted path went through an FTA-borrowed position
  joint             MJSD only: list[JointCheck], one per draft prefix i = 1..n: length i, p (P_i, the target's
                    joint probability of the prefix), q (Q_i, its beam probability), ratio min(1, P_i / Q_i) and
                    passed (ratio >= settings.tree.tau_acc); the accepted length is the largest passing i
  tree_size, tree_depth   nodes verified (root included) and the deepest node's depth (0 for the AR loop)
  draft_ms, verify_ms, other_ms   wall time drafting (the drafter's `observe` of the verification included),
                                  in the target forward + acceptance, and the rest of the cycle (KV compaction,
                                  bookkeeping; recording the trace itself excluded)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

SCHEMA_VERSION = 3
# The papers' order after AR, then MJSD (approximate), then the methods that draft without trained weights.
METHODS = ("ar", "medusa", "hydra", "eagle1", "eagle2", "gumiho", "mjsd", "lookup", "recycle")
DRAFTED_METHODS = tuple(m for m in METHODS if m != "ar")
WEIGHT_FREE_METHODS = ("lookup", "recycle")  # prompt lookup, Token Recycling: no drafter folder (drafters.WEIGHT_FREE)
METHOD_NAMES = {"ar": "AR", "medusa": "Medusa", "hydra": "Hydra", "eagle1": "EAGLE", "eagle2": "EAGLE-2",
                "gumiho": "Gumiho", "mjsd": "MJSD", "lookup": "Prompt lookup", "recycle": "Token Recycling"}
READABLE_SCHEMAS = (1, 2, 3)


class TraceError(ValueError):
    """A trace file that does not follow the schema."""


@dataclass
class TraceNode:
    id: int
    token_id: int
    text: str
    parent: int
    depth: int
    score: float
    source: str
    q: float | None = None
    p: float | None = None
    accept: float | None = None
    draw: float | None = None


@dataclass
class TracePath:
    nodes: list[int]
    filled: list[bool]
    accepted: int


@dataclass
class JointCheck:
    """MJSD's test of one draft prefix (docs/design.md §16)."""

    length: int
    p: float
    q: float
    ratio: float
    passed: bool


@dataclass
class CycleTrace:
    index: int
    accepted_nodes: list[int]
    accepted_tokens: list[int]
    bonus_token: int
    emitted: list[int]
    draft_ms: float
    verify_ms: float
    other_ms: float
    tree_size: int = 1
    tree_depth: int = 0
    fta_used: bool = False
    bonus_text: str = ""
    nodes: list[TraceNode] = field(default_factory=list)
    paths: list[TracePath] = field(default_factory=list)
    joint: list[JointCheck] = field(default_factory=list)
    expected_accepted: float | None = None  # per-cycle sizing: the draft tokens it expected the target to accept

    @property
    def accept_length(self) -> int:
        return len(self.accepted_tokens)

    @property
    def total_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.other_ms


@dataclass
class RunSettings:
    """How a generation was run: everything a reader needs to reproduce it, and what was chosen automatically."""

    sampling: dict[str, float]
    tree: dict[str, Any] | None
    fta_applied: bool
    max_new_tokens: int
    chat: bool
    seed: int
    device: str
    threads: int
    dtype: str = "float32"
    forward: str = "transformers"
    choice: str = ""
    approximate: str = ""
    # "row-consistent" (kernels/: a tree row = a one-token step, bit for bit; "row-consistent-amx": in bf16 products
    # on AMX tiles) or "sdpa"
    attention: str = ""


@dataclass
class GenerationTrace:
    method: str
    model: str
    prompt: str
    prompt_tokens: int
    settings: RunSettings
    drafter: str = ""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    first_token: int = -1
    prefill_ms: float = 0.0
    cycles: int = 0
    wall_s: float = 0.0
    finish_reason: str = ""
    steps: list[CycleTrace] = field(default_factory=list)
    schema: int = SCHEMA_VERSION

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tau(self) -> float:
        return (self.new_tokens - 1) / self.cycles if self.cycles else float(self.new_tokens > 0)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(new_tokens=self.new_tokens, tau=self.tau, tokens_per_s=self.tokens_per_s)
        return data

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: Any) -> GenerationTrace:
        """Parse and validate; raises TraceError with a readable reason."""
        if not isinstance(data, dict):
            raise TraceError("a trace must be a JSON object")
        if data.get("schema") not in READABLE_SCHEMAS:
            raise TraceError(f"unsupported trace schema {data.get('schema')!r} (expected {SCHEMA_VERSION})")
        if data.get("method") not in METHODS:
            raise TraceError(f"unknown method {data.get('method')!r}")
        try:
            steps = [_cycle_from_dict(s) for s in data.get("steps", [])]
            if not isinstance(data.get("settings"), dict):
                raise TypeError("settings must be an object")
            settings = _build(RunSettings, data["settings"])
            trace = _build(cls, data, steps=steps, settings=settings, schema=SCHEMA_VERSION)
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            raise TraceError(f"malformed trace: {exc}") from exc
        _check(trace)
        return trace

    @classmethod
    def from_json(cls, text: str) -> GenerationTrace:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(f"not valid JSON: {exc.msg} (line {exc.lineno})") from exc
        return cls.from_dict(data)


def _build(cls, data: dict, **overrides):
    """Construct a dataclass from a dict, ignoring derived keys; a missing field raises TypeError."""
    names = {f.name for f in fields(cls)}
    kwargs = {k: v for k, v in data.items() if k in names}
    kwargs.update(overrides)
    return cls(**kwargs)


def _cycle_from_dict(data: dict) -> CycleTrace:
    if not isinstance(data, dict):
        raise TypeError("each step must be an object")
    nodes = [TraceNode(**n) for n in data.get("nodes", [])]
    paths = [TracePath(**p) for p in data.get("paths", [])]
    joint = [JointCheck(**j) for j in data.get("joint", [])]
    return _build(CycleTrace, data, nodes=nodes, paths=paths, joint=joint)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(trace: GenerationTrace) -> None:
    if trace.method not in METHODS:
        raise TraceError(f"unknown method {trace.method!r}")
    for step in trace.steps:
        if [n.id for n in step.nodes] != list(range(len(step.nodes))):
            raise TraceError(f"cycle {step.index}: node ids must be 0, 1, 2, ... in order")
        ids = {n.id for n in step.nodes}
        for n in step.nodes:
            numbers = (n.token_id, n.parent, n.depth, n.score)
            if not isinstance(n.text, str) or not isinstance(n.source, str) or not all(_number(v) for v in numbers):
                raise TraceError(f"cycle {step.index}: node {n.id} has a field of the wrong type")
            if any(v is not None and not _number(v) for v in (n.q, n.p, n.accept, n.draw)):
                raise TraceError(f"cycle {step.index}: node {n.id} has a probability that is not a number")
            if n.parent != -1 and (n.parent not in ids or n.parent >= n.id):
                raise TraceError(f"cycle {step.index}: node {n.id} has a parent {n.parent} that is not before it")
        for p in step.paths:
            if not p.nodes or len(p.filled) != len(p.nodes) or any(i not in ids for i in p.nodes):
                raise TraceError(f"cycle {step.index}: a path is empty or names nodes that are not in the tree")
        expected = step.expected_accepted
        if expected is not None and (isinstance(expected, bool) or not isinstance(expected, (int, float))
                                     or expected < 0):
            raise TraceError(f"cycle {step.index}: expected_accepted must be a number >= 0")
        if step.nodes and any(i not in ids for i in step.accepted_nodes):
            raise TraceError(f"cycle {step.index}: the accepted path names nodes that are not in the tree")
        for i, check in enumerate(step.joint, start=1):
            numbers = (check.p, check.q, check.ratio)
            if check.length != i or not isinstance(check.passed, bool) or not all(_number(v) for v in numbers):
                raise TraceError(f"cycle {step.index}: joint check {i} is out of order or has a field of the wrong type")

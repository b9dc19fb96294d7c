"""Hand-built traces with known contents for the app's tests (no model needed)."""

from __future__ import annotations

from gumiho.trace import CycleTrace, GenerationTrace, RunSettings, TraceNode, TracePath

TOKENS = {"The": 10, " cat": 11, " dog": 12, " sat": 13, " on": 14, " ran": 15, " the": 16, ".": 17}


def node(id: int, text: str, parent: int, depth: int, score: float, source: str, q: float | None = None,
         p: float | None = None) -> TraceNode:
    return TraceNode(id=id, token_id=TOKENS[text], text=text, parent=parent, depth=depth, score=score, source=source,
                     q=q, p=p)


def gumiho_cycle(index: int, root: str) -> CycleTrace:
    """Root -> {cat -> sat -> on, dog -> ran}; the short path [dog, ran] borrows 'on' through FTA.

    Cycle 0 accepts cat, sat, on (serial-1, serial-2, mlp-3) and adds the bonus ' the'; cycle 1 accepts nothing.
    The target's p is known under the accepted nodes only (the rows a greedy walk reads).
    """
    nodes = [
        node(0, root, -1, 0, 0.0, "root"),
        node(1, " cat", 0, 1, -0.1, "serial-1", q=0.905, p=0.62),
        node(2, " dog", 0, 1, -1.5, "serial-1", q=0.223, p=0.2),
        node(3, " sat", 1, 2, -0.3, "serial-2", q=0.819, p=0.9),
        node(4, " on", 3, 3, -0.5, "mlp-3", q=0.819, p=0.51),
        node(5, " ran", 2, 2, -2.0, "serial-2", q=0.607),
    ]
    accepted = [0, 1, 3, 4] if index == 0 else [0]
    paths = [
        TracePath(nodes=[0, 1, 3, 4], filled=[False, False, False, False], accepted=3 if index == 0 else 0),
        TracePath(nodes=[0, 2, 5, 4], filled=[False, False, False, True], accepted=0),
    ]
    bonus = " the" if index == 0 else "."
    emitted = [TOKENS[nodes[i].text] for i in accepted[1:]] + [TOKENS[bonus]]
    return CycleTrace(index=index, accepted_nodes=accepted, accepted_tokens=emitted[:-1], bonus_token=TOKENS[bonus],
                      emitted=emitted, draft_ms=20.0, verify_ms=60.0, other_ms=5.0, tree_size=6, tree_depth=3,
                      fta_used=False, bonus_text=bonus, nodes=nodes, paths=paths)


def ar_cycle(index: int, root: str, bonus: str) -> CycleTrace:
    return CycleTrace(index=index, accepted_nodes=[0], accepted_tokens=[], bonus_token=TOKENS[bonus],
                      emitted=[TOKENS[bonus]], draft_ms=0.0, verify_ms=50.0, other_ms=1.0, bonus_text=bonus,
                      nodes=[node(0, root, -1, 0, 0.0, "root")], paths=[TracePath(nodes=[0], filled=[False],
                                                                                 accepted=0)])


def settings(method: str, fta: bool = False) -> RunSettings:
    tree = None if method == "ar" else {"top_k": 2, "depth": 6, "total_tokens": 6, "fta": fta}
    return RunSettings(sampling={"temperature": 0.0, "top_p": 1.0, "top_k": 0}, tree=tree, fta_applied=fta,
                       max_new_tokens=6, chat=True, seed=0, device="cpu", threads=1)


def gumiho_trace() -> GenerationTrace:
    """6 tokens: 'The' (prefill), cycle 0: ' cat sat on' + bonus ' the', cycle 1: bonus '.'."""
    steps = [gumiho_cycle(0, "The"), gumiho_cycle(1, " the")]
    ids = [TOKENS["The"]] + [t for s in steps for t in s.emitted]
    return GenerationTrace(method="gumiho", model="tiny", prompt="Say something", prompt_tokens=5,
                           settings=settings("gumiho", fta=True), drafter="random-gumiho", text="The cat sat on the.",
                           token_ids=ids, first_token=TOKENS["The"], prefill_ms=100.0, cycles=2, wall_s=0.3,
                           finish_reason="length", steps=steps)


def ar_trace(words: tuple[str, ...] = ("The", " cat", " sat", " on", " the", ".")) -> GenerationTrace:
    """The same 6 tokens one per forward (or other words, to make a text that differs)."""
    steps = [ar_cycle(i, words[i], words[i + 1]) for i in range(len(words) - 1)]
    return GenerationTrace(method="ar", model="tiny", prompt="Say something", prompt_tokens=5, settings=settings("ar"),
                           text="".join(words), token_ids=[TOKENS[w] for w in words], first_token=TOKENS[words[0]],
                           prefill_ms=100.0, cycles=len(steps), wall_s=0.6, finish_reason="length", steps=steps)

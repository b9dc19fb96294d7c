"""How things look: method and head names, token labels, the page's CSS (colours: palette.py)."""

from __future__ import annotations

from gumiho.trace import METHOD_NAMES as ENGINE_NAMES

from .palette import CSS as STATE_CSS, source_family

METHOD_NAMES = {**ENGINE_NAMES, "gumiho+fta": "Gumiho + FTA", "mjsd": "MJSD (approximate)",
                "transformers-fp32": "transformers generate (fp32)", "transformers-bf16": "transformers generate (bf16)",
                "transformers-fp16": "transformers generate (fp16)"}
SOURCE_KINDS = {"serial": "Transformer", "mlp": "MLP head", "eagle": "EAGLE draft step", "medusa": "Medusa head",
                "hydra": "Hydra head", "mjsd": "MJSD beam step", "lookup": "prompt lookup match",
                "recycle": "recycled target top-k"}


def method_name(method: str) -> str:
    return METHOD_NAMES.get(method, method)


def source_name(source: str) -> str:
    """A legend label: which part of which drafter produced the node."""
    kind = SOURCE_KINDS.get(source_family(source)[0])
    return f"{source} ({kind})" if kind else source


def source_order(source: str) -> tuple[int, int]:
    """Sort key: root, then serial, MLP, EAGLE, Medusa, Hydra and MJSD heads by depth, then lookup and recycle."""
    family, depth = source_family(source)
    return (0 if source == "root" else 1 + list(SOURCE_KINDS).index(family) if family in SOURCE_KINDS
            else len(SOURCE_KINDS) + 1), depth


def token_label(text: str, width: int = 10) -> str:
    """A token as a short visible label: a leading space as '␣', line breaks as '⏎'."""
    label = text.replace("\n", "⏎").replace("\t", "⇥")
    if label.startswith(" "):
        label = "␣" + label[1:]
    if not label:
        label = "∅"
    return label if len(label) <= width else label[: width - 1] + "…"


CSS = """
.gm-output { white-space: pre-wrap; line-height: 1.9; font-size: 15px; padding: 10px; border-radius: 8px;
             border: 1px solid var(--border-color-primary); min-height: 3em; }
.gm-tok { border-radius: 3px; padding: 1px 0; }
.gm-legend { font-size: 13px; margin: 4px 0; }
.gm-legend span { margin-right: 10px; padding: 1px 5px; border-radius: 3px; }
.gm-texts { display: grid; grid-template-columns: repeat(auto-fit, minmax(260px, 1fr)); gap: 10px; }
.gm-texts h4 { margin: 0 0 4px 0; }
.gm-status { font-size: 14px; }
#gm-bench table th, #gm-bench table td { white-space: nowrap; word-break: keep-all; overflow-wrap: normal; }
#gm-bench table th { padding: 6px 10px; }
#gm-bench table td { padding: 4px 10px; }
#gm-bench .gm-report table { display: block; overflow-x: auto; max-width: 100%; }
.gm-link-note { font-size: 14px; }
/* Presenter view (body.gm-present, set by its toggle): what a class does not need is hidden, the rest is larger. */
body.gm-present .gm-extra, body.gm-present #gm-explore-examples, body.gm-present #gm-race-examples,
body.gm-present footer { display: none !important; }
body.gm-present .gradio-container { max-width: 100% !important; }
/* !important: Gradio also adds every rule scoped under .gradio-container .contain, which outranks body.gm-present */
body.gm-present .prose, body.gm-present .gm-legend { font-size: 18px !important; }
body.gm-present .gm-output { font-size: 24px !important; }
body.gm-present .gm-texts { font-size: 20px !important; }
@media (prefers-reduced-motion: reduce) {
  *, *::before, *::after { animation-duration: 0.01ms !important; animation-iteration-count: 1 !important;
                           transition-duration: 0.01ms !important; scroll-behavior: auto !important; }
}
""" + STATE_CSS

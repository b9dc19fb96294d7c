"""How things look: method names, one colour per draft head, token labels, the page's CSS."""

from __future__ import annotations

from gumiho.trace import METHOD_NAMES as ENGINE_NAMES

METHOD_NAMES = {**ENGINE_NAMES, "gumiho+fta": "Gumiho + FTA", "mjsd": "MJSD (approximate)",
                "transformers-fp32": "transformers generate (fp32)", "transformers-bf16": "transformers generate (bf16)",
                "transformers-fp16": "transformers generate (fp16)"}
METHOD_COLORS = {"eagle2": "#2a9d8f", "gumiho": "#e76f51", "gumiho+fta": "#f4a261", "ar": "#6c757d"}

# Gumiho: the serial Transformer in blues, the parallel MLP heads in warm colours. EAGLE-2: greens by depth.
SOURCE_COLORS = {
    "root": "#495057",
    "serial-1": "#1d4ed8",
    "serial-2": "#60a5fa",
    "mlp-3": "#f97316",
    "mlp-4": "#ef4444",
    "mlp-5": "#db2777",
    "mlp-6": "#9333ea",
    "mlp-7": "#a16207",
}
EAGLE_GREENS = ["#14532d", "#15803d", "#22c55e", "#4ade80", "#86efac", "#bbf7d0", "#dcfce7", "#f0fdf4"]
OTHER_SOURCE = "#9ca3af"
BONUS_COLOR = "#eab308"
ACCEPTED_COLOR = "#16a34a"
FTA_COLOR = "#f59e0b"
TIME_COLORS = {"draft": "#8b5cf6", "verify": "#0ea5e9", "other": "#cbd5e1"}


def method_name(method: str) -> str:
    return METHOD_NAMES.get(method, method)


def source_color(source: str) -> str:
    """The colour of the head that drafted a node ("root", "serial-1", "mlp-5", "eagle-3", ...)."""
    if source in SOURCE_COLORS:
        return SOURCE_COLORS[source]
    if source.startswith("eagle-") and source[6:].isdigit():
        depth = int(source[6:])
        return EAGLE_GREENS[min(max(depth, 1), len(EAGLE_GREENS)) - 1]
    return OTHER_SOURCE


def source_name(source: str) -> str:
    """A legend label: which part of which drafter produced the node."""
    if source.startswith("serial-"):
        return f"{source} (Transformer)"
    if source.startswith("mlp-"):
        return f"{source} (MLP head)"
    if source.startswith("eagle-"):
        return f"{source} (EAGLE-2 step)"
    return source


def source_order(source: str) -> tuple[int, int]:
    """Sort key: root, then serial, MLP and EAGLE heads by depth."""
    family = {"root": 0, "serial": 1, "mlp": 2, "eagle": 3}.get(source.split("-")[0], 4)
    tail = source.rsplit("-", 1)[-1]
    return family, int(tail) if tail.isdigit() else 0


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
.gm-bonus { box-shadow: inset 0 -3px 0 #eab308; }
.gm-borrowed { outline: 2px dashed #f59e0b; }
.gm-diff { background: #fecaca !important; text-decoration: underline wavy #dc2626; }
.gm-cycle.gm-selected { outline: 2px solid #111827; border-radius: 4px; }
.gm-legend { font-size: 13px; margin: 4px 0; }
.gm-legend span { margin-right: 10px; padding: 1px 5px; border-radius: 3px; }
.gm-texts { display: grid; grid-template-columns: repeat(auto-fit, minmax(260px, 1fr)); gap: 10px; }
.gm-texts h4 { margin: 0 0 4px 0; }
.gm-status { font-size: 14px; }
#gm-bench table th, #gm-bench table td { white-space: nowrap; word-break: keep-all; overflow-wrap: normal; }
#gm-bench table th { padding: 6px 10px; }
#gm-bench table td { padding: 4px 10px; }
#gm-bench .gm-report table { display: block; overflow-x: auto; max-width: 100%; }
"""

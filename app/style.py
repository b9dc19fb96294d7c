"""How things look: method names, one colour per draft head, token labels, the page's CSS."""

from __future__ import annotations

from gumiho.trace import METHOD_NAMES as ENGINE_NAMES

METHOD_NAMES = {**ENGINE_NAMES, "gumiho+fta": "Gumiho + FTA", "mjsd": "MJSD (approximate)",
                "transformers-fp32": "transformers generate (fp32)", "transformers-bf16": "transformers generate (bf16)",
                "transformers-fp16": "transformers generate (fp16)"}
METHOD_COLORS = {"medusa": "#7c3aed", "hydra": "#0d9488", "eagle1": "#65a30d", "eagle2": "#2a9d8f",
                 "gumiho": "#e76f51", "gumiho+fta": "#f4a261", "mjsd": "#b45309", "lookup": "#0369a1",
                 "recycle": "#be185d", "ar": "#6c757d"}

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
    # The draft-free methods: one colour each (their nodes carry no depth in the source name).
    "lookup": "#0284c7",
    "recycle": "#c026d3",
}
# The other drafters: one hue per method, darkest at depth 1 ("eagle-3", "medusa-2", ...).
DEPTH_PALETTES = {
    "eagle": ["#14532d", "#15803d", "#22c55e", "#4ade80", "#86efac", "#bbf7d0", "#dcfce7", "#f0fdf4"],
    "medusa": ["#4c1d95", "#6d28d9", "#8b5cf6", "#a78bfa", "#c4b5fd", "#ddd6fe"],
    "hydra": ["#134e4a", "#0f766e", "#14b8a6", "#5eead4", "#99f6e4", "#ccfbf1"],
    "mjsd": ["#78350f", "#b45309", "#d97706", "#fbbf24", "#fde68a", "#fef3c7"],
}
SOURCE_KINDS = {"serial": "Transformer", "mlp": "MLP head", "eagle": "EAGLE draft step", "medusa": "Medusa head",
                "hydra": "Hydra head", "mjsd": "MJSD beam step", "lookup": "prompt lookup match",
                "recycle": "recycled target top-k"}
OTHER_SOURCE = "#9ca3af"
BONUS_COLOR = "#eab308"
ACCEPTED_COLOR = "#16a34a"
FTA_COLOR = "#f59e0b"
TIME_COLORS = {"draft": "#8b5cf6", "verify": "#0ea5e9", "other": "#cbd5e1"}


def method_name(method: str) -> str:
    return METHOD_NAMES.get(method, method)


def _family(source: str) -> tuple[str, int]:
    """("eagle", 3) for "eagle-3"; (source, 0) for a name without a depth."""
    family, _, depth = source.rpartition("-")
    return (family, int(depth)) if family and depth.isdigit() else (source, 0)


def source_color(source: str) -> str:
    """The colour of the head that drafted a node ("root", "serial-1", "mlp-5", "eagle-3", "medusa-2", ...)."""
    if source in SOURCE_COLORS:
        return SOURCE_COLORS[source]
    family, depth = _family(source)
    palette = DEPTH_PALETTES.get(family)
    if palette is None or depth < 1:
        return OTHER_SOURCE
    return palette[min(depth, len(palette)) - 1]


def source_name(source: str) -> str:
    """A legend label: which part of which drafter produced the node."""
    kind = SOURCE_KINDS.get(_family(source)[0])
    return f"{source} ({kind})" if kind else source


def source_order(source: str) -> tuple[int, int]:
    """Sort key: root, then serial, MLP, EAGLE, Medusa, Hydra and MJSD heads by depth, then lookup and recycle."""
    family, depth = _family(source)
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

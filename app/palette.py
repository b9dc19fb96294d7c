"""Every colour the app draws with, and the cue beside each colour, so that no meaning rests on colour alone.

The hues are Okabe and Ito's (https://jfly.uni-koeln.de/color/), chosen to stay apart under the common colour-vision
deficiencies. Marks are drawn on white, and WCAG 2.x asks 3:1 of a mark against its background: Okabe–Ito's orange
and sky blue reach 2.3 there, so they are darkened until they reach 3:1, and yellow (1.3) is left out. Where more
colours are needed, darker shades of the same hues follow. tests/test_palette.py checks every entry.

The second cues: methods differ by dash and marker symbol too (`METHOD_LINES`); in a draft tree the accepted path
is thick and solid, other edges dotted, FTA's borrowed ones dashed, rejected nodes crossed out (✗) and the bonus a
star (★); in the text each kind of head underlines its tokens in its own style (`SOURCE_UNDERLINES`).
"""

from __future__ import annotations

from dataclasses import dataclass

BACKGROUND = "#ffffff"  # every plot's
INK = "#1a1a1a"  # text and outlines drawn on it
GRID = "#e5e5e5"  # grid lines: decoration, not a mark (exempt from the 3:1 rule)
# The page's own text on its background, light and dark theme (Gradio's default theme: zinc 800 on white, zinc 100
# on zinc 950): tinted token spans keep that text, so it must stay readable on every tint.
PAGES = {"light": ("#27272a", "#ffffff"), "dark": ("#f4f4f5", "#0f0f11")}
TINT = 0.25  # opacity of a head's colour behind a token of the text

BLACK = "#000000"
GREY = "#666666"
BLUE = "#0072b2"
SKY = "#4a9bc8"  # Okabe–Ito sky blue #56b4e9, darkened to 3:1
GREEN = "#009e73"  # bluish green
VERMILLION = "#d55e00"
ORANGE = "#c48700"  # Okabe–Ito orange #e69f00, darkened to 3:1
PURPLE = "#cc79a7"  # reddish purple


def mix(color: str, other: str, share: float) -> str:
    """`color` with `share` of `other` blended in (sRGB, as a browser blends a translucent colour)."""
    a, b = _rgb(color), _rgb(other)
    return "#" + "".join(f"{round(x + (y - x) * share):02x}" for x, y in zip(a, b))


def _rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def shades(color: str, n: int, darkest: float = 0.5) -> list[str]:
    """n shades of one hue, the darkest first (`darkest` of black blended in) and `color` itself last."""
    return [mix(color, BLACK, darkest * (n - 1 - i) / max(n - 1, 1)) for i in range(n)]


DARK_BLUE, DARK_GREEN, DARK_VERMILLION, DARK_PURPLE = (mix(c, BLACK, 0.5) for c in (BLUE, GREEN, VERMILLION, PURPLE))

METHODS = {"ar": GREY, "medusa": PURPLE, "hydra": GREEN, "eagle1": DARK_BLUE, "eagle2": BLUE, "gumiho": VERMILLION,
           "gumiho+fta": SKY, "mjsd": DARK_VERMILLION, "lookup": BLACK, "recycle": DARK_PURPLE}
REFERENCE = mix(GREY, BLACK, 0.6)  # plain transformers generate (transformers-fp32, -bf16, ...), a baseline like AR


@dataclass(frozen=True)
class Line:
    """How a method's series is drawn besides its colour: a Plotly dash and marker symbol."""

    dash: str
    symbol: str


METHOD_LINES = {
    "ar": Line("longdashdot", "circle"),
    "medusa": Line("dot", "triangle-up"),
    "hydra": Line("dashdot", "triangle-down"),
    "eagle1": Line("longdash", "square"),
    "eagle2": Line("dash", "diamond"),
    "gumiho": Line("solid", "star"),
    "gumiho+fta": Line("6px,2px", "star-open"),
    "mjsd": Line("8px,3px,2px,3px,2px,3px", "hexagon"),
    "lookup": Line("2px,5px", "cross"),
    "recycle": Line("10px,3px,10px,8px", "pentagon"),
}
REFERENCE_LINE = Line("1px,2px", "x")
# Bars of the reference runs differ by dtype in their fill pattern, since they share a colour.
REFERENCE_PATTERNS = {"transformers-fp32": "/", "transformers-bf16": "\\", "transformers-fp16": "x"}

# Draft heads: one hue per kind, darkest at depth 1. Gumiho's serial Transformer in blues, its parallel MLP heads in
# vermillion; prompt lookup in black, so that its tree never reads as a learned drafter's after the switch.
SOURCE_HUES = {"serial": SKY, "mlp": VERMILLION, "eagle": SKY, "medusa": PURPLE, "hydra": GREEN, "mjsd": VERMILLION}
DEPTHS = {"serial": 2, "mlp": 5, "eagle": 8, "medusa": 6, "hydra": 6, "mjsd": 6}  # deepest of each kind
SOURCES = {"root": GREY, "lookup": BLACK, "recycle": DARK_PURPLE}
OTHER_SOURCE = GREY
# The underline of a drafted token in the text, per kind of head: the Transformers solid, the heads dashed, MJSD's
# beam double, the draft-free candidates dotted.
SOURCE_UNDERLINES = {"serial": "solid", "eagle": "solid", "mlp": "dashed", "medusa": "dashed", "hydra": "dashed",
                     "mjsd": "double", "lookup": "dotted", "recycle": "dotted"}


@dataclass(frozen=True)
class States:
    """What happened to a node or token, each with its own shape or line besides the colour."""

    accepted: str = GREEN  # the accepted path: thick and solid; accepted nodes get an INK ring
    edge: str = GREY  # the other draft edges: thin and dotted
    bonus: str = ORANGE  # a star in the tree, a thick bar under the token in the text
    fta: str = PURPLE  # FTA-borrowed: dashed segments in the tree, a dashed outline in the text
    differs: str = VERMILLION  # text that leaves AR's: a wavy underline


STATES = States()
TIMES = {"draft": PURPLE, "verify": BLUE, "other": GREY}  # a cycle's time, stacked bars with these patterns:
TIME_PATTERNS = {"draft": "/", "verify": "", "other": "."}
LESSON = {"terms": BLUE, "gain": VERMILLION}  # the τ calculator: its bars and its line


def source_family(source: str) -> tuple[str, int]:
    """("eagle", 3) for "eagle-3"; (source, 0) for a name without a depth."""
    family, _, depth = source.rpartition("-")
    return (family, int(depth)) if family and depth.isdigit() else (source, 0)


def source_color(source: str) -> str:
    """The colour of the head that drafted a node ("root", "serial-1", "mlp-5", "eagle-3", "medusa-2", ...)."""
    if source in SOURCES:
        return SOURCES[source]
    family, depth = source_family(source)
    if family not in SOURCE_HUES or depth < 1:
        return OTHER_SOURCE
    first = 3 if family == "mlp" else 1  # Gumiho's MLP heads draft depths 3 to 7
    ramp = shades(SOURCE_HUES[family], DEPTHS[family])
    return ramp[min(depth - first, len(ramp) - 1)]


def source_underline(source: str) -> str:
    """The CSS text-decoration style of a token drafted by `source` ("solid", "dashed", ...)."""
    return SOURCE_UNDERLINES.get(source_family(source)[0], "solid")


def method_color(method: str) -> str:
    return REFERENCE if method.startswith("transformers") else METHODS.get(method, OTHER_SOURCE)


def method_pattern(method: str) -> str:
    """A bar's fill pattern: "" (solid) for the engine's methods."""
    return REFERENCE_PATTERNS.get(method, "." if method.startswith("transformers") else "")


def method_line(method: str) -> Line:
    return REFERENCE_LINE if method.startswith("transformers") else METHOD_LINES.get(method, Line("solid", "circle"))


def tint(color: str, alpha: float = TINT) -> str:
    """`color` at `alpha`, as CSS and Plotly read it (rgba)."""
    return f"rgba({', '.join(str(c) for c in _rgb(color))}, {alpha:g})"


def token_style(source: str) -> str:
    """Inline CSS of a drafted token: its head's tint behind it and its head's underline style under it."""
    color = source_color(source)
    return (f"background:{tint(color)};text-decoration:underline {source_underline(source)} {color};"
            "text-decoration-thickness:2px;text-underline-offset:3px")


CSS = f"""
.gm-bonus {{ box-shadow: inset 0 -3px 0 {STATES.bonus}; }}
.gm-borrowed {{ outline: 2px dashed {STATES.fta}; }}
.gm-diff {{ background: {tint(STATES.differs)} !important;
            text-decoration: underline wavy {STATES.differs} !important; }}
.gm-cycle.gm-selected {{ outline: 2px solid currentColor; border-radius: 4px; }}
"""

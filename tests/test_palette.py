"""The palette against WCAG 2.x contrast (3:1 for marks on the plot, 4.5:1 for text on its background), colour-blind
simulations, the second cue of every colour, and no colour picked outside app/palette.py."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import pytest

from app import palette
from app.style import source_order

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["root", "lookup", "recycle", "serial-1", "serial-2", *(f"mlp-{d}" for d in range(3, 8)),
           *(f"{kind}-{d}" for kind in ("eagle", "medusa", "hydra", "mjsd") for d in range(1, 9))]
METHODS = list(palette.METHOD_LINES)
# Machado, Oliveira and Fernandes (2009), severity 1.0, on linear RGB.
DEUTERANOPIA = ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413), (-0.011820, 0.042940, 0.968881))
PROTANOPIA = ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216), (-0.003882, -0.048116, 1.051998))


def rgb(color: str, under: str = palette.BACKGROUND) -> tuple[float, float, float]:
    """A "#rrggbb" or "rgba(r, g, b, a)" colour as 0..255 channels, a translucent one blended over `under`."""
    if color.startswith("rgba("):
        *channels, alpha = (float(v) for v in color[5:-1].split(","))
        return tuple(c * alpha + b * (1 - alpha) for c, b in zip(channels, rgb(under)))
    return tuple(float(int(color[i : i + 2], 16)) for i in (1, 3, 5))


def linear(channel: float) -> float:
    """WCAG 2.x: an sRGB channel (0..255) to linear light."""
    c = channel / 255
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def luminance(color: tuple[float, float, float]) -> float:
    """WCAG 2.x relative luminance."""
    r, g, b = (linear(c) for c in color)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def marks() -> dict[str, str]:
    """Every colour drawn as a mark on a plot, by what it marks."""
    named = {f"method {m}": palette.method_color(m) for m in [*METHODS, "transformers-fp32"]}
    named.update({f"head {s}": palette.source_color(s) for s in SOURCES})
    named.update({f"state {k}": v for k, v in vars(palette.STATES).items()})
    named.update({f"time {k}": v for k, v in palette.TIMES.items()})
    named.update({f"lesson {k}": v for k, v in palette.LESSON.items()})
    return named


def test_the_wcag_formula_gives_the_known_ratios():
    assert contrast(rgb("#000000"), rgb("#ffffff")) == pytest.approx(21.0)
    assert contrast(rgb("#767676"), rgb("#ffffff")) == pytest.approx(4.54, abs=0.01)
    assert contrast(rgb("#e69f00"), rgb("#ffffff")) < 3  # Okabe–Ito's own orange is too light for marks on white


@pytest.mark.parametrize("name,color", marks().items())
def test_every_mark_stands_out_from_the_plot_at_3_to_1(name, color):
    assert contrast(rgb(color), rgb(palette.BACKGROUND)) >= 3, name


def test_plot_text_is_readable_at_4_5_to_1():
    assert contrast(rgb(palette.INK), rgb(palette.BACKGROUND)) >= 4.5


@pytest.mark.parametrize("theme", palette.PAGES)
@pytest.mark.parametrize("tint", [*(palette.tint(palette.source_color(s)) for s in SOURCES),
                                  palette.tint(palette.STATES.differs)])
def test_the_pages_text_is_readable_on_every_tint_at_4_5_to_1(theme, tint):
    text, page = palette.PAGES[theme]
    assert contrast(rgb(text), rgb(page)) >= 4.5
    assert contrast(rgb(text), rgb(tint, under=page)) >= 4.5


def cvd_lab(color: str, matrix) -> tuple[float, float, float]:
    """CIELAB (D65) of a colour as seen with a colour-vision deficiency (`matrix` None: typical vision)."""
    lin = [linear(c) for c in rgb(color)]
    if matrix is not None:
        lin = [min(1.0, max(0.0, sum(m * c for m, c in zip(row, lin)))) for row in matrix]
    r, g, b = lin
    xyz = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b, \
        (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883
    fx, fy, fz = (t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116 for t in xyz)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


@pytest.mark.parametrize("matrix", [None, DEUTERANOPIA, PROTANOPIA], ids=["typical", "deuteranopia", "protanopia"])
def test_method_colours_stay_apart_under_colour_blindness(matrix):
    colors = [palette.method_color(m) for m in [*METHODS, "transformers-fp32"]]
    gaps = [math.dist(cvd_lab(a, matrix), cvd_lab(b, matrix)) for a, b in itertools.combinations(colors, 2)]
    assert min(gaps) >= 10  # CIE76 ΔE: clearly different side by side


def test_every_method_has_its_own_dash_and_marker():
    lines = [palette.method_line(m) for m in [*METHODS, "transformers-fp32"]]
    assert len({line.dash for line in lines}) == len({line.symbol for line in lines}) == len(lines)
    references = ["transformers-fp32", "transformers-bf16", "transformers-fp16"]  # one colour, a pattern each
    assert len({palette.method_pattern(m) for m in references}) == 3 and palette.method_pattern("gumiho") == ""


def test_heads_of_one_drafter_have_distinct_colours_and_text_underlines():
    families = {"gumiho": ["root", "serial-1", "serial-2", *(f"mlp-{d}" for d in range(3, 8)), "lookup"]}
    families.update({kind: ["root", *(f"{kind}-{d}" for d in range(1, 7)), "lookup"]
                     for kind in ("eagle", "medusa", "hydra")})
    for family, sources in families.items():
        assert len({palette.source_color(s) for s in sources}) == len(sources), family
    kinds = {palette.source_underline(s) for s in ("serial-1", "mlp-3", "mjsd-1", "lookup")}
    assert len(kinds) == 4  # the Transformers, the heads, MJSD's beam, the draft-free candidates
    assert sorted(SOURCES, key=source_order)[0] == "root"


def test_no_colour_is_picked_outside_the_palette():
    hex_color = re.compile(r"#[0-9a-fA-F]{6}\b|#[0-9a-fA-F]{3}\b|rgba?\(")
    files = [p for p in [*(ROOT / "app").glob("*.py"), *(ROOT / "gumiho" / "bench").glob("*.py")]
             if p.name != "palette.py"]
    stray = {p.name: hex_color.findall(p.read_text(encoding="utf-8")) for p in files}
    assert not {name: found for name, found in stray.items() if found}

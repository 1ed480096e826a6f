"""The memory as one picture: its markers seen from above beside its contact sheet (the README's picture). No ROS.

``render_picture`` draws what a viewer shows (``MarkerSpec`` by (ns, id), as ``programs/memory_capture.py`` records
``~/memory_markers``) in the markers' own frame, x right and y up as RViz's top-down view: the path as a grey line,
each frame as a dot in its marker's colour (green resident, orange offloaded, darker older), still spans as blue
segments and each sighting's label at its pose (labels at one place are stacked, where RViz would overlap them);
the JPEG of ``~/memory_sheet`` beside it. The PNG is quantised to 256 colours: a picture for a page, a few hundred KB.
"""

from __future__ import annotations

import io
from collections.abc import Mapping

import numpy as np
from PIL import Image

from videokv_node.view.markers import NS_FRAMES, NS_PATH, NS_STILL, NS_WORDS, MarkerSpec

LABEL_PT = 6.5  # label font size, points
STACK_M = 0.3  # labels closer than this (on the map) to an earlier one are stacked (a robot that stood still)
MAX_LABEL_CHARS = 28


def map_layers(shown: Mapping[tuple[str, int], MarkerSpec]) -> dict:
    """What the map draws, as plain data: ``path`` [(x, y)], ``frames`` [(x, y, rgba)], ``still`` [((x0, y0), (x1, y1))],
    ``labels`` [(x, y, text)] (oldest block first), ``frame_id``."""
    ms = sorted(shown.values(), key=lambda m: (m.ns, m.id))
    path = next((m for m in ms if m.ns == NS_PATH), None)
    return {
        "frame_id": next((m.frame_id for m in ms if m.frame_id), ""),
        "path": [p[:2] for p in path.points] if path is not None else [],
        "frames": [(m.position[0], m.position[1], m.rgba) for m in ms if m.ns == NS_FRAMES],
        "still": [(m.points[0][:2], m.points[-1][:2]) for m in ms if m.ns == NS_STILL and m.points],
        "labels": [(m.position[0], m.position[1], m.text) for m in ms if m.ns == NS_WORDS],
    }


def stacked(labels: list[tuple[float, float, str]]) -> list[tuple[float, float, str, int]]:
    """Each label with its place in the stack of labels within ``STACK_M`` of the first of them (0: on its own)."""
    heads: list[tuple[float, float, int]] = []  # (x, y, labels stacked there)
    out = []
    for x, y, text in labels:
        for i, (hx, hy, n) in enumerate(heads):
            if np.hypot(x - hx, y - hy) < STACK_M:
                heads[i] = (hx, hy, n + 1)
                out.append((hx, hy, text, n))
                break
        else:
            heads.append((x, y, 1))
            out.append((x, y, text, 0))
    return out


def along(path: list[tuple[float, float]], x: float, y: float) -> bool:
    """Whether the path runs mostly along x near (x, y): labels there are written slanted, so that neighbours
    a metre apart do not overlap."""
    if len(path) < 2:
        return True
    i = min(range(len(path) - 1), key=lambda k: np.hypot(path[k][0] - x, path[k][1] - y))
    (x0, y0), (x1, y1) = path[i], path[i + 1]
    return abs(x1 - x0) >= abs(y1 - y0)


def render_picture(shown: Mapping[tuple[str, int], MarkerSpec], sheet_jpeg: bytes | None, title: str = "",
                   notes: str = "") -> bytes:
    """PNG bytes of the map of ``shown`` and, where given, the sheet beside it (module docstring)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: never a display
    import matplotlib.pyplot as plt

    layers = map_layers(shown)
    sheet = np.asarray(Image.open(io.BytesIO(sheet_jpeg)).convert("RGB")) if sheet_jpeg else None
    fig, axes = plt.subplots(1, 2 if sheet is not None else 1, figsize=(13 if sheet is not None else 7, 6.2),
                             gridspec_kw={"width_ratios": [1, 1.15]} if sheet is not None else None, squeeze=False)
    ax = axes[0][0]
    if layers["path"]:
        ax.plot(*zip(*layers["path"]), color="0.55", lw=1.5, zorder=1, label="path over the span held")
    for a, b in layers["still"]:
        ax.plot([a[0], b[0]], [a[1], b[1]], color=(0.2, 0.45, 1.0), lw=3, zorder=2)
    if layers["frames"]:
        xs, ys, colours = zip(*layers["frames"])
        ax.scatter(xs, ys, c=[c[:3] for c in colours], s=28, edgecolors="black", linewidths=0.3, zorder=3,
                   label="a frame in memory (green: KV on the device, orange: on the host)")
    for x, y, text, k in stacked(layers["labels"]):
        slant = along(layers["path"], x, y) and k == 0
        # a stack grows up and to the left of its place; a label on a path along x leans at 50 degrees
        offset = (4, 5) if slant else (-6, 6 + 1.35 * LABEL_PT * k)
        ax.annotate(text[:MAX_LABEL_CHARS], (x, y), xytext=offset, textcoords="offset points", fontsize=LABEL_PT,
                    color="0.1", zorder=4, rotation=50 if slant else 0, ha="left" if slant else "right",
                    rotation_mode="anchor", bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="0.7", lw=0.3, alpha=0.85))
    ax.set_aspect("equal", adjustable="datalim")
    ax.grid(True, lw=0.3, color="0.85")
    ax.set_xlabel(f"x (m, {layers['frame_id'] or 'no frame'})")
    ax.set_ylabel("y (m)")
    ax.set_title("~/memory_markers, seen from above", fontsize=10)
    ax.legend(loc="upper left", fontsize=7, framealpha=0.9)
    if sheet is not None:
        axes[0][1].imshow(sheet)
        axes[0][1].set_axis_off()
        axes[0][1].set_title("~/memory_sheet (newest first)", fontsize=10)
    if title:
        fig.suptitle(title, fontsize=11)
    if notes:
        fig.text(0.01, 0.01, notes, fontsize=7, color="0.3")
    fig.tight_layout(rect=(0, 0.03 if notes else 0, 1, 1))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()

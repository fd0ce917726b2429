#!/usr/bin/env python3
"""The course's drawn figures (no run behind them), as SVG: the source of the files
it writes into docs/charts/, which the lessons embed. Rerun after editing:

    python3 plots/figures.py docs/charts

tp_block.svg   lab05: one Transformer MLP and attention block under tensor parallelism, t = 2
grid3d.svg     lab06: the 2 x 2 x 2 grid, rank = tp + t (dp + d pp), its groups and hosts
grid4d.svg     lab09: tp 2 x cp 2 x pp 2, rank = tp + t (cp + c (dp + d pp)): heads, positions, layers per rank"""
import os
import sys

FONT = 'font-family="DejaVu Sans, Arial, sans-serif"'
BLUE, GREEN, ORANGE, RED, GREY, PURPLE = "#4c72b0", "#55a868", "#dd8452", "#c44e52", "#8c8c8c", "#8172b3"


class Svg:
    def __init__(self, w, h):
        self.w, self.h, self.items = w, h, []

    def rect(self, x, y, w, h, fill, text="", color="#ffffff", size=14, stroke="none", dash=False, rx=6):
        d = ' stroke-dasharray="6,4"' if dash else ""
        self.items.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="{rx}" fill="{fill}" '
                          f'stroke="{stroke}" stroke-width="2"{d}/>')
        if text:
            lines = text.split("\n")
            for i, line in enumerate(lines):
                ty = y + h / 2 + (i - (len(lines) - 1) / 2) * (size + 3) + size / 3
                self.text(x + w / 2, ty, line, color, size)

    def text(self, x, y, s, color="#222222", size=14, anchor="middle", weight="normal"):
        s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        self.items.append(f'<text x="{x}" y="{y}" {FONT} font-size="{size}" fill="{color}" '
                          f'text-anchor="{anchor}" font-weight="{weight}">{s}</text>')

    def arrow(self, x1, y1, x2, y2, color="#444444"):
        self.items.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{color}" stroke-width="2" '
                          f'marker-end="url(#head)"/>')

    def write(self, path):
        with open(path, "w") as f:
            f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" height="{self.h}" '
                    f'viewBox="0 0 {self.w} {self.h}">\n<defs><marker id="head" markerWidth="10" markerHeight="8" '
                    f'refX="9" refY="4" orient="auto"><path d="M0,0 L10,4 L0,8 z" fill="#444444"/></marker></defs>\n'
                    f'<rect width="100%" height="100%" fill="#ffffff"/>\n' + "\n".join(self.items) + "\n</svg>\n")


def tp_block(path):
    """Megatron's MLP and attention split over t = 2 ranks: f (identity forward, all-reduce backward)
    before, g (all-reduce forward, identity backward) after."""
    s = Svg(1000, 600)
    s.text(500, 30, "Tensor parallelism (lab05), t = 2: one layer's MLP and attention on two ranks", size=18,
           weight="bold")
    for half, (y0, title) in enumerate(((60, "MLP:  Y = GELU(X W1) W2"), (320, "attention:  heads split per rank"))):
        s.text(30, y0 + 20, title, size=15, anchor="start", weight="bold")
        s.rect(30, y0 + 90, 120, 70, GREY, "X [B T, C]\nreplicated")
        s.rect(170, y0 + 95, 60, 60, PURPLE, "f", size=18)
        for r in range(2):
            y = y0 + 40 + r * 120
            s.text(260, y - 8, f"rank {r}", GREY, 13, "start")
            if half == 0:
                s.rect(260, y, 170, 60, BLUE, f"X W1[:, {'first' if r == 0 else 'second'} half]\ncolumns: [B T, 2C]")
                s.rect(450, y, 90, 60, GREEN, "GELU\nlocal")
                s.rect(560, y, 170, 60, ORANGE, f"· W2[{'first' if r == 0 else 'second'} half, :]\nrows: partial [B T, C]")
            else:
                s.rect(260, y, 170, 60, BLUE, f"q, k, v of heads {2 * r}, {2 * r + 1}\nW_qkv columns")
                s.rect(450, y, 90, 60, GREEN, "softmax\n(q kᵀ) v")
                s.rect(560, y, 170, 60, ORANGE, "· W_proj rows\npartial [B T, C]")
            s.arrow(230, y0 + 125, 258, y + 30)
            s.arrow(430, y + 30, 448, y + 30)
            s.arrow(540, y + 30, 558, y + 30)
            s.arrow(730, y + 30, 768, y0 + 125)
        s.rect(770, y0 + 95, 60, 60, RED, "g", size=18)
        s.rect(850, y0 + 90, 120, 70, GREY, "Y = sum of\nthe partials")
        s.arrow(830, y0 + 125, 848, y0 + 125)
        s.arrow(150, y0 + 125, 168, y0 + 125)
    s.text(500, 585, "f: identity forward, all-reduce of dX backward.  g: all-reduce of the partial sums forward, "
                     "identity backward.  2 + 2 all-reduces of [B T, C] per layer.", size=13)
    s.write(path)


def grid3d(path):
    """lab06's default grid: t = p = d = 2 on two hosts of 4 ranks."""
    s = Svg(1000, 520)
    s.text(500, 30, "3D grid (lab06), t = p = d = 2:  rank = tp + t (dp + d pp), two hosts of 4 ranks", size=18,
           weight="bold")
    for pp in range(2):
        hy = 70 + pp * 200
        s.rect(120, hy, 620, 170, "#f4f4f4", stroke=GREY, dash=True)
        s.text(130, hy + 22, f"host {'AB'[pp]}", GREY, 14, "start")
        s.text(60, hy + 95, f"stage {pp}", size=15, weight="bold")
        s.text(60, hy + 115, f"layers [{4 * pp},{4 * pp + 4})", GREY, 12)
        for dp in range(2):
            gx = 160 + dp * 290
            s.rect(gx, hy + 40, 250, 110, "#ffffff", stroke=BLUE)
            s.text(gx + 125, hy + 60, f"TP group, dp {dp}", BLUE, 12)
            for tp in range(2):
                rank = tp + 2 * (dp + 2 * pp)
                s.rect(gx + 8 + tp * 122, hy + 72, 112, 64, BLUE, f"rank {rank}\n(tp {tp}, pp {pp}, dp {dp})", size=12)
    # pipelines: rank r (stage 0) -> r + 4 (stage 1)
    for dp in range(2):
        for tp in range(2):
            x = 160 + dp * 290 + 8 + tp * 122 + 56
            s.arrow(x, 206, x, 340)
    s.text(760, 105, "TP group: all-reduces in every", BLUE, 13, "start")
    s.text(760, 122, "layer: inside a host (NVLink)", BLUE, 13, "start")
    s.text(760, 270, "pipeline [0 4] [1 5] [2 6] [3 7]:", "#444444", 13, "start")
    s.text(760, 287, "one activation per micro-batch", "#444444", 13, "start")
    s.text(760, 304, "and boundary: across hosts", "#444444", 13, "start")
    s.text(760, 400, "DP groups [0 2] [1 3] [4 6] [5 7]:", GREEN, 13, "start")
    s.text(760, 417, "one gradient all-reduce per step", GREEN, 13, "start")
    s.text(760, 434, "(here inside a host)", GREEN, 13, "start")
    for pp in range(2):
        y = 70 + pp * 200 + 160
        s.items.append(f'<path d="M {160 + 65} {y} q 145 25 290 0" fill="none" stroke="{GREEN}" stroke-width="2" '
                       f'stroke-dasharray="5,3"/>')
    s.text(500, 490, "TP fastest, then DP, then PP: mpirun fills a host with consecutive ranks, so each TP group "
                     "lands on one host.", size=13)
    s.write(path)


def grid4d(path):
    """lab09's default run: t = c = p = 2, d = 1, on two hosts of 4 ranks; each rank's heads and positions."""
    s = Svg(1000, 560)
    s.text(500, 30, "lab09's mesh, t = c = p = 2:  rank = tp + t (cp + c (dp + d pp)), two hosts of 4 ranks", size=18,
           weight="bold")
    positions = ["positions 0-15, 48-63", "positions 16-47"]
    for pp in range(2):
        hy = 60 + pp * 220
        s.rect(120, hy, 620, 190, "#f4f4f4", stroke=GREY, dash=True)
        s.text(130, hy + 22, f"host {'AB'[pp]}", GREY, 14, "start")
        s.text(60, hy + 95, f"stage {pp}", size=15, weight="bold")
        s.text(60, hy + 115, f"layers {4 * pp}-{4 * pp + 3}", GREY, 12)
        for cp in range(2):
            gx = 160 + cp * 290
            s.rect(gx, hy + 35, 250, 140, "#ffffff", stroke=BLUE)
            s.text(gx + 125, hy + 55, f"TP group, cp {cp}: {positions[cp]}", BLUE, 12)
            for tp in range(2):
                rank = tp + 2 * (cp + 2 * (0 + 1 * pp))  # d = 1
                s.rect(gx + 8 + tp * 122, hy + 70, 112, 92, BLUE,
                       f"rank {rank}\n(tp {tp}, cp {cp})\nheads {2 * tp}-{2 * tp + 1}", size=12)
        # CP ring: rank r <-> r + 2 within a stage (same tp)
        for tp in range(2):
            x0 = 160 + 8 + tp * 122 + 56
            s.items.append(f'<path d="M {x0} {hy + 170} q 145 30 290 0" fill="none" stroke="{ORANGE}" '
                           f'stroke-width="2" stroke-dasharray="5,3"/>')
    for cp in range(2):
        for tp in range(2):
            x = 160 + cp * 290 + 8 + tp * 122 + 56 + (tp - 0.5) * 20
            s.arrow(x, 222, x, 348)
    s.text(760, 100, "TP group: 4 all-reduces per", BLUE, 13, "start")
    s.text(760, 117, "layer and micro-batch (NVLink)", BLUE, 13, "start")
    s.text(760, 215, "CP group [0 2] [1 3] ...: K and V", ORANGE, 13, "start")
    s.text(760, 232, "of the rank's heads, each attention", ORANGE, 13, "start")
    s.text(760, 300, "pipeline [0 4] [1 5] [2 6] [3 7]:", "#444444", 13, "start")
    s.text(760, 317, "one activation per micro-batch", "#444444", 13, "start")
    s.text(760, 334, "and boundary: across hosts", "#444444", 13, "start")
    s.text(760, 420, "replicas (cp x dp) [0 2] [1 3] ...:", GREEN, 13, "start")
    s.text(760, 437, "the same weights: one gradient", GREEN, 13, "start")
    s.text(760, 454, "all-reduce per step", GREEN, 13, "start")
    s.text(500, 535, "Each rank: 1/t of the heads and MLP units, 1/c of the positions, 1/p of the layers, 1/d of the "
                     "rows (d = 1 here).", size=13)
    s.write(path)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/charts"
    os.makedirs(out, exist_ok=True)
    tp_block(os.path.join(out, "tp_block.svg"))
    grid3d(os.path.join(out, "grid3d.svg"))
    grid4d(os.path.join(out, "grid4d.svg"))
    print(f"tp_block.svg, grid3d.svg, grid4d.svg in {out}")

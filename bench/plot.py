#!/usr/bin/env python3
"""Draws docs/bench.svg: each benchmark's measured figure divided by its goal (left of the line =
goal met). The figures are the ones in README's performance section; update both together.

Usage: bench/plot.py [OUT.svg]
"""
import sys

# (label, measured, goal, unit) — from README "Performance" (bench/run, 2 cores).
ROWS = [
    ("full snapshot → file, zstd, 1 GiB (× etcdctl save)", 0.77, 1.05, "×"),
    ("full snapshot → S3 (s3s-fs), 425 MiB (× limit)", 1.23, 1.15, "×"),
    ("  the same, completion after the last byte", 0.99, 1.15, "×"),
    ("full snapshot → S3 (s3s-fs), 1 GiB (× limit)", 1.04, 1.15, "×"),
    ("full snapshot → S3 (s3s-fs), 2 GiB (× limit)", 1.04, 1.15, "×"),
    ("snapshot peak RSS, 0.4–2.1 GiB DB (MiB)", 36.2, 40.0, "MiB"),
    ("restore 1.1 GiB + 102k revisions (× etcdutl)", 0.77, 1.0, "×"),
    ("restore 7.4 GiB + 200k revisions (× etcdutl)", 0.63, 1.0, "×"),
    ("  the same on etcd 3.7.3", 0.55, 1.0, "×"),
    ("full snapshot → S3 (s3s-fs), 8 GiB (× CPU floor)", 1.24, 1.10, "×"),
    ("restore peak RSS (MiB)", 27.2, 40.0, "MiB"),
    ("fencing: worst kill, 1 s interval (ms)", 948.0, 1050.0, "ms"),
    ("RPO, 1 s period: median lost window (s)", 0.34, 2.0, "s"),
    ("RPO, 10 s period: median lost window (s)", 1.17, 11.0, "s"),
    ("idle RSS beside etcd (MiB)", 10.0, 15.0, "MiB"),
    ("idle CPU (% of a core)", 0.067, 0.2, "%"),
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/bench.svg"
    w, left, bar_w, row_h, top = 900, 330, 480, 28, 40
    scale = bar_w / 2.5  # ratio 2.5 fills the bar area
    h = top + row_h * len(ROWS) + 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="13">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{left}" y="22" font-weight="bold">measured ÷ goal (left of the dashed line: goal met)</text>',
    ]
    for i, (label, measured, goal, unit) in enumerate(ROWS):
        y = top + i * row_h
        ratio = measured / goal
        colour = "#3a7d44" if ratio <= 1.0 else "#c0392b"
        length = min(ratio, 2.5) * scale
        parts.append(f'<text x="{left - 8}" y="{y + 17}" text-anchor="end">{label}</text>')
        parts.append(f'<rect x="{left}" y="{y + 5}" width="{length:.1f}" height="{row_h - 10}" fill="{colour}"/>')
        parts.append(f'<text x="{left + length + 6:.1f}" y="{y + 17}">{measured:g} / {goal:g} {unit}</text>')
    x1 = left + scale
    parts.append(f'<line x1="{x1}" y1="{top - 4}" x2="{x1}" y2="{top + row_h * len(ROWS)}" stroke="black" stroke-dasharray="4,3"/>')
    parts.append(f'<text x="{x1 - 4}" y="{h - 14}">1.0</text>')
    parts.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(parts) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

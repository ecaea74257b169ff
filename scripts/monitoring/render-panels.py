#!/usr/bin/python3
"""Draws the dashboard's panels as one PNG from a live Prometheus, so a reader sees what the
Grafana dashboard (deploy/monitoring/ivory-dashboard.json) shows before installing Grafana.
Run by scripts/monitoring/render-dashboard.sh, which points it at the Prometheus of the
integration test `monitoring` (a live `ivory serve`, admissions, a registry outage, a cache
flush). Each panel's queries (queries.json, variables filled in) are read with query_range over
the last minutes and drawn with matplotlib (Debian's python3-matplotlib); panels whose queries
return nothing in that set-up say so.

    render-panels.py PROMETHEUS_URL OUT.png [MINUTES]
"""

import json
import math
import sys
import time
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)

QUERIES = "deploy/monitoring/queries.json"


def query_range(base, promql, start, end, step):
    params = urllib.parse.urlencode({"query": promql, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{params}", timeout=30) as answer:
        body = json.load(answer)
    return body.get("data", {}).get("result", []) if body.get("status") == "success" else []


def panels(queries):
    """Panel title -> its queries, in the dashboard's order (alerts are left out)."""
    out = {}
    for q in queries["queries"]:
        if not q["id"].startswith("panel: "):
            continue
        title = q["id"][len("panel: "):].rsplit(" / ", 1)[0]
        out.setdefault(title, []).append(q["promql"])
    return out


def label_of(metric):
    text = ",".join(f"{k}={v}" for k, v in sorted(metric.items()) if k not in ("__name__",))
    return text[:48] or "value"


def main():
    base, out = sys.argv[1].rstrip("/"), sys.argv[2]
    minutes = float(sys.argv[3]) if len(sys.argv) > 3 else 3
    end = time.time()
    start = end - minutes * 60
    with open(QUERIES) as f:
        chosen = panels(json.load(f))
    columns = 4
    rows = math.ceil(len(chosen) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(columns * 4.2, rows * 2.6))
    for axis, (title, exprs) in zip(axes.flat, chosen.items()):
        drawn = 0
        for expr in exprs:
            for series in query_range(base, expr, start, end, 2)[:6]:
                points = [(float(t) - end, float(v)) for t, v in series["values"]
                          if v not in ("NaN", "+Inf", "-Inf")]
                if points:
                    xs, ys = zip(*points)
                    axis.plot(xs, ys, linewidth=1, label=label_of(series["metric"]))
                    drawn += 1
        axis.set_title(title, fontsize=7)
        axis.tick_params(labelsize=6)
        if drawn:
            axis.legend(fontsize=4, loc="upper left")
        else:
            axis.text(0.5, 0.5, "no data in this set-up", ha="center", va="center",
                      fontsize=7, color="grey", transform=axis.transAxes)
    for axis in list(axes.flat)[len(chosen):]:
        axis.axis("off")
    figure.suptitle("ivory dashboard panels, from the monitoring test's Prometheus "
                    f"(last {minutes:g} min, seconds before the end on the x axis)", fontsize=10)
    figure.tight_layout(rect=(0, 0, 1, 0.98))
    figure.savefig(out, dpi=80)
    print(f"render-panels: {len(chosen)} panels drawn into {out}", file=sys.stderr)


if __name__ == "__main__":
    main()

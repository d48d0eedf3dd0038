"""Where one rank's steps went, unit by unit, from its timeline
(shardline-train --trace, network_compare.py --trace): per unit and phase,
the seconds it computed and the seconds the step thread waited on
collectives before it, or inside it (the sparse lookup's exchanges), by op
kind: the exposed communication that unit's work waited for; the waits after the last backward (the step's last
reductions, the norm's and the loss's all-reduces) and the optimizer on
lines of their own. Medians over the steps after the first (a warm-up).

    .venv/bin/python bench/timeline_summary.py DIR/trace-rank-0.json [--steps 2,3]
"""
import argparse
import json
import statistics
import sys


def step_rows(spans, step):
    """[(label, compute s, {op: waited s})] of one step, in order."""
    lo, hi = step["ts"], step["ts"] + step["dur"]
    inside = sorted((e for e in spans if e["tid"] == 0 and e is not step and lo <= e["ts"] <= hi),
                    key=lambda e: e["ts"])
    rows, waits = [], {}
    for e in inside:
        name = e["name"]
        if name.startswith("wait "):
            # A wait inside a unit's span (the sparse lookup's exchanges) is
            # that unit's; otherwise it is the next one's.
            op = name[5:]
            if rows and e["ts"] < rows[-1][3]:
                rows[-1][2][op] = rows[-1][2].get(op, 0) + e["dur"] * 1e-6
                rows[-1][1] -= e["dur"] * 1e-6  # (not compute)
            else:
                waits[op] = waits.get(op, 0) + e["dur"] * 1e-6
            continue
        rows.append([name, e["dur"] * 1e-6, waits, e["ts"] + e["dur"]])
        waits = {}
    rows.append(["end of step", 0.0, waits, hi])
    return [(label, compute, w) for label, compute, w, _ in rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", default="", help="1-based steps to take (default: all but the first)")
    a = ap.parse_args()
    with open(a.trace) as f:
        spans = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    steps = [e for e in spans if e["tid"] == 0 and e["name"].startswith("step ")]
    wanted = {int(s) for s in a.steps.split(",")} if a.steps else {int(e["name"][5:]) for e in steps[1:]}
    steps = [e for e in steps if int(e["name"][5:]) in wanted]
    if not steps:
        sys.exit(f"timeline_summary: no steps {sorted(wanted)} in {a.trace}")
    per_step = [step_rows(spans, s) for s in steps]
    ops = sorted({op for rows in per_step for _, _, w in rows for op in w})
    labels = [label for label, _, _ in per_step[0]]
    print(f"# {a.trace}: steps {', '.join(e['name'][5:] for e in steps)} (median s)\n")
    print("| unit and phase | compute s | " + " | ".join(f"waited {op} s" for op in ops) + " |")
    print("|---|---|" + "---|" * len(ops))
    totals = {"compute": [], **{op: [] for op in ops}}
    for i, label in enumerate(labels):
        rows = [rows[i] for rows in per_step if i < len(rows) and rows[i][0] == label]
        compute = statistics.median(r[1] for r in rows)
        waited = {op: statistics.median(r[2].get(op, 0) for r in rows) for op in ops}
        print(f"| {label} | {compute:.3f} | " + " | ".join(f"{waited[op]:.3f}" for op in ops) + " |")
    for rows in per_step:
        totals["compute"].append(sum(r[1] for r in rows if not r[0].startswith("step")))
        for op in ops:
            totals[op].append(sum(r[2].get(op, 0) for r in rows))
    step_s = statistics.median(e["dur"] * 1e-6 for e in steps)
    print(f"| **step {step_s:.3f} s** | {statistics.median(totals['compute']):.3f} | "
          + " | ".join(f"{statistics.median(totals[op]):.3f}" for op in ops) + " |")


if __name__ == "__main__":
    main()

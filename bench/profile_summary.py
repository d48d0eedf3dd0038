"""Where a training step's time goes on a GPU, from a Kineto trace (Chrome's
trace format): shardline-train --profile FILE, or torch.profiler's
export_chrome_trace of the same steps.

    python3 bench/profile_summary.py TRACE.json [--steps K] [--top 12] [--label NAME]

Per step (the trace's span over K steps):
  span       from the first event to the last one's end (host and device)
  busy       the union of the device's kernels, copies and fills
  idle       span - busy: the device waiting on the host (launches, syncs,
             Python, the host's own work) or on a transfer it was not given
  kernels    launches per step; a step of many short kernels is bound by the
             host's launch rate (a few microseconds a launch) before the GPU's
  by kind    kernel time by what the kernel is (matrix products, attention,
             elementwise, reductions and norms, the optimizer, copies, NCCL)
and the largest kernels by total time, each under the ATen op that launched
it with that op's input types and shapes where the trace has them
(shardline-train --profile records them; torch.profiler with
record_shapes=True): what tells one copy from another. Without device events
(a CPU run, the script's dry run) it lists the host's ATen ops instead.
"""
import argparse
import collections
import gzip
import json
import re

# First match wins; names are CUDA kernels' (cuBLAS/cuBLASLt/CUTLASS's
# sm90_xmma/nvjet for matmuls, flash/fmha/cudnn for SDPA, PyTorch's
# elementwise and reduce templates, its fused and foreach Adam).
KINDS = [
    ("nccl", r"nccl"),
    ("attention", r"flash|fmha|attention|sdpa|cudnn"),
    ("matmul", r"gemm|xmma|nvjet|cutlass|cublas|wgmma|matmul|splitK|sm90_"),
    ("optimizer", r"adam|multi_tensor|foreach|fused_adam"),
    ("norm/softmax", r"norm|softmax|layer_norm|rms"),
    ("reduce", r"reduce|Reduce|sum_|argmax|max_"),
    ("copy/cast", r"copy|Copy|cast|memcpy|Memcpy|cat_|CatArray|index|gather|scatter"),
    ("elementwise", r"elementwise|vectorized|unrolled|Elementwise|pointwise|fill|Fill|memset|Memset"),
]
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name):
            return kind
    return "other"


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def merged(intervals):
    """The union of [start, stop) intervals as disjoint ones, in order."""
    out = []
    for start, stop in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], stop)
        else:
            out.append([start, stop])
    return out


def short(name, width=72):
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= width else name[:width - 3] + "..."


def launching_ops(events):
    """External id -> "op(type[dims], ...)" of the host op a kernel was launched under."""
    ops = {}
    for e in events:
        if e.get("cat") != "cpu_op":
            continue
        args = e.get("args", {})
        dims, types = args.get("Input Dims"), args.get("Input type")
        shapes = ""
        if dims and types:
            shapes = ", ".join(f"{t}{list(d)}" for t, d in zip(types, dims) if d)
        ops.setdefault(args.get("External id"), f"{e['name']}({shapes})" if shapes else e["name"])
    return ops


def summarize(events, steps, top=12):
    """The summary's lines, and a dict of its figures (milliseconds per step)."""
    timed = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    if not timed:
        return ["no timed events in the trace"], {}
    begin = min(e["ts"] for e in timed)
    end = max(e["ts"] + e["dur"] for e in timed)
    span = (end - begin) / steps / 1e3
    device = [e for e in timed if e.get("cat") in DEVICE_CATS]
    lines = []
    if not device:
        ops = collections.defaultdict(lambda: [0, 0.0])
        for e in timed:
            if e.get("cat") == "cpu_op":
                ops[e["name"]][0] += 1
                ops[e["name"]][1] += e["dur"]
        lines.append(f"span {span:.2f} ms/step; no device events (a CPU run): the host's ATen ops, inclusive time")
        for name, (n, us) in sorted(ops.items(), key=lambda kv: -kv[1][1])[:top]:
            lines.append(f"  {us / steps / 1e3:9.3f} ms  {n / steps:7.1f}/step  {short(name)}")
        return lines, {"span_ms": span}
    spans = merged([(e["ts"], e["ts"] + e["dur"]) for e in device])  # when the device was busy
    busy = sum(stop - start for start, stop in spans) / steps / 1e3
    kernels = [e for e in device if e.get("cat") == "kernel"]
    by_kind = collections.defaultdict(float)
    by_name = collections.defaultdict(lambda: [0, 0.0])
    by_op = collections.defaultdict(lambda: collections.Counter())  # kernel name -> its launching ops
    ops = launching_ops(events)
    for e in device:
        name = e["name"]
        by_kind[kind_of(name) if e.get("cat") == "kernel" else "copy/cast"] += e["dur"]
        by_name[name][0] += 1
        by_name[name][1] += e["dur"]
        by_op[name][ops.get(e.get("args", {}).get("External id"), "?")] += e["dur"]
    device_sum = sum(by_kind.values()) / steps / 1e3
    launches = sum(1 for e in timed if e.get("cat") == "cuda_runtime" and "aunch" in e["name"]) / steps
    gaps = (b[0] - a[1] for a, b in zip(spans, spans[1:]))  # idle between busy spans
    big_gaps = sum(g for g in gaps if g > 100) / steps / 1e3
    figures = {"span_ms": span, "busy_ms": busy, "idle_ms": span - busy, "kernels": len(kernels) / steps,
               "launches": launches, "gaps_over_100us_ms": big_gaps,
               **{f"{k}_ms": v / steps / 1e3 for k, v in by_kind.items()}}
    lines.append(f"span {span:.2f} ms/step: device busy {busy:.2f} ({busy / span:.0%}), idle {span - busy:.2f}; "
                 f"{len(kernels) / steps:.0f} kernels/step, {launches:.0f} launch calls/step; "
                 f"gaps over 100 us: {big_gaps:.2f} ms/step")
    lines.append("  by kind (device time, ms/step, % of the device's sum):")
    for kind, us in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {kind:<13} {us / steps / 1e3:8.2f}  {us / steps / 1e3 / device_sum:6.1%}")
    lines.append(f"  the {top} largest (ms/step, launches/step, kind, name; under it the op that launched it):")
    for name, (n, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"    {us / steps / 1e3:8.3f} {n / steps:6.1f}  {kind_of(name):<12} {short(name)}")
        for op, op_us in by_op[name].most_common(2):
            lines.append(f"                     {op_us / us:4.0%} {short(op, 96)}")
    return lines, figures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=3, help="steps the trace covers")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    lines, _ = summarize(load(a.trace), a.steps, a.top)
    print(f"== {a.label or a.trace}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

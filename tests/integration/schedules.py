"""[optimizer] schedule: the learning rate shardline-train uses at every step
of a 12-step run (rank 0's report) equals its counterpart's: nanoGPT's
get_lr for cosine (tests/oracle/nanogpt.py), transformers'
get_linear_schedule_with_warmup, get_constant_schedule_with_warmup and
get_wsd_schedule stepped as the HF Trainer steps them (a LambdaLR over
torch.optim's lr, read before each optimizer step).

Tolerance: both sides compute in IEEE double with the same operations in
the same order, and Python's math.cos is the same libm's cos: they agree to
the last bit, allowed 4 ulp (rel 1e-15) for a compiler that contracts a
multiply-add into an FMA."""
import os
import sys

import harness

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
from nanogpt import lr_at  # noqa: E402

STEPS, WARMUP, DECAY, LR = 12, 3, 4, 1e-3


def hf_lrs(schedule, min_lr):
    import torch
    from transformers import (get_constant_schedule_with_warmup, get_linear_schedule_with_warmup,
                              get_wsd_schedule)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    sched = {"linear": lambda: get_linear_schedule_with_warmup(opt, WARMUP, STEPS),
             "constant": lambda: get_constant_schedule_with_warmup(opt, WARMUP),
             "wsd": lambda: get_wsd_schedule(opt, WARMUP, DECAY, num_training_steps=STEPS,
                                             min_lr_ratio=min_lr / LR)}[schedule]()
    out = []
    for _ in range(STEPS):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def main():
    c = harness.Checks()
    cases = [("cosine", 1e-4), ("linear", 0.0), ("constant", 1e-4), ("wsd", 0.0), ("wsd", 1e-4)]
    for schedule, min_lr in cases:
        cfg = harness.config("no_shard", 1, micro_batches=1, train__steps=STEPS, optimizer__lr=LR,
                             optimizer__min_lr=min_lr, optimizer__warmup_steps=WARMUP, optimizer__schedule=schedule)
        if schedule == "wsd":
            cfg["optimizer"]["decay_steps"] = DECAY
        _, ranks = harness.run(cfg, 1)
        got = [s["lr"] for s in ranks[0]["steps"]]
        want = ([lr_at(s, STEPS, LR, min_lr, WARMUP) for s in range(STEPS)] if schedule == "cosine"
                else hf_lrs(schedule, min_lr))
        worst = max(abs(g - w) / max(abs(w), 1e-300) if w else abs(g) for g, w in zip(got, want))
        c.check(len(got) == STEPS and worst <= 1e-15,
                f"{schedule} (min_lr {min_lr:g}): the lr of every step equals its counterpart's",
                f"worst relative difference {worst:.1e}; got {[f'{x:.6g}' for x in got]}")
    # Distinct shapes, or the cases above could pass on one formula.
    c.check(len({tuple(round(x, 12) for x in hf_lrs(s, 0.0)) for s in ("linear", "constant", "wsd")}) == 3,
            "the three transformers schedules differ from each other")
    c.finish()


if __name__ == "__main__":
    main()

"""[train] max_nonfinite_skips: a step whose gradient norm is NaN (injected
with SHARDLINE_FAULT=nan-grad@3, as after an overflow) makes no update on any
rank, so the parameters after it equal, bitwise, those of a run that stopped
before it, and training goes on to finish. Without the key, or past it, the run
fails naming the step."""
import os

import harness


def main():
    checks = harness.Checks()
    world = 2
    # zero1 gathers the updated parameters after every step: a rank that
    # skipped while another did not would hang or corrupt, not pass.
    base = dict(train__max_nonfinite_skips=1, train__steps=3)
    out, _ = harness.run(harness.config("zero1", world, train__steps=2), world)
    before = harness.load_params(out)
    os.environ["SHARDLINE_FAULT"] = "nan-grad@3"
    try:
        out, ranks = harness.run(harness.config("zero1", world, **base), world)
        after = harness.load_params(out)
        steps = ranks[0]["steps"]
        checks.check([s["skipped"] for s in steps] == [False, False, True] and steps[2]["grad_norm"] is None,
                     "step 3 is skipped, its gradient norm reported as not finite", str(steps[2]))
        same = all((before[k] == after[k]).all() for k in before)
        checks.check(same, "the skipped step left every parameter as it was (bitwise)")
        out, ranks = harness.run(harness.config("zero1", world, **dict(base, train__steps=6)), world)
        checks.check(len(ranks[0]["steps"]) == 6 and ranks[0]["steps"][-1]["loss"] is not None,
                     "training goes on after the skipped step", str(ranks[0]["steps"][-1]))
        try:
            harness.run(harness.config("zero1", world, train__steps=5), world)
            checks.check(False, "without max_nonfinite_skips the NaN step fails the run")
        except harness.RunError as e:
            msg = str(e)
            checks.check("step 3: the loss is" in msg and "gradient norm nan" in msg and "training diverged" in msg,
                         "without max_nonfinite_skips the NaN step fails the run, naming it", msg[-200:])
    finally:
        del os.environ["SHARDLINE_FAULT"]
    checks.finish()


if __name__ == "__main__":
    main()

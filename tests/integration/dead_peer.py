"""A rank killed with SIGKILL mid-training: the surviving ranks' next
collective fails within its deadline, and each exits non-zero with one line
naming its rank, the op and the peer it lost by number (never a hang)."""
import os
import re
import signal
import subprocess
import time

import harness

DEADLINE = 5


def main():
    checks = harness.Checks()
    world = 3
    cfg = harness.config("full_shard", world, micro_batches=1, train__steps=100000)
    out = harness.scratch_dir("shardline-dead-")
    path = os.path.join(out, "job.toml")
    harness.write_toml(cfg, path)
    port = harness.free_port()
    procs = [subprocess.Popen([harness.TRAIN, "--config", path, "--rank", str(r), "--world", str(world),
                               "--store-port", str(port), "--timeout", str(DEADLINE)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    # Wait until training is really under way (rank 0 printed three steps).
    for _ in range(3):
        line = procs[0].stdout.readline()
        checks.check('"step"' in line, "training started", line.strip()[:60])
    killed = 2
    os.kill(procs[killed].pid, signal.SIGKILL)
    killed_at = time.time()
    named = set()
    for r in (0, 1):
        try:
            _, err = procs[r].communicate(timeout=DEADLINE + 10)
        except subprocess.TimeoutExpired:
            procs[r].kill()
            checks.check(False, f"rank {r} exits", "still running: hung")
            continue
        took = time.time() - killed_at
        last = err.strip().splitlines()[-1] if err.strip() else ""
        checks.check(procs[r].returncode != 0, f"rank {r} exits non-zero", f"rc={procs[r].returncode}")
        checks.check(took <= DEADLINE + 3, f"rank {r} fails within the deadline", f"{took:.1f}s")
        checks.check(f"[rank {r}]" in last and any(op in last for op in ("all_gather", "reduce_scatter", "all_reduce")),
                     f"rank {r} names itself and the op", last)
        checks.check(len(err.strip().splitlines()) == 1, f"rank {r} error is one line")
        # The peer, by its number ("[rank r]" alone would satisfy a check for
        # the word). Every op of a full_shard step runs on the ring (its
        # all-reduces are a few scalars) and names the neighbour it lost:
        # rank 0 receives from the killed rank 2; rank 1 sends to rank 2, or
        # receives from rank 0 when rank 0 failed and left first.
        peers = [int(p) for p in re.findall(r"(?:from|to) rank (\d+)\b", last)]
        named.update(peers)
        expected = (killed,) if r == 0 else (killed, 0)
        checks.check(bool(peers) and all(p in expected for p in peers),
                     f"rank {r} names the peer it lost ({' or '.join(map(str, expected))})", str(peers))
    checks.check(killed in named, f"the killed rank {killed} is named by a survivor", str(sorted(named)))
    procs[killed].wait()
    checks.finish()


if __name__ == "__main__":
    main()

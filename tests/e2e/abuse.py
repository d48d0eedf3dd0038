"""A worker holding a real rank presses the rendezvous store with its
credential (tests/e2e/store_abuse.cc): five rounds of 1 MiB values until the
store refuses one (its per-job limit), deleted again, then 1000 waits given up
after 100 ms. The store refuses past the limit every round, every abandoned
wait is freed before the next round (none is refused for too many pending
waits), and the coordinator's resident memory after the fifth round is within
32 MiB of what it was after the second."""
import os
import subprocess

from cluster import BUILD, Checks, Cluster, job_file, wait_for

ABUSER = os.path.join(BUILD, "tests", "store_abuse")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    c = Checks()
    cl = Cluster(token="user-token", worker_token="worker-token")
    p = subprocess.Popen([ABUSER, cl.address, cl.worker_token_file, "5"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    c.check(p.stdout.readline().strip() == "registered", "the abuser registers as a worker")
    wait_for(lambda: cl.ctl_json("workers")["workers"], 10, "the abuser in the registry")
    job = cl.ctl_json("submit", job_file(cl.dir, "victim", workers=1, steps=1000000))["job_id"]
    rss, rounds = [], []
    for _ in range(5):
        line = p.stdout.readline().split()
        if not line:
            break
        rounds.append(dict(zip(line[0::2], (int(v) for v in line[1::2]))))
        rss.append(rss_mib(cl.coordinator.pid))
    p.wait(timeout=60)
    c.check(len(rounds) == 5, "five rounds ran", p.stderr.read().strip()[-200:])
    # 8 MiB per job: eight values of just under 1 MiB fit, the ninth is refused (RESOURCE_EXHAUSTED = 8).
    c.check(all(r["set"] == 8 and r["refused_set"] == 8 for r in rounds),
            "each round the job's values fit up to its limit and the next is refused", str(rounds))
    c.check(all(r["refused_waits"] == 0 for r in rounds), "abandoned waits are freed: none refused in later rounds",
            str([r["refused_waits"] for r in rounds]))
    # After the second round (the allocator's arenas have grown to what one round needs).
    c.check(len(rss) == 5 and rss[-1] - rss[1] < 32, "the coordinator's memory stays flat",
            " -> ".join(f"{v:.0f}" for v in rss) + " MiB")
    c.check(cl.coordinator.poll() is None and cl.job(job)["id"] == job, "the coordinator still serves")
    c.finish()


if __name__ == "__main__":
    main()

"""End to end with the real binaries on loopback: submit -> RUNNING ->
SUCCEEDED with the loss falling; cancel; a job asking for more workers than
are idle waits and starts when one joins; kill -9 of a worker mid-job fails
the job within 10 s naming the rank, and the other workers are idle again;
kill -9 and restart of the coordinator keeps the job list; the coordinator's
log (--log-format json) has one JSON line per worker joined or lost and per
job submitted or changing state, with the reason; SIGTERM is logged."""
import json
import signal
import subprocess
import time

from cluster import Checks, Cluster, job_file, wait_for


def main():
    c = Checks()
    cl = Cluster(coordinator_args=["--log-format", "json"])
    for h in ("host-a", "host-b"):
        cl.add_worker(h)
    cl.wait_workers(2)

    # 1. submit --follow: the progress stream ends SUCCEEDED and the loss falls.
    rc, out, err = cl.ctl("--json", "submit", job_file(cl.dir, "learn", steps=40), "--follow", timeout=180)
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    job_id = lines[0]["job_id"]
    snaps = [l for l in lines[1:] if l.get("step", 0) > 0]
    c.check(rc == 0, "submit --follow exits 0", err.strip())
    c.check(snaps and snaps[-1]["state"] == "SUCCEEDED", "job SUCCEEDED", snaps[-1]["state"] if snaps else "")
    c.check(any(s["state"] == "RUNNING" for s in snaps), "job was RUNNING on the way")
    first, last = snaps[0]["loss"], snaps[-1]["loss"]
    c.check(last < first * 0.9, "loss fell clearly", f"{first:.4f} -> {last:.4f}")
    status = cl.job(job_id)
    c.check(status["step"] == 40 and status["state"] == "SUCCEEDED", "status --json after the run",
            json.dumps({k: status[k] for k in ("id", "name", "state", "step", "loss", "message")}))
    rc, out, _ = cl.ctl("watch", job_id)
    c.check(rc == 0 and "SUCCEEDED" in out, "watch of a finished job exits 0")

    # 2. cancel a running job: it stops and the workers go back to idle.
    rc, out, _ = cl.ctl("--json", "submit", job_file(cl.dir, "long", steps=1000000))
    long_id = json.loads(out)["job_id"]
    wait_for(lambda: cl.job(long_id)["step"] > 2, 60, "the long job to make progress")
    rc, out, _ = cl.ctl("cancel", long_id)
    c.check(rc == 0 and "CANCELLED" in out, "cancel answers CANCELLED")
    t0 = time.time()
    idle = wait_for(lambda: len(cl.idle_workers()) >= 2, 20, "2 idle workers", fail=False)
    c.check(idle, "workers idle after cancel", f"{time.time() - t0:.1f}s")
    rc, _, err = cl.ctl("watch", long_id)
    c.check(rc != 0, "watch of a cancelled job exits non-zero", err.strip())
    rc, _, err = cl.ctl("cancel", long_id)
    c.check(rc != 0 and "already CANCELLED" in err, "cancelling twice is an error", err.strip())

    # 3. three workers wanted, two idle: PENDING until a third joins.
    rc, out, _ = cl.ctl("--json", "submit", job_file(cl.dir, "three", workers=3, steps=10))
    three = json.loads(out)["job_id"]
    time.sleep(1.5)
    c.check(cl.job(three)["state"] == "PENDING", "waits while too few workers are idle")
    cl.add_worker("host-c")
    wait_for(lambda: cl.job(three)["state"] in ("RUNNING", "SUCCEEDED"), 30, "the job to start")
    rc, _, _ = cl.ctl("watch", three, timeout=120)
    c.check(rc == 0, "starts when a worker joins and succeeds")
    ranks = cl.job(three)["worker_ids"]
    hosts = {w["id"]: w["host"] for w in cl.ctl_json("workers")["workers"]}
    c.check([hosts[w] for w in ranks] == ["host-a", "host-b", "host-c"], "ranks follow host order",
            str([hosts[w] for w in ranks]))

    # 4. kill -9 of the worker holding rank 1, mid-job.
    cl.wait_workers(3)
    rc, out, _ = cl.ctl("--json", "submit", job_file(cl.dir, "victim", workers=3, steps=1000000, restarts=0))
    victim = json.loads(out)["job_id"]
    wait_for(lambda: cl.job(victim)["step"] > 2, 60, "the victim job to make progress")
    rank1 = hosts[cl.job(victim)["worker_ids"][1]]
    cl.workers[rank1].send_signal(signal.SIGKILL)
    t0 = time.time()
    failed = wait_for(lambda: cl.job(victim)["state"] == "FAILED", 10, "the job to fail", fail=False)
    msg = cl.job(victim)["message"]
    c.check(failed, "job FAILED after kill -9", f"{time.time() - t0:.1f}s")
    c.check("rank 1" in msg and rank1 in msg, "failure names the rank and host", msg)
    idle = wait_for(lambda: len(cl.idle_workers()) >= 2, 15, "2 idle workers", fail=False)
    c.check(idle, "the other workers are idle again")
    check_log(c, cl, job_id, long_id, victim, rank1)

    # 5. kill -9 and restart of the coordinator keeps the job list.
    before = {j["id"]: j["state"] for j in cl.ctl_json("jobs")["jobs"]}
    cl.kill_coordinator()
    cl.start_coordinator()
    after = {j["id"]: j["state"] for j in cl.ctl_json("jobs")["jobs"]}
    c.check(after == before, "job list survives kill -9", str(after))
    back = wait_for(lambda: len(cl.idle_workers()) >= 2, 20, "2 idle workers", fail=False)
    c.check(back, "workers reconnect to the new coordinator")
    rc, _, _ = cl.ctl("submit", job_file(cl.dir, "again", steps=5), "--follow", timeout=120)
    c.check(rc == 0, "a job runs after the restart")

    # 6. SIGTERM of the workers mid-job: each exits promptly (a stopping
    # worker never waits on a job stuck with a peer that is gone).
    rc, out, _ = cl.ctl("--json", "submit", job_file(cl.dir, "doomed", steps=1000000, restarts=0))
    doomed = json.loads(out)["job_id"]
    wait_for(lambda: cl.job(doomed)["step"] > 2, 60, "the doomed job to make progress")
    t0 = time.time()
    running = [p for p in cl.workers.values() if p.poll() is None]
    for p in running:
        p.send_signal(signal.SIGTERM)
    codes = [p.wait(timeout=15) for p in running]
    c.check(time.time() - t0 < 8, "workers stop within the bound after SIGTERM",
            f"{time.time() - t0:.1f}s, exit codes {codes}")
    failed = wait_for(lambda: cl.job(doomed)["state"] == "FAILED", 10, "the job to fail", fail=False)
    c.check(failed, "the job fails when its workers stop", cl.job(doomed)["message"])

    # 7. SIGTERM of the coordinator while a rank waits in rendezvous for a
    # peer that never comes (stopped): it answers the wait and exits at once,
    # not when the wait would have timed out.
    cl2 = Cluster()
    cl2.add_worker("host-live", collective_timeout=30)
    stopped = cl2.add_worker("host-stopped", collective_timeout=30)
    cl2.wait_workers(2)
    stopped.send_signal(signal.SIGSTOP)
    rc, out, _ = cl2.ctl("--json", "submit", job_file(cl2.dir, "waits", steps=5))
    waits = json.loads(out)["job_id"]
    wait_for(lambda: cl2.job(waits)["state"] != "PENDING", 10, "the job to start")
    time.sleep(1)  # the live rank has set its address and waits for its peer's
    t0 = time.time()
    cl2.coordinator.send_signal(signal.SIGTERM)
    try:
        code = cl2.coordinator.wait(timeout=30)
    except subprocess.TimeoutExpired:
        code = None
        cl2.coordinator.kill()
    c.check(time.time() - t0 < 5 and code == 0, "the coordinator stops within 5 s of SIGTERM with a store wait pending",
            f"{time.time() - t0:.1f}s, exit code {code}")
    stopped.send_signal(signal.SIGCONT)
    c.check("coordinator_stopping signal=15" in cl2.coordinator_log(), "the stop is logged (text form)",
            cl2.coordinator_log().strip()[-200:])
    c.finish()


def check_log(c, cl, learn, cancelled, victim, victim_host):
    """What an operator reads in the coordinator's log of sections 1-4."""
    raw = [l for l in cl.coordinator_log().splitlines() if l.strip()]
    try:
        log = [json.loads(l) for l in raw]
    except ValueError as e:
        c.check(False, "every line of the log is JSON", f"{e}: {raw[:3]}")
        return
    c.check(all(l.get("time", "").endswith("Z") and l.get("event") for l in log), "each line has its time and event")

    def has(event, **fields):
        return any(l["event"] == event and all(l.get(k) == v for k, v in fields.items()) for l in log)
    c.check(has("coordinator_started") and has("worker_joined", host="host-a") and has("worker_joined", host="host-b"),
            "start and the workers joining are logged")
    c.check(has("job_submitted", job=learn, name="learn", workers=2), "the submit is logged")
    states = [l["to"] for l in log if l["event"] == "job_state" and l["job"] == learn]
    c.check(states == ["RUNNING", "SUCCEEDED"], "each state change of a job, once", str(states))
    c.check(has("job_state", job=cancelled, to="CANCELLED", message="cancelled by the user"), "the cancel is logged")
    c.check(has("worker_lost", host=victim_host, job=victim, rank=1), "the lost worker is logged with its job and rank")
    failed = [l for l in log if l["event"] == "job_state" and l["job"] == victim and l["to"] == "FAILED"]
    c.check(failed and "rank 1" in failed[0]["message"], "the failure is logged with its reason",
            failed[0]["message"] if failed else "")


if __name__ == "__main__":
    main()

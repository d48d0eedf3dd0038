"""Observability end to end: Debian's Prometheus server on loopback scrapes a
local cluster (the coordinator, and the workers it lists at /sd/workers)
that runs a job, with the shipped scrape config and alert rules.

Asserts: promtool accepts both shipped configs and the rules, and every
/metrics page; every panel query of the shipped Grafana dashboard evaluates
and returns data; every alert expression evaluates and every rule is healthy;
a SIGSTOPped worker is named as the stalled rank within 15 s by
`shardctl status` and by shardline_rank_stalled, and ShardlineJobStalled
fires for it; after SIGCONT the stall clears and the job trains on; kill -9
of a worker fires ShardlineWorkerLost.

The coordinator runs with --lost-after-missed 60 (30 s of silence before a
worker is lost) so that a paused rank is seen as a stall first; with the
defaults (3 missed heartbeats) the job would fail at once naming the rank,
which tests/e2e/lifecycle.py covers."""
import json
import os
import re
import signal
import subprocess
import time
import urllib.parse
import urllib.request

from cluster import Checks, Cluster, free_port, job_file, wait_for

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PROM_DIR = os.path.join(ROOT, "deploy", "prometheus")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "shardline-dashboard.json")
RATE_WINDOW = "15s"  # what Grafana's $__rate_interval is at a 1 s scrape interval, with margin


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Prometheus:
    def __init__(self, workdir, coordinator_metrics):
        # The shipped local config, pointed at this cluster's coordinator and
        # sped up to 1 s (scrape, discovery, rule evaluation); rules unchanged.
        with open(os.path.join(PROM_DIR, "prometheus-local.yml")) as f:
            cfg = f.read()
        cfg = cfg.replace("localhost:9400", coordinator_metrics)
        cfg = re.sub(r"(scrape_interval|evaluation_interval|refresh_interval): \d+s", r"\1: 1s", cfg)
        cfg = cfg.replace("  - alerts.yml", "  - " + os.path.join(os.path.abspath(PROM_DIR), "alerts.yml"))
        self.config = os.path.join(workdir, "prometheus.yml")
        with open(self.config, "w") as f:
            f.write(cfg)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(workdir, "prometheus.log"), "w")
        self.proc = subprocess.Popen(["prometheus", f"--config.file={self.config}",
                                      f"--storage.tsdb.path={os.path.join(workdir, 'tsdb')}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(self.ready, 60, "Prometheus to be ready")

    def ready(self):
        try:
            return "Ready" in http_get(self.url + "/-/ready", timeout=1)
        except OSError:
            return False

    def api(self, path, **params):
        q = urllib.parse.urlencode(params)
        try:
            return json.loads(http_get(f"{self.url}/api/v1/{path}?{q}"))
        except urllib.error.HTTPError as e:  # 400/422 carry the error as JSON
            return json.loads(e.read().decode())

    def query(self, expr):
        return self.api("query", query=expr)

    def firing(self, alert):
        alerts = self.api("alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"].get("alertname") == alert and a["state"] == "firing"]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def panel_queries():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            expr = t["expr"].replace("$__rate_interval", RATE_WINDOW).replace('"$job"', '".*"')
            out.append((p["title"], t["legendFormat"], expr))
    return out


def alert_rules():
    rules = []
    with open(os.path.join(PROM_DIR, "alerts.yml")) as f:
        text = f.read()
    # The rules file is YAML; Prometheus itself parses it below (/api/v1/rules).
    # Here only the names, to check each is loaded.
    for m in re.finditer(r"- alert: (\S+)", text):
        rules.append(m.group(1))
    return rules


def promtool(*args, stdin=None):
    r = subprocess.run(["promtool", *args], input=stdin, capture_output=True, text=True, timeout=60)
    return r.returncode, (r.stdout + r.stderr).strip()


def main():
    c = Checks()
    for cfg in ("prometheus-local.yml", "prometheus-kubernetes.yml"):
        rc, out = promtool("check", "config", os.path.join(PROM_DIR, cfg))
        c.check(rc == 0, f"promtool check config {cfg}", "" if rc == 0 else out)
        with open(os.path.join(PROM_DIR, cfg)) as f:
            c.check("`job` label" not in f.read(), f"{cfg} names the job label the series carry (job_id)")
    rc, out = promtool("check", "rules", os.path.join(PROM_DIR, "alerts.yml"))
    c.check(rc == 0, "promtool check rules alerts.yml", out.splitlines()[-1] if out else "")

    metrics_port = free_port()
    cl = Cluster(coordinator_args=["--metrics-port", str(metrics_port), "--lost-after-missed", "60",
                                   "--stall-after", "3"])
    coord_metrics = f"127.0.0.1:{metrics_port}"
    for h in ("host-a", "host-b"):
        cl.add_worker(h, args=["--metrics-port", "0"], collective_timeout=120)
    cl.wait_workers(2)
    prom = Prometheus(cl.dir, coord_metrics)

    ckpt = '\n[checkpoint]\ndir = "ckpt"\ninterval = 200\nkeep_latest = 2\n'
    rc, out, err = cl.ctl("submit", job_file(cl.dir, "watched", steps=10_000_000, extra=ckpt, eval_interval=5,
                                               restarts=0))
    job = out.strip()
    c.check(rc == 0 and job.startswith("job-"), "job submitted", err.strip())
    wait_for(lambda: cl.job(job)["step"] > 0, 60, "the job's first step")

    # Every /metrics page is valid exposition format.
    targets = json.loads(http_get(f"http://{coord_metrics}/sd/workers"))
    c.check(len(targets) == 2, "/sd/workers lists both workers", json.dumps(targets))
    pages = {"coordinator": coord_metrics} | {t["labels"]["shardline_host"]: t["targets"][0] for t in targets}
    for name, addr in pages.items():
        page = http_get(f"http://{addr}/metrics")
        rc, out = promtool("check", "metrics", stdin=page)
        c.check(rc == 0 and not out, f"promtool check metrics: {name} (clean, no lint warnings)", out[:300])
        missing = [m for m in ("shardline_build_info{", "process_cpu_seconds_total ", "process_resident_memory_bytes ",
                               "process_virtual_memory_bytes ", "process_open_fds ", "process_max_fds ",
                               "process_start_time_seconds ") if f"\n{m}" not in page]
        c.check(not missing, f"{name} carries shardline_build_info and the process metrics", ", ".join(missing))
        c.check(not re.search(r'[{,]job="', page), f"{name}: no series labelled job (it is job_id)")

    # Prometheus scrapes all three, discovered through the coordinator.
    up = wait_for(lambda: (lambda r: len(r) == 3 and all(x["value"][1] == "1" for x in r) and r)(
        prom.query('up')["data"]["result"]), 30, "3 healthy scrape targets")
    c.check(len(up) == 3, "Prometheus scrapes the coordinator and both workers",
            ", ".join(sorted(x["metric"]["instance"] for x in up)))

    # Every panel query evaluates and returns data (rates need a few scrapes,
    # checkpoint panels a commit: poll until all do or the deadline).
    queries = panel_queries()
    empty = {}
    deadline = time.time() + 90
    pending = list(queries)
    while pending and time.time() < deadline:
        still = []
        for title, legend, expr in pending:
            r = prom.query(expr)
            if r["status"] != "success":
                empty[(title, legend)] = r.get("error", "?")
                continue
            if not r["data"]["result"]:
                still.append((title, legend, expr))
        pending = still
        if pending:
            time.sleep(2)
    for title, legend, expr in queries:
        key = (title, legend)
        if key in empty:
            c.check(False, f"panel query evaluates: {title} [{legend}]", empty[key])
    c.check(not empty, f"all {len(queries)} panel queries evaluate without error")
    for title, legend, expr in pending:
        c.check(False, f"panel returns data: {title} [{legend}]", expr)
    c.check(not pending, f"all {len(queries)} panel queries return data")

    # Every alert rule is loaded and evaluates without error.
    names = alert_rules()
    wait_for(lambda: all(r.get("lastEvaluation", "").startswith("20") for r in
                         [x for g in prom.api("rules")["data"]["groups"] for x in g["rules"]]), 20,
             "every rule evaluated")
    loaded = {r["name"]: r for g in prom.api("rules")["data"]["groups"] for r in g["rules"]}
    for n in names:
        r = loaded.get(n)
        c.check(r is not None and r["health"] == "ok", f"alert rule {n} evaluates",
                "missing" if r is None else r.get("lastError", ""))
        if r is not None:
            q = prom.query(r["query"])
            c.check(q["status"] == "success", f"alert expression {n} evaluates as a query", q.get("error", ""))
    c.check(not prom.firing("ShardlineJobStalled"), "no stall alert while the job trains")

    # SIGSTOP rank 1's worker: named within 15 s by status and by a metric;
    # the stalled-job alert fires for it.
    rank1 = cl.job(job)["worker_ids"][1]
    stopped = cl.workers["host-b"]
    stopped.send_signal(signal.SIGSTOP)
    t0 = time.time()

    def status_names_rank1():
        rc, out, _ = cl.ctl("status", job)
        return "STALLED" in out and "rank 1 on host host-b" in out and out

    out = wait_for(status_names_rank1, 15, "shardctl status to name the stalled rank")
    t_status = time.time() - t0
    c.check(t_status <= 15, "shardctl status names rank 1 as stalled within 15 s", f"after {t_status:.1f}s")
    print(out)
    j = cl.job(job)
    c.check(j["state"] == "RUNNING" and [r["rank"] for r in j["ranks"] if r["stalled"]] == [1],
            "status --json flags rank 1 only, and the job still runs", json.dumps(j["ranks"]))
    res = wait_for(lambda: prom.query(f'shardline_rank_stalled{{job_id="{job}"}} == 1')["data"]["result"],
                   15 - (time.time() - t0) + 1, "shardline_rank_stalled in Prometheus")
    t_metric = time.time() - t0
    c.check([x["metric"]["rank"] for x in res] == ["1"] and t_metric <= 16,
            "shardline_rank_stalled names rank 1 in Prometheus", f"after {t_metric:.1f}s")
    alerts = wait_for(lambda: prom.firing("ShardlineJobStalled"), 20, "ShardlineJobStalled to fire")
    c.check(alerts[0]["labels"].get("rank") == "1" and alerts[0]["labels"].get("job_id") == job,
            "ShardlineJobStalled fires for rank 1", f"after {time.time() - t0:.1f}s: {alerts[0]['labels']}")

    # SIGCONT: the stall clears and training goes on.
    stopped.send_signal(signal.SIGCONT)
    step_before = cl.job(job)["step"]
    wait_for(lambda: (lambda j: not j["stalled"] and j["step"] > step_before + 5)(cl.job(job)), 30,
             "the stall to clear after SIGCONT")
    c.check(cl.job(job)["state"] == "RUNNING", "after SIGCONT the stall clears and the job trains on")
    c.check(rank1 == cl.job(job)["worker_ids"][1], "the same worker is still rank 1")

    # kill -9 of a worker: ShardlineWorkerLost fires.
    stopped.send_signal(signal.SIGKILL)
    stopped.wait()
    failed = wait_for(lambda: (lambda j: j["state"] == "FAILED" and j)(cl.job(job)), 15, "the job to fail")
    c.check("rank 1" in failed["message"], "the lost worker's job fails naming rank 1", failed["message"])
    lost = wait_for(lambda: prom.firing("ShardlineWorkerLost"), 20, "ShardlineWorkerLost to fire")
    c.check(bool(lost), "ShardlineWorkerLost fires")
    desc = lost[0].get("annotations", {}).get("description", "") if lost else ""
    c.check(re.match(r"1 worker\(s\) dropped", desc) is not None,
            "its description counts whole workers (increase() extrapolates to fractions)", desc[:80])
    page = http_get(f"http://{coord_metrics}/metrics")
    c.check(f'job_id="{job}"' not in page, "an ended job's rank series leave the coordinator's page")

    # The surviving worker's page keeps its (now ended) job's series, still:
    # the token counter and the FLOPs formula against the job's shapes.
    page = http_get(f"http://{pages['host-a']}/metrics")
    value = lambda name: float(re.search(rf"^{name}{{[^}}]*}} (\S+)$", page, re.M).group(1))
    steps, tokens = value("shardline_step"), value("shardline_tokens_total")
    split = {m[1]: float(m[2]) for m in re.finditer(r'^shardline_step_time_split_seconds{[^}]*part="(\w+)"[^}]*} (\S+)$',
                                                   page, re.M)}
    c.check(sorted(split) == ["all_gather", "all_reduce", "compute", "optimizer", "reduce_scatter"]
            and min(split.values()) >= 0 and split["compute"] > 0 and split["optimizer"] > 0,
            "shardline_step_time_split_seconds: the last step by part (compute, waits by op, optimizer)", str(split))
    c.check(steps > 0 and tokens == steps * 12 * 16 / 2, "tokens_total = steps x batch tokens / world",
            f"{tokens:.0f} tokens over {steps:.0f} steps")
    L, H, E, V, T = 2, 4, 32, 64, 16  # cluster.JOB's model
    n = V * E + L * (2 * E + E * 3 * E + 3 * E + E * E + E + 2 * E + E * 4 * E + 4 * E + 4 * E * E + E) + 2 * E
    c.check(value("shardline_model_flops_per_token") == 6 * n + 12 * L * H * (E // H) * T,
            "model FLOPs per token = 6N + 12*L*H*Q*T (N without wpe)", f"{6 * n + 12 * L * H * (E // H) * T}")
    prom.stop()
    c.finish()


if __name__ == "__main__":
    main()

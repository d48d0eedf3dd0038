"""A wrong or missing token is refused (UNAUTHENTICATED) and the right one
works, for shardctl and for workers. Roles: the workers' token cannot list or
submit jobs and the users' cannot open a worker session (PERMISSION_DENIED,
counted in shardline_coordinator_refused_total{what="role"}); a token is
rotated by adding the new one and SIGHUP, then removing the old one and
SIGHUP. /metrics asks for its own bearer token (401 without it). Bad job files, both through shardctl's
own checks and sent straight to the coordinator: malformed TOML, unknown keys,
wrong types, n_embd not divisible by n_head, batch not divisible by the world
size, a missing data file: each is one line naming the key or file, exit 1,
and the coordinator keeps serving. Integers past their bounds, an infinite
lr, an empty file and a model past any machine (or past int64) are refused
the same way, by `shardctl plan` too, whose flags are bounded like
--workers and --page-size; a job whose loss diverges to NaN FAILS naming the
step; --heartbeat-ms 0 stops the coordinator at start."""
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

import cluster
from cluster import WORKER, Checks, Cluster, job_file, wait_for


def one_line(err):
    return len(err.strip().splitlines()) == 1


def scrape(port, token=None):
    """(HTTP status, body) of the coordinator's /metrics."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def check_roles_rotation_and_metrics(c, cl, metrics_port):
    rc, _, err = cl.ctl("--token-file", cl.worker_token_file, "jobs", token=False)
    c.check(rc == 1 and "a worker token may not call ListJobs" in err and one_line(err),
            "the workers' token cannot list jobs", err.strip())
    rc, _, err = cl.ctl("--token-file", cl.worker_token_file, "submit", job_file(cl.dir, "w", workers=1),
                        token=False)
    c.check(rc == 1 and "may not call SubmitJob" in err, "the workers' token cannot submit", err.strip())
    p = subprocess.Popen([WORKER, "--coordinator", cl.address, "--host", "as-user", "--token-file", cl.token_file],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1.5)
    p.kill()
    log = p.stdout.read()
    hosts = [w["host"] for w in cl.ctl_json("workers")["workers"]]
    c.check("as-user" not in hosts and "a user token may not call WorkerSession" in log,
            "the users' token cannot open a worker session", log.strip().splitlines()[0] if log.strip() else "")

    status, _ = scrape(metrics_port)
    c.check(status == 401, "/metrics without its token: 401", str(status))
    status, body = scrape(metrics_port, "scrape-token")
    refused = [l for l in body.splitlines() if l.startswith('shardline_coordinator_refused_total{what="role"}')]
    c.check(status == 200 and refused and float(refused[0].split()[-1]) >= 3,
            "/metrics with its token, counting the refused roles", refused[0] if refused else str(status))

    # Rotation: the new token works beside the old, then alone.
    new = cl.secret_file("new-token", "n3w-token")
    with open(cl.token_file, "a") as f:
        f.write("n3w-token\n")
    cl.coordinator.send_signal(signal.SIGHUP)
    ok = wait_for(lambda: cl.ctl("--token-file", new, "jobs", token=False)[0] == 0, 10, "the new token", fail=False)
    c.check(ok and cl.ctl("jobs")[0] == 0, "after SIGHUP the new token works beside the old one")
    old = cl.secret_file("old-token", "s3cret-token")
    cl.secret_file("token", "n3w-token")
    cl.coordinator.send_signal(signal.SIGHUP)
    ok = wait_for(lambda: "wrong token" in cl.ctl("--token-file", old, "jobs", token=False)[2], 10,
                  "the old token's removal", fail=False)
    c.check(ok and cl.ctl("--token-file", new, "jobs", token=False)[0] == 0,
            "after the second SIGHUP only the new token works")


def main():
    c = Checks()
    scrape_tokens = os.path.join(cluster.scratch_dir("shardline-scrape-"), "scrape-token")
    with open(os.open(scrape_tokens, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("scrape-token\n")
    cl = Cluster(token="s3cret-token", worker_token="w0rker-token",
                 coordinator_args=["--metrics-listen", "127.0.0.1:0", "--metrics-token-file", scrape_tokens])
    metrics_port = int(cl.coordinator.stdout.readline().split()[-1])  # "metrics on port N"
    cl.add_worker("host-a")
    c.check(wait_for(lambda: len(cl.idle_workers()) >= 1, 20, "1 idle worker", fail=False),
            "a worker with the workers' token registers")

    rc, _, err = cl.ctl("jobs", token=False)
    c.check(rc == 1 and "missing token" in err and one_line(err) and "--token-file" in err and
            "SHARDLINE_TOKEN_FILE" in err, "missing token refused, naming the flag and the variable", err.strip())
    wrong = cl.secret_file("wrong", "nope")
    rc, _, err = cl.ctl("--token-file", wrong, "jobs", token=False)
    c.check(rc == 1 and "wrong token" in err and wrong in err, "wrong token refused, naming its file", err.strip())
    rc, out, err = cl.ctl("jobs")
    c.check(rc == 0, "right token accepted", err.strip())
    # The token file from the environment, as the README's recipe sets it once.
    r = subprocess.run([cluster.SHARDCTL, "--coordinator", cl.address, "jobs"], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, SHARDLINE_TOKEN_FILE=cl.token_file))
    c.check(r.returncode == 0, "SHARDLINE_TOKEN_FILE stands for --token-file", r.stderr.strip())
    r = subprocess.run([cluster.SHARDCTL, "--coordinator", cl.address, "--token-file", wrong, "jobs"],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, SHARDLINE_TOKEN_FILE=cl.token_file))
    c.check(r.returncode == 1 and "wrong token" in r.stderr, "--token-file wins over SHARDLINE_TOKEN_FILE",
            r.stderr.strip())

    # A token file is its first line: a second line neither breaks nor leaks.
    rc, _, err = cl.ctl("--token-file", cl.secret_file("two-lines", "s3cret-token\nsecond line"), "jobs", token=False)
    c.check(rc == 0, "a token file of two lines uses its first", err.strip())
    rc, _, err = cl.ctl("--token-file", cl.secret_file("ctrl", "s3cret\x01token"), "jobs", token=False)
    c.check(rc == 1 and "not visible ASCII" in err and "s3cret" not in err and one_line(err),
            "a token with a control character refused, not echoed", err.strip())
    rc, _, err = cl.ctl("--token-file", cl.secret_file("loose", "s3cret-token", 0o644), "jobs", token=False)
    c.check(rc == 1 and "permissions 0644 are too open" in err and "s3cret" not in err,
            "a token file others can read is refused, as ssh refuses a loose key", err.strip())
    # A worker without the token never registers.
    p = subprocess.Popen([WORKER, "--coordinator", cl.address, "--host", "intruder"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    time.sleep(1.5)
    p.kill()
    log = p.stdout.read()
    hosts = [w["host"] for w in cl.ctl_json("workers")["workers"]]
    c.check("intruder" not in hosts and "missing token" in log, "worker without token refused",
            log.strip().splitlines()[0] if log.strip() else "")
    check_roles_rotation_and_metrics(c, cl, metrics_port)

    d = cl.dir
    cases = {
        "malformed TOML": ("[model]\nn_layer = = 2\n", "malformed TOML"),
        "unknown key": (open(job_file(d, "k")).read().replace("n_layer = 2", "n_layers = 2"),
                        "[model] n_layers: unknown key"),
        "wrong type": (open(job_file(d, "t")).read().replace("n_head = 4", "n_head = \"four\""),
                       "[model] n_head must be an integer"),
        "n_embd % n_head": (open(job_file(d, "e")).read().replace("n_head = 4", "n_head = 5"),
                            "[model] n_embd = 32 is not divisible by n_head = 5"),
        "batch % world": (open(job_file(d, "b", workers=2)).read().replace("workers = 2", "workers = 5"),
                          "[train] batch_size = 12 is not divisible by the world size 5"),
        "missing data file": (open(job_file(d, "m")).read().replace('format = "synthetic"',
                                                                    'format = "llmc"\npath = "nowhere/train.bin"'),
                              "nowhere/train.bin: no such file"),
        "steps beyond an int": (open(job_file(d, "s")).read().replace("steps = 20", "steps = 4294967301"),
                                "[train] steps = 4294967301 is out of range [1, 2147483647]"),
        "vocab beyond its bound": (open(job_file(d, "v")).read().replace("vocab_size = 64",
                                                                         "vocab_size = 1099511627840"),
                                   "[model] vocab_size = 1099511627840 is out of range"),
        "infinite lr": (open(job_file(d, "l")).read().replace("lr = 3e-3", "lr = inf"),
                        "[optimizer] lr = inf must be finite"),
        "empty file": ("", "no [model] section"),
        "a model past any machine": (open(job_file(d, "h")).read().replace("n_layer = 2", "n_layer = 10000")
                                     .replace("n_embd = 32", "n_embd = 1048576"), "more than the limit of 1e+13"),
        "missing init_from": (open(job_file(d, "i")).read().replace("block_size = 16",
                                                                    'block_size = 16\ninit_from = "gone.safetensors"'),
                              "[model] init_from: " + d + "/gone.safetensors: no such file"),
    }
    for name, (text, expected) in cases.items():
        path = os.path.join(d, f"bad-{name.replace(' ', '_').replace('%', 'mod')}.toml")
        with open(path, "w") as f:
            f.write(text)
        for mode, extra in (("shardctl", []), ("coordinator", ["--skip-local-check"])):
            rc, out, err = cl.ctl("submit", path, *extra)
            ok = rc == 1 and expected in err and one_line(err) and (expected == "malformed TOML" or path in err
                                                                   or "train.bin" in err or "gone.safetensors" in err)
            c.check(ok, f"{name} rejected by {mode}", err.strip())
    rc, out, err = cl.ctl("--json", "jobs")
    c.check(rc == 0 and '"jobs":[]' in out, "coordinator still serving, nothing was submitted", out.strip())
    rc, out, err = cl.ctl("submit", job_file(d, "fine", workers=1, steps=3), "--follow", timeout=60)
    c.check(rc == 0, "a good job still runs")
    # A diverging job fails naming the step instead of ending SUCCEEDED with NaN.
    diverging = open(job_file(d, "diverge", workers=1, steps=30)).read().replace("lr = 3e-3", "lr = 1e30")
    with open(os.path.join(d, "diverge.toml"), "w") as f:
        f.write(diverging)
    rc, out, err = cl.ctl("--json", "submit", os.path.join(d, "diverge.toml"), "--follow", timeout=60)
    job = [l for l in out.splitlines() if l.startswith("{")]
    st = cl.job(json.loads(job[0])["job_id"]) if job else {}
    c.check(rc != 0 and st.get("state") == "FAILED" and "training diverged" in st.get("message", "")
            and "step " in st.get("message", ""), "a diverging job FAILS naming the step", st.get("message", err))
    # Flags are validated at start.
    r = subprocess.run([cl.coordinator.args[0], "--state-dir", os.path.join(d, "s2"), "--heartbeat-ms", "0"],
                       capture_output=True, text=True, timeout=10)
    c.check(r.returncode != 0 and "--heartbeat-ms" in r.stderr, "--heartbeat-ms 0 refused at start",
            r.stderr.strip().splitlines()[0] if r.stderr.strip() else "")
    rc, _, err = cl.ctl("status", "job-404")
    c.check(rc == 1 and "no job job-404" in err, "unknown job named", err.strip())
    # A job file past the limit is refused whole, by shardctl before it is
    # sent (the coordinator's own refusal: CoreTest.AJobFilePastTheLimitIsRefused);
    # listing pages through the jobs (without their spec text), so many jobs
    # never make a message too big.
    huge = os.path.join(d, "huge.toml")
    with open(huge, "w") as f:
        f.write(open(job_file(d, "huge", workers=1, steps=3)).read() + "#" * (300 << 10) + "\n")
    rc, _, err = cl.ctl("submit", huge)
    c.check(rc == 1 and "huge.toml: job file holds" in err and "more than the 262144 allowed" in err and one_line(err),
            "a 300 KiB job file refused",
            err.strip()[-100:])
    rc, whole, _ = cl.ctl("--json", "jobs")
    rc2, paged, _ = cl.ctl("--json", "jobs", "--page-size", "1")
    listed = json.loads(whole)["jobs"] if rc == 0 else []
    c.check(rc == 0 and rc2 == 0 and len(listed) >= 2 and json.loads(paged) == json.loads(whole),
            "jobs listed one per page equal the default listing", f"{len(listed)} jobs")
    # Sizes each within their key's bound whose parameter count passes int64
    # (a wrapped count once passed the limit); and `shardctl plan` checks its
    # job file and bounds its flags before computing anything (10^8 layers
    # once never returned); negative --workers and an oversized --page-size
    # are refused naming the flag instead of ignored.
    wide = os.path.join(d, "wide.toml")
    with open(wide, "w") as f:
        f.write(open(job_file(d, "wide", workers=1)).read().replace(
            "n_layer = 2\nn_head = 4\nn_embd = 32",
            'family = "llama"\nn_layer = 10000\nn_head = 65536\nn_embd = 1048576\nhead_dim = 65536\n'
            "intermediate_size = 1"))
    for name, args in (("submit", ("submit", wide)), ("coordinator", ("submit", wide, "--skip-local-check")),
                       ("plan", ("plan", wide))):
        rc, _, err = cl.ctl(*args, timeout=20)
        c.check(rc == 1 and "wide.toml" in err and "the model has 1.8e+20 parameters, more than the limit of 1e+13"
                in err and one_line(err), f"a parameter count past int64 refused by {name}", err.strip())
    for args, flag in ((("plan", "--layers", "100000000", "--hidden", "768", "--heads", "12"), "--layers"),
                       (("plan", "--params", "1e300"), "--params"), (("plan", "--params", "7e9", "--mem-bw", "nan"),
                                                                    "--mem-bw"),
                       (("submit", job_file(d, "neg", workers=1), "--workers", "-1"), "--workers"),
                       (("jobs", "--page-size", "5000"), "--page-size")):
        rc, _, err = cl.ctl(*args, timeout=20)
        first = err.strip().splitlines()[0] if err.strip() else ""
        c.check(rc != 0 and first.startswith(flag + ":"), f"{' '.join(args[:2])} ... {flag} refused naming it", first)
    rc, _, err = cl.ctl("plan", "--layers", "10000", "--hidden", "1048576", "--heads", "1", timeout=20)
    c.check(rc == 1 and "--layers/--hidden/--heads: the model has 1.32e+17 parameters" in err and one_line(err),
            "plan: a shape past the parameter limit names its flags", err.strip())
    c.finish()


if __name__ == "__main__":
    main()

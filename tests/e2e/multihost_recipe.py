"""docs/operating.md's "Several hosts" recipe, run as written: the shell
block after its `<!-- recipe: several-hosts -->` marker, one bash script
from the repository's root (its scratch folder and tests/hosts.py's state
file moved under this test's scratch folder), must bring three emulated
hosts up, run the hybrid job of examples/hybrid-hosts.toml across them to
SUCCEEDED (`submit --follow` exits 0 only then), list its last step, and take
the hosts down again; nothing of it may be left (every namespace removed),
also when it fails. Exits 77 (skipped) where emulated hosts cannot be built."""
import os
import re
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import hosts as emulated  # noqa: E402
from cluster import Checks, scratch_dir  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MARKER = "<!-- recipe: several-hosts -->"


def recipe():
    with open(os.path.join(ROOT, "docs", "operating.md")) as f:
        text = f.read()
    after = text.split(MARKER, 1)[1] if MARKER in text else ""
    m = re.match(r"\s*```sh\n(.*?)```", after, re.S)
    return m.group(1) if m else ""


def main():
    c = Checks()
    why = emulated.available()
    if why:
        c.skip(why)
    script = recipe()
    c.check("tests/hosts.py up 3" in script and "tests/hosts.py\" down" in script,
            "docs/operating.md has the several-hosts recipe", script[:60])
    work = scratch_dir("shardline-recipe-")
    env = dict(os.environ, SHARDLINE_HOSTS_STATE=os.path.join(work, "hosts.json"))
    env.pop("SHARDLINE_COORDINATOR", None)
    env.pop("SHARDLINE_TOKEN_FILE", None)
    body = script.replace("/tmp/shardline-hosts", os.path.join(work, "run"))
    p = subprocess.Popen(["bash", "-c", "set -euo pipefail\n" + body], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        out += "\n(timed out)"
    finally:
        # Whatever the script reached: the hosts go, and what ran on them.
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "hosts.py"), "down"], env=env,
                       capture_output=True, timeout=60)
    c.check(p.returncode == 0, "every command of the recipe succeeded", out.strip()[-800:])
    c.check("SUCCEEDED" in out, "the hybrid job across host-b and host-c SUCCEEDED", out.strip()[-300:])
    c.check("step-00000040" in out, "and its last step (40) is committed", "")
    c.check(out.count(" host-b ") >= 2 and out.count(" host-c ") >= 2,
            "`shardctl workers` listed two workers on each of host-b and host-c", "")
    left = emulated.leftovers()
    c.check(not os.path.exists(env["SHARDLINE_HOSTS_STATE"]) and not left, "`tests/hosts.py down` left nothing",
            str(left))
    c.finish()


if __name__ == "__main__":
    main()

"""deploy/kubernetes: every manifest is valid Kubernetes 1.30 and says what Shardline needs.

Offline, with kubernetes-validate (PyPI; tests/deps.sh installs it) and its
strict 1.30 schemas, so an unknown field or a wrong type fails. Beyond the
schemas it checks what they cannot: the kustomization lists every manifest
and names every image; each flag the pods pass is one the program defines
(read from its main.cc); the coordinator is one StatefulSet replica with its
--state-dir on a volumeClaimTemplate and gRPC probes on grpc.health.v1; the
workers ask for nvidia.com/gpu and dial the coordinator's Service; token
files come from a Secret, mounted read-only, in a form the programs accept
(0600 and the reader's own: see secret.yaml); the Services, ports and
annotations match deploy/prometheus/prometheus-kubernetes.yml. Then it breaks
copies of the manifests (a wrong type, a named port where an integer
belongs, an unknown field, a resource left out of the kustomization) and each
must fail, so the checks can fail.

  kubernetes_test.py [--manifests DIR]   (default: deploy/kubernetes)
"""
import argparse
import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from harness import Checks  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S_VERSION = "1.30.0"
PROMETHEUS_CONFIG = os.path.join(ROOT, "deploy", "prometheus", "prometheus-kubernetes.yml")
PROGRAMS = {  # the command a container runs -> the source that defines its flags
    "shardline-coordinator": os.path.join(ROOT, "server", "coordinator_main.cc"),
    "shardline-worker": os.path.join(ROOT, "worker", "worker_main.cc"),
}
TOKEN_FLAGS = ("--token-file", "--worker-token-file", "--metrics-token-file")
WORKLOAD_KINDS = ("StatefulSet", "Deployment", "DaemonSet", "Job")


# ---- reading --------------------------------------------------------------

def manifest_files(d):
    return sorted(f for f in os.listdir(d) if f.endswith((".yaml", ".yml")) and f != "kustomization.yaml")


def load_docs(path):
    """Every non-empty document of a (multi-document) YAML file."""
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def schema_errors(docs, where):
    """What kubernetes-validate (strict, 1.30) says against each document; [] when all pass."""
    import kubernetes_validate as kv
    errors = []
    for i, doc in enumerate(docs):
        name = f"{where}#{i} {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}" \
            if isinstance(doc, dict) else f"{where}#{i}"
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            errors.append(f"{name}: not a Kubernetes object (no apiVersion/kind)")
            continue
        try:
            kv.validate(doc, K8S_VERSION, strict=True)
        except kv.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            errors.append(f"{name}: {path}: {e.message}")
        except kv.SchemaNotFoundError as e:  # the CLI only warns: here an unknown kind is an error
            errors.append(f"{name}: {e.message}")
    return errors


def cli_validate(paths):
    """The kubernetes-validate command itself: its exit status and output."""
    r = subprocess.run([sys.executable, "-m", "kubernetes_validate", "-k", K8S_VERSION, "--strict", "--quiet",
                        *paths], capture_output=True, text=True, timeout=120)
    return r.returncode, (r.stdout + r.stderr).strip()


def program_flags(source):
    """The long flags a CLI11 program defines: add_option/add_flag("--name[,...]", ...)."""
    with open(source) as f:
        text = f.read()
    flags = set()
    for names in re.findall(r'add_(?:option|flag)\(\s*"([^"]+)"', text):
        flags.update(n for n in names.split(",") if n.startswith("--"))
    return flags


def flag_values(container):
    """{--flag: value or True} of a container's args (--flag=value, --flag value, --flag)."""
    args = [str(a) for a in (container.get("command") or [])[1:]] + [str(a) for a in container.get("args") or []]
    out, i = {}, 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
                out[k] = v
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                out[a] = args[i + 1]
                i += 1
            else:
                out[a] = True
        i += 1
    return out


def image_name(image):
    """shardline/worker:tag or @digest -> shardline/worker."""
    image = image.split("@", 1)[0]
    last = image.rsplit("/", 1)[-1]
    return image[: len(image) - len(last)] + last.split(":", 1)[0]


def pod_spec(workload):
    return ((workload.get("spec") or {}).get("template") or {}).get("spec") or {}


def containers(workload, init=False):
    return pod_spec(workload).get("initContainers" if init else "containers") or []


def mount_of(container, path):
    """The volumeMount whose mountPath holds `path` (the deepest), or None."""
    best = None
    for m in container.get("volumeMounts") or []:
        mp = m.get("mountPath", "").rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best["mountPath"].rstrip("/")):
                best = m
    return best


def volume(workload, name):
    return next((v for v in pod_spec(workload).get("volumes") or [] if v.get("name") == name), None)


def find(docs, kind, name=None):
    return [d for d in docs if d.get("kind") == kind and (name is None or d["metadata"].get("name") == name)]


def program_workloads(docs, program):
    """(workload, container) pairs whose container runs `program`."""
    out = []
    for d in docs:
        if d.get("kind") in WORKLOAD_KINDS:
            for c in containers(d):
                if (c.get("command") or [None])[0] == program or \
                        (not c.get("command") and (c.get("args") or [None])[0] == program):
                    out.append((d, c))
    return out


def visible_ascii_token(line):
    t = line.strip()
    return bool(t) and not t.startswith("#") and all(0x21 <= ord(ch) <= 0x7e for ch in t)


# ---- checks ---------------------------------------------------------------

def check_kustomization(c, d, files, docs_by_file):
    path = os.path.join(d, "kustomization.yaml")
    if not c.check(os.path.exists(path), "kustomization exists", path):
        return False
    k = load_docs(path)[0]
    ok = c.check(k.get("apiVersion") == "kustomize.config.k8s.io/v1beta1" and k.get("kind") == "Kustomization",
                 "kustomization kind", f"{k.get('apiVersion')} {k.get('kind')}")
    listed = list(k.get("resources") or [])
    ok &= c.check(sorted(listed) == sorted(files) and len(set(listed)) == len(listed),
                  "kustomization lists every manifest",
                  f"listed {listed}, files {files}")
    used = {image_name(ct["image"]) for docs in docs_by_file.values() for doc in docs
            if doc.get("kind") in WORKLOAD_KINDS for ct in containers(doc) + containers(doc, init=True)}
    named = {i.get("name") for i in k.get("images") or []}
    ok &= c.check(used and used <= named and all(i.get("newTag") or i.get("digest") for i in k.get("images") or []),
                  "kustomization images entry for every image", f"images used {sorted(used)}, entries {sorted(named)}")
    ok &= c.check(used == {"shardline/coordinator", "shardline/worker"}, "images are shardline/coordinator and "
                  "shardline/worker", f"{sorted(used)}")
    return ok


def check_rendered(c, d, n_docs):
    """kubectl's built-in kustomize (tests/deps.sh installs kubectl): the rendered stream validates too."""
    kubectl = shutil.which("kubectl")
    if not c.check(kubectl is not None, "kubectl is installed (tests/deps.sh installs kubernetes-client)"):
        return
    r = subprocess.run([kubectl, "kustomize", d], capture_output=True, text=True, timeout=120)
    if not c.check(r.returncode == 0, "kubectl kustomize renders", r.stderr.strip()[-400:]):
        return
    docs = [x for x in yaml.safe_load_all(r.stdout) if x is not None]
    errors = schema_errors(docs, "kustomize output")
    c.check(len(docs) == n_docs and not errors, "rendered kustomization validates against 1.30",
            f"{len(docs)} objects (files hold {n_docs}) {'; '.join(errors)[:600]}")
    tagged = [ct["image"] for doc in docs if doc.get("kind") in WORKLOAD_KINDS
              for ct in containers(doc) + containers(doc, init=True)]
    c.check(tagged and all(":" in i.rsplit("/", 1)[-1] or "@" in i for i in tagged), "rendered images carry a tag",
            f"{sorted(set(tagged))}")
    c.check(all(doc["metadata"].get("namespace") == "shardline" for doc in docs if doc["kind"] != "Namespace"),
            "rendered objects live in namespace shardline")


def check_flags(c, docs):
    ok = True
    for program, source in PROGRAMS.items():
        defined = program_flags(source)
        pairs = program_workloads(docs, program)
        ok &= c.check(bool(pairs), f"a workload runs {program}")
        for w, ct in pairs:
            used = set(flag_values(ct))
            unknown = sorted(used - defined)
            ok &= c.check(not unknown, f"{w['metadata']['name']}: every flag is one {program} defines",
                          f"unknown {unknown}" if unknown else f"{sorted(used)}")
    return ok


def check_coordinator(c, docs):
    pairs = program_workloads(docs, "shardline-coordinator")
    if not pairs:
        return c.check(False, "coordinator workload found")
    w, ct = pairs[0]
    name = w["metadata"]["name"]
    flags = flag_values(ct)
    c.check(w["kind"] == "StatefulSet" and (w["spec"].get("replicas") == 1), "coordinator is a StatefulSet of 1",
            f"{w['kind']} replicas={w['spec'].get('replicas')}")
    state_dir = flags.get("--state-dir")
    claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates") or []}
    m = mount_of(ct, state_dir) if isinstance(state_dir, str) else None
    c.check(m is not None and m["name"] in claims and not m.get("readOnly"),
            "--state-dir lies on a volumeClaimTemplate", f"{state_dir} on {m and m['name']} (claims {sorted(claims)})")
    # The coordinator chmods its state directory 0700: it must be one it creates, not the volume's root.
    c.check(m is not None and state_dir.rstrip("/") != m["mountPath"].rstrip("/"),
            "--state-dir is a directory under the volume's root", f"{state_dir}")
    c.check("--token-file" in flags and ("--worker-token-file" in flags or "--shared-token" in flags),
            "--token-file comes with --worker-token-file (or --shared-token)", f"{sorted(flags)}")

    # gRPC probes on grpc.health.v1.
    listen = flags.get("--listen", "127.0.0.1:50051")
    port = int(str(listen).rsplit(":", 1)[1])
    c.check(not str(listen).startswith(("127.", "localhost", "[::1]")), "coordinator listens beyond loopback",
            str(listen))
    with open(PROGRAMS["shardline-coordinator"]) as f:
        src = f.read()
    c.check("EnableDefaultHealthCheckService(true)" in src, "coordinator registers grpc.health.v1",
            "(the default health service: the server's status under service \"\")")
    for probe in ("readinessProbe", "livenessProbe"):
        p = ct.get(probe) or {}
        handlers = sorted(k for k in ("grpc", "httpGet", "tcpSocket", "exec") if k in p)
        g = p.get("grpc") or {}
        c.check(handlers == ["grpc"] and g.get("port") == port and g.get("service", "") == "",
                f"{probe} is a gRPC probe on the serving port", f"{handlers} {g} (listen {listen})")
    if "startupProbe" in ct:
        p = ct["startupProbe"]
        c.check("grpc" in p and p["grpc"].get("port") == port, "startupProbe is a gRPC probe", f"{p}")
    ports = {p.get("name"): p.get("containerPort") for p in ct.get("ports") or []}
    c.check(ports.get("grpc") == port, "grpc containerPort matches --listen", f"{ports}")

    # The Service the workers dial.
    svc = find(docs, "Service", w["spec"].get("serviceName"))
    c.check(bool(svc), "coordinator StatefulSet's serviceName is a Service", f"{w['spec'].get('serviceName')}")
    if svc:
        s = svc[0]
        labels = w["spec"]["template"]["metadata"].get("labels") or {}
        sel = s["spec"].get("selector") or {}
        c.check(sel and all(labels.get(k) == v for k, v in sel.items()), "coordinator Service selects its pod",
                f"{sel}")
        sports = {p.get("name"): p for p in s["spec"].get("ports") or []}
        g = sports.get("grpc") or {}
        c.check(g.get("targetPort") in ("grpc", port) and "metrics" in sports,
                "coordinator Service has the gRPC and metrics ports", f"{sorted(sports)}")
    return w, ct, svc[0] if svc else None


def check_workers(c, docs, coordinator_svc):
    pairs = program_workloads(docs, "shardline-worker")
    if not pairs:
        return c.check(False, "worker workload found")
    for w, ct in pairs:
        name = w["metadata"]["name"]
        res = ct.get("resources") or {}
        gpus = [str((res.get(k) or {}).get("nvidia.com/gpu")) for k in ("limits", "requests")]
        c.check(gpus[0] == "1" and gpus[1] in ("1", "None"), f"{name} requests nvidia.com/gpu: 1",
                f"limits/requests {gpus}")
        flags = flag_values(ct)
        c.check(flags.get("--device") == "cuda:0", f"{name} runs --device cuda:0", f"{flags.get('--device')}")
        c.check(isinstance(flags.get("--token-file"), str), f"{name} passes --token-file")
        # Several nodes: the host is the node (hybrid groups stay on it), the
        # collectives bind the pod IP, each from the downward API.
        env = {e.get("name"): ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
               for e in ct.get("env") or []}
        for flag, var, field in (("--host", "NODE_NAME", "spec.nodeName"),
                                 ("--listen-address", "POD_IP", "status.podIP")):
            c.check(flags.get(flag) == f"$({var})" and env.get(var) == field,
                    f"{name} passes {flag}=$({var}) from {field}", f"{flags.get(flag)} {var}={env.get(var)}")
        target = str(flags.get("--coordinator", ""))
        host, _, port = target.rpartition(":")
        ok = coordinator_svc is not None
        if ok:
            sname, ns = coordinator_svc["metadata"]["name"], coordinator_svc["metadata"].get("namespace", "shardline")
            grpc_port = next((p["port"] for p in coordinator_svc["spec"]["ports"] if p.get("name") == "grpc"), None)
            ok = host in (sname, f"{sname}.{ns}", f"{sname}.{ns}.svc", f"{sname}.{ns}.svc.cluster.local") and \
                port == str(grpc_port)
        c.check(ok, f"{name} dials the coordinator's Service and gRPC port", target)


def check_tokens(c, docs):
    """Token files come from a Secret mounted read-only, in a form ReadSecretFile accepts:
    a regular file, mode & 077 == 0, readable by the process (common/base/file_util.cc)."""
    secrets = {s["metadata"]["name"]: s for s in find(docs, "Secret")}
    c.check(bool(secrets), "the tokens are Secrets", f"{sorted(secrets)}")
    for s in secrets.values():
        values = dict(s.get("stringData") or {})
        c.check(values and not any(visible_ascii_token(line) for v in values.values() for line in str(v).splitlines()),
                f"secret {s['metadata']['name']}: its placeholders are refused as tokens",
                "(an unedited deployment must not run with a published token)")
    for program in PROGRAMS:
        for w, ct in program_workloads(docs, program):
            spec = pod_spec(w)
            psc = spec.get("securityContext") or {}
            uid = (ct.get("securityContext") or {}).get("runAsUser", psc.get("runAsUser"))
            for flag, path in flag_values(ct).items():
                if flag not in TOKEN_FLAGS or not isinstance(path, str):
                    continue
                what = f"{w['metadata']['name']} {flag}"
                m = mount_of(ct, path)
                if not c.check(m is not None and m.get("readOnly") is True, f"{what} is mounted read-only",
                               f"{path} on {m and m['name']} readOnly={m and m.get('readOnly')}"):
                    continue
                v = volume(w, m["name"]) or {}
                base = os.path.relpath(path, m["mountPath"])
                if "secret" in v:
                    # Straight from a Secret volume: root's file, and fsGroup ORs in 0440.
                    ok = check_secret_volume(c, what, v, base, secrets)
                    c.check(ok and uid == 0 and "fsGroup" not in psc,
                            f"{what}: a Secret volume file is readable as 0400 only by root without fsGroup",
                            f"runAsUser={uid} fsGroup={psc.get('fsGroup')}")
                    continue
                # A private copy: a memory emptyDir that an init container fills from a Secret with mode 0600.
                c.check((v.get("emptyDir") or {}).get("medium") == "Memory", f"{what}: the copy stays in memory",
                        f"{m['name']}: {v}")
                filled = False
                for init in containers(w, init=True):
                    dst = next((im for im in init.get("volumeMounts") or [] if im["name"] == m["name"]), None)
                    if dst is None:
                        continue
                    script = " ".join(str(x) for x in (init.get("command") or []) + (init.get("args") or []))
                    for im in init.get("volumeMounts") or []:
                        iv = volume(w, im["name"]) or {}
                        if "secret" not in iv or not re.search(re.escape(im["mountPath"].rstrip("/") + "/") + r"\S+",
                                                               script):
                            continue
                        c.check(im.get("readOnly") is True, f"{what}: the Secret is mounted read-only in "
                                f"{init['name']}", f"{im['mountPath']}")
                        ok = check_secret_volume(c, what, iv, base, secrets)
                        mode_ok = re.search(r"(-m\s*0?600\b|chmod\s+0?600\b)", script) is not None
                        c.check(mode_ok and base in script, f"{what}: {init['name']} copies {base} with mode 0600",
                                script)
                        filled = ok and mode_ok
                c.check(filled, f"{what} is the Secret's token, copied by an init container")
                c.check(psc.get("fsGroup") is not None and uid not in (None, 0) and psc.get("runAsNonRoot") is True,
                        f"{what}: non-root with an fsGroup (it reads the Secret, owns the copy)",
                        f"runAsUser={uid} fsGroup={psc.get('fsGroup')}")


def check_secret_volume(c, what, v, base, secrets):
    sv = v["secret"]
    name = sv.get("secretName")
    s = secrets.get(name)
    keys = set((s or {}).get("stringData") or {}) | set((s or {}).get("data") or {})
    items = {i["path"]: i["key"] for i in sv.get("items") or []}
    key = items.get(base, base) if items else base
    ok = c.check(s is not None and key in keys, f"{what}: Secret {name} holds {key}", f"keys {sorted(keys)}")
    ok &= c.check(sv.get("defaultMode") == 0o400 and all(i.get("mode", 0o400) == 0o400 for i in sv.get("items") or []),
                  f"{what}: Secret volume defaultMode 0400", f"{oct(sv.get('defaultMode') or 0)}")
    return ok


def check_prometheus(c, docs, coordinator, workers):
    with open(PROMETHEUS_CONFIG) as f:
        prom = yaml.safe_load(f)
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    co = jobs.get("shardline-coordinator") or {}
    dns = (co.get("dns_sd_configs") or [{}])[0]
    names = dns.get("names") or [""]
    svc_name, ns = (names[0].split(".") + ["", ""])[:2]
    svc = [s for s in find(docs, "Service", svc_name) if s["metadata"].get("namespace") == ns]
    ok = c.check(bool(svc) and svc[0]["spec"].get("clusterIP") == "None",
                 "prometheus' DNS name is the coordinator's headless Service", f"{names[0]}")
    if not ok or coordinator is None:
        return
    w, ct = coordinator[0], coordinator[1]
    port = dns.get("port")
    mport = next((p for p in svc[0]["spec"]["ports"] if p.get("name") == "metrics"), {})
    flags = flag_values(ct)
    cports = {p.get("name"): p.get("containerPort") for p in ct.get("ports") or []}
    c.check(mport.get("port") == port and str(flags.get("--metrics-port")) == str(port) and cports.get("metrics") == port,
            "coordinator metrics port matches prometheus-kubernetes.yml",
            f"config {port}, Service {mport.get('port')}, --metrics-port {flags.get('--metrics-port')}, "
            f"containerPort {cports.get('metrics')}")
    sd = ((jobs.get("shardline-workers") or {}).get("http_sd_configs") or [{}])[0].get("url", "")
    c.check(sd == f"http://{names[0]}:{port}/sd/workers", "the workers' http_sd URL is the coordinator's /sd/workers",
            sd)
    c.check(co.get("honor_labels") is True, "prometheus keeps Shardline's labels (honor_labels)")
    for w, ct in [coordinator] + workers:
        ann = (w["spec"]["template"]["metadata"].get("annotations") or {})
        p = str(flag_values(ct).get("--metrics-port"))
        c.check(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == p and p.isdigit() and
                int(p) > 0, f"{w['metadata']['name']} pods are annotated for scraping on --metrics-port",
                f"{ann} --metrics-port {p}")


def run_checks(c, d):
    """Every check on the manifests in `d`."""
    files = manifest_files(d)
    c.check(bool(files), "manifests found", d)
    docs_by_file = {}
    for f in files:
        try:
            docs = load_docs(os.path.join(d, f))
        except yaml.YAMLError as e:
            c.check(False, f"{f} parses", str(e).replace("\n", " ")[:300])
            continue
        docs_by_file[f] = docs
        c.check(bool(docs), f"{f} parses", f"{len(docs)} document(s): " +
                ", ".join(f"{x.get('kind')}/{(x.get('metadata') or {}).get('name')}" for x in docs
                          if isinstance(x, dict)))
    check_kustomization(c, d, files, docs_by_file)
    all_docs = []
    for f, docs in docs_by_file.items():
        errors = schema_errors(docs, f)
        c.check(not errors, f"{f} validates against Kubernetes {K8S_VERSION} (strict)", "; ".join(errors)[:800])
        all_docs += [x for x in docs if isinstance(x, dict)]
    rc, out = cli_validate([os.path.join(d, f) for f in files])
    c.check(rc == 0 and "WARN" not in out, "kubernetes-validate -k 1.30.0 --strict exits 0", out[-600:])
    check_rendered(c, d, len(all_docs))
    if not all(isinstance(x.get("metadata"), dict) and "kind" in x for x in all_docs):
        c.check(False, "every document has a kind and metadata")
        return
    check_flags(c, all_docs)
    coordinator = program_workloads(all_docs, "shardline-coordinator")
    svc = None
    if coordinator:
        result = check_coordinator(c, all_docs)
        svc = result[2] if isinstance(result, tuple) else None
    else:
        c.check(False, "coordinator workload found")
    check_workers(c, all_docs, svc)
    check_tokens(c, all_docs)
    check_prometheus(c, all_docs, coordinator[0] if coordinator else None, program_workloads(all_docs,
                                                                                             "shardline-worker"))


# Broken copies: (what, file, the text, what replaces it, which check must then fail).
BREAKS = [
    ("a wrong type: replicas: \"one\"", "coordinator.yaml", "replicas: 1", 'replicas: "one"', "schema"),
    # GRPCAction.port is an integer: unlike httpGet's, it takes no named port.
    ("a named port in a gRPC probe", "coordinator.yaml", "grpc:\n              port: 50051",
     "grpc:\n              port: grpc", "schema"),
    ("an unknown field: podManagmentPolicy", "workers.yaml", "podManagementPolicy: Parallel",
     "podManagmentPolicy: Parallel", "schema"),
    ("workers.yaml left out of the kustomization", "kustomization.yaml", "  - workers.yaml\n", "", "kustomization"),
]


def check_breaks(c, d):
    for what, f, old, new, check in BREAKS:
        label = f"broken copy fails ({f}: {what})"
        with tempfile.TemporaryDirectory(prefix="k8s-broken-") as tmp:
            bad = os.path.join(tmp, "kubernetes")
            shutil.copytree(d, bad)
            with open(os.path.join(bad, f)) as fh:
                text = fh.read()
            if old not in text:
                c.check(False, label, f"the text to break is not in {f}: {old!r}")
                continue
            with open(os.path.join(bad, f), "w") as fh:
                fh.write(text.replace(old, new, 1))
            if check == "schema":
                errors = schema_errors(load_docs(os.path.join(bad, f)), f)
                rc, _ = cli_validate([os.path.join(bad, f)])
                c.check(bool(errors) and rc != 0, label, f"{'; '.join(errors)[:300]} | kubernetes-validate rc={rc}")
            else:
                sub = Checks()
                with contextlib.redirect_stdout(io.StringIO()):
                    check_kustomization(sub, bad, manifest_files(bad),
                                        {x: load_docs(os.path.join(bad, x)) for x in manifest_files(bad)})
                c.check("kustomization lists every manifest" in sub.failed, label, f"failed: {sub.failed}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--manifests", default=os.path.join(ROOT, "deploy", "kubernetes"))
    args = ap.parse_args()
    c = Checks()
    try:
        import kubernetes_validate
    except ImportError:
        c.check(False, "kubernetes-validate is installed", "run tests/run.sh (tests/deps.sh installs it)")
        c.finish()
    print(f"kubernetes-validate {kubernetes_validate.__version__}, schemas {K8S_VERSION}, manifests {args.manifests}")
    run_checks(c, os.path.abspath(args.manifests))
    check_breaks(c, os.path.abspath(args.manifests))
    c.finish()


if __name__ == "__main__":
    main()

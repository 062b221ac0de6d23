#!/usr/bin/env bash
# Installs every build and run dependency of remat from Debian 12's packages.
# Idempotent: packages already present are skipped, and `apt-get update` runs only
# when something is missing. Needs root (or sudo).
set -euo pipefail

packages=(
  build-essential cmake git
  libtorch-dev            # LibTorch 1.13.1 (CPU)
  libopenblas0-openmp     # optimized BLAS; without it LibTorch uses reference BLAS (~16x slower)
  libgtest-dev googletest # GoogleTest, GoogleMock
  nlohmann-json3-dev      # JSON for chains and plans
  libcli11-dev            # argument parsing for the remat tool
  gnuplot-nox             # plots in `remat bench` / `remat explain`
  clang-format
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all dependencies present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"

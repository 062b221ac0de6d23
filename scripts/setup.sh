#!/usr/bin/env bash
# Installs every build and run dependency of remat from Debian 12's packages.
# Idempotent: packages already present are skipped, and `apt-get update` runs only
# when something is missing. Needs root (or sudo).
#
#   bash scripts/setup.sh          the build and run dependencies
#   bash scripts/setup.sh bench    the same plus python3-torch, the PyTorch column of
#                                  benchmark E6 (Python's torch.utils.checkpoint)
set -euo pipefail

packages=(
  build-essential cmake git
  libtorch-dev            # LibTorch 1.13.1 (CPU)
  libgloo-dev             # Gloo's headers, for c10d's Gloo backend (data-parallel training)
  libopenblas0-openmp     # optimized BLAS; without it LibTorch uses reference BLAS (~16x slower)
  libgtest-dev googletest # GoogleTest, GoogleMock
  nlohmann-json3-dev      # JSON for chains and plans
  libcli11-dev            # argument parsing for the remat tool
  gnuplot-nox             # plots in `remat bench` / `remat explain`
  clang-format
)
for group in "$@"; do
  case "$group" in
    bench) packages+=(python3-torch) ;; # PyTorch 1.13.1 for /usr/bin/python3, over the same LibTorch
    *) echo "setup: unknown group '$group' (known: bench)" >&2; exit 2 ;;
  esac
done

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

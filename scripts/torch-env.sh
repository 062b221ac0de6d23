#!/usr/bin/env bash
# torch-env.sh — build and test remat against other LibTorch versions, each in a
# Debian root made with debootstrap from Debian's own packages.
#
#   scripts/torch-env.sh VARIANT prepare        make the root (reused when present)
#   scripts/torch-env.sh VARIANT run 'COMMAND'  copy this checkout into the root and
#                                               run COMMAND there, in the copy
#   scripts/torch-env.sh VARIANT path           print the root's folder
#   scripts/torch-env.sh VARIANT remove         delete the root
#
# Variants:
#   trixie       Debian 13, LibTorch 2.6.0 (CPU)
#   trixie-cuda  Debian 13, LibTorch 2.6.0 with CUDA 12.4 (contrib and non-free):
#                compiles and links, cannot run without a GPU (and without cuDNN)
#   sid          Debian unstable, LibTorch 2.14.1 (CPU; its headers need C++20)
#   bookworm     Debian 12 with nothing but `make`: a fresh machine, on which the
#                README's own commands must install what they need
#
# Roots live outside the checkout, in $REMAT_ROOTS (default /var/cache/remat/roots),
# and are reused: `prepare` on an existing root only installs what its package list
# gained. The checkout is copied to /work/remat inside the root (git's tracked and
# untracked-not-ignored files); build folders there survive between runs, so a second
# run rebuilds only what changed. The Debian mirror is the host's own apt mirror
# unless REMAT_DEBIAN_MIRROR names one.
#
# Safety: `run` mounts /proc and binds /dev into the root for the command's
# duration only, and a trap unmounts them however the script ends. `remove` refuses
# while anything is mounted below the root and deletes with --one-file-system, so it
# can never reach through a mount into the host.
set -euo pipefail

usage() {
  sed -n '2,15p' "$0" >&2
  exit 2
}

[ $# -ge 2 ] || usage
variant=$1
action=$2
shift 2

case "$variant" in
  trixie) suite=trixie components=main ;;
  trixie-cuda) suite=trixie components="main contrib non-free non-free-firmware" ;;
  sid) suite=sid components=main ;;
  bookworm) suite=bookworm components=main ;;
  *)
    echo "torch-env: unknown variant '$variant' (expected trixie, trixie-cuda, sid or bookworm)" >&2
    exit 2
    ;;
esac

roots=${REMAT_ROOTS:-/var/cache/remat/roots}
root="$roots/$variant"
checkout=$(cd "$(dirname "$0")/.." && pwd)

# What every variant needs to build and test remat (the same roles as setup.sh).
packages=(build-essential cmake git ccache libgtest-dev googletest nlohmann-json3-dev
  libcli11-dev gnuplot-nox libopenblas0-openmp)
case "$variant" in
  trixie | sid) packages+=(libtorch-dev libgloo-dev) ;;
  bookworm) packages=(make) ;;
  # find_package(Torch) needs the CUDA toolkit (nvcc, headers) besides LibTorch;
  # CUDA LibTorch uses Gloo's CUDA build, which conflicts with libgloo-dev's.
  trixie-cuda) packages+=(libtorch-cuda-dev nvidia-cuda-toolkit libgloo-cuda-dev) ;;
esac

log() { echo "torch-env[$variant]: $*" >&2; }

need_root() {
  [ "$(id -u)" -eq 0 ] || {
    log "needs root (debootstrap, chroot and mount do)"
    exit 1
  }
}

# The first plain Debian archive in the host's apt sources.
host_mirror() {
  local uri
  uri=$(grep -rhoE '(https?://[^ ]+/debian)/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ \
    2>/dev/null | head -n 1 | tr -d ' ')
  echo "${uri%/}"
}

mounts_below() {
  # Mount points at or below the root, deepest first (field 5 of mountinfo).
  awk -v r="$root" '$5 == r || index($5, r "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r
}

unmount_all() {
  local m
  for m in $(mounts_below); do
    umount "$m" 2>/dev/null || umount -l "$m" || log "could not unmount $m"
  done
}

in_root() {
  chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive CCACHE_DIR=/var/cache/ccache \
    CI="${CI:-}" "$@"
}

# Runs "$@" (a command or a function of this script) with /proc and /dev mounted in
# the root; the trap unmounts them however the script ends.
with_mounts() {
  trap unmount_all EXIT
  trap 'exit 130' INT TERM
  mount -t proc proc "$root/proc"
  mount --bind /dev "$root/dev"
  "$@"
  unmount_all
  trap - EXIT INT TERM
}

apt_install() {
  # nvidia-cudnn (pulled in by libtorch-cuda-dev) downloads cuDNN from outside the
  # Debian archive in its install script; that step fails here. Every other package's
  # files are unpacked and usable, so for the CUDA variant a failed configure step is
  # reported and tolerated, and the presence of what the build needs is checked instead.
  if ! in_root apt-get install -y -q --no-install-recommends "${packages[@]}"; then
    [ "$variant" = trixie-cuda ] || return 1
    log "apt-get reported an error (expected: nvidia-cudnn's download); checking the files"
    in_root dpkg --configure -a || true
  fi
  in_root ldconfig
}

install_packages() {
  in_root apt-get update -q
  apt_install
}

prepare() {
  need_root
  local stamp="$root/.remat-packages"
  local wanted="${packages[*]}"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
    log "root ready at $root"
    return 0
  fi
  if [ ! -x "$root/usr/bin/apt-get" ]; then
    command -v debootstrap >/dev/null || {
      log "installing debootstrap"
      apt-get install -y -q --no-install-recommends debootstrap
    }
    local mirror=${REMAT_DEBIAN_MIRROR:-$(host_mirror)}
    [ -n "$mirror" ] || {
      log "no Debian mirror in the host's apt sources; set REMAT_DEBIAN_MIRROR"
      exit 1
    }
    log "debootstrap $suite from $mirror into $root"
    unmount_all
    rm -rf --one-file-system "$root"
    mkdir -p "$roots"
    debootstrap --variant=minbase --components="${components// /,}" "$suite" "$root" "$mirror"
    echo "deb $mirror $suite $components" > "$root/etc/apt/sources.list"
    # sid's Release file can be past its Valid-Until date on a frozen mirror.
    echo 'Acquire::Check-Valid-Until "false";' > "$root/etc/apt/apt.conf.d/99remat"
  fi
  log "installing ${packages[*]}"
  with_mounts install_packages
  echo "$wanted" > "$stamp"
  log "root ready at $root"
}

run() {
  need_root
  [ $# -eq 1 ] || usage
  prepare  # quick when the root is ready with the same package list
  log "copying the checkout to $root/work/remat"
  mkdir -p "$root/work/remat"
  # Sources are replaced; build folders (ignored by git) are kept for incremental builds.
  (cd "$checkout" && git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do if [ -f "$f" ]; then printf '%s\0' "$f"; fi; done |
    tar --null -T - -cf -) | (cd "$root/work/remat" && tar -xf -)
  log "running: $1"
  with_mounts in_root bash -c "cd /work/remat && $1"
}

remove() {
  need_root
  if [ -n "$(mounts_below)" ]; then
    log "refusing to delete $root: mounted below it: $(mounts_below | tr '\n' ' ')"
    exit 1
  fi
  rm -rf --one-file-system "$root"
  log "removed $root"
}

case "$action" in
  prepare) prepare ;;
  run) run "$@" ;;
  path) echo "$root" ;;
  remove) remove ;;
  *) usage ;;
esac

#!/usr/bin/env bash
# gpu-bundle.sh DIR — gathers, from this Debian machine's packages, the build
# dependencies that a GPU machine without a package manager lacks, so that they
# can travel with the source tree to bench/gpu.sh:
#   DIR/usr/src/googletest        GoogleTest sources (built there, with its compiler)
#   DIR/usr/include/{CLI,nlohmann} and DIR/usr/share/cmake/{CLI11,nlohmann_json}
#                                 the header-only CLI11 and nlohmann-json, with
#                                 their CMake package files (relocatable)
# Default DIR: .gpu-deps in the checkout (ignored by git). Installs the packages
# first when missing (scripts/setup.sh).
set -euo pipefail
checkout=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$checkout/.gpu-deps}
bash "$checkout/scripts/setup.sh" >&2
rm -rf "$dir"
mkdir -p "$dir/usr/src" "$dir/usr/include" "$dir/usr/share/cmake"
cp -a /usr/src/googletest "$dir/usr/src/"
cp -a /usr/include/CLI /usr/include/nlohmann "$dir/usr/include/"
cp -a /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json "$dir/usr/share/cmake/"
echo "gpu-bundle: $(du -sh "$dir" | cut -f1) in $dir"

#!/usr/bin/env bash
# Builds libkvoffload alone, as an engine that wants only the cache would, on a root that holds
# nothing but the packages it needs: cmake, g++, make, libboost-dev and libxxhash-dev, with what
# they depend on (and a shell). The root is made here from this machine's installed files
# (hard links, no download) and entered with chroot; the tree is configured with
# -DKVO_BUILD_MODEL=OFF -DKVO_BUILD_TOOLS=OFF -DKVO_BUILD_TESTS=OFF -DKVO_BUILD_BENCHMARKS=OFF
# -DKVO_WITH_CUDA=OFF, and the static and shared libraries are built. A dependency that crept
# into the library (nlohmann-json, CLI11, PCRE2, OpenBLAS, pkg-config...) fails it.
# Needs root (chroot); the packages must be installed (tools/setup.sh --deps-only).
#   tools/check-library-alone.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "check-library-alone: needs root (chroot)" >&2; exit 2; }
wanted=(cmake g++ make libboost-dev libxxhash-dev bash coreutils dash sed grep findutils)
# The installed closure of their dependencies (virtual packages resolved by apt to what provides
# them).
mapfile -t packages < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances "${wanted[@]}" 2>/dev/null | grep '^[a-z0-9]' | sort -u |
  while read -r p; do [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ] && echo "$p"; done)
chroot_dir=$(mktemp -d)
trap 'rm -rf "$chroot_dir"' EXIT
for link in lib lib64 bin sbin; do
  [ -L "/$link" ] && ln -s "$(readlink "/$link")" "$chroot_dir/$link"
done
mkdir -p "$chroot_dir"/{usr/lib,usr/lib64,usr/bin,usr/sbin,tmp,dev,src}
count=0
for p in "${packages[@]}"; do
  while read -r path; do
    if [ -d "$path" ] && [ ! -L "$path" ]; then
      mkdir -p "$chroot_dir$path"
    elif [ -e "$path" ] || [ -L "$path" ]; then
      mkdir -p "$(dirname "$chroot_dir$path")"
      cp -al "$path" "$chroot_dir$path" 2>/dev/null || cp -a "$path" "$chroot_dir$path"
      count=$((count + 1))
    fi
  done < <(dpkg -L "$p" 2>/dev/null)
done
cp -a /dev/null "$chroot_dir/dev/null" 2>/dev/null || : >"$chroot_dir/dev/null"
echo "check-library-alone: a root of ${#packages[@]} packages ($count files) from: ${wanted[*]}"
# What the model and tools need is not there (else this check would prove nothing).
for absent in /usr/include/nlohmann /usr/include/CLI /usr/include/pcre2.h /usr/bin/pkg-config \
              /usr/include/sentencepiece_processor.h /usr/include/gtest; do
  if [ -e "$chroot_dir$absent" ]; then
    echo "check-library-alone: the root holds $absent" >&2
    exit 1
  fi
done
git -C "$root" archive --format=tar HEAD | tar -C "$chroot_dir/src" -xf -
# The working tree's changes too, when there are any (a check before a commit).
git -C "$root" diff HEAD --binary | (cd "$chroot_dir/src" && git apply --allow-empty 2>/dev/null || true)
for f in $(git -C "$root" ls-files --others --exclude-standard); do
  mkdir -p "$(dirname "$chroot_dir/src/$f")" && cp -a "$root/$f" "$chroot_dir/src/$f"
done
chroot "$chroot_dir" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/tmp /bin/sh -c '
  set -e
  cmake -S /src -B /tmp/build -DCMAKE_BUILD_TYPE=Release -DKVO_BUILD_MODEL=OFF \
    -DKVO_BUILD_TOOLS=OFF -DKVO_BUILD_TESTS=OFF -DKVO_BUILD_BENCHMARKS=OFF -DKVO_WITH_CUDA=OFF
  cmake --build /tmp/build -j "$(nproc)" --target kvoffload kvoffload_shared
  ls -l /tmp/build/libkvoffload.a /tmp/build/libkvoffload.so.0'
echo "check-library-alone: libkvoffload built with cmake, g++, make, Boost and xxHash alone"

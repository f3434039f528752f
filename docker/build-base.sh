#!/usr/bin/env bash
# The CPU image's base, made here instead of pulled: a Debian bookworm root filesystem built
# by mmdebstrap from the Debian mirror and imported into Docker as sglang-domino-base:bookworm.
# No registry is needed (Docker Hub is not reachable from the build machines).
#
#   docker/build-base.sh [IMAGE]        # default sglang-domino-base:bookworm; run as root
#
# What it holds, and why:
# - python3 (3.11 on bookworm: sglang 0.5.23 ships only a cp311 wheel), python3-venv, and
#   python3-dev + gcc + libc6-dev (Triton and torch compile small C helpers at run time), and
#   g++: `--enable-torch-compile` compiles inductor's C++ graphs and the CPU paged-attention
#   kernel (kernels/cpu_paged_attention.cpp) on the serving machine;
# - ca-certificates (pip over HTTPS), libnuma1 (linked by sglang-kernel), procps (ps, kill);
# - libibverbs1 and libcurl4: loaded by mooncake's transfer engine (the test extra, for
#   prefill-decode disaggregation); with libibverbs1 present, scripts/install.sh needs no apt-get.
# Needs: mmdebstrap, a running Docker daemon, the Debian mirror.
set -euo pipefail
IMAGE="${1:-sglang-domino-base:bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
PACKAGES=ca-certificates,python3,python3-venv,python3-dev,gcc,g++,libc6-dev,libnuma1,libibverbs1,libcurl4,procps

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# minbase: essential packages + apt; no documentation, man pages or apt lists in the image.
mmdebstrap --variant=minbase --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$tmp/rootfs.tar" \
    "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" "deb $SECURITY bookworm-security main"
docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --message "Debian bookworm minbase + $PACKAGES (mmdebstrap)" \
    "$tmp/rootfs.tar" "$IMAGE"
docker run --rm "$IMAGE" python3 --version

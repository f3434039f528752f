#!/usr/bin/env bash
# Builds the CPU image (docker/Dockerfile.cpu) as sglang-domino:cpu, on the locally made base.
#
#   docker/build-cpu.sh [extra docker build args...]      # run as root, from anywhere
#
# - Makes the base first (docker/build-base.sh) when sglang-domino-base:bookworm is missing.
# - Builds with --network host: the build reaches PyPI (and the local wheel server below)
#   through the host's network.
# - Local wheels: the file:// extra indexes of the host's pip configuration (on the build machines
#   /opt/pypi and /opt/pypi-more, which hold torch 2.14.1 and the nvidia-* wheels) are served to the
#   build over HTTP on 127.0.0.1, for the duration of the build only, so those GBs are not
#   downloaded again. Without them the build takes the same wheels from PyPI.
# - CA certificates: the host's local additions (/usr/local/share/ca-certificates/*.crt, e.g. a
#   TLS-intercepting egress proxy's) are given to pip for the install only (EXTRA_CA_PEM).
# Override with WHEEL_INDEX_DIRS="dir ..." (index roots holding simple/; "" for none), WHEEL_PORT (38080),
# EXTRA_CA_FILES="file ..." ("" for none), IMAGE and BASE.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${IMAGE:-sglang-domino:cpu}"
BASE="${BASE:-sglang-domino-base:bookworm}"

docker image inspect "$BASE" >/dev/null 2>&1 || "$ROOT/docker/build-base.sh" "$BASE"

if [ -z "${WHEEL_INDEX_DIRS+x}" ]; then
    # file:///X/simple in the host's pip configuration -> /X
    WHEEL_INDEX_DIRS="$(pip config list 2>/dev/null | sed -n "s/^[a-z]*\.extra-index-url='\(.*\)'$/\1/p" \
        | tr ' ' '\n' | sed -n 's#^file://\(/.*\)/simple/\?$#\1#p' | tr '\n' ' ' || true)"
fi
if [ -z "${EXTRA_CA_FILES+x}" ]; then
    EXTRA_CA_FILES="$(ls /usr/local/share/ca-certificates/*.crt 2>/dev/null | tr '\n' ' ' || true)"
fi

args=()
server_pid=""
serve_dir=""
cleanup() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
    if [ -n "$serve_dir" ]; then rm -rf "$serve_dir"; fi
}
trap cleanup EXIT
if [ -n "${WHEEL_INDEX_DIRS// /}" ]; then
    serve_dir="$(mktemp -d)"
    # A fixed port keeps the build argument, and so Docker's layer cache, the same from build to build.
    port="${WHEEL_PORT:-38080}"
    python3 -c "import socket; socket.socket().bind(('127.0.0.1', $port))" 2>/dev/null \
        || port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    indexes=""
    i=0
    for dir in $WHEEL_INDEX_DIRS; do
        [ -d "$dir/simple" ] || continue
        ln -s "$dir" "$serve_dir/$i"
        indexes="$indexes http://127.0.0.1:$port/$i/simple"
        i=$((i + 1))
    done
    if [ -n "$indexes" ]; then
        python3 -m http.server "$port" --bind 127.0.0.1 --directory "$serve_dir" >/dev/null 2>&1 &
        server_pid=$!
        for _ in $(seq 50); do
            python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/')" 2>/dev/null && break
            sleep 0.1
        done
        echo "[build-cpu] local wheel indexes for the build:$indexes"
        args+=(--build-arg "WHEEL_INDEXES=${indexes# }" --build-arg "WHEEL_TRUSTED_HOSTS=127.0.0.1:$port")
    fi
fi
if [ -n "${EXTRA_CA_FILES// /}" ]; then
    echo "[build-cpu] extra CA certificates for pip: $EXTRA_CA_FILES"
    # shellcheck disable=SC2086
    args+=(--build-arg "EXTRA_CA_PEM=$(cat $EXTRA_CA_FILES)")
fi

cd "$ROOT"
docker build --network host -f docker/Dockerfile.cpu --build-arg "BASE=$BASE" -t "$IMAGE" "${args[@]}" "$@" .
docker image ls "$IMAGE"

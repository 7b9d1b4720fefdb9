#!/usr/bin/env bash
# Start a Docker engine in the background if none answers, then wait (up to 60 s) until it does.
# Idempotent: does nothing when `docker info` already works. No systemd needed.
#   DOCKERD_LOG  where dockerd writes its output (default /tmp/dockerd.log)
set -euo pipefail

log=${DOCKERD_LOG:-/tmp/dockerd.log}

if docker info >/dev/null 2>&1; then
    echo "start-dockerd: engine already running"
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
    echo "start-dockerd: dockerd not installed (apt-get install -y docker.io)" >&2
    exit 1
fi

if [ -S /var/run/docker.sock ] && ! pgrep -x dockerd >/dev/null 2>&1; then
    rm -f /var/run/docker.sock /var/run/docker.pid  # stale leftovers of a dead daemon
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
    echo "start-dockerd: starting dockerd (log: $log)"
    nohup dockerd >"$log" 2>&1 &
fi

for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then
        echo "start-dockerd: engine is up"
        exit 0
    fi
    sleep 1
done
echo "start-dockerd: dockerd did not answer within 60 s; last log lines:" >&2
tail -n 20 "$log" >&2 || true
exit 1

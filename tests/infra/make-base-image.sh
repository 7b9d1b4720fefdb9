#!/usr/bin/env bash
# Make a local stand-in for a registry base image (NGC / Habana): Debian bookworm + python3 (+ torch).
#
#   make-base-image.sh NAME:TAG
#
# There is no container registry here, so the image is built from scratch: debootstrap a minimal
# bookworm rootfs with python3 from the Debian mirror apt already uses, install the workload's
# Python packages into it with the HOST's pip (containers cannot reach the host's package index),
# then `docker import` the tree. Idempotent: exits at once if NAME:TAG already exists. Concurrent
# callers serialize on a lock file, so a CI step and a pytest fixture never build it twice.
#
# Environment:
#   BASE_IMAGE_TORCH   "full" (default): torch==2.14.1 torchvision==0.29.1 with every dependency
#                      pip resolves (the CUDA build; it runs on the CPU here);
#                      "none": python3 only, for images that never import torch.
#   BASE_IMAGE_KEEP_TRITON  1 keeps triton (about 0.9 GB). By default it is removed: torch
#                      imports it lazily, only to compile GPU kernels (torch.compile on CUDA),
#                      which cannot run on these GPU-less machines.
#   DEBIAN_MIRROR      override the mirror (default: the first Debian URI in apt's sources).
#   PYTHON             the host interpreter whose pip installs the packages (default python3;
#                      it must be Python 3.11, bookworm's python3).
set -euo pipefail

ref=${1:?usage: make-base-image.sh NAME:TAG}
torch_mode=${BASE_IMAGE_TORCH:-full}
python=${PYTHON:-python3}
site=/usr/local/lib/python3.11/dist-packages   # on sys.path of bookworm's python3.11

exec 9>"/tmp/make-base-image.$(echo "$ref" | tr '/:' '__').lock"
flock 9

if docker image inspect "$ref" >/dev/null 2>&1; then
    echo "make-base-image: $ref already exists"
    exit 0
fi

case "$torch_mode" in full|none) ;; *) echo "BASE_IMAGE_TORCH must be full or none" >&2; exit 2;; esac
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$torch_mode" = full ] && [ "$pyver" != 3.11 ]; then
    echo "make-base-image: host $python is $pyver; bookworm's python3 is 3.11" >&2
    exit 2
fi

mirror_from_apt() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) { print $i; exit } }' "$f"
    done | head -n 1
    grep -hsE '^deb +(\[[^]]*\] +)?[a-z]+://[^ ]+/debian/? ' /etc/apt/sources.list \
        /etc/apt/sources.list.d/*.list 2>/dev/null | awk '{ print ($2 ~ /^\[/) ? $3 : $2 }' || true
}
mirror=${DEBIAN_MIRROR:-$(mirror_from_apt | sed -n 1p)}
mirror=${mirror:-http://deb.debian.org/debian}

rootfs=$(mktemp -d /tmp/base-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
t0=$(date +%s)

echo "make-base-image: debootstrap bookworm (minbase + python3) from $mirror"
debootstrap --variant=minbase --include=python3,ca-certificates bookworm "$rootfs" "$mirror" \
    >/tmp/make-base-image.debootstrap.log 2>&1 \
    || { tail -n 30 /tmp/make-base-image.debootstrap.log >&2; exit 1; }
t1=$(date +%s)
echo "make-base-image: debootstrap took $((t1 - t0)) s"

if [ "$torch_mode" = full ]; then
    echo "make-base-image: pip --target $site torch==2.14.1 torchvision==0.29.1 (host pip)"
    mkdir -p "$rootfs$site"
    "$python" -m pip install --quiet --no-compile --no-warn-script-location \
        --root-user-action=ignore --target "$rootfs$site" torch==2.14.1 torchvision==0.29.1 \
        2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
    rm -rf "$rootfs$site/bin"   # console scripts with host shebangs: useless in the image
    if [ "${BASE_IMAGE_KEEP_TRITON:-0}" != 1 ]; then
        rm -rf "$rootfs$site"/triton "$rootfs$site"/triton-*.dist-info
    fi
    t2=$(date +%s)
    echo "make-base-image: pip took $((t2 - t1)) s"
fi

# Trim what an image never needs.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*

t3=$(date +%s)
tar --numeric-owner -C "$rootfs" -c . | docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' - "$ref" >/dev/null
t4=$(date +%s)
size=$(docker image inspect -f '{{.Size}}' "$ref")
echo "make-base-image: docker import took $((t4 - t3)) s"
echo "make-base-image: built $ref in $((t4 - t0)) s, size $((size / 1024 / 1024)) MiB"

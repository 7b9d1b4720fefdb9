#!/usr/bin/env bash
# Make a local stand-in for an NGC release's Ubuntu base: a minimal Ubuntu rootfs with python3.
#
#   make-ubuntu-standin.sh NAME:TAG SUITE      (SUITE: focal = 20.04, jammy = 22.04)
#
# There is no container registry here. The Bitfusion client checks the base's Ubuntu release,
# which a Debian stand-in cannot pass, so this debootstraps the Ubuntu suite itself from
# UBUNTU_MIRROR (default http://archive.ubuntu.com/ubuntu, reachable from the project's machines),
# then `docker import`s it with the label org.orchestrate.stand-in saying what it stands in for.
# Debian ships no Ubuntu archive keyring, so the suite's signatures are NOT verified
# (--no-check-gpg): the image is a test fixture built and used on this machine only, never a base
# for anything else. Idempotent (exits at once if NAME:TAG exists); concurrent callers serialize
# on a lock file.
set -euo pipefail

ref=${1:?usage: make-ubuntu-standin.sh NAME:TAG SUITE}
suite=${2:?usage: make-ubuntu-standin.sh NAME:TAG SUITE}
mirror=${UBUNTU_MIRROR:-http://archive.ubuntu.com/ubuntu}
case "$suite" in focal) version=20.04 ;; jammy) version=22.04 ;; bionic) version=18.04 ;;
    *) echo "make-ubuntu-standin: SUITE must be bionic, focal or jammy" >&2; exit 2 ;; esac

exec 9>"/tmp/make-ubuntu-standin.$(echo "$ref" | tr '/:' '__').lock"
flock 9
if docker image inspect "$ref" >/dev/null 2>&1; then
    echo "make-ubuntu-standin: $ref already exists"
    exit 0
fi
command -v debootstrap >/dev/null || { echo "make-ubuntu-standin: no debootstrap" >&2; exit 2; }

rootfs=$(mktemp -d /tmp/ubuntu-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
t0=$(date +%s)
echo "make-ubuntu-standin: debootstrap $suite (Ubuntu $version, minbase + python3) from $mirror"
debootstrap --variant=minbase --no-check-gpg --include=python3,ca-certificates \
    "$suite" "$rootfs" "$mirror" >/dev/null
echo "deb $mirror $suite main universe" > "$rootfs/etc/apt/sources.list"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import \
    -c "LABEL org.orchestrate.stand-in=\"Ubuntu $version ($suite) minbase from $mirror, signatures not verified: a local stand-in for the Ubuntu of an NGC release's base image\"" \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - "$ref" >/dev/null
echo "make-ubuntu-standin: $ref made in $(( $(date +%s) - t0 )) s"

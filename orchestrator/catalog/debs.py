"""Debian packages a template copies into an image: which Ubuntu release a ``.deb`` is built for.

VMware's Bitfusion client is one ``.deb`` per Ubuntu release (``bitfusion-client-ubuntu2004_
4.0.1-5_amd64.deb``: package ``bitfusion-client-ubuntu2004``), linked against that release's
libraries: on a base image of another release it does not install (or does not run). `validate`
compares the two before anything is built (:func:`deb_ubuntu`); the image's own build compares
them again inside the base (``dpkg-deb -f``), for bases `validate` cannot see into.

Pure apart from reading the file: a ``.deb`` is an ``ar`` archive whose ``control.tar.gz`` /
``.xz`` holds ``./control`` (``Package:``, ``Depends:`` ...); a ``control.tar.zst`` (newer
Ubuntu packages) is not readable by the standard library, so there the file name decides.
"""

from __future__ import annotations

import io
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

_UBUNTU = re.compile(r"ubuntu(\d\d)(\d\d)")
_AR_MAGIC = b"!<arch>\n"
#: Most bytes read of a member of the archive (a control archive is a few kB).
_MAX_MEMBER = 16 << 20


@dataclass(frozen=True)
class DebUbuntu:
    """The Ubuntu release a package is built for, and what said so."""

    ubuntu: str | None
    how: str
    package: str | None = None


def control_fields(path: Path) -> dict[str, str]:
    """The ``control`` file of a ``.deb`` as a field -> value mapping; empty when the archive
    cannot be read (not a .deb, a zstd control archive)."""
    try:
        data = path.read_bytes()
    except OSError:
        return {}
    if not data.startswith(_AR_MAGIC):
        return {}
    offset = len(_AR_MAGIC)
    while offset + 60 <= len(data):
        header = data[offset:offset + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            return {}
        body = data[offset + 60:offset + 60 + min(size, _MAX_MEMBER)]
        if name.startswith("control.tar"):
            return _control_of(name, body)
        offset += 60 + size + (size & 1)
    return {}


def _control_of(name: str, body: bytes) -> dict[str, str]:
    mode = {"control.tar.gz": "r:gz", "control.tar.xz": "r:xz", "control.tar": "r:"}.get(name)
    if mode is None:
        return {}
    try:
        with tarfile.open(fileobj=io.BytesIO(body), mode=mode) as tar:  # type: ignore[call-overload]
            member = next((m for m in tar.getmembers()
                           if m.name.lstrip("./") == "control" and m.isfile()), None)
            fh = tar.extractfile(member) if member is not None else None
            text = fh.read(1 << 20).decode("utf-8", "replace") if fh is not None else ""
    except (tarfile.TarError, OSError, EOFError):
        return {}
    fields: dict[str, str] = {}
    key = ""
    for line in text.splitlines():
        if line[:1] in (" ", "\t") and key:
            fields[key] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    return fields


def deb_ubuntu(path: Path) -> DebUbuntu:
    """The Ubuntu release ``path`` is built for: from its ``Package:`` name where the file can
    be read (``...-ubuntu2004`` -> ``20.04``), else from its file name; None when neither says."""
    fields = control_fields(path)
    package = fields.get("Package")
    if package:
        found = _UBUNTU.search(package)
        if found:
            return DebUbuntu(f"{found[1]}.{found[2]}", f"its package {package!r}", package)
    found = _UBUNTU.search(path.name)
    if found:
        return DebUbuntu(f"{found[1]}.{found[2]}", f"its file name {path.name!r}", package)
    return DebUbuntu(None, "neither its package name nor its file name names an Ubuntu "
                           "release", package)

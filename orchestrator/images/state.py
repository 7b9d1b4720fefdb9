"""What the image builds recorded, per host: the state ``orchestrate images refresh`` compares
with, and the provenance a cell's result gives of the image it ran.

An :class:`ImageRecord` is one image of one matrix profile (and pinned release) on one host: the
release and why (the host's driver, the cell's ``ngc_release``, the profile's variables), the base
image and the bits it was pinned to (digest or image ID), the tag and the engine's image ID.

The state file is ``<results>/.orchestrate-images.json``, next to the run folders, so the sweeps
of every colleague and the nightly ``images refresh`` share it::

    {"version": 1,
     "hosts": {"dgx-a": {"driver": "550.54.15", "accelerator": "nvidia",
                         "compute_capability": "9.0", "seen_at": 1764000000.0}},
     "images": [{"host": "dgx-a", "matrix": "nightly", "matrix_file": "/lab/nightly.toml",
                 "hardware": "h100", "ngc_release": null, "how": "auto", "release": "24.05",
                 "driver": "550.54.15", "base_image": "nvcr.io/nvidia/pytorch:24.05-py3",
                 "base_digest": null, "base_image_id": "sha256:...", "tag": "orchestrate/...",
                 "image_id": "sha256:...", ...}]}

Rules: an image's record is keyed by (host, matrix file, hardware, ngc_release) and replaced by
the newest build of that key; a host's entry by its name. The file is replaced atomically and
follows the umask (:func:`orchestrator.results.folders.run_folder.write_json`: a colleague's refresh
can read it);
every update is a read-modify-write under an ``flock`` of ``.orchestrate-images.lock`` beside it,
so two sweeps recording at once never lose each other's records. A damaged file is a
:class:`~orchestrator.errors.ConfigError` naming it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.results.folders import folder_lock
from orchestrator.results.folders.run_folder import ResultsRoot, read_json, write_json

log = logging.getLogger(__name__)

STATE_NAME = ResultsRoot.IMAGES_STATE
LOCK_NAME = ResultsRoot.IMAGES_LOCK
VERSION = 1

RecordKey = tuple[str, str, str, str | None]


@dataclass(frozen=True)
class ImageRecord:
    """One image of a profile (and pinned release) built on one host."""

    host: str
    matrix: str
    matrix_file: str
    hardware: str
    template: str
    tag: str
    ngc_release: str | None = None
    #: How the release was decided: "auto" (the host's driver), "axis", "profile".
    how: str = "profile"
    family: str | None = None
    release: str | None = None
    #: The host's driver the release was chosen for (auto), else as probed (None: not probed).
    driver: str | None = None
    reason: str = ""
    base_image: str = ""
    base_digest: str | None = None
    base_image_id: str | None = None
    image_id: str | None = None
    built: bool = False
    updated_at: float = field(default_factory=time.time)
    #: The ``--set`` overrides the matrix file was read with (as recorded, secrets masked): a
    #: refresh without matrices reads the file with them again.
    overrides: tuple[str, ...] = ()

    @property
    def key(self) -> RecordKey:
        return (self.host, self.matrix_file, self.hardware, self.ngc_release)

    @property
    def base_pin(self) -> str | None:
        """What the image's tag covers of its base: the registry digest, else the image ID."""
        return self.base_digest or self.base_image_id

    def provenance(self) -> dict[str, Any]:
        """The fields a cell's ``result.json`` provenance gives of the image it ran."""
        return {
            "image_id": self.image_id, "image_template": self.template,
            "base_image": self.base_image, "base_digest": self.base_digest,
            "base_image_id": self.base_image_id, "release": self.release,
            "release_family": self.family, "release_how": self.how,
            "release_reason": self.reason, "host_driver": self.driver,
        }

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> ImageRecord:
        """A record from the state file; ValueError if it is not one."""
        if not isinstance(data, dict):
            raise ValueError(f"expected an object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in data.items() if k in names}
        missing = [k for k in ("host", "matrix", "matrix_file", "hardware", "template", "tag")
                   if not isinstance(known.get(k), str)]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        overrides = known.get("overrides", [])
        if not (isinstance(overrides, list) and all(isinstance(o, str) for o in overrides)):
            raise ValueError("overrides: expected a list of KEY=VALUE texts")
        return cls(**{**known, "overrides": tuple(overrides)})


@dataclass
class ImageState:
    """The state file's contents: the hosts as last probed and the images as last built."""

    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    images: dict[RecordKey, ImageRecord] = field(default_factory=dict)

    def put(self, record: ImageRecord) -> None:
        """Record the newest build of ``record``'s key."""
        self.images[record.key] = record

    def host_seen(self, name: str, driver: str | None, accelerator: str | None,
                  compute_capability: str | None) -> None:
        """Record what host ``name`` reported when it was probed."""
        self.hosts[name] = {"driver": driver, "accelerator": accelerator,
                            "compute_capability": compute_capability, "seen_at": time.time()}

    def of_host(self, host: str) -> list[ImageRecord]:
        """The records of ``host``, in a stable order."""
        return sorted((r for r in self.images.values() if r.host == host),
                      key=lambda r: (r.matrix_file, r.hardware, r.ngc_release or ""))

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "hosts": dict(sorted(self.hosts.items())),
                "images": [r.to_json() for r in sorted(self.images.values(), key=_order)]}


def _order(record: ImageRecord) -> tuple[str, str, str, str]:
    return (record.host, record.matrix_file, record.hardware, record.ngc_release or "")


def state_path(results_root: Path) -> Path:
    """Where the image state of a results folder lives."""
    return ResultsRoot(Path(results_root)).images_state


def load_state(path: Path) -> ImageState:
    """The state at ``path`` (empty when there is none yet); a damaged file is a ConfigError."""
    if not path.exists():
        return ImageState()
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("images", []), list) \
            or not isinstance(data.get("hosts", {}), dict):
        raise ConfigError("not an image state file (expected an object with 'hosts' and "
                          "'images'); move it away to start afresh", file=str(path))
    state = ImageState(hosts={str(k): dict(v) for k, v in data.get("hosts", {}).items()
                              if isinstance(v, dict)})
    for i, item in enumerate(data.get("images", [])):
        try:
            state.put(ImageRecord.from_json(item))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"images[{i}]: {exc}; move the file away to start afresh",
                              file=str(path)) from None
    return state


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = folder_lock.open_regular(path.parent / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def update_state(path: Path, change: Callable[[ImageState], None]) -> ImageState:
    """Read the state, apply ``change`` and write it back, all under the state's lock."""
    with _locked(path):
        state = load_state(path)
        change(state)
        write_json(path, state.to_json())
    return state

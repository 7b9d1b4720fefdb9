"""The machine's truth: the torch a cell runs, checked against the GPU it will get.

Part of the one decision of :mod:`orchestrator.backends.checks` (``validate``, ``plan``,
``--dry-run`` and the sweep take it alike). For every profile the cells use, on the backend
they run on:

* **the torch that runs the cell**: this machine's Python for the process and slurm backends
  (a Slurm node runs the same environment from the shared filesystem), read from its files
  without importing torch (:func:`orchestrator.plan.software.host_stack`: version, CUDA, GPU
  architectures); the image's NGC release for the docker and ssh backends and for Apptainer
  (its CUDA, its oldest supported GPU and its minimum driver, from the release table);
* **the GPU it gets**: this machine's (``nvidia-smi``; ``hl-smi`` for Gaudi) for the
  backends that run cells here (their record says ``here``: process, docker); the profile's
  ``gpu`` / ``compute_capability`` for the others (slurm, ssh), whose nodes and hosts are not
  asked (a dry run and ``validate`` connect to nothing);
* **the rules**: a CUDA cell needs an NVIDIA GPU at all (a Gaudi cell a Gaudi card) where it
  runs here; a CUDA build of torch; kernels for the GPU's compute capability
  (:func:`orchestrator.catalog.torch_builds.arch_runs`; an NGC release's
  ``min_compute_capability``); a driver that runs the build's CUDA (the release's
  ``min_driver``, with forward compatibility on data-center GPUs). What cannot be known here (a
  node's driver, a host's GPU when the profile names none) is a note.

Every error names the cells, the GPU and what to install or set instead. A Bitfusion profile's
cells get their GPUs from the Bitfusion servers, a CPU profile's none
(:func:`orchestrator.plan.placement.holds_local_gpus`: nothing of this machine is checked); a
profile whose release is chosen per host (``release = "auto"``) gets a release its host's driver
and GPU run, so only the GPU's presence is checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from orchestrator.catalog import gpus, releases, torch_builds
from orchestrator.config.matrix_file import HardwareProfile
from orchestrator.errors import MISSING, SHORT, UNCHECKED, Problem, Requirement
from orchestrator.plan import software
from orchestrator.plan.matrix import Cell
from orchestrator.plan.placement import holds_local_gpus
from orchestrator.plan.software import PlannedStack


class Report(Protocol):
    """Where the findings go (:class:`orchestrator.backends.checks.Findings`)."""

    def error(self, problem: Problem) -> None: ...
    def warning(self, problem: Problem) -> None: ...
    def note(self, problem: Problem) -> None: ...

#: How many cell ids a message names before counting the rest.
_NAMED = 2


@dataclass(frozen=True)
class Gpu:
    """A GPU a cell will get: its model and compute capability (None: not known)."""

    model: str
    capability: tuple[int, int] | None

    @property
    def label(self) -> str:
        cc = f"compute capability {self.capability[0]}.{self.capability[1]}" \
            if self.capability else "compute capability unknown"
        return f"{self.model} ({cc})"


def who(cells: Sequence[Cell]) -> str:
    """``cell a`` / ``40 cells (a, b, ...)``: the cells a message is about."""
    ids = [c.id for c in cells]
    if len(ids) == 1:
        return f"cell {ids[0]}"
    more = ", ..." if len(ids) > _NAMED else ""
    return f"{len(ids)} cells ({', '.join(ids[:_NAMED])}{more})"


def local_gpus(facts: gpus.HostFacts, profile: HardwareProfile) -> list[Gpu]:
    """This machine's NVIDIA GPUs a profile's cells may get (its ``gpu_ids``, else all), one
    per model."""
    chosen = [g for g in facts.gpus
              if profile.gpu_ids is None or g.index in profile.gpu_ids]
    seen: dict[str, Gpu] = {}
    for g in chosen:
        cc = gpus.compute_capability(g.model)
        seen.setdefault(g.model, Gpu(g.model, releases.parse_capability(cc) if cc else None))
    return list(seen.values())


def describe(found: tuple[list[Gpu], str | None], facts: gpus.HostFacts | None) -> str:
    """The GPUs a profile's cells get, in words: ``this machine's H100 (compute capability
    9.0), driver 580.65.06``; "" where nothing is known."""
    targets, driver = found
    if not targets:
        return ""
    shown = ", ".join(g.label for g in targets)
    where = f"{_machine(facts)}'s" if facts is not None else "the profile's"
    return f"{where} {shown}" + (f", driver {driver}" if driver else "")


@dataclass
class GpuCheck:
    """The rules for one profile's cells (of one pinned release) on ``backend``."""

    report: Report
    file: str
    hw: str
    profile: HardwareProfile
    stack: PlannedStack
    cells: Sequence[Cell]
    backend: str
    #: This machine's facts where the backend runs cells here; None: the GPUs are elsewhere.
    facts: gpus.HostFacts | None
    #: Where the image's release is set (``hardware.NAME.image_vars.base_tag``, the cells'
    #: ``ngc_release`` values).
    release_fields: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"hardware.{self.hw}"

    def error(self, fld: str, message: str) -> None:
        self.report.error(Problem(self.file, fld, message))

    def lacks(self, fld: str, kind: str, message: str) -> None:
        """What the machine the cells run on lacks (a :class:`~orchestrator.errors.Requirement`
        of ``kind``, for these cells): a fact of that machine, not of the file."""
        self.report.error(Requirement(self.file, fld, message, kind=kind,
                                      cells=tuple(c.id for c in self.cells), state=MISSING))

    def unchecked(self, fld: str, kind: str, message: str) -> None:
        """What only the machine the cells run on can tell (a note, listed as a requirement to
        check there)."""
        self.report.note(Requirement(self.file, fld, message, kind=kind,
                                     cells=tuple(c.id for c in self.cells), state=UNCHECKED))

    @property
    def machine(self) -> str:
        """``this machine``, or the declared target the facts describe (``--target``)."""
        return _machine(self.facts)

    def run(self) -> None:
        """Every rule for these cells (:meth:`targets`, then :meth:`software`)."""
        found = self.targets()
        if found is not None:
            self.software(*found)

    def targets(self) -> tuple[list[Gpu], str | None] | None:
        """The GPUs the cells get and the driver they run under (None: not known here);
        None when they get none: there is no GPU for them here (an error says so) or they need
        none of this machine's (CPU cells, Bitfusion's remote GPUs)."""
        if not holds_local_gpus(self.profile):
            return None
        if self.profile.device == "hpu":
            self._gaudi_present()
            return None
        return self._targets()

    def software(self, targets: list[Gpu], driver: str | None) -> None:
        """The torch of the cells' stack against ``targets`` and ``driver``."""
        if self.stack.candidates:  # release = "auto": each host gets one its driver runs
            return
        if self.stack.host_build:
            self._host_torch(targets, driver)
        elif self.stack.release is not None:
            self._release(targets, driver)

    # --- the GPU -------------------------------------------------------------------------

    def _targets(self) -> tuple[list[Gpu], str | None] | None:
        if self.facts is None:
            cc = software.capability(self.profile)
            model = self.profile.gpu or "the profile's GPU"
            self.unchecked(f"{self.where}.device", "GPUs", (
                f"{who(self.cells)} {_need(self.cells)} {self.wanted()} where the "
                f"{self.backend} backend runs them: not checked here (a dry run and validate "
                "contact no node or host)"))
            return ([Gpu(model, cc)] if cc else []), None
        if self.facts.accelerator != "nvidia":
            self.lacks(f"{self.where}.device", "GPUs", (
                f"{who(self.cells)} {_need(self.cells)} {self.wanted()}, and "
                f"{self.machine} has none ({_why_none(self.facts)}), where the {self.backend} "
                f"backend runs them. {self._elsewhere()}"))
            return None
        found = local_gpus(self.facts, self.profile)
        if not found:
            listed = ", ".join(map(str, self.profile.gpu_ids or ()))
            self.lacks(f"{self.where}.gpu_ids", "GPUs", (
                f"{who(self.cells)}: {self.machine} has no GPU with index {listed} (it has "
                f"{', '.join(str(g.index) for g in self.facts.gpus)})"))
            return None
        self._named_gpu(found)
        self._count(len(self._usable()))
        return found, self.facts.driver

    def _usable(self) -> list[int]:
        """The ids of the facts' accelerators these cells may get (the profile's gpu_ids)."""
        assert self.facts is not None
        ids = self.facts.gpu_ids
        return [i for i in ids if self.profile.gpu_ids is None or i in self.profile.gpu_ids]

    def _count(self, have: int) -> None:
        """Cells that need more GPUs than the machine has for them: a requirement that falls
        short (those cells are recorded unplaceable when the sweep reaches them; the others
        run): a warning, which ``--strict`` refuses."""
        over = [c for c in self.cells if c.params.gpus_per_node > have]
        if not over:
            return
        counts = sorted({c.params.gpus_per_node for c in over})
        many = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
        self.report.warning(Requirement(self.file, f"{self.where}.device", (
            f"{who(over)} {_need(over)} {many} GPUs{' each' if len(over) > 1 else ''}, and "
            f"{self.machine} has {have} "
            "for them: they would be recorded unplaceable (the other cells run)"),
            kind="GPUs", cells=tuple(c.id for c in over), state=SHORT))

    def wanted(self) -> str:
        """The GPUs these cells need, in words: ``an NVIDIA GPU (V100, compute capability
        7.0), 1 to 8 per cell``."""
        cc = software.capability(self.profile)
        named = ", ".join(p for p in (self.profile.gpu or "",
                                      f"compute capability {cc[0]}.{cc[1]}" if cc else "") if p)
        counts = sorted({c.params.gpus_per_node for c in self.cells})
        per = (f"{counts[0]} per cell" if len(counts) == 1
               else f"{counts[0]} to {counts[-1]} per cell")
        return f"an NVIDIA GPU ({named}{'; ' if named else ''}{per}; device = \"cuda\")"

    def _elsewhere(self) -> str:
        """How to meet a missing accelerator: a machine that has it, or the backends that run
        the cells where it is; a profile that names no GPU may also run on the CPU."""
        gpu = self.profile.gpu or ("a Gaudi card" if self.profile.device == "hpu" else "GPUs")
        cpu = "" if self.profile.gpu else ", or set device = \"cpu\""
        return (f"Run them on a machine with {gpu} (plan for one with --target), or where the "
                f"GPUs are: --backend ssh with a hosts inventory, --backend slurm{cpu}")

    def _named_gpu(self, found: list[Gpu]) -> None:
        """A profile that names another GPU than this machine's: its cells run on this one."""
        named = self.profile.gpu
        if named is None:
            return
        mine = {gpus.compute_capability(named) or named.upper()}
        theirs = {gpus.compute_capability(g.model) or g.model.upper() for g in found}
        if gpus.compute_capability(named) is None or mine == theirs:
            return
        models = ", ".join(g.label for g in found)
        self.report.warning(Problem(self.file, f"{self.where}.gpu", (
            f"names {named!r}, but the {self.backend} backend runs {who(self.cells)} on "
            f"{self.machine}'s {models}: the results will say {models.split(' (')[0]}")))

    def _gaudi_present(self) -> None:
        if self.facts is None:
            self.unchecked(f"{self.where}.device", "GPUs", (
                f"{who(self.cells)} {_need(self.cells)} a Gaudi card (device = \"hpu\") where "
                f"the {self.backend} backend runs them: not checked here"))
            return
        if self.facts.accelerator == "gaudi":
            self._count(len(self._usable()))
            return
        self.lacks(f"{self.where}.device", "GPUs", (
            f"{who(self.cells)} {_need(self.cells)} a Gaudi card (device = \"hpu\"), and "
            f"{self.machine} has none (hl-smi found no card), where the {self.backend} backend "
            "runs them. Run them on a Gaudi host (--backend ssh with a hosts inventory, or "
            "plan for one with --target gpu=Gaudi2)"))

    # --- this machine's torch (process, slurm) ---------------------------------------------

    def _host_torch(self, targets: list[Gpu], driver: str | None) -> None:
        stack = self.stack
        if stack.cuda is None:
            self.lacks(f"{self.where}.device", "python", (
                f"{who(self.cells)} {_need(self.cells)} CUDA, and this Python's torch "
                f"{stack.torch} is not a CUDA build: {torch_builds.cpu_build_advice()}"))
            return
        for gpu in targets:
            self._host_archs(gpu)
        if not targets and self.facts is None:
            self.report.note(Problem(self.file, self.where, (
                f"which GPU the {self.backend} backend's cells get is not known here (set gpu = "
                f"\"A100\" or compute_capability): whether torch {stack.torch} (CUDA "
                f"{stack.cuda}) has kernels for it is not checked")))
        self._host_driver(targets, driver)

    def _host_archs(self, gpu: Gpu) -> None:
        stack = self.stack
        if gpu.capability is None:
            self.report.note(Problem(self.file, self.where, (
                f"{gpu.model}: its compute capability is not known, so whether torch "
                f"{stack.torch} has kernels for it is not checked")))
            return
        if stack.cuda_archs is None:
            self.report.note(Problem(self.file, self.where, (
                f"the GPU architectures of torch {stack.torch} could not be read: whether it "
                f"runs the {gpu.model} ({torch_builds.sm(gpu.capability)}) is not checked")))
            return
        if torch_builds.arch_runs(stack.cuda_archs, gpu.capability):
            return
        fld = f"{self.where}.gpu" if self.profile.gpu and self.facts is None else self.where
        self.lacks(fld, "python", (
            f"{who(self.cells)} run on {gpu.label} with this Python's torch {stack.torch}, "
            f"which carries kernels for {' '.join(stack.cuda_archs)} only (no "
            f"{torch_builds.sm(gpu.capability)}): {torch_builds.gpu_advice(gpu.capability)}"))

    def _host_driver(self, targets: list[Gpu], driver: str | None) -> None:
        stack = self.stack
        assert stack.cuda is not None
        need = torch_builds.min_driver(stack.cuda)
        if driver is None:
            if need and self.facts is None:
                self.unchecked(self.where, "driver", (
                    f"the driver where the {self.backend} backend runs the cells is not known "
                    f"here: torch {stack.torch} (CUDA {stack.cuda}) needs driver {need} or "
                    "newer there"))
            return
        if torch_builds.driver_runs(driver, stack.cuda) is False:
            cc = next((g.capability for g in targets if g.capability), None)
            self.lacks(self.where, "driver", (
                f"{who(self.cells)}: {self.machine}'s driver {driver} is older than torch "
                f"{stack.torch} (CUDA {stack.cuda}) needs ({need} or newer): "
                f"{torch_builds.driver_advice(driver, cc)}"))

    # --- an image's torch (docker, ssh, Apptainer) ----------------------------------------

    def _release(self, targets: list[Gpu], driver: str | None) -> None:
        release = releases.find_release(self.stack.release or "")
        if release is None:
            return
        for gpu in targets:
            if gpu.capability is None or release.runs_on(_shown(gpu.capability)):
                continue
            older = [r for r in releases.load_releases()
                     if r.offered and r.runs_on(_shown(gpu.capability))]
            pick = (f"pick NGC {older[-1].name} or older (base_tag = \"{older[-1].base_tag}\")"
                    if older else "no offered NGC release supports it")
            self._release_error(
                f"{who(self.cells)} run NGC PyTorch {release.name}, which supports compute "
                f"capability {release.min_compute_capability} and newer; {gpu.label} is "
                f"older: {pick}", kind="GPUs" if self.facts is not None else "")
        if driver is None:
            if self.facts is None:
                self.unchecked(self.where, "driver", (
                    f"the driver where the {self.backend} backend runs the cells is not known "
                    f"here: NGC PyTorch {release.name} needs {release.min_driver} or newer "
                    "there"))
            return
        try:
            runs = release.driver_runs(driver, datacenter=self.profile.forward_compat)
        except ValueError:
            return
        if not runs:
            self._release_error(
                f"{who(self.cells)}: {self.machine}'s driver {driver} is older than NGC PyTorch "
                f"{release.name} needs ({release.min_driver} or newer): upgrade the driver, "
                f"pick an older base_tag, or set release = \"auto\" (the newest release the "
                "driver runs)", kind="driver")

    def _release_error(self, message: str, kind: str = "") -> None:
        """An error at each field that sets the release; ``kind``: a fact of the machine the
        cells run on (this machine's GPU or driver), a requirement of that kind."""
        for fld in self.release_fields or (f"{self.where}.image",):
            if kind:
                self.lacks(fld, kind, message)
            else:
                self.error(fld, message)


def _machine(facts: gpus.HostFacts | None) -> str:
    """Who the facts are of: ``this machine`` (probed), else the declared target's name."""
    return "this machine" if facts is None or facts.name == "localhost" else facts.name


def _need(cells: Sequence[Cell]) -> str:
    return "needs" if len(cells) == 1 else "need"


def _shown(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def _why_none(facts: gpus.HostFacts) -> str:
    if facts.accelerator == "gaudi":
        return "it has Gaudi cards"
    if facts.notes:
        return "; ".join(facts.notes)
    return "nvidia-smi is not installed or lists no GPU"

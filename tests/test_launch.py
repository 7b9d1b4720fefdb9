"""launch.py: the command of a cell, and the contract with the workload's own command line.

The orchestrator writes the workload's flags (:func:`workload_flags`); the workload reads them
with its own parser (``workload.cli.build_parser``), which imports nothing of the orchestrator.
The defaults of a cell's parameters live in ``CellParams`` and in that parser: these tests keep
the two agreeing, field by field, and check every value survives the trip.
"""

from __future__ import annotations

import pytest

from orchestrator.config.matrix_file import (
    ORCHESTRATOR_PARAMS,
    CellParams,
    HardwareProfile,
    Program,
)
from orchestrator.plan.launch import (
    NodeRole,
    node_roles,
    python_launcher,
    rdzv_port,
    workload_argv,
    workload_env,
    workload_flags,
)
from orchestrator.plan.matrix import Cell
from orchestrator.plan.placement import Allocation, Slot
from workload.cli import build_parser

#: Workload options the orchestrator sets itself (not cell parameters).
NOT_PARAMS = {"device", "output_dir", "checkpoint_dir", "help"}

#: A value for every workload parameter other than its default (a space in the data path: one
#: argv item, never split).
CHANGED = {
    "batch_size": 7, "precision": "bf16", "mode": "infer", "arch": "resnet18",
    "image_size": 32, "warmup": 0, "iterations": 3, "data": "/data/image net",
    "channels_last": False, "compile": "max-autotune", "cuda_graphs": True, "pretrained": True,
    "num_classes": 10, "workers": 0, "seed": 5, "profiler": "nsys", "profile_start": 1,
    "profile_iterations": 2, "telemetry_interval": 2.5, "hpu_mode": "eager",
}


def workload_fields() -> list[str]:
    return [name for name in CellParams.model_fields if name not in ORCHESTRATOR_PARAMS]


def cell(**params: object) -> Cell:
    values = CellParams.model_validate({"hardware": "cpu", **params})
    return Cell(id="c", group="c", repeat=1, params=values, hash="h")


def test_every_parameter_is_a_workload_option_and_every_option_a_parameter() -> None:
    parser = build_parser()
    options = {action.dest for action in parser._actions}
    assert options - NOT_PARAMS == set(workload_fields())
    assert set(CHANGED) == set(workload_fields())


@pytest.mark.parametrize("name", workload_fields())
def test_defaults_agree_with_the_workload_parser(name: str) -> None:
    assert CellParams.model_fields[name].default == build_parser().get_default(name)


@pytest.mark.parametrize("params", [{}, CHANGED], ids=["defaults", "every value changed"])
def test_flags_round_trip_through_the_workload_parser(params: dict[str, object]) -> None:
    this = cell(**params)
    parsed = vars(build_parser().parse_args(workload_flags(this)))
    expected = this.params.workload_params()
    assert {k: parsed[k] for k in expected} == expected
    if params:
        assert all(expected[k] != CellParams.model_fields[k].default for k in expected)


def test_launchers() -> None:
    assert python_launcher("py", 1) == ["py", "-m"]
    assert python_launcher("py", 4) == ["py", "-m", "torch.distributed.run", "--standalone",
                                        "--nproc_per_node=4", "-m"]
    role = NodeRole(nnodes=2, rank=1, nproc=3, endpoint="10.0.0.1:29401", rdzv_id="cell-r1")
    assert python_launcher("py", 6, role) == [
        "py", "-m", "torch.distributed.run", "--nnodes=2", "--node_rank=1", "--nproc_per_node=3",
        "--rdzv_backend=static", "--rdzv_endpoint=10.0.0.1:29401", "--rdzv_id=cell-r1", "-m"]


def test_workload_argv_of_one_node_of_a_multi_node_cell() -> None:
    profile = HardwareProfile(device="cuda", wrapper="none")
    this = cell(gpus=4, profiler="nsys")
    role = NodeRole(nnodes=2, rank=0, nproc=2, endpoint="h:1", rdzv_id="c")
    argv = workload_argv(this, profile, python="python3", output_dir="/out", node=role)
    helper = ["python3", "-m", "workload.profile_run", "--tool", "nsys", "--out", "/out", "--"]
    assert argv[:8] == helper
    assert argv[8:15] == ["nsys", "profile", "--force-overwrite=true", "--trace=cuda,nvtx,osrt",
                          "--output=/out/profile", "--capture-range=cudaProfilerApi",
                          "--capture-range-end=stop"]
    launcher = argv[15:15 + 10]
    assert launcher == python_launcher("python3", 4, role)
    assert argv[25] == "workload" and argv[-4:] == ["--device", "cuda", "--output-dir", "/out"]
    assert "--standalone" not in argv


def test_node_roles_follow_the_allocation() -> None:
    allocation = Allocation("big-r1", (Slot("a", (0, 1, 2)), Slot("b", (4,))), exclusive=True)
    first, second = node_roles(allocation, "10.1.2.3")
    endpoint = f"10.1.2.3:{rdzv_port('big-r1')}"
    assert first == NodeRole(2, 0, 3, endpoint, "big-r1")
    assert second == NodeRole(2, 1, 1, endpoint, "big-r1")
    assert rdzv_port("big-r1") == rdzv_port("big-r1") and 29400 <= rdzv_port("x") < 29900


@pytest.mark.parametrize(("nnodes", "rank", "nproc"), [(1, 0, 1), (2, 2, 1), (2, -1, 1), (2, 0, 0)])
def test_impossible_node_roles_are_refused(nnodes: int, rank: int, nproc: int) -> None:
    with pytest.raises(ValueError):
        NodeRole(nnodes, rank, nproc, "h:1", "c")


# --- Gaudi: the mode of each cell (eager, lazy, compile) -------------------------------------

GAUDI = HardwareProfile(device="hpu", image="habana", env={"HABANA_VISIBLE_DEVICES": "all"})


@pytest.mark.parametrize(("params", "mode", "lazy"), [
    ({"hpu_mode": "eager"}, "eager", "0"),
    ({"hpu_mode": "lazy"}, "lazy", "1"),
    ({"hpu_mode": "compile"}, "compile", "0"),
    ({}, "lazy", "1"),                       # unset: lazy, said explicitly
    ({"compile": "default"}, "compile", "0"),  # torch.compile without a mode: compiled mode
])
def test_each_gaudi_cell_gets_its_mode(params: dict[str, object], mode: str, lazy: str) -> None:
    """No Gaudi here: this checks what each cell is given (its environment and command, in a
    container too); the workload's side is tests/test_workload_gaudi.py."""
    from orchestrator.runtimes.docker import container_kwargs, container_spec

    this = cell(**params)
    assert workload_env(this, GAUDI, (0, 1))["PT_HPU_LAZY_MODE"] == lazy
    argv = workload_argv(this, GAUDI)
    assert argv[argv.index("--hpu-mode") + 1] == mode
    assert argv.count("--hpu-mode") == 1
    parsed = build_parser().parse_args(argv[argv.index("workload") + 1:])
    assert parsed.hpu_mode == mode and parsed.device == "hpu"
    spec = container_spec(this, GAUDI, Program("workload"), image="orchestrate/habana:x",
                          output_dir="/out", labels={})
    environment = container_kwargs(spec)["environment"]
    assert environment["PT_HPU_LAZY_MODE"] == lazy
    assert environment["HABANA_VISIBLE_DEVICES"] == "all"


def test_two_cells_of_one_profile_get_different_modes() -> None:
    eager, lazy = cell(hpu_mode="eager"), cell(hpu_mode="lazy")
    assert workload_env(eager, GAUDI, ())["PT_HPU_LAZY_MODE"] == "0"
    assert workload_env(lazy, GAUDI, ())["PT_HPU_LAZY_MODE"] == "1"


def test_the_cell_mode_wins_over_a_profile_env() -> None:
    profile = GAUDI.model_copy(update={"env": {"PT_HPU_LAZY_MODE": "1"}})
    assert workload_env(cell(hpu_mode="eager"), profile, ())["PT_HPU_LAZY_MODE"] == "0"


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_no_gaudi_mode_elsewhere(device: str) -> None:
    profile = HardwareProfile(device=device)  # type: ignore[arg-type]
    assert "PT_HPU_LAZY_MODE" not in workload_env(cell(), profile, (0,))
    assert "--hpu-mode" not in workload_argv(cell(), profile)


def test_container_arguments_are_what_docker_py_makes(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """``container_kwargs`` writes the Engine API's dicts itself (a plan of many containers
    imports no Docker SDK: it is made here with the SDK unimportable): key for key and in
    docker-py's order they are what its ``Mount``, ``Ulimit`` and ``DeviceRequest`` make, and
    the shared memory is what its ``parse_bytes`` reads, for every size a matrix may give."""
    import sys

    from orchestrator.config.matrix_file import MAX_MEMORY_BYTES, memory_bytes
    from orchestrator.runtimes.docker import CONTAINER_OUT, container_kwargs, container_spec

    profile = HardwareProfile(device="cuda", image="ngc-pytorch", container={  # type: ignore[arg-type]
        "shm_size": "16g", "ulimits": {"memlock": -1, "stack": 67108864, "nofile": 0},
        "mounts": [{"source": "/data/imagenet", "target": "/imagenet"},
                   {"source": "/scratch", "target": "/scratch", "read_only": False}]})
    spec = container_spec(cell(gpus=2), profile, Program("workload"), image="x:1",
                          output_dir="/runs/cell", labels={}, gpu_ids=(3, 5))
    with monkeypatch.context() as blocked:
        for name in [m for m in sys.modules if m == "docker" or m.startswith("docker.")]:
            blocked.delitem(sys.modules, name)
        blocked.setitem(sys.modules, "docker", None)  # `import docker` raises ImportError
        kw = container_kwargs(spec)
    from docker.types import DeviceRequest, Mount, Ulimit
    from docker.utils import parse_bytes

    expected = {
        "mounts": [Mount(target="/imagenet", source="/data/imagenet", type="bind",
                         read_only=True),
                   Mount(target="/scratch", source="/scratch", type="bind", read_only=False),
                   Mount(target=CONTAINER_OUT, source="/runs/cell", type="bind",
                         read_only=False)],
        "ulimits": [Ulimit(name="memlock", soft=-1, hard=-1),
                    Ulimit(name="stack", soft=67108864, hard=67108864),
                    Ulimit(name="nofile", soft=0, hard=0)],
        "device_requests": [DeviceRequest(driver="nvidia", device_ids=["3", "5"],
                                          capabilities=[["gpu"]])],
    }
    for key, made in expected.items():
        assert [list(d.items()) for d in kw[key]] == [list(d.items()) for d in made], key
    assert kw["shm_size"] == parse_bytes("16g")
    sizes = ["0", "1", "512", "7b", "1k", "64K", "300m", "8g", "16G", "16384g",
             str(MAX_MEMORY_BYTES), f"{MAX_MEMORY_BYTES >> 30}g", "0000000000000009m"]
    assert [memory_bytes(s) for s in sizes] == [parse_bytes(s) for s in sizes]

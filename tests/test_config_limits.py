"""Matrix and hosts files: strict types, a range for every number, the cell cap, how user files
are read (regular files only, size and nesting limits) and the nearest-key suggestion."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.config import files
from orchestrator.config.files import read_config_text
from orchestrator.config.inventory import load_hosts, parse_hosts
from orchestrator.config.matrix_file import MAX_CELLS, json_schema
from orchestrator.errors import ConfigError
from orchestrator.plan.matrix import MAX_ID_LENGTH, load_matrix, parse_only

ROOT = Path(__file__).resolve().parents[1]

BASE = """
[matrix]
{matrix}
[workload]
hardware = "cpu"
{workload}
[axes]
{axes}
[hardware.cpu]
device = "cpu"
{hardware}
"""


def matrix_text(matrix: str = "", workload: str = "", axes: str = "", hardware: str = "") -> str:
    return BASE.format(matrix=matrix, workload=workload, axes=axes, hardware=hardware)


def problems_of(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    return [str(p) for p in err.value.problems]


@pytest.fixture
def write(tmp_path: Path) -> Callable[..., Path]:
    def write(text: str, name: str = "m.toml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write


# --- ranges ----------------------------------------------------------------------------------

OUT_OF_RANGE = [
    ("workload", "gpus = 1000000", "workload.gpus"),
    ("workload", "gpus = 65", "workload.gpus"),
    ("workload", "batch_size = 1000000000000", "workload.batch_size"),
    ("workload", "iterations = 1000000000000", "workload.iterations"),
    ("workload", "warmup = 1000000000000", "workload.warmup"),
    ("workload", "num_classes = 1000000000000", "workload.num_classes"),
    ("workload", "workers = 1000000", "workload.workers"),
    ("workload", "seed = 4294967296", "workload.seed"),
    ("workload", "image_size = 8", "workload.image_size"),
    ("matrix", "repeats = 10000000", "matrix.repeats"),
    ("matrix", "retries = 1000", "matrix.retries"),
    ("matrix", "timeout_s = inf", "matrix.timeout_s"),
    ("matrix", "timeout_s = nan", "matrix.timeout_s"),
    ("matrix", "timeout_s = 1e300", "matrix.timeout_s"),
    ("matrix", "timeout_s = 0", "matrix.timeout_s"),
    ("hardware", "bitfusion = { partial = 0 }", "hardware.cpu.bitfusion.partial"),
    ("hardware", "bitfusion = { partial = 1.5 }", "hardware.cpu.bitfusion.partial"),
    ("hardware", "bitfusion = { partial = nan }", "hardware.cpu.bitfusion.partial"),
    ("hardware", 'container = { shm_size = "99999999g" }', "hardware.cpu.container.shm_size"),
    ("hardware", 'container = { mem_limit = "lots" }', "hardware.cpu.container.mem_limit"),
    ("hardware", "container = { ulimits = { nofile = -2 } }", "hardware.cpu.container.ulimits"),
    ("hardware", "container = { ulimits = { nofle = 1 } }", "hardware.cpu.container.ulimits"),
    ("hardware", "gpu_ids = [-1]", "hardware.cpu.gpu_ids"),
    ("hardware", "gpu_ids = [256]", "hardware.cpu.gpu_ids"),
    ("hardware", "gpu_ids = [0, 0]", "hardware.cpu.gpu_ids"),
    ("hardware", "slurm = { cpus_per_gpu = 100000 }", "hardware.cpu.slurm.cpus_per_gpu"),
    ("hardware", 'slurm = { mem = "99999999T" }', "hardware.cpu.slurm.mem"),
    ("hardware", 'slurm = { time_limit = "99999999999:00:00" }', "hardware.cpu.slurm.time_limit"),
    ("hardware", 'env = { "A=B" = "x" }', "hardware.cpu.env"),
    ("hardware", 'env = { A = "x\\u0000y" }', "hardware.cpu.env.A"),
    ("workload", 'data = "/data/\\nimagenet"', "workload.data"),
]


@pytest.mark.parametrize(("section", "line", "field"), OUT_OF_RANGE)
def test_out_of_range_values_are_refused(
    write: Callable[..., Path], section: str, line: str, field: str
) -> None:
    got = problems_of(write(matrix_text(**{section: line})))
    assert any(f": {field}" in p for p in got), got


@pytest.mark.parametrize(("section", "line"), [
    ("workload", "gpus = 64"),
    ("workload", "batch_size = 65536"),
    ("workload", "seed = 4294967295"),
    ("matrix", "timeout_s = 604800"),
    ("matrix", "timeout_s = 0.5"),
    ("matrix", "repeats = 1000"),
    ("hardware", "bitfusion = { partial = 1 }"),  # an int where a float is expected
    ("hardware", "bitfusion = { partial = 0.25 }"),
    ("hardware", 'container = { shm_size = "16g", ulimits = { memlock = -1, nofile = 1048576 } }'),
    ("hardware", 'slurm = { mem = "512G", time_limit = "7-00:00:00" }'),
    ("hardware", 'env = { NCCL_DEBUG = "WARN", EMPTY = "" }'),
])
def test_values_at_the_edge_of_the_ranges_are_accepted(
    write: Callable[..., Path], section: str, line: str
) -> None:
    assert load_matrix(write(matrix_text(**{section: line}))).cells


def test_the_schema_documents_the_ranges() -> None:
    schema = json_schema()
    defs = schema["$defs"]
    settings = defs["MatrixSettings"]["properties"]
    assert settings["timeout_s"]["maximum"] == 7 * 24 * 3600
    assert "inf is refused" in settings["timeout_s"]["description"]
    assert settings["repeats"]["maximum"] == 1000
    workload = defs["PartialParams"]["properties"]["gpus"]["anyOf"][0]
    assert workload["maximum"] == 64
    axis = defs["AxisValues"]["properties"]["batch_size"]["anyOf"][0]
    assert axis["maxItems"] == MAX_CELLS and axis["items"]["maximum"] == 65536


def test_hosts_ranges_are_in_their_descriptions() -> None:
    from orchestrator.config.inventory import HostOptions

    props = HostOptions.model_json_schema()["properties"]
    assert props["connect_timeout"]["maximum"] == 600
    assert "inf would hang" in props["connect_timeout"]["description"]


# --- strict types ----------------------------------------------------------------------------

@pytest.mark.parametrize(("section", "line", "field"), [
    ("workload", 'batch_size = "8"', "workload.batch_size"),
    ("workload", "gpus = 1.0", "workload.gpus"),
    ("workload", 'channels_last = "yes"', "workload.channels_last"),
    ("workload", "channels_last = 1", "workload.channels_last"),
    ("workload", "iterations = true", "workload.iterations"),
    ("matrix", 'repeats = "3"', "matrix.repeats"),
    ("matrix", 'timeout_s = "1800"', "matrix.timeout_s"),
    ("matrix", "timeout_s = true", "matrix.timeout_s"),
    ("matrix", 'one_cell_per_host = "no"', "matrix.one_cell_per_host"),
    ("axes", 'gpus = ["1", "2"]', "axes.gpus[0]"),
    ("hardware", "env = { A = 1 }", "hardware.cpu.env.A"),
    ("hardware", 'bitfusion = { partial = "1" }', "hardware.cpu.bitfusion.partial"),
])
def test_a_typo_of_type_is_refused_not_guessed(
    write: Callable[..., Path], section: str, line: str, field: str
) -> None:
    got = problems_of(write(matrix_text(**{section: line})))
    assert any(f": {field}:" in p for p in got), got


def test_only_still_parses_strings() -> None:
    assert parse_only(["batch_size=8", "channels_last=yes", "gpus=64", "repeat=2"]) == {
        "batch_size": [8], "channels_last": [True], "gpus": [64], "repeat": ["2"]
    }
    with pytest.raises(ConfigError, match="--only: gpus=65"):
        parse_only(["gpus=65"])
    with pytest.raises(ConfigError, match="--only: batch_size=eight"):
        parse_only(["batch_size=eight"])


def test_only_filters_a_real_matrix(write: Callable[..., Path]) -> None:
    from orchestrator.plan.matrix import filter_cells

    axes = "batch_size = [8, 16]\nchannels_last = [true, false]"
    matrix = load_matrix(write(matrix_text(axes=axes)))
    kept = filter_cells(matrix, ["batch_size=8", "channels_last=no"])
    assert [c.params.batch_size for c in kept.cells] == [8]
    assert [c.params.channels_last for c in kept.cells] == [False]


# --- the cell cap ----------------------------------------------------------------------------

def test_too_many_cells_names_the_fields_that_multiply(write: Callable[..., Path]) -> None:
    seeds = ", ".join(str(i) for i in range(101))
    got = problems_of(write(matrix_text(matrix="repeats = 100", axes=f"seed = [{seeds}]")))
    assert len(got) == 1
    assert "axes.seed (101 values) x matrix.repeats (100) plan 10,100 cells" in got[0]


def test_too_many_combinations_is_refused_before_expansion(write: Callable[..., Path]) -> None:
    a = ", ".join(str(i) for i in range(200))
    b = ", ".join(str(i + 1) for i in range(200))
    text = matrix_text(axes=f"seed = [{a}]\nbatch_size = [{b}]") + "[[exclude]]\nseed = 0\n"
    (got,) = problems_of(write(text))
    assert "axes.seed (200 values) x axes.batch_size (200 values) multiply up to 40,000" in got


def test_excludes_may_bring_a_big_product_under_the_cap(write: Callable[..., Path]) -> None:
    seeds = ", ".join(str(i) for i in range(12_000 // 2))
    text = matrix_text(axes=f"seed = [{seeds}]\nmode = [\"train\", \"infer\"]")
    text += '[[exclude]]\nmode = "infer"\n'
    assert len(load_matrix(write(text)).cells) == 6000


def test_an_axis_longer_than_the_cap(write: Callable[..., Path]) -> None:
    seeds = ", ".join(str(i) for i in range(MAX_CELLS + 1))
    got = problems_of(write(matrix_text(axes=f"seed = [{seeds}]")))
    assert any("axes.seed: List should have at most 10000 items" in p for p in got), got


def test_long_ids_are_cut_and_keep_their_hash(write: Callable[..., Path]) -> None:
    long = "/data/" + "x" * 300
    matrix = load_matrix(write(matrix_text(axes=f'data = ["synthetic", "{long}"]')))
    ids = [c.id for c in matrix.cells]
    assert all(len(i) <= MAX_ID_LENGTH + 3 for i in ids)
    cut = next(c for c in matrix.cells if c.params.data == long)
    assert cut.group.endswith(cut.hash)


# --- reading user files ----------------------------------------------------------------------

def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "m.toml"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []
    worker = threading.Thread(target=lambda: _catch(outcome, lambda: read_config_text(fifo)))
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "reading a FIFO blocked"
    assert isinstance(outcome[0], ConfigError) and "a FIFO" in str(outcome[0])


def _catch(into: list[BaseException], fn: Callable[[], object]) -> None:
    try:
        fn()
    except BaseException as exc:  # handed to the test thread
        into.append(exc)


@pytest.mark.parametrize(("make", "expected"), [
    (lambda d: Path("/dev/zero"), "a character device"),
    (lambda d: d, "a folder"),
    (lambda d: _link(d / "zero.toml", "/dev/zero"), "a character device"),
    (lambda d: d / "missing.toml", "no such file"),
    (lambda d: _file(d / "big.toml", b"#" * (files.MAX_FILE_BYTES + 1)), "at most 1,048,576"),
    (lambda d: _file(d / "latin.toml", b"name = '\xe9'\n"), "not UTF-8"),
])
def test_special_files_are_refused(tmp_path: Path, make: Callable[[Path], Path],
                                   expected: str) -> None:
    path = make(tmp_path)
    with pytest.raises(ConfigError, match=expected) as err:
        read_config_text(path)
    assert err.value.problems[0].file == str(path)


def _link(path: Path, target: str) -> Path:
    path.symlink_to(target)
    return path


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_symlink_to_a_regular_file_is_fine(tmp_path: Path) -> None:
    (tmp_path / "real.toml").write_text("x = 1\n")
    assert read_config_text(_link(tmp_path / "link.toml", str(tmp_path / "real.toml"))) == "x = 1\n"


@pytest.mark.parametrize("text", [
    "a = " + "[" * 500 + "]" * 500,
    "a = " + "{b = " * 500 + "1" + "}" * 500,
    "[" + ".".join(["a"] * 500) + "]\nx = 1\n",
    "a = " + "[" * 17 + "]" * 17,
])
def test_absurd_nesting_is_refused(write: Callable[..., Path], text: str) -> None:
    (got,) = problems_of(write(text))
    assert "nested too deeply" in got


def test_hosts_and_manifests_are_read_the_same_way(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="a character device"):
        load_hosts("/dev/zero")
    fifo = tmp_path / "hosts.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="a FIFO"):
        load_hosts(fifo)


# --- suggestions -----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "field", "guess"), [
    (matrix_text(workload="batch_sze = 8"), "workload.batch_sze", "batch_size"),
    (matrix_text(matrix="repeat = 3"), "matrix.repeat", "repeats"),
    (matrix_text(hardware="contaner = {}"), "hardware.cpu.contaner", "container"),
    (matrix_text(hardware='container = { shm_sise = "1g" }'), "hardware.cpu.container.shm_sise",
     "shm_size"),
    (matrix_text() + "[[include]]\nhardwre = \"cpu\"\n", "include[0].hardwre", "hardware"),
    (matrix_text().replace("[axes]", "[axis]"), "axis", "axes"),
])
def test_a_misspelt_key_gets_the_nearest_one(
    write: Callable[..., Path], text: str, field: str, guess: str
) -> None:
    got = problems_of(write(text))
    assert any(f": {field}: unknown key (did you mean {guess!r}?" in p for p in got), got


def test_no_suggestion_when_nothing_is_near(write: Callable[..., Path]) -> None:
    got = problems_of(write(matrix_text(workload="zzzz = 1")))
    assert any("unknown key (check the spelling" in p for p in got), got


def test_hosts_files_suggest_too() -> None:
    with pytest.raises(ConfigError) as err:
        parse_hosts('[options]\nconect_timeout = 5\n[[hosts]]\nname = "a"\nadress = "x"\n')
    text = str(err.value)
    assert "options.conect_timeout: unknown key (did you mean 'connect_timeout'?" in text
    assert "hosts[0] (a).adress: unknown key (did you mean 'address'?" in text


# --- shipped files ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted((ROOT / "matrices").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_matrix_still_validates(path: Path) -> None:
    assert load_matrix(path).cells


@pytest.mark.parametrize("path", sorted((ROOT / "hosts").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_hosts_file_still_validates(path: Path) -> None:
    assert load_hosts(path).hosts

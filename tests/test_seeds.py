"""The seed matrices (matrices/seeds/) against the seeds: every cell's command, flag by flag.

Each seed's command lines are quoted below as the seed runs them (its README's lines, or the
script it runs, with the script's shell variables expanded as the script expands them), and the
cells' commands -- what the docker / slurm backends start, :func:`cell_command` -- must equal
them, except for the differences each seed's entry declares (a path that is the cell folder
instead of the seed's working folder, ...). docs/seeds.md lists the same differences with their
reasons; a test below keeps the two lists equal. Where the seeds folder is there
(``../shared/seeds``), seed 000's lines are also read from the seed file itself.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from gpu_support import GAUDI, facts

from orchestrator.backends.checks import check_matrix
from orchestrator.plan.launch import cell_command
from orchestrator.plan.matrix import Cell, Matrix, load_matrix
from orchestrator.runtimes.docker import CONTAINER_OUT, CONTAINER_PYTHON

ROOT = Path(__file__).resolve().parents[1]
SEEDS = ROOT / "matrices" / "seeds"
HERE = Path(__file__).resolve()


def seeds_dir() -> Path | None:
    for base in (os.environ.get("ORCHESTRATE_SEEDS"), HERE.parents[2] / "shared" / "seeds",
                 "/work/shared/seeds"):
        if base and Path(base).is_dir():
            return Path(base)
    return None


@dataclass(frozen=True)
class Seed:
    """A seed matrix and the command lines it must reproduce."""

    matrix: str
    #: cell -> the seed's argv for it (shell words).
    expected: dict[str, list[str]]
    #: The declared differences: (word in the seed's line, word in ours).
    differences: tuple[tuple[str, str], ...] = field(default=())


def words(line: str) -> list[str]:
    return shlex.split(line)


# --- seed 000: alexhanl/machine-learning PyTorch/README.md ----------------------------------------

S000_TRAIN = ("python ./main.py --arch resnet50 --epochs 3 --batch-size 256 --label-smoothing 0.1 "
              "--amp --static-loss-scale 256 --no-checkpoints /imagenet")
S000_INFER = ("python ./main.py --arch resnet50 --evaluate --epochs 1 --pretrained "
              "--batch-size {bs} /imagenet")
S000_BITFUSION = "bitfusion run -n 1 -p 1 -- "


def _s000() -> dict[str, list[str]]:
    out = {}
    for side, prefix in (("v100", ""), ("v100_bitfusion", S000_BITFUSION)):
        out[f"{side}-dle_train-resnet50-train-g1-bs256-amp-nopretrained-r1"] = words(
            prefix + S000_TRAIN)
        for bs in (256, 1):
            out[f"{side}-dle_infer-resnet50-infer-g1-bs{bs}-fp32-pretrained-r1"] = words(
                prefix + S000_INFER.format(bs=bs))
        # the seed gives no line for resnext101: the resnet50 line with its arch (DLE's name)
        out[f"{side}-dle_infer-resnext101_32x4d-infer-g1-bs1-fp32-pretrained-r1"] = words(
            prefix + S000_INFER.format(bs=1).replace("resnet50", "resnext101-32x4d"))
    return out


# --- seed 003: DLPerf @ 183b8d1 scripts/single_node_train.sh, WORKSPACE=/workspace/rn50 ---------

S003 = ("python /workspace/rn50/multiproc.py --nproc_per_node {g} /workspace/rn50/main.py "
        "--data-backend dali-cpu --raport-file /workspace/rn50/raport.json -j8 -p 1 --lr {lr} "
        "--optimizer-batch-size -1 --warmup 8 --arch resnet50 -c fanin --label-smoothing 0.1 "
        "--lr-schedule cosine --mom 0.125 --wd 3.0517578125e-05 --workspace /workspace/rn50 "
        "-b 128 --epochs 1 --prof 120 --training-only --no-checkpoints /data")


def _s003() -> dict[str, list[str]]:
    lrs = {1: "0.128", 4: "0.512", 8: "1.024"}  # awk 'BEGIN{print 128 * g / 1000}'
    return {f"v100-g{g}-bs128-fp32-r{r}": words(S003.format(g=g, lr=lr))
            for g, lr in lrs.items() for r in range(1, 6)}


# --- seed 001: tbd-suite @ ad48842 source/scripts/measure_*.sh, start 10, profile 5 -------------

S001_THROUGHPUT = (
    "python3 /app/source/resnet/src/resnet_ctl_imagenet_main.py --num_gpus=1 "
    "--batch_size={bs} --train_steps=1000 --steps_per_loop=100 --log_steps=100 --dtype=fp32 "
    "--use_synthetic_data=false --skip_eval --data_dir=/app/data/TFRecords/ "
    "-model_dir=./model_temp")
S001_NCU = (
    "ncu --csv --target-processes all --profile-from-start no --metrics "
    "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_elapsed,"
    "sm__inst_executed_pipe_fp16.avg.pct_of_peak_sustained_elapsed,"
    "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_elapsed,"
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_elapsed,gpc__cycles_elapsed.max "
    "python3 /app/source/resnet/src/resnet_ctl_imagenet_main.py --num_gpus=1 "
    "--batch_size={bs} --train_steps=10000 --steps_per_loop=5 --log_steps=5 --dtype=fp32 "
    "--use_synthetic_data=false --skip_eval --data_dir=/app/data/TFRecords/ --profile_step 10 "
    "-model_dir=./model1")
S001_NVPROF = (
    "nvprof --profile-from-start off --export-profile "
    "./profiled_data_nvprof/resnet50-tensorflow-{bs}-%p.nvvp -f "
    "python3 /app/source/resnet/src/resnet_ctl_imagenet_main.py --num_gpus=1 "
    "--batch_size={bs} --train_steps=1000 --steps_per_loop=5 --log_steps=5 --dtype=fp32 "
    "--use_synthetic_data=false --skip_eval --data_dir=/app/data/TFRecords/ --profile_step 10 "
    "-model_dir=./model1")


def _s001() -> dict[str, list[str]]:
    out = {}
    for bs in (1, 2, 4, 8, 16, 32, 64, 96, 128):
        out[f"gpu-tbd_throughput-g1-bs{bs}-fp32-r1"] = words(S001_THROUGHPUT.format(bs=bs))
        out[f"gpu-tbd_ncu-g1-bs{bs}-fp32-r1"] = words(S001_NCU.format(bs=bs))
        out[f"gpu-tbd_nvprof-g1-bs{bs}-fp32-r1"] = words(S001_NVPROF.format(bs=bs))
    return out


# --- seed 002: the artifact @ 7961513 sec5a_resnet/run-resnet.sh ----------------------------------

S002 = (
    "/usr/local/cuda/bin/nvprof --print-gpu-trace --profile-child-processes --system-profiling "
    "on --kernel-latency-timestamps on --csv --log-file resnet_%p_${ts}_${HOSTNAME}.csv "
    "--device-buffer-size 128 --continuous-sampling-interval 1 -f python -m "
    "torch.distributed.launch --nproc_per_node=4 torch_imagenet_resnet.py --base-lr 0.05 "
    "--batch-size 64 --kfac-update-freq 0 --kfac-cov-update-freq 50 --damping 0.003 --model "
    "resnet50 --checkpoint-freq 90 --kfac-comm-method comm-opt --kfac-grad-worker-fraction 0.0 "
    "--epochs 1 --lr-decay 30 60 80")


# --- seed 004: its demo_resnet lines, as Model-References 1.6.1's train.py takes them -------------
# (0.13's demo_resnet no longer exists: the seed's own line is kept in a comment of each)

S004_1 = ("python -u train.py --data-path=/root/datasets/imagenet/ILSVRC2012 --model=resnet50 "
          "--device=hpu --batch-size={bs} --epochs=1 --workers=0 --print-freq=1 {prec} {mode} "
          "--num-train-steps 100 --num-eval-steps 30")
S004_8 = ("mpirun -n 8 --bind-to core --map-by slot:PE=7 --rank-by core --report-bindings "
          "--allow-run-as-root " + S004_1)
S004_BF16 = ("--hmp --hmp-bf16 ./ops_bf16_Resnet.txt --hmp-fp32 ./ops_fp32_Resnet.txt")


def _s004() -> dict[str, list[str]]:
    out = {}
    for prec, bs, flags in (("bf16", 256, S004_BF16), ("fp32", 128, "")):
        for mode, flag in (("eager", "--run-lazy-mode=False"), ("lazy", "--run-lazy-mode=True")):
            # seed: ./demo_resnet --data-type {prec} -b {bs} --mode graph -p PATH
            #       --num-train-steps 100 --num-eval-steps 30
            line = S004_1.format(bs=bs, prec=flags, mode=flag)
            out[f"gaudi-rn50_1card-g1-bs{bs}-{prec}-{mode}-r1"] = words(line)
            # seed: ./demo_resnet_dist --data-type {prec} --batch-size {bs} -p PATH
            line = S004_8.format(bs=bs, prec=flags, mode=flag)
            out[f"gaudi-rn50_8cards-g8-bs{bs}-{prec}-{mode}-r1"] = words(line)
    return out


SEED_TABLE: dict[str, Seed] = {
    "000": Seed("000_bitfusion_dle.toml", _s000()),
    "001": Seed("001_tbd.toml", _s001(), (
        ("./profiled_data_nvprof/resnet50-tensorflow-{bs}-%p.nvvp",
         f"{CONTAINER_OUT}/resnet50-tensorflow-{{bs}}-%p.nvvp"),)),
    "002": Seed("002_variability.toml", {"gpu_node-g4-bs64-fp32-r1": words(S002)}, (
        ("resnet_%p_${ts}_${HOSTNAME}.csv", "{cell}/resnet_%p.csv"),
        ("torch_imagenet_resnet.py", "/opt/sec5a_resnet/torch_imagenet_resnet.py"))),
    "003": Seed("003_dlperf.toml", _s003(), (
        ("/workspace/rn50/raport.json", f"{CONTAINER_OUT}/raport.json"),
        ("/workspace/rn50", CONTAINER_OUT))),
    "004": Seed("004_habana.toml", _s004()),
}


def load(seed: Seed) -> Matrix:
    return load_matrix(SEEDS / seed.matrix)


def rendered(matrix: Matrix, cell: Cell) -> list[str]:
    """The cell's command as its backend starts it: in a container (python3, the cell folder
    at /orchestrate/out) or, for the Apptainer profile, the program part of it (what runs inside
    the image; `{cell}` stands for the cell folder)."""
    profile = matrix.profile(cell)
    output = "{cell}" if profile.apptainer_runtime else CONTAINER_OUT
    return cell_command(cell, profile, matrix.program(cell), python=CONTAINER_PYTHON,
                        output_dir=output).argv


def apply(seed: Seed, argv: list[str], batch: int | None) -> list[str]:
    """The seed's argv with the declared differences applied."""
    out = []
    for word in argv:
        for theirs, ours in seed.differences:
            theirs = theirs.replace("{bs}", str(batch))
            if word == theirs:
                word = ours.replace("{bs}", str(batch))
                break
        out.append(word)
    return out


@pytest.mark.parametrize("number", sorted(SEED_TABLE))
def test_every_seed_cell_runs_the_seeds_command_line(number: str) -> None:
    seed = SEED_TABLE[number]
    matrix = load(seed)
    assert {c.id for c in matrix.cells} == set(seed.expected), number
    for cell in matrix.cells:
        ours = rendered(matrix, cell)
        theirs = apply(seed, seed.expected[cell.id], cell.params.batch_size)
        assert ours == theirs, (cell.id, _first_difference(ours, theirs))


def _first_difference(ours: list[str], theirs: list[str]) -> str:
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return f"word {i}: ours {a!r}, the seed's {b!r}"
    return f"lengths {len(ours)} vs {len(theirs)}"


def test_seed_000s_lines_are_the_seed_files_own() -> None:
    """The command lines above are copied from the seed file: checked against it where it is."""
    folder = seeds_dir()
    if folder is None:
        pytest.skip("no seeds folder (../shared/seeds): the lines above stand alone")
    text = (folder / "000_77ab2210305bafb1.txt").read_text(encoding="utf-8")
    lines = {ln.strip() for ln in text.splitlines() if "./main.py" in ln}
    assert S000_TRAIN in lines and S000_BITFUSION.strip() + " " + S000_TRAIN in lines
    for bs in (256, 1):
        assert S000_INFER.format(bs=bs) in lines
        assert S000_BITFUSION + S000_INFER.format(bs=bs) in lines


def test_every_seed_matrix_validates_and_names_its_rule_and_stack() -> None:
    expected = {
        "000": ("dle", {"v100": "21.03", "v100-bitfusion": "21.03"}),
        "001": ("tbd", {"gpu": None}),
        "002": ("per-gpu", {"gpu-node": "22.06"}),
        "003": ("dlperf", {"v100": "20.03"}),
        "004": ("habana", {"gaudi": None}),
    }
    v100s = facts("V100", count=8)  # seed 000 pins gpu_ids = [1]
    machines = {"000": v100s, "001": v100s, "003": v100s,
                "004": GAUDI}  # the docker backend's cells get this machine's (stand-in) GPUs
    for number, (rule, stacks) in expected.items():
        matrix = load(SEED_TABLE[number])
        found = check_matrix(matrix, machine=machines.get(number))
        assert found.errors == [], (number, found.errors)
        assert matrix.settings.table_rule == rule
        for hw, release in stacks.items():
            assert found.stacks[hw].release == release, (number, hw)


def test_the_seed_matrices_are_the_ones_listed() -> None:
    assert {s.matrix for s in SEED_TABLE.values()} == {p.name for p in SEEDS.glob("*.toml")}


def test_docs_list_every_declared_difference() -> None:
    """docs/seeds.md names every difference the golden test allows (the paths above)."""
    docs = (ROOT / "docs" / "seeds.md").read_text(encoding="utf-8")
    for number, seed in SEED_TABLE.items():
        section = docs.split(f"## Seed {number}", 1)[1].split("\n## ", 1)[0]
        for theirs, _ in seed.differences:
            shown = re.sub(r"\{bs\}", "<batch>", theirs)
            assert shown in section or theirs in section, (number, theirs)


def test_graph_mode_is_refused_with_its_reason_on_the_seeds_gaudi_software(tmp_path: Path
                                                                            ) -> None:
    text = (SEEDS / "004_habana.toml").read_text().replace(
        'hpu_mode = ["eager", "lazy"]', 'hpu_mode = ["eager", "lazy", "graph"]')
    path = tmp_path / "004.toml"
    path.write_text(text)
    found = check_matrix(load_matrix(path), machine=GAUDI)
    assert [p.field for p in found.errors] == ["axes.hpu_mode[2]"]
    assert "torch.jit.trace" in found.errors[0].message
    assert "use hpu_mode = \"lazy\"" in found.errors[0].message


@pytest.mark.subprocess  # the CLI in a process
def test_seed_002s_dry_run_prints_the_seeds_command(tmp_path: Path) -> None:
    """`orchestrate matrix --dry-run` of the Slurm seed prints each cell's apptainer command:
    after the image, the seed's own line (with the two declared paths). A stand-in
    `singularity` on PATH (the dry run only asks that it exists), an empty program folder and
    the data folder it binds (the sweep, so the dry run, refuses a bind source that is not
    there)."""
    import subprocess
    import sys

    fake = tmp_path / "bin" / "singularity"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'singularity-ce version 3.7.2 (stand-in)'\n")
    fake.chmod(0o755)
    (tmp_path / "lab" / "sec5a_resnet").mkdir(parents=True)
    path = tmp_path / "002.toml"
    (tmp_path / "imagenetv2").mkdir()
    path.write_text((SEEDS / "002_variability.toml").read_text().replace(
        "/opt/lab/gpu_variability_sc22_artifact/sec5a_resnet", "lab/sec5a_resnet").replace(
        '"/scratch/imagenetv2"', f'"{tmp_path / "imagenetv2"}"'))
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-m", "orchestrator", "matrix", str(path),
                           "--dry-run", "--results", str(tmp_path / "r")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    shown = done.stdout.splitlines()
    start = shown.index("  gpu_node-g4-bs64-fp32-r1:")
    line = next(ln for ln in shown[start:] if ln.startswith("    command: srun singularity exec"))
    argv = shlex.split(line.split(": ", 1)[1])
    after = argv[next(i for i, w in enumerate(argv) if w.endswith(".sif")) + 1:]
    cell = str(tmp_path / "r" / "seed002_variability" / "<run id>" / "cells"
               / "gpu_node-g4-bs64-fp32-r1")
    seed = SEED_TABLE["002"]
    expected = [w.replace("{cell}", cell) for w in apply(seed, words(S002), 64)]
    assert after == expected, _first_difference(after, expected)

#!/usr/bin/env bash
# One GPU session of issues 27 and 28, run through the device tool on a lent H100/H200 (its
# own PyTorch, no Docker, no internet): every step time-boxed, each step's files packed into
# $OUT/<step>.tar.gz as soon as it ends, so a session cut short still brings back what it
# measured. Here, before the call: the orchestrator's dependencies as wheels in .whl/ and the
# peers (DLE ConvNets, DLLogger) in .peers/ (see benchmarks/README.md, "GPU session").
#
#   bash benchmarks/gpu_session.sh [STEP...]    # default: every step, in priority order
#   bash benchmarks/gpu_session.sh --dry [STEP...]   # what it would run, or why not here
#   bash benchmarks/gpu_session.sh --help
#
# Steps: env dle prof sweep telemetry paths
#
# Each step runs in a session of its own; when it ends (or its time box does), what is left
# of that session is stopped by process id, and nothing else: the benchmarks stop the runs
# they started themselves (benchmarks/common.py, stop_on_sigterm), so no process of anyone
# else on a shared GPU machine is touched.
set -uo pipefail
STEPS=(env dle prof sweep telemetry paths)
DRY=
case "${1:-}" in
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --dry) DRY=1; shift ;;
esac
if [ "${1:-}" != "--step" ]; then
    for s in "$@"; do
        case " ${STEPS[*]} " in *" $s "*) ;; *) echo "unknown step '$s' (steps: ${STEPS[*]})" >&2
            exit 2 ;; esac
    done
fi
if [ -n "$DRY" ]; then
    steps=("$@")
    [ ${#steps[@]} -eq 0 ] && steps=("${STEPS[@]}")
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '
    then
        echo "cannot run here: no NVIDIA GPU (nvidia-smi lists none); would run the steps" \
            "${steps[*]}" >&2
        exit 3
    fi
    echo "would run the steps ${steps[*]} on: $(nvidia-smi -L | head -1)"
    exit 0
fi
OUT=${OUT:-/tmp/gpu-session-out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=/tmp/gpu-session
mkdir -p "$WORK"
cd "$ROOT" || exit 1
export PYTHONUNBUFFERED=1
if [ -z "${GPU_SESSION_STEP:-}" ]; then  # once, not again in each step's session
    exec > >(tee -a "$OUT/session.log") 2>&1
    if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl || exit 1
    fi
    export T0=$(date +%s)
fi
export PYTHONPATH=/tmp/site:$ROOT:$ROOT/.peers/dllogger
export DLE_CONVNETS_DIR=$ROOT/.peers/dle-convnets
PY=python3
ORCH=("$PY" -m orchestrator)
DEADLINE=${DEADLINE:-575}  # seconds after the start by which every step has ended and packed

box() {  # box <seconds>: that time box, or less so the session ends by $DEADLINE
    local left=$(( DEADLINE - ($(date +%s) - T0) - 12 ))
    [ "$left" -lt "$1" ] && echo $(( left > 5 ? left : 5 )) || echo "$1"
}

in_session() {  # in_session <sid>: the ids of the processes still in that session
    ps -e -o pid=,sid= | awk -v s="$1" '$2 == s { print $1 }'
}

stop_session() {  # stop_session <sid>: what is left of a step's session, by process id
    local pids
    [ -n "$1" ] || return 0
    pids=$(in_session "$1")
    [ -z "$pids" ] && return 0
    kill -TERM $pids 2>/dev/null
    sleep 3
    pids=$(in_session "$1")
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    return 0
}

pack() {  # pack <step>: the step's folder, compressed, into $OUT (after stopping what its
          # session left running, by process id)
    stop_session "$(cat "$WORK/.session-$1" 2>/dev/null)"
    tar -C "$WORK" -czf "$OUT/$1.tar.gz" "$1" 2>/dev/null
    echo "== $1 done at +$(( $(date +%s) - T0 )) s ($(du -h "$OUT/$1.tar.gz" | cut -f1))"
}

step_env() {
    local d=$WORK/env; mkdir -p "$d"
    nvidia-smi > "$d/nvidia-smi.txt" 2>&1
    nvidia-smi -q > "$d/nvidia-smi-q.txt" 2>&1
    nvidia-smi --query-gpu=name,driver_version,pci.bus_id,memory.total,power.limit,clocks.max.sm \
        --format=csv > "$d/nvidia-smi-query.csv" 2>&1
    $PY -c 'import torch, torchvision, sys; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "arch", torch.cuda.get_arch_list(), "device", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0)); print("torchvision", torchvision.__version__)' > "$d/torch.txt" 2>&1
    $PY -m pip list 2>/dev/null > "$d/pip-list.txt"
    { command -v ncu; ncu --version; command -v nsys; ls -d /opt/nvidia/nsight-* /usr/local/cuda*/nsight* 2>/dev/null; nvcc --version; } > "$d/tools.txt" 2>&1
    timeout "$(box 45)" ncu --query-metrics-mode all --query-metrics --chip gh100 \
        > "$d/ncu-query-metrics.txt" 2>&1
    grep -E 'pipe_(fma|fp16|tensor|xu)|gpc__cycles_elapsed|gpu__time_duration' \
        "$d/ncu-query-metrics.txt" > "$d/ncu-query-pipe-metrics.txt"
    cat "$d/torch.txt" "$d/tools.txt"; head -20 "$d/nvidia-smi.txt"
    "${ORCH[@]}" --version > "$d/orchestrate-version.txt" 2>&1; cat "$d/orchestrate-version.txt"
}

step_dle() {
    local d=$WORK/dle; mkdir -p "$d"
    PYTHONPATH=$ROOT/benchmarks/dle_nodali:$PYTHONPATH \
    timeout "$(box 240)" $PY benchmarks/workload_vs_dle.py --dle-dir "$DLE_CONVNETS_DIR" \
        ${DLE_CASES:+--cases $DLE_CASES} --iterations 60 --warmup 20 --timeout "$(box 120)" --json "$d/workload_vs_dle.json" 2>&1 \
        | tee "$d/workload_vs_dle.txt"
}

# ncu: the default _active pipe metrics and TBD's _elapsed ones weighted by gpc__cycles_elapsed
NCU_METRICS=(
    "gpu__time_duration.sum"
    'regex:^smsp?__inst_executed_pipe_(fma|fp16|xu)\.avg\.pct_of_peak_sustained_active$'
    'regex:^smsp?__pipe_(fma|fp16|tensor|tensor_op_hmma|tensor_op_gmma)_cycles_active\.avg\.pct_of_peak_sustained_active$'
    'regex:^sm__inst_executed_pipe_(fma|fp16|tensor.*|xu)\.avg\.pct_of_peak_sustained_elapsed$'
    "gpc__cycles_elapsed.max"
)
step_prof() {
    local d=$WORK/prof; mkdir -p "$d"
    timeout "$(box 260)" $PY benchmarks/profiler_overhead.py --profilers ${PROFILERS:-none torch ncu nsys} \
        --repeats 1 ${PROF_ARGS:---iterations 60 --warmup 20 --start 30} --count 1 --timeout "$(box 220)" \
        --ncu-metrics "${NCU_METRICS[@]}" --keep "$d/runs" --json "$d/profiler_overhead.json" \
        2>&1 | tee "$d/profiler_overhead.txt"
    local rep=$d/runs/ncu-0/profile.ncu-rep
    if [ -f "$rep" ]; then  # the seed's stdout format (details page) and the raw page, by ncu
        ncu --import "$rep" --csv > "$d/ncu-details.csv" 2> "$d/ncu-details.err"
        ncu --import "$rep" --csv --page raw --print-units base > "$d/ncu-raw.csv" 2>&1
    fi
    # the report and the torch trace are large (25 MB packed): what comes back is capped
    rm -f "$rep"; find "$d/runs" -name 'trace_rank*.json' -exec gzip -9 {} +
    find "$d/runs" -name 'trace_rank*.json.gz' -size +6M -delete
}

step_sweep() {
    local d=$WORK/sweep; mkdir -p "$d"
    sed -e 's/^iterations = 200/iterations = 60/' -e 's/^warmup = 30 /warmup = 20 /' \
        matrices/h100_speed.toml > "$d/h100_speed.toml"
    timeout "$(box 150)" "${ORCH[@]}" matrix "$d/h100_speed.toml" --results "$d/results" \
        --only repeat=1 --only precision=bf16 --only compile=none 2>&1 | tee "$d/h100_speed.txt"
    "${ORCH[@]}" report h100_speed --results "$d/results" --baseline cuda_graphs=false \
        --plot "$d/h100_speed.png" --html "$d/h100_speed.html" 2>&1 | tee -a "$d/h100_speed.txt"
    PYTHONPATH=$PYTHONPATH:$ROOT/benchmarks/dle_nodali \
    timeout "$(box 120)" "${ORCH[@]}" matrix matrices/seed003_h100.toml \
        --results "$d/results" 2>&1 | tee "$d/seed003.txt"
    "${ORCH[@]}" report seed003_h100 --results "$d/results" --plot "$d/seed003.png" \
        --html "$d/seed003.html" 2>&1 | tee -a "$d/seed003.txt"
}

step_telemetry() {
    local d=$WORK/telemetry; mkdir -p "$d"
    timeout "$(box 150)" $PY benchmarks/telemetry_interval.py --intervals 0.02 0.005 --iterations 60 \
        --warmup 20 --timeout "$(box 120)" --keep "$d/runs" --json "$d/telemetry.json" 2>&1 \
        | tee "$d/telemetry.txt"
}

step_paths() {
    local d=$WORK/paths; mkdir -p "$d"
    timeout "$(box 300)" $PY benchmarks/gpu_paths.py --iterations 60 --warmup 20 \
        --images 1024 --timeout "$(box 200)" --json "$d/gpu_paths.json" --cases \
        train-amp-bs256-graphs infer-amp-bs1-graphs train-bf16-bs256-graphs \
        train-amp-bs256-jpeg-nvjpeg train-amp-bs256-jpeg-cpu train-amp-bs256-compile 2>&1 \
        | tee "$d/gpu_paths.txt"
}

if [ "${1:-}" = "--step" ]; then  # one step, in the session setsid made for it
    ps -o sid= -p $$ | tr -d ' ' > "$WORK/.session-$2"
    "step_$2"
    exit $?
fi
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=("${STEPS[@]}")
for s in "${steps[@]}"; do
    echo "== $s starts at +$(( $(date +%s) - T0 )) s"
    GPU_SESSION_STEP=$s setsid -w bash "$0" --step "$s"
    pack "$s"
done

# Sourced by the tools/gpu_*.sh scripts: their log, step selection, environment block and the
# quantization extension's build. The sourcing script sets ROOT, STEPS and OUT, then calls
# start_run (or sets LOG itself and works in ROOT).

log() { echo "== $(date +%T) $*" | tee -a "$LOG"; }

# The run's start: $OUT created, LOG=$OUT/log.txt emptied, the working directory ROOT, Python
# unbuffered (its lines reach the logs as they are printed).
start_run() {
  mkdir -p "$OUT"
  LOG=$OUT/log.txt
  : > "$LOG"
  cd "$ROOT" || exit 2
  export PYTHONUNBUFFERED=1
}
has_step() { [[ " $STEPS " == *" $1 "* ]]; }

# The GPU, its clocks and the software versions, into the log.
gpu_environment() {
  log "environment"
  {
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv,noheader
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cudnn', torch.backends.cudnn.version(), 'gpus', torch.cuda.device_count())"
    python3 -c "import triton; print('triton', triton.__version__)" || echo "no triton"
    command -v nvcc > /dev/null && nvcc --version | tail -n 1
    git log -1 --format='commit %h %s' 2> /dev/null
  } 2>&1 | tee -a "$LOG"
}

# build_quantize_extension EXT_DIR FALLBACK: with step "build", the extension for sm_90 into
# EXT_DIR/lib; a failed build is a warning (FALLBACK names what then runs the torch reference).
build_quantize_extension() {
  has_step build && [ -f build_tools/cmake_build.py ] || return 0
  log "build the quantization extension (sm_90)"
  python3 -m build_tools.cmake_build --build-dir "$1/cmake" --install-dir "$1/lib" --arch 90 \
    >> "$LOG" 2>&1 || log "WARNING: the extension did not build: $2 use the torch fallback"
}

# Sourced by the GPU scripts (tools/gpu_te_check.sh, tools/gpu_audit_bench.sh): put the assembled
# fork on the path of a GPU machine without network where upstream TE 2.20.2 was staged
# (shared/device/upstream-te.sh): /tmp/te-env.sh (or $TE_ENV), upstream's core library and torch
# extension installed into $TE_SITE_DIR (default /tmp/te-site), the pinned pure-Python wheel in
# $TE_STAGE_DIR (default /tmp/stage).
#
#   use_fork [DIR]   assemble the fork into DIR (default /tmp/te-fork) unless TE_FORK_DIR already
#                    names an assembled tree; link upstream's libraries beside it; build the fork's
#                    CUDA extension for sm_90 (or copy a prebuilt one from TE_FORK_EXT, a
#                    cmake_build --install-dir); export PYTHONPATH and TE_FORK_DIR. Logs via `log`.
# Returns non-zero if the fork could not be assembled.

_FORK_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# TE finds libtransformer_engine*.so and transformer_engine_torch*.so next to its own package
# (common/__init__.py): put upstream's beside the assembled tree.
_link_upstream_libraries() {
  local fork=$1 site=${TE_SITE_DIR:-/tmp/te-site} so
  for so in "$site"/transformer_engine_torch*.so; do
    [ -e "$so" ] && ln -sf "$so" "$fork/"
  done
  if [ -d "$site/transformer_engine/wheel_lib" ]; then
    ln -sfn "$site/transformer_engine/wheel_lib" "$fork/transformer_engine/wheel_lib"
  fi
  for so in "$site"/transformer_engine/libtransformer_engine*.so; do
    [ -e "$so" ] && ln -sf "$so" "$fork/transformer_engine/"
  done
  return 0
}

use_fork() {
  local fork=${1:-/tmp/te-fork} stage=${TE_STAGE_DIR:-/tmp/stage}
  source "${TE_ENV:-/tmp/te-env.sh}"
  if [ -z "${TE_FORK_DIR:-}" ]; then
    log "assemble the fork into $fork (offline: the pure-Python wheel from $stage)"
    rm -rf "$fork" "$fork.build"
    (cd "$_FORK_ROOT" && python3 -m build_tools.assemble --out "$fork" --offline "$stage") 2>&1 |
      tee -a "$LOG"
    [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
    _link_upstream_libraries "$fork"
    if [ -n "${TE_FORK_EXT:-}" ]; then  # a prebuilt extension (cmake_build's --install-dir)
      log "the fork's CUDA extension from $TE_FORK_EXT"
      cp "$TE_FORK_EXT"/transformer_engine_exact_fp8*.so "$fork/" || return 1
    else
      log "build the fork's CUDA extension (sm_90)"
      if ! (cd "$_FORK_ROOT" && python3 -m build_tools.cmake_build --build-dir "$fork.build" \
            --install-dir "$fork" --arch 90) >> "$LOG" 2>&1; then
        log "WARNING: the CUDA extension did not build (see $LOG); quantization runs its reference"
      fi
    fi
    TE_FORK_DIR=$fork
  fi
  export TE_FORK_DIR
  export PYTHONPATH=$TE_FORK_DIR${PYTHONPATH:+:$PYTHONPATH}
  export PYTHONSAFEPATH=1  # `python -m` must import the assembled fork, never the checkout's tree
}

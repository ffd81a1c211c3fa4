#!/usr/bin/env bash
# CI's sanitizer stages (.ci/run calls this after tests/run_all.sh):
#   asan  every single-process test and a representative set of the
#         multi-rank ones (each code path once, asan() says which and what it
#         leaves out; only the programs that run are built), built with
#         AddressSanitizer + UndefinedBehaviorSanitizer in build-asan; any
#         finding aborts the test that hit it (-fno-sanitize-recover). Leaks are
#         checked too, except what Open MPI's own init keeps (tests/lsan.supp).
#   tsan  ThreadSanitizer on one small case of every path where threads
#         meet (tsan() lists them): the communication queues under bucketed DP
#         and ZeRO-1/2/3 with prefetch and overlapped param gathers, the
#         pipeline's async p2p, the ring attention's overlapped sends, the
#         watchdog and peer-status threads, the math threads' wake and sleep, DualPipeV's
#         pair worker (two host threads computing at once);
#         2 ranks over shared memory; only those targets are built, in build-tsan.
#   fuzz  libFuzzer (clang) on what a stranger's model folder holds: the
#         safetensors header reader, config.json, the shard index and
#         tokenizer.json, and on the UTF-8 decoder, FUZZ_SECONDS each (default
#         15, one target per CPU at a time) from the seeds in fuzz/corpus.
# Usage: bash tests/sanitizers.sh [asan] [tsan] [fuzz]   (none: all three)
# Each stage prints its wall time; builds go through ccache when it is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# gcc's sanitizer runtimes come with g++; libFuzzer comes with clang's runtime package.
bash examples/apt_install.sh clang libclang-rt-14-dev
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(asan tsan fuzz)
jobs=$(nproc)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# Sanitizer builds need neither the benchmarks nor -march=native's exact
# timings; -O1 -g1 keeps stack traces readable (file:line: -g1 is the line
# tables, without the local variables' records no sanitizer report prints) and
# the suite fast enough. -g1 instead of -g: 22-27% less compile time per file
# (test_train_gpt_parallel.cpp 3.81 -> 2.79 s, distributed_optimizer.cpp 7.61
# -> 5.95 s; the ASan build took 915 s at -g without ccache, 2026-11-27).
# Host code only (-DLOOM_CUDA=OFF): the sanitizers instrument what the CPU runs;
# the CUDA sources are compiled by the normal build, and the CUDA runtime does
# not start under ASan's shadow memory anyway.
# The hf tests reuse the normal build's venv (tests/hf/setup_venv.sh: installed once).
common=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_BUILD_BENCH=OFF -DLOOM_CUDA=OFF -DLOOM_WASM=OFF -DLOOM_HF_VENV="$PWD/build/hf-venv" "${launcher[@]}")
supp="$PWD/tests/lsan.supp"

# Each stage runs as `timed "asan (total)" asan`, on the left of a `||`, where bash ignores set -e inside the
# function: so every step in a stage ends with `|| return`, or a failed step would be passed over and the
# stage would return only its last step's status (until 2026-12-07 a failed ASan single-process test or any
# TSan case but the last left CI green).
timed() {  # timed NAME CMD...: runs CMD, then prints "[sanitizers] NAME: N s"; CMD's exit status
  local name=$1 start=$SECONDS status=0
  shift
  "$@" || status=$?
  echo "[sanitizers] $name: $((SECONDS - start)) s"
  return $status
}

asan() {
  local flags="-O1 -g1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
  # Exported before the build: gtest_discover_tests runs the binaries then.
  # (Not detect_stack_use_after_return: its fake stack frames break the
  # 64-byte-aligned vector stores -march=native emits for row_sum's 16 lanes.)
  # fast_unwind_on_malloc=0: allocation stacks through Open MPI's frames (its
  # libraries have no frame pointers, where the fast unwinder stops), so that
  # what its PMIx thread keeps is seen through libevent's frames (tests/lsan.supp;
  # what MPI_Init_thread and MPI_Finalize keep is left out by
  # parallel/comm/distributed.cpp). malloc_context_size=8: that frame is within
  # 8, and each malloc unwinds 8 frames instead of 30: the multi-rank set's
  # longest test, mpi_pipeline_np2, 101 -> 51 s (2026-12-07, issue 51: CI's time;
  # the fast unwinder: 25 s, but that leak then shows no module to suppress).
  # A report's allocation stack is 8 frames deep; rerun the test with
  # malloc_context_size=30 in ASAN_OPTIONS for the whole one.
  local asan_options="abort_on_error=1:strict_string_checks=1:fast_unwind_on_malloc=0:malloc_context_size=8:allocator_may_return_null=1"
  export LSAN_OPTIONS="suppressions=$supp:print_suppressions=0:fast_unwind_on_malloc=0:malloc_context_size=8"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  # loom sets OpenBLAS to one thread itself (tensor/cpu/gemm.h), but OpenBLAS
  # starts its pool when the library loads; with 1 here it starts none, so the
  # leak check at each process's exit has no idle pool thread to stop.
  export OPENBLAS_NUM_THREADS=1
  # The build lists each test binary's tests (--gtest_list_tests) with ASan
  # on but the leak check off: one CI build aborted in that listing, once, on
  # a test that lists cleanly here 100 times, and a flaky exit check there
  # fails the whole build; the leak check runs at each test's exit in ctest.
  export ASAN_OPTIONS="detect_leaks=0:$asan_options"
  # The test programs' own files at -O0 (LOOM_TESTS_OPT), the library at -O1:
  # they set up runs and compare numbers, and GCC instruments them at -O0 in
  # about half the CPU (CPU s, 2026-12-07: test_optim.cpp 9.9 -> 5.7,
  # test_train_gpt_zero3.cpp 22.8 -> 15.1, test_tensor_ops.cpp 42.2 -> 18.3;
  # issue 51: CI's time). Neither level contracts a * b + c into an FMA, so
  # a test's own arithmetic rounds as the library's does.
  # Timeouts x3: instrumented multi-rank tests on 2 loaded cores run close to
  # the normal build's 120 s (mpi_pipeline_np4 took 76 s alone, over 120 s
  # beside the rest of the suite).
  # Not built (nor their tests registered): the test programs of which the
  # representative set below runs no test, 11 of ~100 (issue 51: CI's time).
  # What they run is run here by other tests, but for HSDP (--dp-shard:
  # test_train_gpt_hsdp, _expert_hsdp), which no test here runs: ZB-H1, ZB-V
  # and DualPipeV (test_train_gpt_zero_bubble, _v) in the MoE pipeline's run
  # of all three; the experts over tp, cp, pp and ZeRO-3 (test_train_gpt_moe,
  # _moe_combined, _expert_pipeline_grid) one or two axes at a time in the
  # Expert* and MoE* runs; the MoE and split-backward ledgers and the MoE
  # planner (test_memory_ledger_moe, _zero_bubble, test_plan_moe) through the
  # dense ledger's and the planner's code; test_multihost's label is not run
  # here (below).
  local not_built=(test_train_gpt_hsdp test_train_gpt_zero_bubble test_train_gpt_zero_bubble_v test_train_gpt_moe
                   test_train_gpt_moe_combined test_train_gpt_expert_hsdp test_train_gpt_expert_pipeline_grid
                   test_memory_ledger_moe test_memory_ledger_zero_bubble test_plan_moe test_multihost)
  timed asan-configure cmake -S . -B build-asan "${common[@]}" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DLOOM_TEST_TIMEOUT_SCALE=3 \
    -DLOOM_TESTS_NOT_BUILT="$(IFS=';'; echo "${not_built[*]}")" -DLOOM_TESTS_OPT=-O0 >/dev/null || return
  timed asan-build cmake --build build-asan -j"$jobs" || return
  # Not install_find_package: it builds a consumer program against the
  # installed (here: instrumented) libraries with the consumer's own flags, and
  # would fail to link the sanitizer runtimes; it runs in the normal suite.
  # Not docs_check: it reruns the chapters' commands and compares the numbers
  # the chapters quote, which are the Release build's (-O3, -march=native); at
  # -O1 the fp16 run of chapter 5 printed other losses than the five lines it
  # quotes (measured in this stage, 2026-11-27; every other chapter matched).
  # It runs in the normal suite, where those numbers come from.
  # Not the multihost label (tests/multihost/: links cut and hosts frozen on a
  # timer; what they test is launch, ssh and timeout plumbing, which the
  # normal suite runs; the library code they reach - watchdog, peer status,
  # handshake - runs instrumented in the mpi_* tests), and not
  # mpi_pipeline_np4 (the same binary as mpi_pipeline_np2, whose code paths
  # it repeats on twice the ranks): 150 s and 79 s of this stage's 1076 s.
  # A representative set, not the whole suite again (CI's time: the suite
  # took 1,715 s here, over half of CI's budget on its own; the normal build
  # runs all of it). Every single-process test runs, but the catalogs that
  # launch train_gpt dozens of times to read its messages (the flag, path and
  # number catalogs, the kill loop: parsing that the fuzz stage and the
  # normal suite cover). Of the multi-rank tests (label mpi), each code path
  # once: every mpi_* binary at one rank count (2, and 3 where a rank count
  # that does not divide matters; mpi_grid at 4, the count it runs at besides
  # 1: the set named mpi_grid_np2 until 2026-12-07, a test that does not
  # exist, so it ran none), and train_gpt in each mode - bucketed and
  # naive dp, each pipeline schedule (mpi_pipeline's; train_gpt at 1F1B,
  # interleaved and zero-bubble), tp with and without SP, cp (GPT, Llama,
  # recompute), ZeRO-1/2/3 with tp, fp16's overflow, bf16, a checkpoint
  # resumed across a reshard at each rung (ZeRO-2's state is laid out as
  # ZeRO-1's, so ZeRO-1's reshard stands for both), the trace and the teach-breaks -
  # and the memory ledger on one case per kind (dp, ZeRO-1/2, pp, tp+SP, Llama,
  # recompute). The normal suite runs the rest: more ranks, more grids, the
  # same modes again in other combinations. Cut on 2026-12-06 (issue 51: CI's
  # cold time) by the runs that repeated a path already here: AFAB and the
  # interleaved schedule with dp beside 1F1B and the all-axes run, ZeRO-2's
  # resume and bf16 beside ZeRO-1's, ZeRO-3 with SP and fp16 beside ZeRO-3 with
  # tp and ZeRO-1's fp16, the pipeline+ZeRO resume, the --zero flag's parsing.
  local catalogs='TrainGpt\.(BadInputFailsWithAClearMessage|DeviceIsCheckedUpFront|EveryFlagIsCheckedBeforeTrainingWithItsRange|DropoutRunsAreTheSameOnOneAndTwoThreads)'
  local representative=(
    mpi_{collectives,handshake,tensor_parallel,ring_attention,process_group_by_device,pipeline,finalize_model_grads}_np2
    mpi_{pipeline_io,distributed_optimizer,fully_sharded,param_gather_overlap,grad_sync_edges,all_to_all}_np2
    mpi_grid_np4 'mpi_(data_parallel|distributed_optimizer)_np3' 'mpi_(watchdog|rank_that_throws|train_gpt_ranks)_.*'
    'Plan(Memory|Step|Checks|Communication|Compute|ContextParallel|Llama|Pipeline|Program|Recompute)\..*' 'Typos\..*'
    '(ActivationFormula|CommBuffers|Dp234|TeachBreak|TrainGptRecompute|Modes/RecomputeModel)\..*'
    'PlanAgainstRun\.(MemoryOfDataParallelZeroBf16|RingBytesOfAContextParallelRunAreThePlans)'
    'TrainGptParallel\.((BucketDataParallel|NaiveDataParallel|TensorParallel|SequenceParallel|Zero)TwoRanks|PipelineTwoStages1F1B|ZeroOverlapParamGather|ZeroWithPipeline|AllAxesInterleavedWithZeroOverlap)MatchesOneProcess'
    'TrainGptParallel\.(GradientAccumulationEqualsTheLargerBatch|ZeroCheckpointReshardsFromTwoToFourRanks|TensorParallelCheckpointResumesAtDataAndTensorParallel|Fp16OverflowSkipsTheStepOnEveryRank|Bf16TracksFp32|TraceHasARowPerRankWithComputeAndCommunication|MemoryReportShowsTheShardedOptimizerState|MemoryReportUnderTensorParallelShowsTheSplit|InvalidGridFailsOnEveryRankWithTheSizes)'
    'TrainGptZero3\.(TwoRanksMatchOneProcess|WithTensorParallelMatchesOneProcess|CheckpointResumesAtZero1OnTwoRanks)'
    'TrainGptZero3Trace\.EachUnitsGathers.*' 'TrainGptZero3Tied\.PipelineMatchesOneProcess'
    'TrainGptExpertParallel\.EpTwoEqualsOneProcessWithEveryRoutingOption' 'mpi_expert_parallel_np2'
    'TrainGptMoETensorParallel\.SequenceParallelEqualsOneProcessDropless'
    'TrainGptMoEPipeline\.ZeroBubbleSchedulesEqualOneProcess'
    'TrainGptExpertZero\.ZeroOneAndTwoShardingExpertsOverExpertDpEqualOneProcess'
    'TrainGptExpertGrid\.TpTimesEpEqualsOneProcessWithEveryRoutingOption'
    'TrainGptExpertTpZero\.ZeroOneAndThreeEqualOneProcessWithEveryRoutingOptionAndResume'
    'TrainGptOverlappedPairs\.TwoMathThreadsSplitTheSameWayInBothHalves'
    'Zero2\.(TwoRanksMatchesOneProcess|WithTensorParallelMatchesOneProcess)'
    'TrainGptContextParallel\.(TwoRanksMatchOneProcessInTrainingAndEvaluation|WithRecomputationMatchesOneProcess|LlamaWithTheTokensTruePositionsMatchesOneProcess|CheckpointResumesAcrossCpSizes)'
    'TrainLlamaParallel\.(BucketDataParallelTwoRanksMatchesOneProcess|PipelineTwoStagesMatchesOneProcess|TensorParallelWithSequenceParallelMatchesOneProcess|SingleProcessRunHasTheLlamaParameters)'
    'CheckpointCommit\.(APieceFromAnotherRunIsRefusedNamingIt|KeepsOnlyTheLastStepsPiecesAndNoTemporaries|MetadataIsParsedStrictly)'
    'Manifest\.(APieceWithOneByteFlippedIsRefused|CleanUpRemovesOnlyLoomsOwnPieces)' 'Faults\.AFileSizeLimitDuringASave.*'
    'Numbers\.TheParserReadsOnlyWholeNumbers' 'TensorParallel\..*'
    'EveryMode/MemoryLedger\.MeasuredEqualsTheFormulaOnEveryRank/(one_process_fp32|dp2_bf16_zero|dp2_fp32_zero2|pp2_fp16|tp2_sp_bf16|llama_tp2_sp_bf16|full_fp32)'
  )
  # By test number (ctest -I): CTest's own regexes take at most 9 groups.
  # Each pattern must name a test: one renamed, or in a program of not_built,
  # would otherwise drop out of this stage unseen (as mpi_grid_np2 and the
  # memory ledger's cases had: their listing lines end with their parameter).
  local listing chosen pattern
  # (A parameterized test's line goes on with "  # GetParam() = ...": the name alone is kept.)
  listing=$(ctest --test-dir build-asan -N -L mpi | sed -nE 's/^ *Test +#([0-9]+): ([^ ]+).*$/\1 \2/p')
  for pattern in "${representative[@]}"; do
    grep -qE " ($pattern)\$" <<<"$listing" ||
      { echo "sanitizers.sh: asan: '$pattern' names no multi-rank test of build-asan" >&2; return 1; }
  done
  chosen=$(grep -E " ($(IFS='|'; echo "${representative[*]}"))\$" <<<"$listing" | cut -d' ' -f1 | paste -sd, -)
  export ASAN_OPTIONS="detect_leaks=1:$asan_options"
  timed asan-ctest-single ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE 'multihost|mpi|combinations' \
    -E "^(install_find_package|docs_check|docs_site|$catalogs)\$" || return
  # Two 2-rank tests at once, as the normal suite runs them (tests/run_all.sh): their ranks wait on each
  # other, and the second test fills those waits. Quiet, this machine, 135 tests (2026-12-07): 481 s at
  # -j2, 411 s at -j4, all passed both ways.
  timed asan-ctest-mpi ctest --test-dir build-asan --output-on-failure -j$((2 * jobs)) -I "0,0,0,$chosen" || return
}

tsan() {
  local flags="-O1 -g1 -fsanitize=thread"
  # MPI itself is not instrumented: its internal threads and shared-memory
  # transport are invisible to TSan, so it sees only loom's own threads.
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"
  # binary : gtest filter ('*': all of it) : what its threads share
  local cases=(
    "mpi_data_parallel:*:buckets and gradients, the compute thread and the bucket all-reduces"
    "mpi_distributed_optimizer:*ZeroMatchesUnsharded*:DistributedOptimizer.AnInfOnOneRankSkipsTheStepOnEveryRank:ZeRO-1/2 reduce-scatters and param all-gathers"
    "mpi_param_gather_overlap:ParamGatherOverlap.Fp32ClippedMatchesWithoutOverlapAndGathersAreInFlightAtForward:all-gathers awaited in forward pre-hooks"
    "mpi_fully_sharded:*:ZeRO-3's prefetched all-gathers and gradient reduce-scatters"
    "mpi_pipeline:Pipeline.OneFOneBMatchesSingleProcessWithMoreMicroBatchesThanStages:Pipeline.InterleavedMatchesSingleProcess:Pipeline.InASchedule*:async p2p sends and receives"
    "mpi_ring_attention:RingAttention.EqualsOneProcessFp32:RingAttention.AsTheCoreOfCausalSelfAttention:the ring's overlapped sends"
    "mpi_watchdog_slow:-:the watchdog and peer-status threads, 12 slow all-reduces under a 2 s watchdog"
    "test_thread_wait:*:the math threads' spin, sleep and wake"
    "test_overlapped_pairs:PairWorker.*:DualPipeV's pair worker, two host threads computing at once"
  )
  local targets=() c
  for c in "${cases[@]}"; do targets+=("${c%%:*}"); done
  # The test programs' own files at -O0, as in asan() (the library, where the threads meet, at -O1).
  timed tsan-configure cmake -S . -B build-tsan "${common[@]}" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" -DLOOM_TESTS_OPT=-O0 >/dev/null || return
  timed tsan-build cmake --build build-tsan -j"$jobs" --target "${targets[@]}" || return
  local name rest filter bin np
  for c in "${cases[@]}"; do
    name=${c%%:*} rest=${c#*:}
    filter=${rest%:*}  # everything up to the description
    bin=$(find build-tsan/tests -name "$name" -type f -perm -u+x | head -n 1)
    [ -n "$bin" ] || { echo "sanitizers.sh: tsan: no binary $name in build-tsan" >&2; return 1; }
    local args=()
    [ "$filter" != - ] && args=(--gtest_filter="$filter")
    np=2 && [[ $name != mpi_* ]] && np=1
    echo "[sanitizers] tsan $name ($np ranks): ${c##*:}"
    if [ "$np" = 1 ]; then
      timed "tsan-$name" env OPENBLAS_NUM_THREADS=1 timeout 600 "$bin" "${args[@]}" || return
    else
      timed "tsan-$name" env LOOM_COLLECTIVE_TIMEOUT="$([ "$name" = mpi_watchdog_slow ] && echo 2 || echo 240)" \
        OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 timeout 600 mpirun --allow-run-as-root --oversubscribe \
        --mca btl self,vader -x TSAN_OPTIONS -x LOOM_COLLECTIVE_TIMEOUT -np 2 "$bin" "${args[@]}" || return
    fi
  done
}

fuzz() {
  local seconds=${FUZZ_SECONDS:-15}
  # The libraries get coverage instrumentation (fuzzer-no-link); only the
  # fuzz targets link libFuzzer's main. -g1 as in asan(): a finding's stack
  # still has file:line, and clang compiles in ~12% less CPU than at -g
  # (nn/hf_checkpoint.cpp 17.1 -> 15.0 s, tensor/ops_view.cpp 17.6 -> 15.4 s).
  timed fuzz-configure cmake -S . -B build-fuzz "${common[@]}" -DCMAKE_CXX_COMPILER=clang++ \
    -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_FUZZ=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" \
    >/dev/null || return
  local targets=(safetensors utf8 hf_config hf_index tokenizer)
  timed fuzz-build cmake --build build-fuzz -j"$jobs" --target "${targets[@]/#/fuzz_}" || return
  export ASAN_OPTIONS="detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  # One libFuzzer process per CPU at a time (each is one thread): the same
  # seconds of fuzzing per target in half the wall time on 2 cores (issue 51).
  # Each writes its own log and exit status; the logs print in order after.
  local target
  rm -f build-fuzz/fuzz_*.status
  for target in "${targets[@]}"; do
    while [ "$(jobs -pr | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    (status=0; fuzz_one "$target" "$seconds" || status=$?; echo $status > "build-fuzz/fuzz_$target.status") \
      > "build-fuzz/fuzz_$target.log" 2>&1 &
  done
  wait
  local failed=()
  for target in "${targets[@]}"; do
    cat "build-fuzz/fuzz_$target.log"
    [ "$(cat "build-fuzz/fuzz_$target.status" 2>/dev/null)" = 0 ] || failed+=("$target")
  done
  [ ${#failed[@]} -eq 0 ] || { echo "sanitizers.sh: fuzz: FAILED: ${failed[*]} (the input that failed: build-fuzz/crash-*, leak-*, timeout-*)" >&2; return 1; }
}

fuzz_one() {  # fuzz_one TARGET SECONDS: fuzzes TARGET from a scratch copy of its seeds
  local target=$1 seconds=$2 corpus status=0
  # New inputs go to a scratch copy, so the committed seeds stay as they are.
  corpus=$(mktemp -d)
  cp fuzz/corpus/$target/* "$corpus"/
  # The JSON readers get the format's tokens and keys (fuzz/json.dict): without them 30 s of byte
  # mutations seldom reach valid JSON with a value of the wrong type.
  local dict=()
  case $target in hf_config | hf_index | tokenizer) dict=(-dict=fuzz/json.dict) ;; esac
  timed fuzz-$target build-fuzz/fuzz/fuzz_$target "${dict[@]}" -max_total_time="$seconds" -max_len=4096 \
    -timeout=10 -print_final_stats=1 -artifact_prefix=build-fuzz/ "$corpus" || status=$?
  rm -rf "$corpus"
  return $status
}

for stage in "${stages[@]}"; do
  case $stage in
    asan | tsan | fuzz) timed "$stage (total)" "$stage" ;;
    *) echo "sanitizers.sh: unknown stage '$stage' (asan, tsan, fuzz)" >&2; exit 2 ;;
  esac
done

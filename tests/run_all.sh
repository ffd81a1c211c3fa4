#!/usr/bin/env bash
# README command 2: set up, build, and run the whole test suite (single-process
# GoogleTest binaries and the multi-rank tests under mpirun, each with a TIMEOUT).
set -euo pipefail
cd "$(dirname "$0")/.."
bash examples/setup_debian.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# -j 2 x cores: the multi-rank tests hold 2 slots each (tests/CMakeLists.txt), and their
# tiny models leave the cores idle a third of the time, so two share the cores;
# the timed ones (watchdogs, links cut on a timer, docs_check) run alone (RUN_SERIAL).
ctest --test-dir build --output-on-failure -j"$((2 * $(nproc)))" "$@"

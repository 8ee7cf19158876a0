#!/usr/bin/env bash
# The native kernels under AddressSanitizer and UndefinedBehaviorSanitizer: builds
# the library with -fsanitize=address,undefined into a kernel cache of its own and
# runs the tests that drive them (the kernels against PyTorch, the plugin's
# search against fairseq's generator for every architecture, the workers and
# half the randomized differential slice) in a Python that preloads the sanitizer
# runtimes. A finding stops the run with the report (exit code != 0).
# Run before each submission that touches fairseq_hardattn/kernels/.
# Usage: scripts/sanitize_kernels.sh PYTHON [PYTEST_ARGS...]   (make sanitize: .venv's Python)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/sanitize_kernels.sh PYTHON [PYTEST_ARGS...] (e.g. .venv/bin/python)" >&2; exit 2; }
PY=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); shift
cd "$(dirname "$0")/.."
CC=${CC:-gcc}
asan=$("$CC" -print-file-name=libasan.so)
ubsan=$("$CC" -print-file-name=libubsan.so)
for lib in "$asan" "$ubsan"; do
  [ -f "$lib" ] || { echo "sanitize_kernels.sh: $CC has no $(basename "$lib") (install its sanitizer runtimes)" >&2; exit 2; }
done
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
export FAIRSEQ_HARDATTN_KERNEL_DIR="$cache"
export FAIRSEQ_HARDATTN_KERNEL_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g"
# Python and torch allocate for the process's life: leaks are not looked for;
# the runtime is preloaded, so the order of libraries does not matter to it; the
# library's C++ shares containers with PyTorch's, which is not instrumented, so
# their annotations would be half-made
export ASAN_OPTIONS="detect_leaks=0:verify_asan_link_order=0:abort_on_error=1:halt_on_error=1:detect_container_overflow=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# half of make test's randomized differential slice: its shapes drive the kernels, in a single process
export FAIRSEQ_HARDATTN_DIFF_CASES=${FAIRSEQ_HARDATTN_DIFF_CASES:-300}
tests=(tests/unit/test_beam_search.py tests/unit/test_panel_linear.py tests/unit/test_direct_step.py tests/unit/test_native_search.py tests/unit/test_int8.py tests/unit/test_sampling.py tests/command_line/test_decoding_workers.py tests/unit/test_flexible_and_local.py
       tests/unit/test_fairseq_transformers.py)
[ -f tests/unit/test_differential.py ] && tests+=(tests/unit/test_differential.py)
# GCC 12's AddressSanitizer does not lock its allocator across fork(): a
# worker forked while another thread allocates inherits the allocator's lock
# held and waits on it for ever (glibc's malloc takes its locks around a fork).
# The tests that fork beside running threads are left to `make test`.
LD_PRELOAD="$asan $ubsan" "$PY" -m pytest -q -p no:cacheprovider -m "not forks_beside_threads" "${tests[@]}" "$@"
# the library was built with the sanitizers (and so ran under them)
ls "$cache"/_native-*.so > /dev/null 2>&1 || { echo "sanitize_kernels.sh: the native library was never built" >&2; exit 1; }
echo "sanitize_kernels.sh: no finding in the native kernels under ASan and UBSan"

# Two entry points: `make demo` (the main job) and `make test`.
# Each creates .venv when it is missing. torch is installed first and pinned
# to the local CPU wheel so that pip never resolves another (CUDA) build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
TORCH_PIN := torch==2.13.0
export OMP_NUM_THREADS ?= 2

.PHONY: demo test test-fast venv clean sanitize

venv: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e .[test,plots]
	# the native library, built now rather than by the first decoding (without a
	# compiler: one line, and the plugin decodes with PyTorch's ops)
	-$(PY) -m fairseq_hardattn.kernels
	touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py $(DEMO_ARGS)

# the whole suite: tests/unit (the mechanisms, the kernels, the search against
# fairseq's generator, in memory), tests/command_line (fairseq's console
# scripts and the hub as a user runs them), tests/tools (scripts/, research/,
# results/); two workers (one per core); tests marked with one xdist_group
# stay together
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup tests $(TEST_ARGS)

# tests/unit alone, less its slow tests (pytest.ini), with a shorter slice of the
# randomized differential cases
test-fast: $(STAMP)
	FAIRSEQ_HARDATTN_DIFF_CASES=$${FAIRSEQ_HARDATTN_DIFF_CASES:-200} $(PY) -m pytest -q -n 2 -m "not slow" tests/unit $(TEST_ARGS)

# the C kernels under AddressSanitizer and UndefinedBehaviorSanitizer (before a change to them ships)
sanitize: $(STAMP)
	bash scripts/sanitize_kernels.sh $(PY) $(TEST_ARGS)

clean:
	rm -rf demo_work .pytest_cache

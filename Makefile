# Two commands do all the set-up: `make demo` and `make test` (see README).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-long test-gpu clean

$(BIN)/dreamshard: pyproject.toml requirements.lock Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the CPU wheel on disk; nothing after may replace it
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q fbgemm-gpu-cpu==1.8.0
	# torchrec declares the CUDA fbgemm-gpu; its real needs are installed from the lock file
	$(BIN)/pip install -q --no-deps torchrec==1.8.0
	$(BIN)/pip install -q -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	@touch $@

# the demo, then the quick form of the results suite (the paper's table on two of its settings)
demo: $(BIN)/dreamshard
	$(BIN)/dreamshard demo
	$(BIN)/dreamshard bench paper --quick --out runs/bench

test: $(BIN)/dreamshard
	$(BIN)/pytest -q

# The tests marked `long` (training, the 2,000-task property run, large tasks, the README's long
# lines), then the command-line fuzzers on 3,000 fresh cases each instead of the default 150.
test-long: $(BIN)/dreamshard
	$(BIN)/pytest -q -m long
	DREAMSHARD_FUZZ_EXAMPLES=3000 $(BIN)/pytest -q tests/test_fuzz_cli.py

# On a CUDA machine with the package's deps (the GPU machines run this from the tree):
test-gpu:
	PYTHONPATH=. $(PY) -m pytest -q -m gpu

clean:
	rm -rf $(VENV)

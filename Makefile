# The two set-up commands in the README are `make demo` and `make test`;
# both build the virtual environment on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
OUT    ?= out

.PHONY: install demo test bench clean

install: $(VENV)/.schedtrace-installed

$(VENV)/.schedtrace-installed: pyproject.toml
	command -v tmux >/dev/null || { apt-get update -qq && apt-get install -y -qq tmux; } \
	  || echo "tmux could not be installed: the terminal test will skip"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile -e '.[dev]'
	@# pip's byte-compilation, on every core (pip's is serial: 1:56 against 1:22 here, docs/performance.md);
	@# as pip does, it skips what does not compile (a Python 3.12 file in torch)
	$(PY) -W ignore -c "import compileall, sys; compileall.compile_dir(sys.prefix + '/lib', quiet=2, workers=0)"
	touch $@

demo: install
	$(VENV)/bin/schedtrace demo --out $(OUT)/demo

test: install
	$(PY) -m pytest

bench: install
	$(PY) -m bench

clean:
	rm -rf $(OUT) .pytest_cache

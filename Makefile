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
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

demo: install
	$(VENV)/bin/schedtrace demo --out $(OUT)/demo

test: install
	$(PY) -m pytest

bench: install
	$(PY) -m bench

clean:
	rm -rf $(OUT) .pytest_cache

# Two entry points for people (see README): `make demo` and `make test`.
# Both create a local virtualenv (.venv) and install memslice into it, building the C libraries.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.memslice-installed
SOURCES = pyproject.toml setup.py $(wildcard interposer/src/*.[ch] interposer/sim/*.[ch] interposer/sim/*.def interposer/include/*.h interposer/Makefile proto/*.proto)

.PHONY: install demo test gpu-check lint native protos clean
install: $(STAMP)

$(STAMP): $(SOURCES)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

native:
	$(MAKE) -C interposer

protos:
	$(PY) proto/generate.py

demo: install
	$(VENV)/bin/memslice demo

lint: install
	$(VENV)/bin/ruff check .

test: install
	$(VENV)/bin/ruff check .
	$(MAKE) -C interposer check
	$(VENV)/bin/pytest -q

# The real-GPU check kit (docs/operations.md): skips, saying why, without an NVIDIA driver and a GPU.
# Frameworks are not in the test extra: pip install torch / 'jax[cuda12]' / cupy-cuda12x into .venv first.
gpu-check: install
	$(VENV)/bin/pytest -rA -s tests/gpu

clean:
	$(MAKE) -C interposer clean
	rm -rf $(VENV) build *.egg-info

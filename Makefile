# Two entry points for people (see README): `make demo` and `make test`.
# Both create a local virtualenv (.venv) and install memslice into it, building the C libraries (and the
# extender's extension module, in place: scheduler_extender/index/_nameids.*.so).
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.memslice-installed
SOURCES = pyproject.toml setup.py proto/generate.py scheduler_extender/index/_nameids.c $(wildcard interposer/src/*.[ch] interposer/sim/*.[ch] interposer/sim/*.def interposer/include/*.h interposer/Makefile proto/*.proto)

# The sanitizer run: the shim, simulator and C tests built with ASan+UBSan (interposer/build-asan), the C
# tests run by `make -C interposer sanitize`, then the shim's pytest files that exercise every hook
# family against that build (the ASan runtime preloaded first, in pytest and in every child), then the
# extender's C extension built the same way under its own tests.
CC        ?= cc
# The extender's C extension (scheduler_extender/index/_nameids.c) under the same sanitizers, loaded by
# tests/extender/test_nameids.py from MEMSLICE_NAMEIDS_SO; PYTHONMALLOC=malloc so that ASan sees Python's small blocks too.
NAMEIDS_SAN = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all \
              -Wall -Wextra -Werror -Wmissing-prototypes -shared -fPIC
# In the order their tests start (after tests/conftest.py's LONGEST_FIRST): the longest under ASan first (the
# moves, 30-45 s each, were the pass's tail when last), the compute shares last (they wait on the clock, and
# measure best on a machine the other tests have left).
SAN_TESTS  = tests/elastic/test_elastic_moves.py tests/shim/test_shim_faults.py tests/shim/test_shim_kinds.py \
            tests/sim/test_sim_copies.py tests/elastic/test_elastic_gate.py tests/elastic/test_elastic_drain.py \
            tests/shim/test_shim_unseen.py tests/shim/test_shim_routes.py tests/shim/test_oversubscribe.py \
            tests/compute/test_compute_share.py tests/compute/test_sim_compute.py
# Tests that run no sanitized code, or the same shim code again, are left out of the (slow) sanitizer rerun, not
# of the main run: the busy-neighbour move test with three of its five entry-point families (test_sim_copies
# takes every family through the work gate under the sanitizers), and the RTLD_NEXT test, which builds its own
# shim with CFLAGS=-O0/-O1/-O2 (replacing interposer/Makefile's sanitizer flags: nothing of it is sanitized),
# and two of the compute-share measurements (7.5 s each, mostly waiting): the 50/50 split of requests (the same
# shim code as the 70/30 one, other numbers) and the control without the shim (the simulator's timeline, which
# every other share test runs under the sanitizers too).
SAN_SKIP   = -k 'not (again_and_again and (copy2d or peer or setasync)) and not rtld_next_keeps \
              and not (requests_hold_under_contention and 50-50) and not without_shares_the_gpu_is_split_evenly'

.PHONY: install demo test test-deep gpu-check lint native protos clean sanitize typecheck kubecluster kubenode \
        san-beside san-native san-pytest san-nameids
install: $(STAMP)

# Progress is shown: each step says what it does, and pip lists each package as it collects and installs it.
$(STAMP): $(SOURCES)
	@test -x $(PY) || { echo "== [1/4] creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "== [2/4] upgrading pip"
	$(PY) -m pip install -q --upgrade pip
	@echo "== [3/4] installing memslice (compiling the C libraries) and its test tools: about 90 packages, 1-2 minutes"
	$(PY) -m pip install --progress-bar on -e '.[test]'
	@# rfc3987-syntax comes with jupyterhub-kubespawner (jupyter-events wants jsonschema[format-nongpl]); jsonschema
	@# imports it when present, and its import compiles a Lark grammar: 2.5-3 CPU-s in every test process that imports
	@# the kubernetes client (kubernetes.dynamic imports kubernetes_validate, which imports jsonschema). Only the "iri"
	@# formats need it, which no schema here uses; the images never install it (no test extras).
	$(PY) -m pip uninstall -y -q rfc3987-syntax
	@echo "== [4/4] the oldest supported kubectl, for the deploy tests"
	$(PY) tests/deploy/kubectl_window.py fetch
	@touch $@

native:
	$(MAKE) -C interposer

protos:
	$(PY) proto/generate.py

demo: install
	$(VENV)/bin/memslice demo
	$(VENV)/bin/memslice demo --elastic

lint: install
	$(VENV)/bin/ruff check .

# mypy --strict (configured in pyproject.toml) on a tree of links with the installed package layout.
# Why a link tree: mypy names a module by its folders, and pyproject's package-dir puts memslice.plugin,
# .scheduler_extender, .interposer and .proto in top-level folders, which only setuptools reads. What else was
# tried (issue 29): mypy --python-executable on the editable install finds no memslice (setuptools' default
# editable mode is an import hook, which mypy never runs); editable_mode=compat puts the checkout itself on
# sys.path, where `import memslice` fails; editable_mode=strict works but is a link tree too (one link per
# file under build/__editable__*, blind to a new module until reinstalled); explicit_package_bases with
# mypy_path names plugin/dra/server.py `plugin.dra.server`, not memslice.plugin.dra.server, so the
# memslice.plugin imports of src/memslice and the memslice.interposer ones of plugin/ stay unresolved.
# One link per folder sees new modules at once.
TC = build/typecheck/memslice
typecheck: install
	rm -rf build/typecheck && mkdir -p $(TC)
	for f in src/memslice/*.py src/memslice/kube; do ln -s ../../../$$f $(TC)/; done
	for d in plugin scheduler_extender interposer proto; do ln -s ../../../$$d $(TC)/$$d; done
	$(VENV)/bin/mypy

# The real control plane for tests/realcluster/test_real_*.py (tests/support/kube_real.py): kube-apiserver (with an embedded etcd),
# kube-scheduler and the resourceclaim controller from k8s.io/kubernetes, one binary (tests/kubecluster).
# `go build` fetches the modules go.sum pins (Go module proxy) and caches them and the build (~/go, ~/.cache).
# Without Go it is not built, and those tests skip, saying so.
KUBECLUSTER     = build/kubecluster
# tests/kubecluster/build.sh shows progress (a line every 50 packages on a cold build: ~19 CPU-minutes).
KUBECLUSTER_SRC = $(wildcard tests/kubecluster/*.go) tests/kubecluster/go.mod tests/kubecluster/go.sum \
                  tests/kubecluster/build.sh
kubecluster: $(KUBECLUSTER)
$(KUBECLUSTER): $(KUBECLUSTER_SRC)
	@if command -v go >/dev/null; then tests/kubecluster/build.sh $@; \
	else echo "go not found: $@ not built; the tests of the real control plane (tests/realcluster/test_real_*.py) will skip:" \
	  "install Go >= 1.26 to run them"; fi

# The real node for tests/realnode/test_realnode_*.py (tests/support/kube_node.py): the kubelet from k8s.io/kubernetes (the same
# version as kubecluster) and containerd 2.x with its runc shim and ctr, from containerd's module
# (tests/kubenode/build.sh, progress on every step; README, "Testing", gives the cold build time). runc is
# Debian's package. Without Go it is not built, and those tests skip, saying so.
KUBENODE     = build/kubenode/kubelet
KUBENODE_SRC = $(wildcard tests/kubenode/*.go) tests/kubenode/go.mod tests/kubenode/go.sum tests/kubenode/build.sh
kubenode: $(KUBENODE)
$(KUBENODE): $(KUBENODE_SRC)
	@command -v runc >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  echo "== installing runc (Debian's package) for the real-node tests" && apt-get install -y -q runc; } || \
	  echo "runc not found and not installable here: the real-node tests will skip (apt-get install runc)"
	@if command -v go >/dev/null; then tests/kubenode/build.sh $(dir $@); \
	else echo "go not found: $(dir $@) not built; the real-node tests (tests/realnode/test_realnode_*.py) will skip:" \
	  "install Go >= 1.26 to run them"; fi

# The tests run in parallel (pytest-xdist): TEST_JOBS workers, one more than the cores because most tests wait on
# processes and sockets rather than compute; `make test TEST_JOBS=0` runs them one by one. README says how
# long `make test` takes; keep it under 10 minutes on a 2-core machine.
TEST_JOBS ?= 3
XDIST = $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadgroup)
# The sanitizer rerun: ASan processes are several times slower and bigger, but with two workers half of the
# pass's worker time was waiting (on the simulated GPU's clock: the compute shares' 7.5 s measurements, the
# link's delays): 110 CPU-s in 113 s on the quiet machine. Three fill it: on the shared machine they passed at
# load 6-12 (197 s and 208 s); at load 12-16 two compute-share measurements missed their bounds, as they did
# with two workers at load 15. `make test SAN_JOBS=2` goes back to two.
SAN_JOBS ?= 3
SAN_XDIST = $(if $(filter 0,$(TEST_JOBS)),,-n $(SAN_JOBS) --dist loadgroup)
# Beside the main pass, at nice QUIET_NICE (a sixtieth of a core while the tests want both, the idle CPU
# otherwise; its per-test bound raised to 900 s to match): the extender's C extension under the sanitizers
# (san-nameids), which measures nothing against the clock (pure computation, ~15 s alone). The main pass's workers
# leave about a sixth of the two cores idle while they wait on processes and sockets, which it fills; at nice 19
# it takes nothing the tests want (at nice 10 a job beside them made a kubelet stand-in's 10 s wait run out,
# below). Its output goes to SAN_LOG (`tail -f` it to follow), shown whole when the main pass is done; it runs in
# its own process group, stopped with the main pass on Ctrl-C.
# The ASan builds (san-native) come before the main pass, not beside it: tests/deploy/test_image_build.py copies
# interposer/ (build-asan included) while the main pass starts, and a library being linked there (ld removes
# its output first) would fail that copy. The shim's pytest files under the sanitizers (san-pytest) run after
# the main pass, with the whole machine: `make test SAN_BESIDE=1 QUIET_NICE=10` runs SAN_EARLY of them beside it
# too. Off by default: measured only on a loaded machine, where the kubelet stand-in's 10 s registration waits
# ran out beside it, and (2026-11-28, beside tests/elastic and tests/compute, load 8) test_elastic_drain's bound
# on a thread held at the work gate ran out under ASan at nice 10; it adds no CPU-seconds, it only fills idle ones.
SAN_BESIDE ?= 0
QUIET_NICE ?= 19
SAN_LOG     = build/sanitize.log
SAN_LATE    = tests/compute/test_compute_share.py tests/compute/test_sim_compute.py
SAN_EARLY   = $(filter-out $(SAN_LATE),$(SAN_TESTS))
SAN_AFTER   = $(if $(filter 1,$(SAN_BESIDE)),$(SAN_LATE),$(SAN_TESTS))
# $(MAKE) named through a variable, so that `make -n test` prints the recipe below instead of running it.
SAN_MAKE    = $(MAKE)
# How many of the slowest tests the main pass lists.
DURATIONS  ?= 15
# Python's bytecode caches are written even where the shell sets PYTHONDONTWRITEBYTECODE (this workplace's
# does): without them every pytest process (three workers, then two for the sanitizers) compiles and
# assertion-rewrites all 160 test modules again (collecting the tests: 14 CPU-s, 5.5 with the caches), and
# every Python child compiles memslice. The package's are written before the main pass (PYCOMPILE), so that no
# test process writes one while test_image_build.py copies the sources (a .pyc is written to a temporary name
# and renamed: a copy that lists it and then opens it fails). __pycache__ is in .gitignore; build.sh and the
# image's cache key skip it.
PYTEST    = env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/pytest
PYCOMPILE = env -u PYTHONDONTWRITEBYTECODE $(PY) -m compileall -q src plugin scheduler_extender interposer proto
test: install kubecluster kubenode
	$(VENV)/bin/ruff check .
	$(MAKE) typecheck
	$(MAKE) -C interposer check
	$(MAKE) --no-print-directory san-native
	$(PYCOMPILE)
	@mkdir -p $(dir $(SAN_LOG))
	@echo "== beside the tests (nice $(QUIET_NICE)): the extender's C extension under the sanitizers" \
	  "$(if $(filter 1,$(SAN_BESIDE)),and $(SAN_EARLY) )(output: $(SAN_LOG); tail -f to follow)"
	@setsid nice -n $(QUIET_NICE) $(SAN_MAKE) --no-print-directory san-beside > $(SAN_LOG) 2>&1 & san=$$!; \
	  trap 'kill -TERM -- -'$$san' 2>/dev/null; exit 130' INT TERM; \
	  $(PYTEST) -q --durations=$(DURATIONS) $(XDIST); main=$$?; \
	  echo "== the tests are done (exit $$main); waiting for the sanitizer steps beside them ($(SAN_LOG))"; \
	  wait $$san; rc=$$?; cat $(SAN_LOG); echo "== the sanitizer steps beside the tests are done (exit $$rc)"; \
	  [ $$main = 0 ] && [ $$rc = 0 ]
	@echo "== the shim's tests under the sanitizers: $(SAN_AFTER)"
	$(MAKE) --no-print-directory san-pytest SAN_FILES="$(SAN_AFTER)"

# The property tests (Hypothesis) with every example figure as written, drawn afresh each run, with Hypothesis'
# example database: `make test` runs ten costly ones at a quarter of their figure (at least 25), the same
# examples every run (tests/support/hypothesis_budget.py). Run it after changing what one of those covers.
test-deep: install
	MEMSLICE_HYPOTHESIS=deep $(PYTEST) -q $(XDIST) -m hypothesis tests

# The sanitizer pass in steps: the ASan+UBSan builds (the C tests run by `make -C interposer sanitize`), the
# shim's pytest files SAN_FILES against that build, the extender's C extension under its own tests.
sanitize: install
	$(MAKE) san-native
	$(MAKE) san-pytest SAN_FILES="$(SAN_TESTS)"
	$(MAKE) san-nameids

# What `make test` runs beside the main pass (see SAN_BESIDE above).
san-beside: install
	$(MAKE) san-nameids NAMEIDS_OPTS="-o timeout=900"
	$(if $(filter 1,$(SAN_BESIDE)),$(MAKE) san-pytest SAN_FILES="$(SAN_EARLY)")

san-native:
	$(MAKE) -j2 -C interposer sanitize
	$(CC) $(NAMEIDS_SAN) -I$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["include"])') \
	  scheduler_extender/index/_nameids.c -o interposer/build-asan/_nameids.so

san-pytest:
	asan=$$($(CC) -print-file-name=libasan.so) && \
	  MEMSLICE_LIB_DIR=$(CURDIR)/interposer/build-asan MEMSLICE_TEST_PRELOAD_FIRST=$$asan LD_PRELOAD=$$asan \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(PYTEST) -q -p no:cacheprovider $(SAN_XDIST) $(SAN_SKIP) $(SAN_FILES)

san-nameids:
	asan=$$($(CC) -print-file-name=libasan.so) && \
	  MEMSLICE_NAMEIDS_SO=$(CURDIR)/interposer/build-asan/_nameids.so PYTHONMALLOC=malloc LD_PRELOAD=$$asan \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(PYTEST) -q -p no:cacheprovider $(NAMEIDS_OPTS) tests/extender/test_nameids.py

# The real-GPU check kit (docs/operations.md): offline, with the machine's own python3 (PYTHON=...) and
# compiler, memslice imported from the source tree (no venv, no pip); skips, saying why, without an NVIDIA
# driver and a GPU. Figures also go to MEMSLICE_GPU_FIGURES (JSON lines; default build/gpu-figures.jsonl).
gpu-check:
	PYTHON=$(PYTHON) tests/gpu/run.sh

clean:
	$(MAKE) -C interposer clean
	rm -rf $(VENV) build *.egg-info

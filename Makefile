# thaw: two commands matter — `make up` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.thaw-installed

# Debian packages the tests start for real (command:package).
SYSDEPS := redis-server:redis-server docker-registry:docker-registry bwrap:bubblewrap

.PHONY: test up lint typecheck unit sysdeps venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

sysdeps:
	@missing=""; \
	for pair in $(SYSDEPS); do \
	  cmd=$${pair%%:*}; pkg=$${pair##*:}; \
	  command -v $$cmd >/dev/null 2>&1 || test -x /usr/sbin/$$cmd || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else \
	    echo "missing system packages:$$missing (run as root or: sudo apt-get install -y$$missing)"; exit 1; \
	  fi; \
	fi

lint: venv
	$(PY) -m ruff check .

typecheck: venv
	$(PY) -m mypy

unit: venv
	$(PY) -m pytest -q tests/unit

test: sysdeps venv lint typecheck
	$(PY) -m pytest -q

up: sysdeps venv
	$(VENV)/bin/thaw up $(UP_ARGS)

clean:
	rm -rf $(VENV) .thaw .pytest_cache .mypy_cache .ruff_cache

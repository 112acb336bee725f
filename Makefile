# make test: create .venv when missing, install the package with its test extra, lint (ruff, mypy), run everything
# on Slurm 25.11 (the live tests in two lanes) and the supported range beside (scripts/compat: the unit suite
# on the other Pythons, the live smoke tests on the oldest supported Ray, on Slurm 22.05).
# make demo: the whole user flow on the SLURM test bed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test unit compat lint demo bench soak testbed-up testbed-down clean

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# Every live test on Slurm 25.11 (built once per machine from vendor/), in two lanes side by side
# on a test bed each (scripts/live-lanes, tests/support/lanes.py); beside them, scripts/compat's
# unit suites (.venv's and every other Python's); in the place of the
# first lane to end, the live smoke tests on the oldest Ray on Slurm 22.05 (Debian's package):
# both ends of each range.
test: $(STAMP)
	$(VENV)/bin/ruff check eray_provider tests bench examples scripts/*.py scripts/test-image scripts/live-lanes
	$(VENV)/bin/mypy
	ERAY_TESTBED_SLURM=25.11 $(PY) scripts/live-lanes \
	    --beside "PYTHON=$(PYTHON) MAIN_VENV=$(VENV) scripts/compat units" \
	    --then "ERAY_TESTBED_SLURM=22.05 PYTHON=$(PYTHON) scripts/compat smoke"

compat: $(STAMP)
	PYTHON=$(PYTHON) scripts/compat

unit: $(STAMP)
	$(PY) -m pytest -ra -m "not slurm and not ray" tests

lint: $(STAMP)
	$(VENV)/bin/ruff check eray_provider tests bench examples scripts/*.py scripts/test-image scripts/live-lanes
	$(VENV)/bin/ruff format --check eray_provider tests bench examples
	$(VENV)/bin/mypy

# the check first, with the system's Python: a test bed that cannot see this checkout stops
# the demo at once, before .venv is built
demo:
	$(PYTHON) scripts/demo.py --check
	$(MAKE) $(STAMP)
	$(PY) scripts/demo.py

# the long scenarios (a 10-minute replacement soak...): run before a change to them lands
soak: $(STAMP)
	ERAY_TESTBED_SLURM=25.11 $(PY) -m pytest -ra -m soak tests

bench: $(STAMP)
	$(PY) bench/hostlist_bench.py

testbed-up:
	scripts/slurm-testbed up

testbed-down:
	scripts/slurm-testbed down

clean:
	rm -rf $(VENV) .venv-* *.egg-info .pytest_cache .ruff_cache .hypothesis

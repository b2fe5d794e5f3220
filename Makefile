# The course's commands. `make lab` and `make test` set everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.d2lpar-installed

.PHONY: lab test test-floor lib lint format normalize html bench stress mutants mutants-quick labcheck gpucheck info clean

# Empty: the newest torch the registry serves, as a learner's `pip install` gets it.
TORCH ?=
# The oldest supported release (README, "Versions"; pyproject.toml's lower bounds). `===`
# matches the version exactly, so a local build such as 2.13.0+cpu is not taken instead.
FLOOR := torch===2.13.0 torchvision===0.28.0

# Jupyter refuses to run as root unless told to (containers often run as root).
ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root)

lab: $(STAMP)  ## open the course in JupyterLab
	$(BIN)/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG)

# The unit tests and the short solution notebooks run two at a time (most of them wait on
# the processes they start); the chapters one at a time, so that each runs on a quiet machine
# within its time budget. The chapters run even when a unit test failed: CI then reports both.
test: $(STAMP)  ## unit tests and solutions, then every chapter notebook under nbval
	$(BIN)/python -m pytest -n 2 --dist loadfile tests notebooks/solutions; \
	status=$$?; \
	$(BIN)/python -m pytest notebooks --ignore=notebooks/solutions || status=1; \
	exit $$status

test-floor:  ## the same tests with the oldest supported torch, in .venv-floor
	$(MAKE) test VENV=.venv-floor TORCH='$(FLOOR)'

lib:  ## regenerate d2lpar/lessons from the notebooks' #@save cells (after editing a saved cell)
	$(PYTHON) d2lpar/tools/lib.py

normalize:  ## strip outputs, keep every cell id (new cells get stable ones): run before committing a notebook
	$(PYTHON) d2lpar/tools/notebooks.py

lint: $(STAMP)  ## ruff check and ruff format --check (rules in pyproject.toml)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)  ## format the code with ruff format (not the notebooks, not the generated lessons)
	$(BIN)/ruff format .

html: $(STAMP)  ## execute every notebook and render the course into build/html
	$(BIN)/python -m d2lpar html $(HTML_FLAGS)

bench: $(STAMP)  ## speed comparisons, printed as ratios measured in one run
	$(BIN)/python -m benchmarks

stress: $(STAMP)  ## every notebook 5 times under CPU load: finds flaky cells (STRESS_FLAGS=--runs 2)
	$(BIN)/python verify/stress.py $(STRESS_FLAGS)

mutants: $(STAMP)  ## plant every registered bug (verify/mutants/) and check that its check fails (MUTANTS_FLAGS="--only 08 -j 2")
	$(BIN)/python verify/mutants/run.py $(MUTANTS_FLAGS)

mutants-quick: $(STAMP)  ## the fast subset of the mutants that CI runs
	$(BIN)/python verify/mutants/run.py --quick -j 2 $(MUTANTS_FLAGS)

labcheck: $(STAMP)  ## Run All in JupyterLab in headless Chromium, every notebook (LABCHECK_FLAGS="--interrupt 'd2lpar.launch('")
	$(BIN)/python -m pip install --quiet --disable-pip-version-check playwright
	$(BIN)/python verify/labcheck.py $(LABCHECK_FLAGS)

gpucheck: $(STAMP)  ## verify the course on a GPU machine: every notebook at full size, the GPU-only runs, one table (GPUCHECK_FLAGS="--quick" or "--rows 05,nccl")
	$(BIN)/python verify/gpucheck.py $(GPUCHECK_FLAGS)

info: $(STAMP)  ## what this machine has: torch, CUDA, GPUs, backends
	$(BIN)/python -m d2lpar info

# Re-installs only when the dependencies change.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(TORCH) -e '.[course]'
	touch $@

clean:  ## remove both virtual environments (about 11 GiB) and the build
	rm -rf $(VENV) .venv-floor *.egg-info build

# Two commands do everything on a fresh machine with only Python:
#   make book   - install into .venv, execute every notebook, build the site into _build/html
#   make test   - install into .venv, run the package tests and every notebook (nbval)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.studylog-installed
JOBS   ?= 2
# Threads per process for torch's CPU ops (OpenMP): make test runs JOBS test workers and the book's notebook
# kernel at once, so each gets its share of the cores; more threads than cores spin against each other and cost
# far more CPU than they save (on two cores the package tests take over twice the CPU time).
THREADS ?= $(shell $(PYTHON) -c "import os; print(max(1, (os.cpu_count() or 1) // ($(JOBS) + 1)))")

.PHONY: install test test-site test-notebooks test-gpu book bench plot lab clean

install: $(STAMP)

# A dropped connection mid-download (Triton's wheel is about 290 MB) should not fail a fresh install: pip resumes a
# partial download (--resume-retries) and the whole step is tried three times before it fails.
PIP_NET := --retries 10 --timeout 60
EXTRAS  := .[test,book,peers]
define with_retries
ok=0; for try in 1 2 3; do $(1) && { ok=1; break; }; echo "install failed (try $$try of 3); trying again"; \
	sleep 10; done; [ $$ok = 1 ]
endef

$(STAMP): pyproject.toml tools/install_torch.py
	$(PYTHON) -m venv $(VENV)
	$(call with_retries,$(BIN)/python -m pip install --quiet $(PIP_NET) --upgrade pip)
	$(call with_retries,PIP_RETRIES=10 PIP_TIMEOUT=60 $(BIN)/python tools/install_torch.py)
	$(call with_retries,$(BIN)/python -m pip install --quiet --no-compile $(PIP_NET) --resume-retries 20 \
		-e "$(EXTRAS)")
	touch $(STAMP)

# The book build executes every notebook (a cell that raises fails it), so the notebooks run once, there, beside
# the package tests, and the site test follows the build on the same side: the two sides keep both cores busy.
# That side's log is $(VENV)/book.log, shown when it fails. (Packages install with --no-compile: Python compiles
# the modules a run imports, not every file of every package.)
test: export OMP_NUM_THREADS = $(THREADS)
test: $(STAMP)
	@rm -f $(VENV)/book.log $(VENV)/book.rc
	@($(MAKE) --no-print-directory book > $(VENV)/book.log 2>&1 && \
		$(BIN)/python -m pytest tests/test_site.py -m site -p no:cacheprovider >> $(VENV)/book.log 2>&1; \
		echo $$? > $(VENV)/book.rc) & \
	$(BIN)/python -m pytest -n $(JOBS) --dist loadfile tests -m "not site" -p no:cacheprovider; tests=$$?; \
	wait; book=$$(cat $(VENV)/book.rc); \
	if [ "$$book" = 0 ]; then grep -a "build succeeded" $(VENV)/book.log; tail -n 1 $(VENV)/book.log; \
	else cat $(VENV)/book.log; echo "make book or the site test failed (log above: $(VENV)/book.log)"; fi; \
	[ "$$tests" = 0 ] && [ "$$book" = 0 ]

# every notebook under nbval, as a reader checks one (make test runs them through the book build)
test-notebooks: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) notebooks --nbval-lax --nbval-current-env --nbval-cell-timeout=900 \
		-p no:cacheprovider

# the built site in headless Chromium (screenshots in _build/screenshots)
test-site: $(STAMP)
	$(BIN)/python -m pytest tests/test_site.py -m site -p no:cacheprovider

test-gpu: $(STAMP)
	$(BIN)/python -m pytest -m gpu tests -p no:cacheprovider

book: $(STAMP)
	rm -rf _build
	$(BIN)/jupyter-book build . --path-output . -W --keep-going

bench: $(STAMP)
	$(BIN)/python -m studylog bench all

plot: $(STAMP)
	$(BIN)/python -m book plot all

lab: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[lab]"
	$(BIN)/jupyter lab notebooks

clean:
	rm -rf _build .jupyter_cache

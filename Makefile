# Two commands do everything on a fresh machine with only Python:
#   make book   - install into .venv, execute every notebook, build the site into _build/html
#   make test   - install into .venv, run the package tests and every notebook (nbval)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.studylog-installed
JOBS   ?= 2

.PHONY: install test test-site test-gpu book bench plot lab clean

install: $(STAMP)

$(STAMP): pyproject.toml tools/install_torch.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python tools/install_torch.py
	$(BIN)/python -m pip install --quiet -e ".[test,book,peers]"
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) --dist loadfile tests notebooks -m "not site" \
		--nbval-lax --nbval-current-env --nbval-cell-timeout=900 -p no:cacheprovider
	$(MAKE) book
	$(BIN)/python -m pytest tests/test_site.py -m site -p no:cacheprovider

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

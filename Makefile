# The two commands a newcomer needs:  make demo   and   make test
# Both install what is missing (system packages, a virtualenv, the package with its C core).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
STAMP := $(VENV)/.emqfast-installed

.PHONY: demo test bench setup clean wheel docs

demo: $(STAMP)
	$(VENV)/bin/emqfast demo

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/emqfast bench

setup: $(STAMP)

# The docs site (mkdocs.yml, docs/) into build/site; --strict: any warning fails the build
DOCS_STAMP := $(VENV)/.emqfast-docs-installed
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,docs]'
	touch $(DOCS_STAMP)

# Release artefacts in dist/: the sdist and a manylinux wheel with the C core inside
wheel:
	./scripts/build-wheel.sh

$(STAMP): pyproject.toml setup.py $(wildcard csrc/*.c csrc/*.h csrc/*.py)
	./scripts/system-deps.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -c "import emqfast; print('emqfast backend:', emqfast.backend())"
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info emqfast/backends/_emqcore*.so emqfast/backends/_emqcore.c

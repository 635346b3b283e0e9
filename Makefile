# tost-serve developer entry points. Everything installs itself: `make run` and `make test` work on
# a fresh Debian 12 machine (scripts/install-deps.sh installs the apt and PyPI packages).
BUILD      ?= build
PORT       ?= 8500
CUDA       ?= ON
CTEST_ARGS ?=
# Tests run side by side, one per core: most of them wait on a server or a socket, and the ones
# that compile (the sanitizer, fuzz and emulator builds) are marked RUN_SERIAL and run alone.
CTEST_JOBS ?= $(shell nproc)
# Tests labelled `slow` (the 10-minute soak) stay out of `make test`; `make test CTEST_SLOW=` runs
# them too, `ctest --test-dir build -L slow` alone.
CTEST_SLOW ?= -LE slow
# The venv's interpreter, recorded by install-deps.sh (read when a recipe needs it).
TOST_PYTHON = $(shell sed -n 's/^TOST_PYTHON=//p' $(BUILD)/deps.env 2>/dev/null)
# The small venv of the deploy validators (requirements-deploy.txt), for tests/deploy.
TOST_DEPLOY_VENV = $(shell sed -n 's/^TOST_DEPLOY_VENV=//p' $(BUILD)/deps.env 2>/dev/null)
# XGrammar's patched source tree (cmake/TostXGrammar.cmake compiles its C++ core).
TOST_XGRAMMAR_SOURCE_DIR = $(shell sed -n 's/^TOST_XGRAMMAR_SOURCE_DIR=//p' $(BUILD)/deps.env 2>/dev/null)

.PHONY: deps configure build run test test-unit clean help

help:
	@echo "make run    install deps, build, serve models/ on port $(PORT)"
	@echo "make test   install deps, build, run every test but the slow soak (ctest -LE slow)"
	@echo "make build  configure + compile only (CUDA=$(CUDA))"

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DTOST_PYTHON=$(TOST_PYTHON) -DTOST_DEPLOY_VENV=$(TOST_DEPLOY_VENV) -DTOST_XGRAMMAR_SOURCE_DIR=$(TOST_XGRAMMAR_SOURCE_DIR) -DTOST_ENABLE_CUDA=$(CUDA) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $$(nproc)

run: build
	$(BUILD)/service/tost_server --model_repository=models --port=$(PORT)

# After ctest, pass or fail: every skip with its reason (scripts/report-skips.py), which ctest
# shows for no passing test; from its JUnit file, with passing tests' whole output kept.
CTEST_RESULTS = $(abspath $(BUILD))/Testing/ctest-results.xml
test: build
	@rm -f $(CTEST_RESULTS)
	ctest --test-dir $(BUILD) --output-on-failure -j $(CTEST_JOBS) $(CTEST_SLOW) $(CTEST_ARGS) \
	  --output-junit $(CTEST_RESULTS) --test-output-size-passed 10000000 || status=$$?; \
	  python3 scripts/report-skips.py $(CTEST_RESULTS); exit $${status:-0}

clean:
	rm -rf $(BUILD)

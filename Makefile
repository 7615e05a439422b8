# gridd developer entry points. Every target builds its own .venv from pyproject.toml.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint format bench demo clean claude-cli agent-clis test-agents-latest

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The agent CLIs for the real-CLI tests, at the versions pinned in tests/tools/agent-clis.txt
# (npm, under .cache/clis/; skipped when present). docs/agents.md.
AGENT_CLIS = claude codex gemini opencode
REAL_CLI_TESTS = tests/test_claude_real.py tests/test_sandbox_claude.py \
	tests/test_codex_real.py tests/test_gemini_real.py tests/test_opencode_real.py \
	tests/test_podman_claude.py

agent-clis:
	for cli in $(AGENT_CLIS); do tests/tools/install-cli.sh $$cli || exit 1; done

claude-cli:
	tests/tools/install-cli.sh claude

# The real-CLI tests against the newest version of each CLI on npm, installed apart from the
# pinned ones (.cache/clis-latest/); not part of `make test`. A failure is drift to fix
# before the pin is bumped.
test-agents-latest: $(STAMP)
	for cli in $(AGENT_CLIS); do \
	  tests/tools/install-cli.sh $$cli latest $(CURDIR)/.cache/clis-latest/$$cli || exit 1; done
	@for cli in $(AGENT_CLIS); do \
	  echo "test-agents-latest: $$cli $$(cat .cache/clis-latest/$$cli/version 2>/dev/null \
	    || echo 'not installed (skipped)') (pinned: $$(awk -v n=$$cli '$$1 == n {print $$3}' \
	    tests/tools/agent-clis.txt))"; done
	GRIDD_AGENT_CLIS=$(CURDIR)/.cache/clis-latest $(BIN)/pytest -n 2 --dist loadgroup -q \
	  $(REAL_CLI_TESTS)

test: $(STAMP) agent-clis
	sh contrib/vscode/scripts/setup.sh
	sh contrib/podman/setup.sh
	$(BIN)/pytest -n 2 --dist loadgroup -q --durations=25

lint: $(STAMP)
	$(BIN)/ruff check gridd tests bench
	$(BIN)/ruff format --check gridd tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	@if command -v npm >/dev/null; then \
	  sh contrib/vscode/scripts/setup.sh lint && cd contrib/vscode && npm run -s lint; \
	else echo "lint: the VS Code extension is not linted: it needs node and npm"; fi

format: $(STAMP)
	$(BIN)/ruff format gridd tests bench
	$(BIN)/ruff check --fix gridd tests bench

bench: $(STAMP)
	$(BIN)/python -m bench

demo: $(STAMP)
	$(BIN)/python -m gridd.demo

clean:
	rm -rf $(VENV) build *.egg-info

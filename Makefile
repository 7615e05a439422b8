# gridd developer entry points. Every target builds its own .venv from pyproject.toml.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint format bench demo clean claude-cli agent-clis

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The pinned Claude Code CLI for the real-CLI tests (npm, under .cache/; skipped when present).
claude-cli:
	tests/tools/install-claude.sh

# The other pinned agent CLIs for their real-CLI tests (docs/agents.md).
agent-clis: claude-cli
	tests/tools/install-codex.sh
	tests/tools/install-gemini.sh
	tests/tools/install-opencode.sh

test: $(STAMP) agent-clis
	sh contrib/vscode/scripts/setup.sh
	sh contrib/podman/setup.sh
	$(BIN)/pytest -n 2 --dist loadgroup -q

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

"""What a model's tokens cost, for agents that report tokens but no dollars (Codex, Gemini
CLI, opencode).

Prices are US dollars per million tokens, as the providers publish them for their APIs
(openai.com/api/pricing, ai.google.dev/gemini-api/docs/pricing), looked up by the longest
model-name prefix that matches: ``gpt-5.1-codex-mini`` is priced as itself,
``gpt-5-codex-2026-01`` as ``gpt-5-codex``. A model with no entry has no price, and its
run no cost (the profile's ``cost_per_session`` estimate stands in). Cached input tokens are
part of the input tokens the CLIs report; they are billed at the cached rate instead.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens."""

    input: float
    cached_input: float
    output: float


PRICES: dict[str, Price] = {
    # OpenAI (Codex CLI)
    "gpt-5.2": Price(1.75, 0.175, 14.0),
    "gpt-5.1-codex-mini": Price(0.25, 0.025, 2.0),
    "gpt-5.1": Price(1.25, 0.125, 10.0),
    "gpt-5-codex": Price(1.25, 0.125, 10.0),
    "gpt-5-mini": Price(0.25, 0.025, 2.0),
    "gpt-5-nano": Price(0.05, 0.005, 0.40),
    "gpt-5": Price(1.25, 0.125, 10.0),
    "codex-mini": Price(1.50, 0.375, 6.0),
    "gpt-4.1-mini": Price(0.40, 0.10, 1.60),
    "gpt-4.1": Price(2.0, 0.50, 8.0),
    "o4-mini": Price(1.10, 0.275, 4.40),
    "o3": Price(2.0, 0.50, 8.0),
    # Google (Gemini CLI); the under-200k-token prompt tier
    "gemini-2.5-pro": Price(1.25, 0.31, 10.0),
    "gemini-2.5-flash-lite": Price(0.10, 0.025, 0.40),
    "gemini-2.5-flash": Price(0.30, 0.075, 2.50),
    "gemini-3-pro": Price(2.0, 0.20, 12.0),
    "gemini-3-flash": Price(0.50, 0.05, 3.0),
}


def price_of(model: str | None) -> Price | None:
    """The price of ``model`` (a provider prefix such as ``openai/`` is ignored), or None."""
    if not model:
        return None
    name = model.rsplit("/", 1)[-1].lower()
    best = max((key for key in PRICES if name.startswith(key)), key=len, default=None)
    return PRICES[best] if best is not None else None


def cost_usd(price: Price, *, input_tokens: int, cached_tokens: int, output_tokens: int) -> float:
    """The dollars ``input_tokens`` (of which ``cached_tokens`` were cached) and
    ``output_tokens`` cost at ``price``."""
    cached = min(max(cached_tokens, 0), max(input_tokens, 0))
    fresh = max(input_tokens, 0) - cached
    total = fresh * price.input + cached * price.cached_input + max(output_tokens, 0) * price.output
    return total / 1_000_000

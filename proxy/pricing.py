"""``pricing``: what a provider bills per million tokens, by model, for the ledger's money
(core/ledger.py, core/prices.py), and how long it keeps a prompt cached (the ledger's
``ttl_expiry``, core/cache_outcome.py). No price is shipped as a fact: a model no rule
matches takes the model registry's list prices (observe/ledger.py), whose cache write,
where listed, is the 5-minute tier's.

Cache writes are billed only where the provider reports them (Anthropic's
``cache_creation_input_tokens``): by default at its multiples of the input price,
1.25 for the 5-minute tier and 2 for the hour's; reads at ``cached_input``
(Anthropic's 0.1 of input, OpenAI's cached-input price).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# Anthropic's cache-write multiples of the input price, by tier.
WRITE_5M = 1.25
WRITE_1H = 2.0


class PriceRule(BaseModel):  # USD per million tokens
    model_config = ConfigDict(extra="forbid", frozen=True)

    match: str = "*"  # a glob on the model name: a model's first matching rule prices it
    input: float = Field(ge=0)
    cached_input: float | None = Field(None, ge=0)  # None: priced as input
    output: float = Field(ge=0)
    cache_write: float | None = Field(None, ge=0)  # a 5-minute write; None: input x 1.25
    cache_write_1h: float | None = Field(None, ge=0)  # an hour's write; None: input x 2
    # How long the provider keeps a prefix cached after its last use (OpenAI: 5-10
    # minutes; Anthropic: 5), and Anthropic's hour tier (a breakpoint's ttl "1h").
    cache_ttl_s: float = Field(300, gt=0)
    cache_long_ttl_s: float = Field(3600, gt=0)

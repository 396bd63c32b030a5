"""Adapters between stratastore and inference engines (docs/engine.md is the contract)."""

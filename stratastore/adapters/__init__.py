"""Adapters between stratastore and inference engines (docs/ENGINE.md is the contract)."""

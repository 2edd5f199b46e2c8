"""Engines the gateway can drive. Each holds one backbone and all of its heads."""

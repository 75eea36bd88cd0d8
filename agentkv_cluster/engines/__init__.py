"""Adapters to real inference engines."""

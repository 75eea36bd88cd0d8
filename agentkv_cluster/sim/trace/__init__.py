"""Agent event traces: one documented JSON-lines format, converters, and replay."""

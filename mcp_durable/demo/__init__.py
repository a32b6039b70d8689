"""Stand-ins for downstream systems, used by `tools/`, the examples and the crash tests."""

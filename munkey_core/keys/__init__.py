"""Frozen key encoders (layer: bottom; docs/modules.md has the map).

- encoders.py: the encoders (offline weights, timm names) and the on-disk key cache.
- cache.py: the key cache's paths and reading, in numpy alone (no torch).
Tests: tests/keys/test_keys.py, tests/run/test_bankonly.py.
"""

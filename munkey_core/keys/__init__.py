"""Frozen key encoders (layer: bottom; docs/modules.md has the map).

- encoders.py: the encoders (offline weights, timm names) and the on-disk key cache.
Tests: tests/keys/test_keys.py.
"""

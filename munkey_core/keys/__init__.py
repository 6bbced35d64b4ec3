"""Frozen key encoders and the on-disk key cache."""

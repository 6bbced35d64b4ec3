"""Metrics, membership-inference attacks, retrained oracles and checkpoint selection."""

"""Deletion requests: the journal and roll-forward, post-deletion evidence."""

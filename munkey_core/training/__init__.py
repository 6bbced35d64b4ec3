"""Training loops (single process and distributed) and torch workarounds."""

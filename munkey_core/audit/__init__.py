"""The hash-chained audit log, its backends, canonical JSON and receipts."""

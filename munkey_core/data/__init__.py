"""Datasets: sources, stable sample ids, splits, image decoding."""

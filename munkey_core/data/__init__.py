"""Datasets (layer: bottom; docs/modules.md has the map).

- datasets.py: the registry: uint8 images, labels, stable sample ids, splits.
- images.py: decoding user images into uint8 (H, W, C).
- sampling.py: seeded subsets (stratified sample, random fraction of ids).
- duplicates.py: near-duplicate search of uploads against the training images.
Tests: tests/data/test_data.py, tests/data/test_images.py, tests/forget/test_forget.py.
"""

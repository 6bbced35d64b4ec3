"""Unlearning methods other than key deletion (layer: above run; docs/modules.md has the map).

- classforget.py: class unlearning on a run (UnAct, SSD, LFSSD, class key deletion), Af/Ar/Delta.
- unact.py: UnAct. ssd.py: SSD and LFSSD.
- posthoc.py, neggrad.py, scrub.py, finetune.py: post-hoc random-forgetting baselines.
Tests: tests/test_classforget.py, tests/test_unact.py, tests/test_ssd.py, tests/test_posthoc.py.
"""

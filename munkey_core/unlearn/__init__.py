"""Unlearning methods other than key deletion (layer: above run; docs/modules.md has the map).

- classforget.py: class unlearning on a run (UnAct, SSD, LFSSD, class key deletion), Af/Ar/Delta.
- unact.py: UnAct. ssd.py: SSD and LFSSD.
- forwardcache.py: a MUNKEY run's test forwards, reused by every class request (same labels, less work).
- posthoc.py, neggrad.py, scrub.py, finetune.py: post-hoc random-forgetting baselines.
- tuning.py: the post-hoc baselines' settings, chosen on a validation forget split.
Tests: tests/unlearn/test_classforget.py, tests/unlearn/test_unact.py, tests/unlearn/test_ssd.py, tests/unlearn/test_posthoc.py,
tests/unlearn/test_forwardcache.py, tests/unlearn/test_tuning.py.
"""

"""Training (layer: above run; docs/modules.md has the map).

- train.py: MUNKEY training (pathway dropout, retrieval simulation), one loop for one or many processes.
- distributed.py: the DDP launcher (`torchrun -m munkey_core.training.distributed`).
- runs.py: a run directory from a dataset (`train_run`, `write_run`) and retraining (oracles).
- classifier.py: ResNet-18 / plain ViT classifier runs.
- torchfix.py: work-arounds for the pinned torch build.
Tests: tests/training/test_train.py, tests/training/test_ddp.py, tests/eval/test_oracles.py.
"""

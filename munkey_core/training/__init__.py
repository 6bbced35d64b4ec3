"""Training (layer: above run; docs/modules.md has the map).

- train.py: MUNKEY training (pathway dropout, retrieval simulation), one loop for one or many processes.
- losses.py: the training loss, shared by the batch step and the per-sample step.
- per_sample.py: per-sample gradient clipping and noise (DP-SGD style), an experimental option.
- distributed.py: the DDP launcher (`torchrun -m munkey_core.training.distributed`).
- runs.py: a run directory from a dataset (`train_run`, `write_run`) and retraining (oracles).
- classifier.py: ResNet-18 / plain ViT classifier runs.
- torchfix.py: work-arounds for the pinned torch build.
Tests: tests/training/test_train.py, tests/training/test_per_sample.py, tests/training/test_ddp.py, tests/eval/test_oracles.py.
"""

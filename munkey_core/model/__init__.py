"""Networks and retrieval inference (layer: bottom; docs/modules.md has the map).

- munkey_vit.py: the MUNKEY ViT (exemplar token, null tokens, late injection).
- predict.py: K nearest keys -> ensemble or fusion -> prediction with evidence.
- classifiers.py: ResNet-18 and plain ViT for the post-hoc methods.
Tests: tests/model/test_model.py, tests/model/test_late.py, tests/model/test_perf_late.py.
"""

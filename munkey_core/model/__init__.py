"""The MUNKEY ViT, its inference (ensemble and fusions) and the plain classifiers."""

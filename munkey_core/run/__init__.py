"""A run directory: paths, atomic writes, the run lock, checkpoint row files, classifier runs."""

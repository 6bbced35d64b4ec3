"""Unlearning methods: key deletion (MUNKEY) now; UnAct and post-hoc baselines as they land."""

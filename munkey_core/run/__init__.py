"""The run directory and the run interface (layer: above data/keys/model/bank; docs/modules.md).

- paths.py: the layout (`RunPaths`), opening and creating a run directory, config and forgotten.json.
- rows.py: the bank's and the checkpoints' row files, purge in place, format-1 migration.
- lock.py: the inter-process run lock and the crash-point test hook.
- mapcache.py: the Embeddings maps cached in the run (embeddings/): derived data a deletion purges.
- tags.py: sample tags and saved grid views in the run (tags.json): data about samples a deletion purges.
- copycache.py: the copy search's calibration kept in the run (duplicates/), `copy_index`: derived data a
  deletion purges by id; brought up to date by searching again only what a deleted image scored.
- predcache.py: predictions of dataset rows kept per bank state; a deletion drops only those it can change.
- predstore.py: those predictions kept in the run (predictions/), so a fresh process starts warm;
  derived data a deletion purges.
- loaded.py: the run interface every layer above works with (`LoadedRun`, `LoadedMunkeyRun`,
  `ClassifierRun`, `DeletionTarget`, `load_run`).
- bankonly.py: a MUNKEY run opened without its model, in numpy alone: a deletion without evaluation.
Tests: tests/run/test_runstore.py, tests/run/test_atomicity.py, tests/test_service.py, tests/eval/test_incremental.py,
tests/run/test_tags.py, tests/run/test_predstore.py,
tests/run/test_bankonly.py.
"""

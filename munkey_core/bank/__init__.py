"""The exemplar memory bank (layer: below run; docs/modules.md has the map).

- memory.py: the bank in RAM: exact top-K search, physical deletion, fingerprint.
- rowmap.py: what both share without torch: the id -> row lookup, a deletion's result, the fingerprint.
- store.py: the bank on disk: a fixed-row file with O(1) in-place deletion.
- ann.py: approximate top-K (IVF) over a store or an in-memory bank.
- search.py: a run's top-K in one place: exact (the reference) or IVF, by bank size or option.
Tests: tests/bank/test_memory.py, tests/bank/test_perf_bankstore.py, tests/bank/test_perf_ann.py,
  tests/bank/test_search.py.
"""

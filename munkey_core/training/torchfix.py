"""Work-arounds for bugs in the torch build we pin (torch 2.14 on CPU), each with the test that shows it.

- oneDNN's backward through our models crashes the process (double free) on odd batch sizes above 1
  when torch runs more than one thread (found by tests/unlearn/test_ssd.py with the default thread count).
  `odd_batch_guard(n)` turns oneDNN off for such a batch only, so even batches keep the fast path and
  timings stay comparable. Used by SSD's importance pass and, as a precaution for an odd-sized last
  batch, by the training loops.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

import torch


@contextlib.contextmanager
def _without_onednn() -> Iterator[None]:
    with warnings.catch_warnings():  # switching the flag warns about Intel-GPU TF32, irrelevant here
        warnings.simplefilter("ignore", UserWarning)
        flags = torch.backends.mkldnn.flags(enabled=False)
        flags.__enter__()
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            flags.__exit__(None, None, None)


def odd_batch_guard(batch_size: int) -> contextlib.AbstractContextManager:
    """A context for one forward/backward of `batch_size` samples that avoids the oneDNN crash."""
    if batch_size > 1 and batch_size % 2 == 1 and torch.get_num_threads() > 1:
        return _without_onednn()
    return contextlib.nullcontext()

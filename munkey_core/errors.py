"""The one exception type for errors a user can cause (bad input, missing data, no network).

The CLI and the dashboard catch it and show its message; anything else is a bug and keeps
its traceback. Messages say what went wrong *and what to do about it*.
"""


class MunkeyError(Exception):
    """A user-facing error whose message tells the user how to fix the problem."""


def non_negative_int(text: str) -> int:
    """argparse type for counts of at least 0 (--max-samples, where 0 means all; --floor-oracles, where 0 means
    none): a clear error for -1 or 'x'; each option's help says what its 0 means."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number of 0 or more, got {value}")
    return value

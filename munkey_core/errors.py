"""The one exception type for errors a user can cause (bad input, missing data, no network).

The CLI and the dashboard catch it and show its message; anything else is a bug and keeps
its traceback. Messages say what went wrong *and what to do about it*.
"""


class MunkeyError(Exception):
    """A user-facing error whose message tells the user how to fix the problem."""

"""The one exception type a user's mistake raises.

The CLI turns a ``TrainmathError`` into a single line on stderr and exit code 2; it never shows a traceback
for bad input. Code raises it (never ``assert``, which ``python -O`` strips) with a message that quotes the
offending values and, where there is one, the fix.
"""


class TrainmathError(Exception):
    """A user-facing error: bad input, impossible layout, unknown model. ``str(e)`` is the whole message."""

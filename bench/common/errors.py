"""The one exception type for errors a user can cause (bad config, bad path, bad size...).

The CLI catches it once, prints its message as one line and exits with code 2.
"""


class UserError(Exception):
    """An error caused by input: its message names the field, path or value at fault."""


class ChecksumError(UserError):
    """Data read back from a checkpoint does not match what was saved."""

"""The error type for a user's mistake: the CLI prints its message as one line and exits 2.

Its own module (no imports) so that code loaded early, such as ``bench.plan.plugins``, can raise it without importing
the configuration machinery.
"""


class ConfigError(ValueError):
    """Bad user input: the message says what was wrong and what is valid."""

"""Errors meant for users: one line that names the input and the fix.

The CLI prints ``UserError`` messages without a traceback and exits with ``exit_code``;
anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """An expected failure caused by input or environment (bad flag, unreachable database...).

    Args:
        message: one line naming the input, the problem and the fix.
        exit_code: process exit status the CLI uses (default 2).
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code

"""The error every layer raises for what the user can fix: `coli` prints it without a traceback
and exits 2, the server's startup says it the same way. It lives below the commands so that the
model store, the launch options and the server can raise it without importing a command."""


class UserError(Exception):
    """An error the user can fix; `coli` prints it without a traceback and exits 2."""

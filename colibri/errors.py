"""The errors every layer raises: UserError for what the user can fix (`coli` prints it without a
traceback and exits 2, the server's startup says it the same way), ConvertError for a checkpoint
the converter cannot convert. They live below the commands and the converter so that the model
store, the launch options, the server and the family modules raise them without importing up."""


class UserError(Exception):
    """An error the user can fix; `coli` prints it without a traceback and exits 2."""


class ConvertError(RuntimeError):
    """A checkpoint the converter cannot convert, with the reason."""

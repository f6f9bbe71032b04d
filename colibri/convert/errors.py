"""The error every converter raises for a checkpoint it cannot convert (`coli convert` and
`coli pull` say it as the user's to fix). Its own module so that the per-format and per-family
converters raise it without importing the HF converter back."""


class ConvertError(RuntimeError):
    """A checkpoint the converter cannot convert, with the reason."""

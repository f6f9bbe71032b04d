"""The error of the JSON Schema compiler (json_schema.py) and its limits (schema_limits.py)."""


class SchemaError(ValueError):
    """A schema outside the supported subset (or not a schema). `keyword` names the culprit,
    `path` is a JSON pointer to the schema holding it."""

    def __init__(self, keyword, path, why):
        path = path if path.startswith("#") else "#" + path
        super().__init__(f"JSON schema keyword '{keyword}' at '{path}': {why}")
        self.keyword, self.path = keyword, path

"""The tool's own problems: inputs it could not read, collection that failed."""

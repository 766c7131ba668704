"""sglang general plugin entry point (filled in by the recorder work)."""


def register() -> None:
    return None

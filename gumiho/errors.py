class GumihoError(ValueError):
    """A problem with the user's input or set-up; its message is meant to be shown as is."""

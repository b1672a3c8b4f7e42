class UserError(Exception):
    """A mistake in the user's input: shown as one line naming the option, exit code 2."""

    def __init__(self, option: str, message: str):
        super().__init__(f"{option}: {message}")
        self.option = option
        self.message = message

class UserError(Exception):
    """A mistake in the user's input: shown as one line naming the option, exit code 2."""

    def __init__(self, option: str, message: str):
        super().__init__(f"{option}: {message}")
        self.option = option
        self.message = message


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during a run: every measured row is on disk and metadata.json says
    'interrupted'; the command line exits with code 130."""

    def __init__(self, folder):
        super().__init__(f"interrupted: rows measured so far are in {folder}")
        self.folder = folder

"""The one exception type that commands raise for the user to read. docs/knobs.md's table of exit
statuses says which status each kind of failure gets."""

EXIT_CONFIG = 78  # sysexits' EX_CONFIG: what this machine or the memd given cannot serve, as the pager's


class FarmemError(Exception):
    """A failure the user can act on. cli() prints `farmem: error: <message>` and exits 1."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code

    def render(self) -> str:
        return f"farmem: error: {self}"


class Unavailable(FarmemError):
    """A feature this machine lacks; the wording is shared by every command (see doctor.require)."""

    def __init__(self, feature: str, detail: str):
        super().__init__(f"{feature} is not available here: {detail}", exit_code=EXIT_CONFIG)
        self.feature = feature
        self.detail = detail

    def render(self) -> str:
        return f"farmem: {self}. Run `farmem doctor` for details."

"""Errors meant for the user: shown as one clear paragraph, without a traceback."""


class Fp8evalError(RuntimeError):
    pass


class InputError(Fp8evalError):
    """A configuration value or data file that cannot give a meaningful number."""

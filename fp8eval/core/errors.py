"""Errors meant for the user: shown as one clear paragraph, without a traceback."""


class Fp8evalError(RuntimeError):
    pass

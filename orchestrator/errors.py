"""The project's own errors, and the one place where Docker's are translated.

The CLI prints a DlbenchError's message on one line and exits non-zero; any
other exception is a bug and keeps its traceback.
"""

import contextlib


class DlbenchError(Exception):
    """An error the user can act on; the message is shown as it is."""

    exit_code = 1


class UsageError(DlbenchError):
    exit_code = 2


class DatasetError(DlbenchError):
    pass


class DockerUnavailable(DlbenchError):
    pass


class BuildError(DlbenchError):
    pass


class GpuError(DlbenchError):
    pass


class StoreError(DlbenchError):
    pass


class StoreWarning(UserWarning):
    """A result file that could not be read and was left out; the CLI shows it on one line."""


@contextlib.contextmanager
def docker_errors(action):
    """Translate the Docker SDK's exceptions raised while doing ``action``."""
    import docker.errors
    import requests.exceptions

    try:
        yield
    except docker.errors.BuildError as exc:
        raise BuildError(f"{action} failed: {exc.msg}") from None
    except docker.errors.ImageNotFound as exc:
        raise DlbenchError(f"{action}: image not found: {exc.explanation}") from None
    except docker.errors.APIError as exc:
        raise DlbenchError(f"{action}: Docker said: {exc.explanation or exc}") from None
    except (docker.errors.DockerException, requests.exceptions.ConnectionError) as exc:
        raise DockerUnavailable(
            f"cannot reach the Docker daemon ({_first_line(exc)}); "
            "is it running, and may this user use it?") from None


def _first_line(exc):
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__

"""memslice's error hierarchy: every error memslice raises on purpose derives from MemsliceError, so a
command can turn any of them into one line and an exit status instead of a traceback.

Each class also keeps the builtin base its domain errors always had (ValueError for a bad value,
RuntimeError for a broken environment), so existing `except ValueError` handlers still catch what they
caught before.

- ConfigError:  a value the operator gave (flag, environment variable, file) is wrong; the message names
  the value and the fix. Commands exit 2.
- InputError:   a value from a tenant or the network (a request body, an annotation, a size string, a
  device ID) is malformed or out of bounds; the component refuses that one request and carries on.
- ContractError: the agent and the extender disagree about a shared record (annotation, reservation);
  the record is refused, never half-applied.
- LimitError:   a request is well-formed but past a documented limit (e.g. the kubelet's 4 MiB
  ListAndWatch message); the message names the limit and how to stay under it.
- UnavailableError: something memslice needs is missing or failing (a library, the GPU driver, the region
  file, the API server); the message says what and where. Commands exit 1.
"""

from __future__ import annotations


class MemsliceError(Exception):
    """Base of every error memslice raises on purpose (never a bug): safe to show as one line."""


class ConfigError(MemsliceError, ValueError):
    """An operator-given value (flag, environment variable, file) is wrong; names the value and the fix."""


class InputError(MemsliceError, ValueError):
    """A value from a tenant or the network is malformed or out of bounds; that request is refused."""


class ContractError(MemsliceError, ValueError):
    """A record shared by the node agent and the extender (annotation, reservation) breaks the contract."""


class LimitError(MemsliceError, RuntimeError):
    """A well-formed request past a documented limit; names the limit and how to stay under it."""


class UnavailableError(MemsliceError, RuntimeError):
    """Something memslice needs (library, driver, region file, API server) is missing or failing."""

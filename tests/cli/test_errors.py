"""memslice's refusals: one error hierarchy, and every refusal the docs promise is a clean exit with one
line (the real `memslice` process, never a traceback)."""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import subprocess
import sys

from memslice import errors

MEMSLICE = [sys.executable, "-m", "memslice"]
PACKAGES = ["memslice", "memslice.plugin", "memslice.plugin.deviceplugin", "memslice.scheduler_extender",
            "memslice.interposer"]


def test_agent_refuses_a_device_list_over_the_kubelet_limit_in_one_line(tmp_path):
    """`memslice node-agent --help` promises: exit 1 with a message naming the --unit-mib that fits when the
    device list would pass the kubelet's 4 MiB ListAndWatch limit. 200 GiB at --unit-mib 1 is 204,800
    devices (about 5.6 MB of message); --unit-mib 2 fits."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_") and k != "LD_PRELOAD"}
    env.update(MEMSLICE_SIM_STATE=str(tmp_path / "node.state"), MEMSLICE_DEVICE_PLUGIN_DIR=str(tmp_path / "dp"),
               MEMSLICE_REGION_ROOT=str(tmp_path / "regions"))
    out = subprocess.run([*MEMSLICE, "node-agent", "--simulate", "200GiB", "--unit-mib", "1"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    errors_logged = [line for line in out.stderr.splitlines() if " ERROR " in line]
    assert len(errors_logged) == 1, out.stderr
    assert "cannot start" in errors_logged[0] and "--unit-mib 2 or larger" in errors_logged[0]
    assert "4194304-byte limit" in errors_logged[0]
    assert not (tmp_path / "dp").exists()  # nothing was served


def _error_classes() -> list[type[BaseException]]:
    found = []
    for name in PACKAGES:
        pkg = importlib.import_module(name)
        for mod in pkgutil.iter_modules(pkg.__path__, prefix=f"{name}."):
            if mod.name.endswith("__main__") or mod.ispkg:
                continue
            module = importlib.import_module(mod.name)
            for _, obj in inspect.getmembers(module, inspect.isclass):
                if issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                    found.append(obj)
    return found


def test_every_error_memslice_defines_is_a_memslice_error():
    """So `memslice` can turn any of them into one line, and a handler can catch all of memslice's own."""
    classes = _error_classes()
    names = {c.__name__ for c in classes}
    assert {"ListTooLarge", "ConfigError", "SizeError", "LibraryMissing", "StartupError"} <= names
    strays = [f"{c.__module__}.{c.__name__}" for c in classes if not issubclass(c, errors.MemsliceError)]
    assert strays == []


"""eagle3conv: make EAGLE-3 drafters load, wire and serve correctly.

Public API (one operation per command, each returning a result object)::

    from eagle3conv import inspect, fix_keys, configure, launch, check_launch, capture, verify, smoke, push
    from eagle3conv import write_example, load_formats, list_targets, WiringOptions
"""

from eagle3conv.version import __version__

# name -> the module that defines it (imported on first use: `import eagle3conv` stays cheap for the CLI)
_FRONT_DOOR = {
    **dict.fromkeys(("inspect", "fix_keys", "configure", "launch", "check_launch", "capture", "verify", "smoke",
                     "InspectResult", "FixResult", "ConfigResult", "VerifyResult", "SmokeResult", "WiringOptions"),
                    "eagle3conv.api"),
    **dict.fromkeys(("push", "PushResult"), "eagle3conv.publish"),
    "write_example": "eagle3conv.example",
    "load_formats": "eagle3conv.spec.formats",
    "list_targets": "eagle3conv.spec.targets",
}


def __getattr__(name):
    module = _FRONT_DOOR.get(name)
    if module is None:
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [*_FRONT_DOOR, "__version__"]

"""eagle3conv: make EAGLE-3 drafters load, wire and serve correctly.

Public API::

    from eagle3conv import inspect, fix_keys, configure, WiringOptions
"""

from eagle3conv.version import __version__


def __getattr__(name):  # lazy: `import eagle3conv` stays cheap for the CLI
    if name in ("inspect", "fix_keys", "configure", "InspectResult", "FixResult", "ConfigResult", "WiringOptions"):
        from eagle3conv import api

        return getattr(api, name)
    if name in ("push", "PushResult"):
        from eagle3conv import publish

        return getattr(publish, name)
    raise AttributeError(name)


__all__ = ["inspect", "fix_keys", "configure", "push", "PushResult", "InspectResult", "FixResult", "ConfigResult", "WiringOptions",
           "__version__"]

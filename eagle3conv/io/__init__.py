"""Level 0: bytes, files, dtypes, devices and where the data files live; no domain knowledge."""

"""Level 1: what engines, trainers, targets and drafters are (data in mappings/ and its readers); no torch."""

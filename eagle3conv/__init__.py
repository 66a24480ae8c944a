"""eagle3conv: make EAGLE-3 drafters load, wire and serve correctly."""

__version__ = "0.1.0"

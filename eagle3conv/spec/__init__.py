"""Specifications: what engines, trainers and targets mean by the fields eagle3conv reads and writes."""

"""Validation against published measurements: `trainsim validate` and what `trainsim calibrate` fits."""

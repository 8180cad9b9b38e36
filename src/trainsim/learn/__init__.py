"""Learned corrections of trainsim's analytical times (PredTOP-style stage-latency models)."""

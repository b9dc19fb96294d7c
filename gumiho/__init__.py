"""Gumiho: a speculative-decoding engine (EAGLE-2 and Gumiho drafters) that records every cycle."""

__version__ = "0.1.0"

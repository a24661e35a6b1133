"""The machine model: the measured constants the cost model reads (a profile)."""

"""Fleet analysis: an incremental Parquet index of many runs and passes over it on Dask
(``reveal fleet index|nodes|baseline|report``; docs/fleet.md)."""

"""The run directory on disk: segments, meta and events (store), root-safe writes (rundir), closing an orphaned run (finalize)."""

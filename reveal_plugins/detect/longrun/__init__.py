"""Long runs in bounded memory: the feature store, incremental featurization, the stored-window analysis."""
